// Vulkan affine quantize/dequantize == the oracle, byte for byte (codes, scales, biases,
// dequantized values), for every bits × group × dtype × rounding of MLX's table, on
// both shader builds (16/8-bit storage, forced u32 words) and with the hardware fast
// paths disabled (a sample of specs on the forced-staging path); tensors sit at odd
// element offsets inside guarded buffers; and invalid input raises the oracle's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/vulkan/vulkan_backend.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_affine_quantize {
namespace {

struct Quantized {
  Tensor wq, scales, biases;
};

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

// Quantizes on `be` with every tensor `lead` elements into a guarded buffer (outputs
// poisoned first), and checks that nothing outside the tensors was written.
Quantized quantize_on(Backend& be, const Tensor& x, const QuantSpec& spec, Rounding rounding, std::size_t lead) {
  const std::int64_t d = x.dim(-1);
  const DType dt = x.dtype();
  const DTensor dx = testing::place(be, dt, x.shape(), lead, x.data());
  const DTensor wq = testing::place(be, DType::u32, with_last(x.shape(), spec.packed_words(d)), lead, nullptr, 0xEE);
  const DTensor sc = testing::place(be, dt, with_last(x.shape(), spec.groups(d)), lead, nullptr, 0xC1);
  const DTensor bi = testing::place(be, dt, with_last(x.shape(), spec.groups(d)), lead, nullptr, 0xC1);
  be.quantize({dx, rounding, {wq, sc, bi, spec}});
  for (const DTensor* t : {&dx, &wq, &sc, &bi}) EXPECT_TRUE(testing::guards_intact(be, *t));
  return {be.download(wq), be.download(sc), be.download(bi)};
}

Tensor dequantize_on(Backend& be, const Quantized& q, const QuantSpec& spec, DType out_dtype, std::size_t lead) {
  const DTensor wq = testing::place(be, DType::u32, q.wq.shape(), lead, q.wq.data());
  const DTensor sc = testing::place(be, q.scales.dtype(), q.scales.shape(), lead, q.scales.data());
  const DTensor bi = testing::place(be, q.biases.dtype(), q.biases.shape(), lead, q.biases.data());
  const DTensor out =
      testing::place(be, out_dtype, with_last(q.wq.shape(), q.scales.dim(-1) * spec.group_size), lead, nullptr, 0xFF);
  be.dequantize({{wq, sc, bi, spec}, out});
  EXPECT_TRUE(testing::guards_intact(be, out));
  return be.download(out);
}

// The float a with a / 1e-7f == 0.49999997f (the float below 1/2): a group {a, −a, 0…}
// sits on the 1e-7 step floor with q0 = 0, and −a asks R about 0.49999997.
float just_below_half_of_floor() {
  for (float a = 0.5e-7f; a > 0.4e-7f; a = std::nextafter(a, 0.0f)) {
    if (a / 1e-7f == std::nextafter(0.5f, 0.0f)) return a;
  }
  ADD_FAILURE() << "no float a with a / 1e-7f == 0.49999997f";
  return 0.0f;
}

// One row of D values, a different kind of group each time: random, constant, all
// negative, exact half-integer ties (group {0, n, k + ½}: scale −1, bias n), huge,
// tiny and denormal, the step floor's 0.49999997 and exact ½ cases, zeros, offset data,
// a NaN/±Inf group, and the extremes ±3e38 (alpha − beta overflows to Inf).
std::vector<float> special_row(testing::SeededRng& rng, std::int64_t d, int gs, int bits, std::int64_t row) {
  const float n = static_cast<float>((1 << bits) - 1), near_half = just_below_half_of_floor();
  std::vector<float> v(static_cast<std::size_t>(d));
  for (std::int64_t g = 0; g < d / gs; ++g) {
    float* p = v.data() + g * gs;
    for (int j = 0; j < gs; ++j) {
      const auto z = static_cast<float>(rng.normal());
      switch ((g + row) % 12) {
        case 0: p[j] = z; break;
        case 1: p[j] = -0.375f; break;
        case 2: p[j] = -std::abs(z) - 0.25f; break;
        case 3: p[j] = j == 0 ? 0.0f : j == 1 ? n : static_cast<float>(rng.integer(0, (1 << bits) - 2)) + 0.5f; break;
        case 4: p[j] = z * 1e30f; break;
        case 5: p[j] = j % 2 ? z * 1e-30f : z * 1e-40f; break;
        case 6: p[j] = j == 0 ? near_half : j == 1 ? -near_half : 0.0f; break;
        case 7: p[j] = j == 0 ? 0.5e-7f : j == 1 ? -0.5e-7f : 0.0f; break;
        case 8: p[j] = 0.0f; break;
        case 9: p[j] = 1000.0f + z; break;
        case 10:
          p[j] = j == 3 ? std::numeric_limits<float>::quiet_NaN()
                 : j == 5 ? (row % 2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity())
                          : z;
          break;
        default: p[j] = j == 0 ? 3e38f : j == 1 ? -3e38f : z;
      }
    }
  }
  return v;
}

void check_dtype(DType dtype) {
  KVLAB_SEEDED_RNG(rng, 20240701 + static_cast<std::uint64_t>(dtype));
  ReferenceBackend ref;
  // One call per shape covers every row kind (12 kinds over rows × groups); an odd lead
  // puts 16-bit outputs at odd element offsets (partial words at both ends).
  const std::vector<std::pair<Shape, std::size_t>> shapes = {{{2, 3, 384}, 1}, {{1, 128}, 0}};
  // One backend per path, and one on the default path with the fast paths disabled.
  const std::vector<testing::VulkanPath> paths = testing::vulkan_paths();
  std::vector<std::unique_ptr<VulkanBackend>> backends;
  for (std::size_t p = 0; p <= paths.size(); ++p) {
    VulkanOptions o;
    o.force_word_storage = p < paths.size() && paths[p].words;
    o.force_staging = p < paths.size() && paths[p].staging;
    o.exact_arithmetic_only = p == paths.size();
    std::string reason;
    backends.push_back(testing::try_vulkan(o, reason));
    if (!backends.back()) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  }
  int configs = 0;
  for (const int bits : {2, 3, 4, 5, 6, 8})
    for (const int gs : {32, 64, 128})
      for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu})
        for (const auto& [shape, lead] : shapes) {
          const QuantSpec spec = QuantSpec::make(QuantMode::affine, bits, gs);
          const std::int64_t d = shape.back(), rows = shape_numel(shape) / d;
          std::vector<float> values;
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::vector<float> row = special_row(rng, d, gs, bits, r + configs);
            values.insert(values.end(), row.begin(), row.end());
          }
          const Tensor x = Tensor::from_values(dtype, shape, values);
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << to_string(spec) << " "
                                            << rounding_name(rounding) << " " << shape_str(shape) << " lead " << lead);
          const Quantized want = quantize_on(ref, x, spec, rounding, 0);
          const Tensor want_deq = dequantize_on(ref, want, spec, dtype, 0);
          const Tensor want_deq32 = dequantize_on(ref, want, spec, DType::f32, 0);
          const DType other = dtype == DType::f16 ? DType::bf16 : DType::f16;  // scales' dtype != out's
          const Tensor want_deq_other = dequantize_on(ref, want, spec, other, 0);
          auto check = [&, lead = lead](VulkanBackend& be) {
            const Quantized got = quantize_on(be, x, spec, rounding, lead);
            EXPECT_TRUE(testing::bit_equal(got.wq, want.wq));
            EXPECT_TRUE(testing::bit_equal(got.scales, want.scales));
            EXPECT_TRUE(testing::bit_equal(got.biases, want.biases));
            EXPECT_TRUE(testing::bit_equal(dequantize_on(be, want, spec, dtype, lead), want_deq));
            EXPECT_TRUE(testing::bit_equal(dequantize_on(be, want, spec, DType::f32, lead), want_deq32));
            EXPECT_TRUE(testing::bit_equal(dequantize_on(be, want, spec, other, lead), want_deq_other));
          };
          ++configs;
          for (std::size_t b = 0; b < backends.size(); ++b) {
            // Staging changes only the transfers, not the shaders: a sample of specs will do.
            if (b < paths.size() && paths[b].staging && (gs != 64 || (bits != 3 && bits != 8))) continue;
            SCOPED_TRACE(b < paths.size() ? paths[b].name : "exact arithmetic only");
            check(*backends[b]);
          }
          if (::testing::Test::HasFailure()) return;  // one failing configuration is enough output
        }
  EXPECT_EQ(configs, 6 * 3 * 2 * 2);
}

TEST(VulkanAffine, F32MatchesTheOracleBitForBitOnEveryPath) { check_dtype(DType::f32); }
TEST(VulkanAffine, F16MatchesTheOracleBitForBitOnEveryPath) { check_dtype(DType::f16); }
TEST(VulkanAffine, Bf16MatchesTheOracleBitForBitOnEveryPath) { check_dtype(DType::bf16); }

TEST(VulkanAffine, StepFloorTiesGiveTheOracleCodes) {
  // Direct pins (f32, 2 bits, group 32) of cases the bulk test mixes in: 0.49999997 must
  // not round up (the trunc(x + 0.5) trap), and exact ½ ties follow each rounding mode.
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  ReferenceBackend ref;
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 2, 32);
  for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu}) {
    for (const float a : {just_below_half_of_floor(), 0.5e-7f}) {
      std::vector<float> v(32, 0.0f);
      v[0] = a;
      v[1] = -a;
      const Tensor x = Tensor::from_values(DType::f32, {1, 32}, v);
      const Quantized want = quantize_on(ref, x, spec, rounding, 0);
      const Quantized got = quantize_on(*be, x, spec, rounding, 3);
      EXPECT_TRUE(testing::bit_equal(got.wq, want.wq)) << rounding_name(rounding) << " a = " << a;
      EXPECT_TRUE(testing::bit_equal(got.scales, want.scales));
    }
  }
  // The 0.49999997 case has a known answer: code 0 for element 1 under both roundings.
  std::vector<float> v(32, 0.0f);
  v[0] = just_below_half_of_floor();
  v[1] = -v[0];
  const Quantized got = quantize_on(*be, Tensor::from_values(DType::f32, {1, 32}, v), spec, Rounding::mlx_gpu, 0);
  EXPECT_EQ((got.wq.to_ints()[0] >> 2) & 3, 0);
}

TEST(VulkanAffine, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  ReferenceBackend ref;
  using Call = std::function<void(Backend&)>;
  const QuantSpec q4 = QuantSpec::make(QuantMode::affine, 4, 32);
  auto quantize = [&](Backend& b, DType xd, Shape xs, Shape ws, DType sd, Shape ss, const QuantSpec& spec) {
    b.quantize({b.allocate(xd, xs), Rounding::mlx_cpu, {b.allocate(DType::u32, ws), b.allocate(sd, ss), b.allocate(sd, ss), spec}});
  };
  const std::vector<std::pair<const char*, Call>> bad = {
      {"mode", [&](Backend& b) { quantize(b, DType::f32, {2, 32}, {2, 4}, DType::f32, {2, 1}, QuantSpec::make(QuantMode::mxfp4)); }},
      {"integer x", [&](Backend& b) { quantize(b, DType::u32, {2, 32}, {2, 4}, DType::u32, {2, 1}, q4); }},
      {"D not a multiple", [&](Backend& b) { quantize(b, DType::f32, {2, 40}, {2, 5}, DType::f32, {2, 1}, q4); }},
      {"wq shape", [&](Backend& b) { quantize(b, DType::f32, {2, 32}, {2, 5}, DType::f32, {2, 1}, q4); }},
      {"scales dtype", [&](Backend& b) { quantize(b, DType::f32, {2, 32}, {2, 4}, DType::f16, {2, 1}, q4); }},
      {"rank 0", [&](Backend& b) { quantize(b, DType::f32, {}, {4}, DType::f32, {1}, q4); }},
      {"dequantize words vs groups", [&](Backend& b) {
         b.dequantize({{b.allocate(DType::u32, {2, 5}), b.allocate(DType::f32, {2, 1}), b.allocate(DType::f32, {2, 1}), q4}, b.allocate(DType::f32, {2, 32})});
       }},
      {"dequantize biases dtype", [&](Backend& b) {
         b.dequantize({{b.allocate(DType::u32, {2, 4}), b.allocate(DType::f32, {2, 1}), b.allocate(DType::f16, {2, 1}), q4}, b.allocate(DType::f32, {2, 32})});
       }},
      {"dequantize out shape", [&](Backend& b) {
         b.dequantize({{b.allocate(DType::u32, {2, 4}), b.allocate(DType::f32, {2, 1}), b.allocate(DType::f32, {2, 1}), q4}, b.allocate(DType::f32, {2, 33})});
       }},
      {"tensor overruns its buffer", [&](Backend& b) {
         const DTensor x{b.allocate(64), 8, DType::f32, {2, 32}};
         b.quantize({x, Rounding::mlx_cpu, {b.allocate(DType::u32, {2, 4}), b.allocate(DType::f32, {2, 1}), b.allocate(DType::f32, {2, 1}), q4}});
       }},
  };
  for (const auto& [what, call] : bad)
    testing::expect_same_error([&, &call = call] { call(ref); }, [&, &call = call] { call(*be); }, what);
}

}  // namespace
}  // namespace test_vulkan_affine_quantize
}  // namespace kvlab
