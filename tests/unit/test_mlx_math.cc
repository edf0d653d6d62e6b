// reference/mlx_math.h against libm in double: the oracle's copies of MLX's exp/sin/cos
// polynomials (the `mlx` flavours' RoPE angles) must stay approximations of the functions
// they stand for. Their bit-exactness with MLX itself is the conformance label's (the
// pinned wheel); this keeps a wrong coefficient from passing where no MLX is installed
// (a mutation survivor: the cosine polynomial's z^4 coefficient off by 10^10).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "reference/mlx_math.h"

namespace kvlab {
namespace test_mlx_math {
namespace {

// Error bounds. Cephes' single-precision polynomials are accurate to about 1 ulp of the
// result on their reduced interval; the three-part Cody–Waite reduction by π/4 leaves an
// absolute error in the reduced argument of about |x|·2^-47 (the third part's rounding),
// and the final f32 rounding adds half an ulp. So sin/cos are held to 2 ulp of 1 (2^-22)
// plus |x|·2^-40 absolute. exp scales by an exact 2^n, so its polynomial and roundings
// give a few ulp relative; but its exponent x·log2(e) is one f32 product with the f32
// constant 1.442695f: the constant's error (|c − log2 e| < 2^-25) and the product's
// rounding (|x·c|·2^-24) move the exponent by up to |x|·(2^-25 + 1.5·2^-24), hence the
// result by ln 2 times that, relative: about 20 ulp at |x| = 87, as in MLX.
double trig_bound(double x) { return 0x1p-22 + std::fabs(x) * 0x1p-40; }
double exp_rel_bound(double x) { return 4 * 0x1p-24 + std::log(2.0) * std::fabs(x) * (0x1p-25 + 1.5 * 0x1p-24); }

TEST(MlxMath, SinAndCosApproximateLibmAcrossTheRopeRange) {
  double worst_sin = 0, worst_cos = 0;
  // 0 to 2^16 rad (a 64K-token position at inverse frequency 1) on a grid that is not a
  // multiple of π/4, and both signs.
  for (std::int64_t i = -400000; i <= 400000; ++i) {
    const auto x = static_cast<float>(static_cast<double>(i) * 0.16384123);
    const double s = std::sin(static_cast<double>(x)), c = std::cos(static_cast<double>(x));
    const double ds = std::fabs(ref::mlx_sin(x) - s), dc = std::fabs(ref::mlx_cos(x) - c);
    worst_sin = std::max(worst_sin, ds / trig_bound(x));
    worst_cos = std::max(worst_cos, dc / trig_bound(x));
    ASSERT_LE(ds, trig_bound(x)) << "sin(" << x << ")";
    ASSERT_LE(dc, trig_bound(x)) << "cos(" << x << ")";
  }
  std::printf("worst sin %.3f, cos %.3f of the bound\n", worst_sin, worst_cos);
}

TEST(MlxMath, ExpApproximatesLibmOverItsRange) {
  double worst = 0;
  for (std::int64_t i = -880000; i <= 880000; ++i) {
    const auto x = static_cast<float>(static_cast<double>(i) * 1e-4);
    const double e = std::exp(static_cast<double>(x));
    // Below 2^-125 the product 2^n·p can be subnormal (and 2^n is built from the exponent
    // bits, as MLX builds it, so n = -127 gives 0): relative accuracy ends there.
    if (e < 0x1p-125) continue;
    const double rel = std::fabs(ref::mlx_exp(x) - e) / e;
    worst = std::max(worst, rel / exp_rel_bound(x));
    ASSERT_LE(rel, exp_rel_bound(x)) << "exp(" << x << ")";
  }
  std::printf("worst exp %.3f of the bound\n", worst);
  EXPECT_EQ(ref::mlx_exp(100.0f), INFINITY);
  EXPECT_EQ(ref::mlx_exp(-100.0f), 0.0f);
  EXPECT_TRUE(std::isnan(ref::mlx_exp(NAN)));
}

}  // namespace
}  // namespace test_mlx_math
}  // namespace kvlab
