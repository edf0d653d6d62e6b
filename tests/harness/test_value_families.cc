// The value families (harness/value_families.h) each aim at one branch of a quantizer,
// so each must draw what its line there says; the cases only ever run the quantizers
// on them, which accept any values, so a family drawing the wrong law passed.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "harness/op.h"
#include "harness/ops/ops.h"
#include "harness/problem.h"
#include "harness/value_families.h"

namespace kvlab::harness {
namespace {

Tensor fill(std::string_view family, DType dtype = DType::f32) {
  const Problem p = parse_problem("affine_quantize B=1 H=1 T=16 D=64 seed=5");
  return value_family_fill(p, "x", dtype, {1, 1, 16, 64}, family);
}

// grid: k/4 for k in [-16, 16]; 1024 draws of 33 values reach both ends and the
// quarter steps between integers.
TEST(ValueFamilies, GridDrawsQuartersFromMinusFourToFour) {
  const Tensor x = fill("grid");
  std::set<int> quarters;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double q = 4.0 * static_cast<double>(x.view().load(i));
    ASSERT_EQ(q, std::round(q)) << "element " << i << " is not a multiple of 1/4";
    ASSERT_LE(std::abs(q), 16.0) << "element " << i;
    quarters.insert(static_cast<int>(q));
  }
  EXPECT_TRUE(quarters.count(-16) && quarters.count(16)) << "the grid's ends -4 and 4 are never drawn";
  EXPECT_TRUE(quarters.count(1) || quarters.count(-1) || quarters.count(3) || quarters.count(-3))
      << "no odd quarter (0.25, 0.75, ...) drawn";
}

TEST(ValueFamilies, SignedAndConstantFamiliesKeepTheirSign) {
  const Tensor neg = fill("negative"), pos = fill("positive"), c = fill("constant", DType::f16);
  for (std::int64_t i = 0; i < neg.numel(); ++i) {
    ASSERT_LE(neg.view().load(i), 0.0f) << i;
    ASSERT_GE(pos.view().load(i), 0.1f) << i;
    ASSERT_EQ(c.view().load(i), c.view().load(0)) << i;
  }
  EXPECT_NEAR(c.view().load(0), 0.3f, 1e-3f);  // 0.3 rounded once to f16
}

// sdpa's special=... (harness/ops/sdpa_info.cc, top comment) is what tests a backend's
// inf/NaN handling; a special that stopped injecting its value would leave a finite case
// that passes under its name. Per special: how many +inf, -inf and NaN each of q, k, v holds.
TEST(SpecialValues, EachSdpaSpecialPutsItsNonFiniteValuesAndNoOthers) {
  struct Count {
    int pos_inf = 0, neg_inf = 0, nan = 0;
    bool operator==(const Count&) const = default;
  };
  struct Expected {
    const char* special;
    Count q, k, v;
  };
  const Expected table[] = {
      {"none", {}, {}, {}},
      {"v_inf", {}, {}, {1, 1, 0}},
      {"k_inf", {}, {1, 0, 0}, {}},
      {"k_ninf", {}, {0, 1, 0}, {}},
      {"q_nan", {0, 0, 1}, {}, {}},
      {"k_nan", {}, {0, 0, 1}, {}},
      {"uniform", {}, {}, {}},
  };
  const auto count = [](const Tensor& t) {
    Count c;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float x = t.view().load(i);
      c.pos_inf += x == INFINITY;
      c.neg_inf += x == -INFINITY;
      c.nan += std::isnan(x);
    }
    return c;
  };
  for (const Expected& e : table) {
    const Problem p = parse_problem(std::string("sdpa B=1 Hq=4 Hkv=2 Lq=3 Lk=12 Dk=8 Dv=8 dtype=f16 special=") + e.special);
    const Prepared prep = find_op("sdpa").prepare(p);
    EXPECT_TRUE(count(prep.input("q")) == e.q) << e.special << ": q";
    EXPECT_TRUE(count(prep.input("k")) == e.k) << e.special << ": k";
    EXPECT_TRUE(count(prep.input("v")) == e.v) << e.special << ": v";
  }
  // uniform: q = 0, so every visible key weighs the same.
  const Tensor q = find_op("sdpa").prepare(parse_problem("sdpa Lq=3 Lk=12 special=uniform")).input("q");
  for (std::int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q.view().load(i), 0.0f) << i;
}

}  // namespace
}  // namespace kvlab::harness
