// SIMD rope vs the oracle on every attainable target, within the derived bound of
// kernels/simd/rope.cc: |got − want| ≤ ulp_dtype(want) + 8·2^-24·2·max|x of the row|
// (the kernel's bound is 3·2^-24·(|x1| + |x2|) plus one storage rounding). Features past
// `dims` must be copied exactly, and invalid input raises the oracle's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
namespace {

Tensor run_rope(Backend& be, const Tensor& x, const RopeParams& p, const Offsets& off_host,
                const std::optional<Tensor>& per_row) {
  const DTensor dx = be.upload(x);
  const DTensor out = be.allocate(x.dtype(), x.shape());
  be.fill(out, 0x7FC00001u);
  Offsets off = off_host;
  if (per_row) off.per_row = be.upload(*per_row);
  be.rope(dx, p, off, out);
  return be.download(out);
}

::testing::AssertionResult within_bound(const Tensor& x, const Tensor& got, const Tensor& want, int dims) {
  const std::int64_t d = x.dim(-1);
  const ConstTensorView vx = x.view(), vg = got.view(), vw = want.view();
  const double eps = dtype_epsilon(x.dtype());
  const double floor = x.dtype() == DType::f16 ? 0x1p-24 : 0.0;  // f16 subnormal spacing
  for (std::int64_t r = 0; r < x.numel() / d; ++r) {
    double row_max = 0;
    for (std::int64_t i = 0; i < dims; ++i) row_max = std::max(row_max, std::abs(double{vx.load(r * d + i)}));
    for (std::int64_t i = 0; i < d; ++i) {
      const double g = vg.load(r * d + i), w = vw.load(r * d + i);
      const double bound = i < dims ? eps * std::abs(w) + 8 * 0x1p-24 * 2 * row_max + floor : 0.0;
      if (!(std::abs(g - w) <= bound)) {
        return ::testing::AssertionFailure() << "row " << r << " feature " << i << ": got " << g << ", want " << w
                                             << ", |diff| " << std::abs(g - w) << " > bound " << bound;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(SimdRope, MatchesTheOracleWithinTheDerivedBoundOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 9001);
  ReferenceBackend ref;
  SimdBackend simd;
  struct Case {
    Shape shape;
    int dims;
  };
  // D not a multiple of any vector width (18, 80), dims < D (copied tail), rank 3 and 5,
  // one token (decode) and several.
  const std::vector<Case> cases = {{{1, 1, 1, 128}, 128}, {{2, 3, 5, 64}, 64},  {{3, 2, 4, 80}, 80},
                                   {{2, 1, 3, 18}, 18},   {{1, 4, 2, 96}, 64},  {{2, 7, 256}, 256},
                                   {{2, 2, 1, 3, 40}, 34}, {{1, 1, 6, 130}, 2}};
  int checked = 0;
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
        if (c % 2) {
          std::vector<std::int64_t> o;
          for (std::int64_t b = 0; b < B; ++b) o.push_back(rng.integer(-5, 200000));
          per_row = Tensor::from_ints(DType::i32, {B}, o);
        } else {
          off.scalar = static_cast<std::int32_t>(rng.integer(0, 70000));
        }
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (traditional ? " traditional " : " ")
                                          << shape_str(k.shape) << " dims " << k.dims);
        const Tensor want = run_rope(ref, x, p, off, per_row);
        testing::for_each_simd_target([&](const std::string&) {
          EXPECT_TRUE(within_bound(x, run_rope(simd, x, p, off, per_row), want, k.dims));
        });
        ++checked;
      }
  EXPECT_EQ(checked, 3 * 2 * 8);
}

TEST(SimdRope, InvalidInputRaisesTheOraclesErrors) {
  ReferenceBackend ref;
  SimdBackend simd;
  using Call = std::function<void(Backend&)>;
  auto params = [](int dims, float base = 10000.0f) {
    RopeParams p;
    p.dims = dims;
    p.base = base;
    return p;
  };
  const std::vector<std::pair<const char*, Call>> bad = {
      {"rank 2", [&](Backend& be) { be.rope(be.allocate(DType::f32, {2, 8}), params(8), {}, be.allocate(DType::f32, {2, 8})); }},
      {"odd dims", [&](Backend& be) {
         be.rope(be.allocate(DType::f32, {1, 2, 8}), params(3), {}, be.allocate(DType::f32, {1, 2, 8}));
       }},
      {"dims > D", [&](Backend& be) {
         be.rope(be.allocate(DType::f32, {1, 2, 8}), params(10), {}, be.allocate(DType::f32, {1, 2, 8}));
       }},
      {"bad base", [&](Backend& be) {
         be.rope(be.allocate(DType::f32, {1, 2, 8}), params(8, -1.0f), {}, be.allocate(DType::f32, {1, 2, 8}));
       }},
      {"out dtype", [&](Backend& be) {
         be.rope(be.allocate(DType::f32, {1, 2, 8}), params(8), {}, be.allocate(DType::f16, {1, 2, 8}));
       }},
      {"in place", [&](Backend& be) {
         const DTensor t = be.allocate(DType::f32, {1, 2, 8});
         be.rope(t, params(8), {}, t);
       }},
      {"both offsets", [&](Backend& be) {
         Offsets o;
         o.scalar = 3;
         o.per_row = be.allocate(DType::i32, {1});
         be.rope(be.allocate(DType::f32, {1, 2, 8}), params(8), o, be.allocate(DType::f32, {1, 2, 8}));
       }},
      {"per-row shape", [&](Backend& be) {
         Offsets o;
         o.per_row = be.allocate(DType::i32, {2});
         be.rope(be.allocate(DType::f32, {1, 2, 8}), params(8), o, be.allocate(DType::f32, {1, 2, 8}));
       }},
  };
  for (const auto& [what, call] : bad) testing::expect_same_error([&] { call(ref); }, [&] { call(simd); }, what);
}

}  // namespace
}  // namespace kvlab
