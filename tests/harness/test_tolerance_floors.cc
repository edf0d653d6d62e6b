// Tolerance floors the ci tier never reaches: kvlab's own kernels match the oracle far
// inside their budgets, so a budget that lost a term passes every check. These tests
// read the budgets themselves where their derivation fixes the value (mutation-testing
// survivors, tools/mutate/survivors.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/ops/ops.h"
#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::harness::ops {
// Defined in harness/ops/rope_info.cc (the flavour=mlx budget), not in a header: the
// harness reaches it through the rope op only.
std::vector<double> rope_budget_mlx(const Tensor& x_in, const RopeParams& rp, const Tensor& ref);
}  // namespace kvlab::harness::ops

namespace kvlab::harness {
namespace {

// rope flavour=mlx: eps_T·(|x1| + |x2| + |ref|) plus T's subnormal spacing. Where the
// rotated pair and the result are zero only the spacing is left: the smallest positive
// subnormal of T, 2^-24 (f16: 10 fraction bits, minimum exponent -14), 2^-133 (bf16: 7
// fraction bits, minimum exponent -126) and 2^-149 (f32: 23 and -126).
TEST(ToleranceFloors, RopeMlxFlavourKeepsTheSubnormalSpacingOfT) {
  const struct {
    DType dtype;
    double spacing;
  } cases[] = {{DType::f16, std::ldexp(1.0, -24)}, {DType::bf16, std::ldexp(1.0, -133)}, {DType::f32, std::ldexp(1.0, -149)}};
  RopeParams rp;
  rp.dims = 4;
  rp.mlx_arithmetic = true;
  for (const auto& c : cases) {
    const Tensor zeros(c.dtype, {1, 1, 2, 4});
    const std::vector<double> budget = ops::rope_budget_mlx(zeros, rp, zeros);
    ASSERT_EQ(budget.size(), 8u);
    for (const double b : budget) EXPECT_EQ(b, c.spacing) << dtype_name(c.dtype);
  }
}

}  // namespace
}  // namespace kvlab::harness
