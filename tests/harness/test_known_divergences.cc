// The register of known divergences (harness/known_divergences.h) over the "wrong"
// backend of test_wrong_kernel.cc (its sdpa corrupts the last output element when Lk > 17):
// a listed failure is SKIPPED with the entry's reason, an unlisted one still fails, an
// entry that no longer reproduces fails the run, and a malformed entry names its line.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/known_divergences.h"
#include "harness/forwarding_backend.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"

namespace kvlab::harness {
namespace {

class CorruptSdpa final : public ForwardingBackend {
 public:
  std::string name() const override { return "corrupt_sdpa"; }
  void sdpa(const SdpaArgs& a) override {
    ref_.sdpa(a);
    if (a.k.shape[2] > 17) {
      const TensorView o = host_view(a.out);
      o.store(o.numel() - 1, o.load(o.numel() - 1) + 1e-2f);
    }
  }
};

class KnownDivergencesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    register_backend({"corrupt_sdpa", "test wrapper", "reference whose sdpa is wrong past Lk 17",
                      [](std::string_view) -> std::unique_ptr<Backend> { return std::make_unique<CorruptSdpa>(); }});
    dir_ = std::filesystem::temp_directory_path() / ("kvlab_known_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    // A one-op case tree: staleness is judged over a whole tier, not over --cases files.
    std::filesystem::create_directories(dir_ / "tree" / "sdpa");
    cases_ = write("tree/sdpa/smoke", "sdpa B=1 Hq=2 Hkv=1 Lq=2 Lk=8,32 Dk=16 Dv=16 dtype=f32 mask=none seed=1\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  CheckSummary check(const std::string& known) {
    CheckOptions o;
    o.backend = "corrupt_sdpa";
    o.cases_dir = dir_ / "tree";
    o.tier = "smoke";
    o.shrink = false;
    if (!known.empty()) o.known_files = {write("known", known)};
    out_.str("");
    return run_check(o, out_);
  }
  std::filesystem::path dir_;
  std::string cases_;
  std::ostringstream out_;
};

TEST_F(KnownDivergencesTest, AnUnlistedDivergenceFails) {
  const CheckSummary s = check("");
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.results[1].status, Status::failed);
}

TEST_F(KnownDivergencesTest, AListedDivergenceIsSkippedWithItsReason) {
  const CheckSummary s = check("corrupt_sdpa | sdpa Lk=32 | upstream-bug | corrupts the last element\n");
  EXPECT_TRUE(s.ok) << out_.str();
  EXPECT_EQ(s.results[0].status, Status::passed);
  ASSERT_EQ(s.results[1].status, Status::skipped);
  EXPECT_NE(s.results[1].reason.find("known divergence (upstream-bug"), std::string::npos) << s.results[1].reason;
  EXPECT_NE(out_.str().find("1 failing cases explained by 1 of 1 entries"), std::string::npos) << out_.str();
}

TEST_F(KnownDivergencesTest, ARegexFilterMatchesWithinAValue) {
  // Lk=32 holds a '3'; Lk=8 none: the entry covers exactly the failing case.
  const CheckSummary s = check("corrupt_sdpa | sdpa Lk~=^3 | upstream-bug | corrupts the last element\n");
  EXPECT_TRUE(s.ok) << out_.str();
  EXPECT_EQ(s.results[1].status, Status::skipped);
  const CheckSummary t = check("corrupt_sdpa | sdpa Lk~=^8$ | upstream-bug | never fails\n");
  EXPECT_FALSE(t.ok);  // Lk=32 unlisted, and the entry is stale
}

TEST_F(KnownDivergencesTest, AnEntryThatNoLongerReproducesFailsTheRun) {
  const CheckSummary s = check("corrupt_sdpa | sdpa Lk=8 | upstream-bug | was wrong once\n");
  EXPECT_FALSE(s.ok);  // Lk=8 passes (stale entry) and Lk=32 fails unlisted
  const CheckSummary t = check("corrupt_sdpa | sdpa Lk=32 | upstream-bug | x\ncorrupt_sdpa | sdpa Lk=8 | representation | y\n");
  EXPECT_FALSE(t.ok);
  EXPECT_NE(out_.str().find("STALE"), std::string::npos) << out_.str();
}

TEST_F(KnownDivergencesTest, APartialSelectionDoesNotJudgeStaleness) {
  CheckOptions o;
  o.backend = "corrupt_sdpa";
  o.case_files = {cases_};
  o.shrink = false;
  o.known_files = {write("known", "corrupt_sdpa | sdpa Lk=32 | upstream-bug | x\ncorrupt_sdpa | sdpa Lk=8 | representation | y\n")};
  std::ostringstream out;
  EXPECT_TRUE(run_check(o, out).ok) << out.str();
  EXPECT_NE(out.str().find("not judged on a partial selection"), std::string::npos) << out.str();
}

TEST_F(KnownDivergencesTest, MalformedEntriesNameTheirLine) {
  for (const char* bad : {"mlx | sdpa Lk=32 | upstream-bug\n", "mlx | sdpa Lk=32 | typo | note\n",
                          "mlx | sdpa nokey=1 | representation | note\n", "mlx | noop | representation | note\n",
                          "mlx | sdpa Lk | representation | note\n", "mlx | sdpa | representation | \n",
                          "mlx | sdpa Lk~=(3 | representation | note\n"}) {
    try {
      KnownDivergences k({write("bad", bad)});
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad:1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kvlab::harness
