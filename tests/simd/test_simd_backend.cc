// SimdBackend basics: target enumeration and forcing, name(), explicit UNIMPLEMENTED.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/simd/simd_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
namespace {

TEST(SimdBackend, ListsTargetsBestFirstAndScalarIsAlwaysAttainable) {
  const std::vector<SimdTarget> all = simd_compiled_targets();
  ASSERT_FALSE(all.empty());
  for (const SimdTarget& t : all) {
    std::cout << "[ target   ] " << t.name << (t.attainable ? " attainable" : " skipped: " + t.reason) << "\n";
  }
  const std::vector<std::string> names = simd_targets();
  EXPECT_NE(std::find(names.begin(), names.end(), "SCALAR"), names.end());
  // Unforced dispatch picks the best attainable target.
  EXPECT_EQ(simd_current_target(), names.front());
  EXPECT_EQ(SimdBackend().name(), "simd:" + names.front());
}

TEST(SimdBackend, ForcingEachTargetRedirectsDispatchAndRestores) {
  const std::string best = simd_current_target();
  const int ran = testing::for_each_simd_target([](const std::string&) {});
  EXPECT_EQ(ran, static_cast<int>(simd_targets().size()));
  EXPECT_EQ(simd_current_target(), best);
  {  // nesting restores the outer force
    ScopedSimdTarget outer("SCALAR");
    {
      ScopedSimdTarget inner(simd_targets().front());
      EXPECT_EQ(simd_current_target(), simd_targets().front());
    }
    EXPECT_EQ(simd_current_target(), "SCALAR");
  }
  EXPECT_EQ(simd_current_target(), best);
}

TEST(SimdBackend, ForcingAnUnknownTargetIsUnsupported) {
  testing::expect_error([] { ScopedSimdTarget t("NEON_SVE9"); }, ErrorKind::unsupported, {"NEON_SVE9"});
  EXPECT_EQ(simd_current_target(), simd_targets().front());
}

}  // namespace
}  // namespace kvlab
