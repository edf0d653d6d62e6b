// SimdBackend basics: target enumeration and forcing, name(), explicit UNIMPLEMENTED.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/simd/simd_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_backend {
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

// Two backends pinned to different targets, alive at once (kvlab check with several
// --backend): each call runs its own target, whichever was made last, and dispatch is
// left as it was between calls. Pinning for the backend's lifetime ran both on the last
// one (the simd:AVX2 lane of a multi-backend check reported SCALAR's results).
TEST(SimdBackend, PinnedBackendsSideBySideEachRunTheirOwnTarget) {
  const std::vector<std::string> names = simd_targets();
  if (names.size() < 2) GTEST_SKIP() << "one attainable target only (" << names.front() << ")";
  const SimdBackend best(names.front());
  const SimdBackend scalar("SCALAR");
  EXPECT_EQ(best.name(), "simd:" + names.front());
  EXPECT_EQ(scalar.name(), "simd:SCALAR");
  EXPECT_EQ(best.name(), "simd:" + names.front());
  EXPECT_EQ(simd_current_target(), names.front());  // nothing stays forced between calls
  {
    ScopedSimdTarget outer("SCALAR");
    EXPECT_EQ(best.name(), "simd:" + names.front());  // the pin wins inside a force
    EXPECT_EQ(simd_current_target(), "SCALAR");         // and the force is back after the call
  }
}

// A name that is no compiled target is a usage error (a typo, the wrong case: `kvlab
// check --backend simd:avx2` exits 2); a compiled target the CPU lacks is unsupported.
TEST(SimdBackend, ForcingAnUnknownTargetIsAnInvalidArgument) {
  testing::expect_error([] { ScopedSimdTarget t("NEON_SVE9"); }, ErrorKind::invalid_argument,
                        {"unknown SIMD target 'NEON_SVE9'", "SCALAR"});
  testing::expect_error([] { ScopedSimdTarget t("avx2"); }, ErrorKind::invalid_argument, {"'avx2'"});
  EXPECT_EQ(simd_current_target(), simd_targets().front());
}

TEST(SimdBackend, ForcingACompiledButUnattainableTargetIsUnsupported) {
  for (const SimdTarget& t : simd_compiled_targets()) {
    if (t.attainable) continue;
    testing::expect_error([&] { ScopedSimdTarget s(t.name); }, ErrorKind::unsupported, {"not attainable"});
    return;
  }
  GTEST_SKIP() << "every compiled target is attainable on this CPU";
}

}  // namespace
}  // namespace test_simd_backend
}  // namespace kvlab
