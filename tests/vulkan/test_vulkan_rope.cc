// Vulkan rope vs the oracle. The shader computes the oracle's angles bit for bit and
// everything after in double, rounding once to the dtype (shaders/rope.comp), so every
// output must be the oracle's or its neighbour in the dtype (at most 1 ulp apart), and
// nearly all must be identical; passthrough features are bit copies. Per-row offsets are
// read from a device buffer. Angles beyond the exact reduction (|θ| >= 8e8) are held to
// rope's tolerance (harness/ops/rope_info.cc). Invalid input raises the oracle's errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <optional>
#include <vector>

#include "kernels/vulkan/vulkan_backend.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
namespace {

Tensor run_rope(Backend& be, const Tensor& x, const RopeParams& p, const Offsets& off_host,
                const std::optional<Tensor>& per_row, std::size_t lead) {
  const DTensor dx = testing::place(be, x.dtype(), x.shape(), lead, x.data());
  const DTensor out = testing::place(be, x.dtype(), x.shape(), lead + 1, nullptr, 0xFF);
  Offsets off = off_host;
  if (per_row) off.per_row = testing::place(be, DType::i32, per_row->shape(), lead, per_row->data());
  be.rope({dx, p, off, out});
  EXPECT_TRUE(testing::guards_intact(be, out));
  return be.download(out);
}

// Position of a value in the dtype's total order of encodings (sign-magnitude → offset
// binary), so that |key(a) − key(b)| counts representable values between a and b.
std::int64_t order_key(const ConstTensorView& v, std::int64_t i) {
  if (v.dtype == DType::f32) {
    const auto u = std::bit_cast<std::uint32_t>(v.load(i));
    return (u & 0x80000000u) ? -static_cast<std::int64_t>(u & 0x7FFFFFFFu) : static_cast<std::int64_t>(u);
  }
  const std::uint16_t h = v.as<const std::uint16_t>()[i];
  return (h & 0x8000u) ? -static_cast<std::int64_t>(h & 0x7FFFu) : static_cast<std::int64_t>(h);
}

struct UlpReport {
  std::int64_t differing = 0, worst = 0, first_bad = -1;
};

UlpReport ulp_distance(const Tensor& got, const Tensor& want) {
  UlpReport r;
  const ConstTensorView g = got.view(), w = want.view();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const std::int64_t dist = std::abs(order_key(g, i) - order_key(w, i));
    if (dist != 0) ++r.differing;
    if (dist > r.worst) {
      r.worst = dist;
      if (dist > 1 && r.first_bad < 0) r.first_bad = i;
    }
  }
  return r;
}

TEST(VulkanRope, EveryOutputIsTheOraclesOrItsNeighbourOnEveryPath) {
  KVLAB_SEEDED_RNG(rng, 9101);
  ReferenceBackend ref;
  struct Case {
    Shape shape;
    int dims;
  };
  // Decode (T = 1) and prefill, partial rotary dims (copied tail), rank 3 and 5, D not a
  // multiple of anything (18, 130), one pair (dims 2).
  const std::vector<Case> cases = {{{1, 1, 1, 128}, 128}, {{2, 3, 5, 64}, 64},  {{3, 2, 4, 80}, 80},
                                   {{2, 1, 3, 18}, 18},   {{1, 4, 2, 96}, 64},  {{2, 7, 256}, 256},
                                   {{2, 2, 1, 3, 40}, 34}, {{1, 1, 6, 130}, 2}};
  std::int64_t elements = 0, differing = 0;
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (const bool traditional : {false, true})
        for (std::size_t c = 0; c < cases.size(); ++c) {
          const Case& k = cases[c];
          RopeParams p;
          p.dims = k.dims;
          p.traditional = traditional;
          p.base = c % 2 ? 500000.0f : 10000.0f;
          p.scale = c % 3 == 0 ? 0.25f : 1.0f;
          if (c == 5) {
            for (int i = 0; i < k.dims / 2; ++i) p.freqs.push_back(static_cast<float>(1.0 + 37.0 * i));
          }
          const Tensor x = testing::random_normal(rng, dtype, k.shape, 2.0);
          const std::int64_t B = k.shape[0];
          std::optional<Tensor> per_row;
          Offsets off;
          if (c % 2) {  // per-row offsets: negative (left padding) to beyond 1e5
            std::vector<std::int64_t> o;
            for (std::int64_t b = 0; b < B; ++b) o.push_back(rng.integer(-5, 200000));
            per_row = Tensor::from_ints(DType::i32, {B}, o);
          } else {
            off.scalar = static_cast<std::int32_t>(rng.integer(0, 70000));
          }
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (traditional ? " traditional " : " ")
                                            << shape_str(k.shape) << " dims " << k.dims);
          const Tensor want = run_rope(ref, x, p, off, per_row, 0);
          const Tensor got = run_rope(be, x, p, off, per_row, c % 3);
          const UlpReport r = ulp_distance(got, want);
          EXPECT_LE(r.worst, 1) << "first element more than 1 ulp off: " << r.first_bad;
          // The tail is copied: bit for bit.
          const std::int64_t d = k.shape.back(), rows = x.numel() / d;
          for (std::int64_t row = 0; row < rows; ++row)
            for (std::int64_t f = k.dims; f < d; ++f) {
              ASSERT_EQ(order_key(got.view(), row * d + f), order_key(x.view(), row * d + f)) << "tail " << row << "," << f;
            }
          elements += got.numel();
          differing += r.differing;
        }
  });
  std::cout << "[ rope     ] " << differing << " of " << elements << " outputs 1 ulp from the oracle, the rest identical\n";
  EXPECT_LT(differing * 1000, elements) << "more than 0.1% of the outputs differ from the oracle";
}

TEST(VulkanRope, HugeAnglesStayWithinRopesTolerance) {
  // Offsets near INT32_MAX and freqs far below 1: |θ| up to ~1e10, past the exact
  // reduction. rope_info.cc's budget per element: (|x1| + |x2|)·(|θ|·5u + 4u) + eps·|ref|.
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  KVLAB_SEEDED_RNG(rng, 9102);
  ReferenceBackend ref;
  RopeParams p;
  p.dims = 8;
  p.freqs = {1.0f, 0.5f, 0.1f, 1e-3f};
  const Tensor x = testing::random_normal(rng, DType::f32, {2, 1, 3, 8});
  const Tensor per_row = Tensor::from_ints(DType::i32, {2}, std::vector<std::int64_t>{2147483640, -2147483647});
  const Tensor want = run_rope(ref, x, p, {}, per_row, 0), got = run_rope(*be, x, p, {}, per_row, 0);
  const ConstTensorView vx = x.view(), vg = got.view(), vw = want.view();
  constexpr double u = 0x1p-24;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const std::int64_t f = i % 8, t = (i / 8) % 3, b = i / 24, pair = f % 4, partner = f < 4 ? f + 4 : f - 4;
    const double theta = std::abs(static_cast<double>(t + per_row.to_ints()[static_cast<std::size_t>(b)]) /
                                  static_cast<double>(p.freqs[static_cast<std::size_t>(pair)]));
    const double mag = std::abs(double{vx.load(i)}) + std::abs(double{vx.load(i - f + partner)});
    const double budget = mag * (theta * 5 * u + 4 * u) + 0x1p-23 * std::abs(double{vw.load(i)}) + 0x1p-149;
    ASSERT_TRUE(std::isfinite(vg.load(i))) << i;
    EXPECT_LE(std::abs(double{vg.load(i)} - double{vw.load(i)}), budget) << "element " << i << " theta " << theta;
  }
}

TEST(VulkanRope, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  ReferenceBackend ref;
  using Call = std::function<void(Backend&)>;
  auto params = [](int dims, float base = 10000.0f) {
    RopeParams p;
    p.dims = dims;
    p.base = base;
    return p;
  };
  const std::vector<std::pair<const char*, Call>> bad = {
      {"rank 2", [&](Backend& b) { b.rope({b.allocate(DType::f32, {2, 8}), params(8), {}, b.allocate(DType::f32, {2, 8})}); }},
      {"odd dims", [&](Backend& b) { b.rope({b.allocate(DType::f32, {1, 2, 8}), params(3), {}, b.allocate(DType::f32, {1, 2, 8})}); }},
      {"dims > D", [&](Backend& b) { b.rope({b.allocate(DType::f32, {1, 2, 8}), params(10), {}, b.allocate(DType::f32, {1, 2, 8})}); }},
      {"bad base", [&](Backend& b) {
         b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8, -1.0f), {}, b.allocate(DType::f32, {1, 2, 8})});
       }},
      {"integer x", [&](Backend& b) { b.rope({b.allocate(DType::u32, {1, 2, 8}), params(8), {}, b.allocate(DType::u32, {1, 2, 8})}); }},
      {"out dtype", [&](Backend& b) { b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8), {}, b.allocate(DType::f16, {1, 2, 8})}); }},
      {"in place", [&](Backend& b) {
         const DTensor t = b.allocate(DType::f32, {1, 2, 8});
         b.rope({t, params(8), {}, t});
       }},
      {"out overlaps x in one buffer", [&](Backend& b) {
         const BufferPtr buf = b.allocate(256);
         b.rope({DTensor{buf, 0, DType::f32, {1, 2, 8}}, params(8), {}, DTensor{buf, 32, DType::f32, {1, 2, 8}}});
       }},
      {"both offsets", [&](Backend& b) {
         Offsets o;
         o.scalar = 3;
         o.per_row = b.allocate(DType::i32, {1});
         b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8), o, b.allocate(DType::f32, {1, 2, 8})});
       }},
      {"per-row shape", [&](Backend& b) {
         Offsets o;
         o.per_row = b.allocate(DType::i32, {2});
         b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8), o, b.allocate(DType::f32, {1, 2, 8})});
       }},
      {"freqs count", [&](Backend& b) {
         RopeParams p = params(8);
         p.freqs = {1.0f, 2.0f};
         b.rope({b.allocate(DType::f32, {1, 2, 8}), p, {}, b.allocate(DType::f32, {1, 2, 8})});
       }},
  };
  for (const auto& [what, call] : bad) testing::expect_same_error([&] { call(ref); }, [&] { call(*be); }, what);
}

}  // namespace
}  // namespace kvlab
