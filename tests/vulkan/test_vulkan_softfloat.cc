// The exact arithmetic of the shaders (kernels/vulkan/shaders/softfloat.glsl and
// rope_math.glsl) against the host's IEEE arithmetic (x86-64 SSE, what the oracle runs
// on), through a probe shader: every special-value pair, the rounding boundaries of
// every f16/bf16 value, and 2^17–2^18 seeded random bit patterns per operation, compared
// bit for bit. This is what licenses the bit-exactness claims of the affine kernels and
// the single rounding of rope's outputs. It also drives the runtime (instance,
// device, buffers, pipeline, command stream) directly.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/vulkan/runtime/buffer.h"
#include "kernels/vulkan/runtime/command.h"
#include "kernels/vulkan/runtime/device.h"
#include "kernels/vulkan/runtime/instance.h"
#include "kernels/vulkan/runtime/pipeline.h"
#include "kvlab/dtype.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_softfloat {
namespace {

const std::uint32_t kProbeSpirv[] =
#include "softfloat_probe_words.spv.inc"
    ;

enum class Probe : std::uint32_t {
  add, sub, mul, div, rint, round, to_f16, to_bf16, f16_to_f32, lt, narrow_f32, narrow_f16, narrow_bf16, widen,
  sincos, to_int
};

// The runtime, driven directly: one device, the probe pipeline, host-visible buffers.
class Prober {
 public:
  explicit Prober(std::string& skip_reason) {
    try {
      instance_ = std::make_unique<vk::Instance>(vk::InstanceOptions{
          vk::Instance::validation_layer_available(),
          [](const std::string& m) { ADD_FAILURE() << "Vulkan validation layer: " << m; }});
      device_ = std::make_unique<vk::Device>(vk::select_physical_device(vk::list_physical_devices(*instance_), ""),
                                             false);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      skip_reason = e.what();
      return;
    }
    if (!device_->supported().float64) {
      skip_reason = "the device lacks shaderFloat64, which the probe (and rope) needs";
      device_.reset();
      return;
    }
    pipeline_ = std::make_unique<vk::ComputePipeline>(*device_, "softfloat_probe", kProbeSpirv, 3, 8);
    stream_ = std::make_unique<vk::CommandStream>(*device_, false);
  }
  bool ready() const { return stream_ != nullptr; }

  // result words: out_per_item per input pair.
  std::vector<std::uint32_t> run(Probe op, const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                                 std::size_t out_per_item = 1) {
    const std::size_t n = a.size();
    vk::DeviceBuffer da(*device_, n * 4, vk::MemoryKind::host_visible), db(*device_, n * 4, vk::MemoryKind::host_visible),
        dout(*device_, n * 4 * out_per_item, vk::MemoryKind::host_visible);
    std::memcpy(da.mapped(), a.data(), n * 4);
    std::memcpy(db.mapped(), b.data(), n * 4);
    const vk::BufferRange ranges[] = {{da.handle(), 0, da.size()}, {db.handle(), 0, db.size()},
                                      {dout.handle(), 0, dout.size()}};
    const std::uint32_t push[] = {static_cast<std::uint32_t>(op), static_cast<std::uint32_t>(n)};
    stream_->begin();
    stream_->dispatch(*pipeline_, ranges, std::as_bytes(std::span(push)), 1024);
    stream_->submit_and_wait();
    std::vector<std::uint32_t> out(n * out_per_item);
    std::memcpy(out.data(), dout.mapped(), out.size() * 4);
    return out;
  }

 private:
  std::unique_ptr<vk::Instance> instance_;
  std::unique_ptr<vk::Device> device_;
  std::unique_ptr<vk::ComputePipeline> pipeline_;
  std::unique_ptr<vk::CommandStream> stream_;
};

#define KVLAB_PROBER_OR_SKIP(var)  \
  std::string var##_reason;        \
  Prober var(var##_reason);        \
  if (!var.ready()) GTEST_SKIP() << var##_reason

float f(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t u(float x) { return std::bit_cast<std::uint32_t>(x); }
bool is_nan(std::uint32_t v) { return (v & 0x7FFFFFFFu) > 0x7F800000u; }

// Special values: zeros, denormals, normal edges, ties of rounding, huge, Inf, NaNs.
std::vector<std::uint32_t> specials() {
  std::vector<std::uint32_t> s = {0x00000000, 0x00000001, 0x00000002, 0x00000003, 0x007FFFFF, 0x00800000, 0x00800001,
                                  0x00FFFFFF, 0x01000000, 0x0C000000, 0x33D6BF95, 0x33800000, 0x34000000, 0x3EFFFFFF,
                                  0x3F000000, 0x3F000001, 0x3F7FFFFF, 0x3F800000, 0x3F800001, 0x3FC00000, 0x40200000,
                                  0x40400000, 0x40E00000, 0x4B000000, 0x4AFFFFFF, 0x4B7FFFFF, 0x4B800000, 0x477FE000,
                                  0x477FF000, 0x477FEFFF, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x7F000000,
                                  0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000};
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n; ++i) s.push_back(s[i] | 0x80000000u);
  return s;
}

// Seeded random operands of several kinds: raw bit patterns, nearby exponents (the
// cancellations of add/sub), denormal ranges, products and quotients at the edges of
// the exponent range, exact quotients, and small integers.
void random_pairs(testing::SeededRng& rng, std::size_t n, std::vector<std::uint32_t>& a, std::vector<std::uint32_t>& b) {
  auto bits = [&] { return static_cast<std::uint32_t>(rng.integer(0, 0xFFFFFFFFll)); };
  auto with_exp = [&](std::int64_t lo, std::int64_t hi) {
    return (bits() & 0x807FFFFFu) | (static_cast<std::uint32_t>(rng.integer(lo, hi)) << 23);
  };
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t x = bits(), y = bits();
    switch (i % 8) {
      case 0: break;
      case 1: {  // close magnitudes
        x = with_exp(1, 254);
        const std::int64_t e = static_cast<std::int64_t>((x >> 23) & 0xFF);
        y = with_exp(std::max<std::int64_t>(0, e - 2), std::min<std::int64_t>(254, e + 2));
        break;
      }
      case 2: x = with_exp(0, 3); y = with_exp(0, 30); break;                      // denormal territory
      case 3: x = with_exp(40, 90); y = with_exp(40, 90); break;                   // products near underflow
      case 4: x = with_exp(190, 254); y = with_exp(100, 140); break;               // near overflow
      case 5: {  // exact quotients and the small integers of quantization
        y = with_exp(100, 150);
        x = u(f(y) * static_cast<float>(rng.integer(-300, 300)));
        break;
      }
      case 6: x = u(static_cast<float>(rng.integer(-300, 300)) + 0.5f * static_cast<float>(rng.integer(0, 1)));
              y = with_exp(110, 140); break;
      default: x = with_exp(0, 254); y = with_exp(0, 254);
    }
    a.push_back(x);
    b.push_back(y);
  }
}

std::uint32_t host_binary(Probe op, std::uint32_t x, std::uint32_t y) {
  const float fx = f(x), fy = f(y);
  switch (op) {
    case Probe::add:
      if (is_nan(x) && is_nan(y)) return x | 0x00400000u;  // the first operand (the compiler may commute addss)
      return u(fx + fy);
    case Probe::sub: return u(fx - fy);
    case Probe::mul:
      if (is_nan(x) && is_nan(y)) return x | 0x00400000u;
      return u(fx * fy);
    case Probe::div: return u(fx / fy);
    case Probe::lt: return fx < fy ? 1u : 0u;
    default: return 0;
  }
}

::testing::AssertionResult all_match(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                                     const std::vector<std::uint32_t>& got,
                                     const std::function<std::uint32_t(std::uint32_t, std::uint32_t)>& want) {
  std::size_t bad = 0;
  ::testing::AssertionResult r = ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::uint32_t w = want(a[i], b[i]);
    if (got[i] == w) continue;
    if (bad++ < 5) {
      char line[160];
      std::snprintf(line, sizeof line, "0x%08x, 0x%08x: got 0x%08x, want 0x%08x; ", a[i], b[i], got[i], w);
      r = ::testing::AssertionFailure() << r.message() << line;
    }
  }
  if (bad) r << "; " << bad << " of " << a.size() << " differ";
  return r;
}

TEST(VulkanSoftfloat, ArithmeticIsCorrectlyRoundedWithTheHostsSpecialValues) {
  KVLAB_PROBER_OR_SKIP(probe);
  KVLAB_SEEDED_RNG(rng, 5150);
  std::vector<std::uint32_t> a, b;
  const std::vector<std::uint32_t> s = specials();
  for (const std::uint32_t x : s)
    for (const std::uint32_t y : s) {
      a.push_back(x);
      b.push_back(y);
    }
  random_pairs(rng, std::size_t{1} << 18, a, b);
  for (const Probe op : {Probe::add, Probe::sub, Probe::mul, Probe::div, Probe::lt}) {
    SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(op));
    EXPECT_TRUE(all_match(a, b, probe.run(op, a, b), [&](std::uint32_t x, std::uint32_t y) { return host_binary(op, x, y); }));
  }
}

TEST(VulkanSoftfloat, RoundingToIntegralMatchesRintAndRoundAtEveryHalf) {
  KVLAB_PROBER_OR_SKIP(probe);
  KVLAB_SEEDED_RNG(rng, 5151);
  std::vector<std::uint32_t> a = specials(), b;
  for (int k = -70000; k <= 70000; ++k) {  // k + 1/2 and its neighbours, every code range
    const float h = static_cast<float>(k) + 0.5f;
    for (const float v : {h, std::nextafter(h, -1e9f), std::nextafter(h, 1e9f), static_cast<float>(k)}) a.push_back(u(v));
  }
  for (int i = 0; i < (1 << 18); ++i) a.push_back(static_cast<std::uint32_t>(rng.integer(0, 0xFFFFFFFFll)));
  b.assign(a.size(), 0);
  // A NaN comes back unchanged, signaling ones too (softfloat.glsl): GCC's inline rint
  // does that, glibc's rintf (what clang calls) quiets them.
  EXPECT_TRUE(all_match(a, b, probe.run(Probe::rint, a, b),
                        [](std::uint32_t x, std::uint32_t) { return is_nan(x) ? x : u(std::rint(f(x))); }));
  EXPECT_TRUE(all_match(a, b, probe.run(Probe::round, a, b), [](std::uint32_t x, std::uint32_t) { return u(std::round(f(x))); }));
  // Integral values to int (the code conversion), |x| <= 2^31.
  std::vector<std::uint32_t> ints;
  for (const std::uint32_t x : a) {
    const float r = std::rint(f(x));
    if (std::isfinite(r) && std::abs(r) <= 2147483648.0f) ints.push_back(u(r));
  }
  std::vector<std::uint32_t> zeros(ints.size(), 0);
  EXPECT_TRUE(all_match(ints, zeros, probe.run(Probe::to_int, ints, zeros), [](std::uint32_t x, std::uint32_t) {
    return static_cast<std::uint32_t>(static_cast<std::int64_t>(f(x)));
  }));
}

TEST(VulkanSoftfloat, StorageConversionsMatchKvlabsAtEveryRoundingBoundary) {
  KVLAB_PROBER_OR_SKIP(probe);
  KVLAB_SEEDED_RNG(rng, 5152);
  std::vector<std::uint32_t> halves(65536), a = specials();
  for (std::uint32_t h = 0; h < 65536; ++h) halves[h] = h;
  // Every f16 and bf16 value's upper rounding boundary (the f32 midpoint to the next
  // value) and its neighbours, plus random f32 patterns.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    for (const float v : {f16_bits_to_f32(static_cast<std::uint16_t>(h)), bf16_bits_to_f32(static_cast<std::uint16_t>(h))}) {
      if (!std::isfinite(v)) continue;
      a.push_back(u(v));
      a.push_back(u(v) + 1);
      a.push_back(u(v) - 1);
    }
    const float lo = f16_bits_to_f32(static_cast<std::uint16_t>(h));
    const float hi = f16_bits_to_f32(static_cast<std::uint16_t>(h + 1));
    if (std::isfinite(lo) && std::isfinite(hi) && (h & 0x7FFF) < 0x7C00) {
      const float mid = static_cast<float>((static_cast<double>(lo) + static_cast<double>(hi)) / 2);
      for (const std::uint32_t m : {u(mid) - 1, u(mid), u(mid) + 1}) a.push_back(m);
    }
    const std::uint32_t bmid = (h << 16) | 0x8000u;  // bf16 ties sit at the half of the dropped bits
    for (const std::uint32_t m : {bmid - 1, bmid, bmid + 1}) a.push_back(m);
  }
  for (int i = 0; i < (1 << 18); ++i) a.push_back(static_cast<std::uint32_t>(rng.integer(0, 0xFFFFFFFFll)));
  std::vector<std::uint32_t> b(a.size(), 0), zeros(halves.size(), 0);
  EXPECT_TRUE(all_match(a, b, probe.run(Probe::to_f16, a, b), [](std::uint32_t x, std::uint32_t) {
    return static_cast<std::uint32_t>(f32_to_f16_bits(f(x)));
  }));
  EXPECT_TRUE(all_match(a, b, probe.run(Probe::to_bf16, a, b), [](std::uint32_t x, std::uint32_t) {
    return static_cast<std::uint32_t>(f32_to_bf16_bits(f(x)));
  }));
  EXPECT_TRUE(all_match(halves, zeros, probe.run(Probe::f16_to_f32, halves, zeros), [](std::uint32_t h, std::uint32_t) {
    return u(f16_bits_to_f32(static_cast<std::uint16_t>(h)));
  }));
}

// A double rounded once to a float dtype, the oracle's way (reference/rope.cc): to
// float with round-to-odd, then RNE to f16/bf16; float keeps >= 2 extra bits, so the
// result is the correctly rounded one.
std::uint32_t host_narrow(double v, DType t) {
  float nearest = static_cast<float>(v);
  if (t != DType::f32 && !std::isnan(v) && static_cast<double>(nearest) != v && (u(nearest) & 1u) == 0u) {
    nearest = std::nextafter(nearest, v > static_cast<double>(nearest) ? INFINITY : -INFINITY);
  }
  if (t == DType::f16) return f32_to_f16_bits(nearest);
  if (t == DType::bf16) return f32_to_bf16_bits(nearest);
  return u(nearest);
}

TEST(VulkanSoftfloat, DoublesNarrowWithOneRoundingAndWidenExactly) {
  KVLAB_PROBER_OR_SKIP(probe);
  KVLAB_SEEDED_RNG(rng, 5153);
  std::vector<double> d = {0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 65519.99, 1e-8, 5.960464477539063e-08,
                           2.9802322387695312e-08, 2.98023223876953125e-08 * (1 + 1e-16), 1e300, -1e-300, 3.4e38,
                           3.4028235677973366e38, 1.1754942807573643e-38, 1.401298464324817e-45, 7.006e-46,
                           std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  for (std::uint32_t h = 0; h < 65536; ++h) {  // every f16/bf16 midpoint in double, and its neighbours
    for (const bool bf : {false, true}) {
      const float lo = bf ? bf16_bits_to_f32(static_cast<std::uint16_t>(h)) : f16_bits_to_f32(static_cast<std::uint16_t>(h));
      const float hi = bf ? bf16_bits_to_f32(static_cast<std::uint16_t>(h + 1)) : f16_bits_to_f32(static_cast<std::uint16_t>(h + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi) || (h & 0x7FFF) == 0x7FFF) continue;
      const double mid = (static_cast<double>(lo) + static_cast<double>(hi)) / 2;
      for (const double m : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300 * (mid < 0 ? -1 : 1))}) d.push_back(m);
    }
  }
  for (int i = 0; i < (1 << 17); ++i) {
    d.push_back(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.integer(-160, 140))));
    d.push_back(std::bit_cast<double>(static_cast<std::uint64_t>(rng.integer(0, 0x7FFFFFFFFFFFFFFFll)) |
                                      (rng.integer(0, 1) ? 0x8000000000000000ull : 0)));
  }
  std::vector<std::uint32_t> lo, hi;
  for (const double v : d) {
    lo.push_back(static_cast<std::uint32_t>(std::bit_cast<std::uint64_t>(v)));
    hi.push_back(static_cast<std::uint32_t>(std::bit_cast<std::uint64_t>(v) >> 32));
  }
  auto dbl = [](std::uint32_t l, std::uint32_t h) { return std::bit_cast<double>((std::uint64_t{h} << 32) | l); };
  for (const auto& [op, t] : {std::pair{Probe::narrow_f32, DType::f32}, std::pair{Probe::narrow_f16, DType::f16},
                               std::pair{Probe::narrow_bf16, DType::bf16}}) {
    SCOPED_TRACE(dtype_name(t));
    EXPECT_TRUE(all_match(lo, hi, probe.run(op, lo, hi), [&, t = t](std::uint32_t l, std::uint32_t h) {
      return host_narrow(dbl(l, h), t);
    }));
  }
  // f32 → double is exact (NaNs keep their payload; the host's cvtss2sd would quiet).
  std::vector<std::uint32_t> a = specials(), zeros;
  for (int i = 0; i < (1 << 18); ++i) a.push_back(static_cast<std::uint32_t>(rng.integer(0, 0xFFFFFFFFll)));
  zeros.assign(a.size(), 0);
  const std::vector<std::uint32_t> wide = probe.run(Probe::widen, a, zeros, 2);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double got = dbl(wide[2 * i], wide[2 * i + 1]);
    const std::uint64_t want =
        is_nan(a[i]) ? (std::uint64_t{a[i] & 0x80000000u} << 32) | (0x7FFull << 52) | (std::uint64_t{a[i] & 0x7FFFFFu} << 29)
                     : std::bit_cast<std::uint64_t>(static_cast<double>(f(a[i])));
    const bool ok = std::bit_cast<std::uint64_t>(got) == want;
    if (!ok && bad++ < 5) ADD_FAILURE() << "widen 0x" << std::hex << a[i] << " gave " << got;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(VulkanSoftfloat, SinCosAreWithinFourUlpOfLibmWhereTheReductionIsExact) {
  KVLAB_PROBER_OR_SKIP(probe);
  KVLAB_SEEDED_RNG(rng, 5154);
  std::vector<double> theta = {0.0, -0.0, 1e-300, 0.5, 0.7853981633974483, 0.7853981633974484, 1.5707963267948966,
                               3.141592653589793, 6.283185307179586, 1e5, 65536.0, 7.9e8, -7.9e8, 8.1e8, 1e12, 1e300,
                               std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  for (int k = -2000; k <= 2000; ++k) theta.push_back(k * 1.5707963267948966);  // near the quadrant edges
  for (int i = 0; i < (1 << 17); ++i) {
    theta.push_back(rng.uniform(-10, 10));
    theta.push_back(rng.uniform(-2e5, 2e5));  // positions × frequencies of real models
    theta.push_back(rng.uniform(-7.9e8, 7.9e8));
  }
  std::vector<std::uint32_t> lo, hi;
  for (const double v : theta) {
    lo.push_back(static_cast<std::uint32_t>(std::bit_cast<std::uint64_t>(v)));
    hi.push_back(static_cast<std::uint32_t>(std::bit_cast<std::uint64_t>(v) >> 32));
  }
  const std::vector<std::uint32_t> out = probe.run(Probe::sincos, lo, hi, 4);
  auto dbl = [&](std::size_t w) { return std::bit_cast<double>((std::uint64_t{out[w + 1]} << 32) | out[w]); };
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const double s = dbl(4 * i), c = dbl(4 * i + 2), t = theta[i];
    bool ok;
    if (!std::isfinite(t)) {
      ok = std::isnan(s) && std::isnan(c);
    } else if (std::abs(t) < 8e8) {
      // Our error (reduction ~2^-53·|r|, polynomial ~2 ulp) plus libm's < 1 ulp.
      const double err = std::max(std::abs(s - std::sin(t)), std::abs(c - std::cos(t)));
      worst = std::max(worst, err);
      ok = err <= 0x1p-50;
    } else {
      ok = std::abs(s) <= 1 && std::abs(c) <= 1;  // unreduced: bounded, rope's tolerance covers it
    }
    if (!ok && bad++ < 5) ADD_FAILURE() << "theta " << t << ": sin " << s << " cos " << c;
  }
  std::cout << "[ sincos   ] worst |error| vs libm below 8e8: " << worst << "\n";
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace test_vulkan_softfloat
}  // namespace kvlab
