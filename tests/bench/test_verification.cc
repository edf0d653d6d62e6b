// The verify-before-timing step: a wrong kernel is never timed (its benchmark reports
// FAILED and the run exits non-zero), an unimplemented one is a skip, a right one times.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bench/bench_suite.h"
#include "bench/timed_case.h"
#include "harness/backends.h"
#include "harness/check.h"
#include "harness/forwarding_backend.h"
#include "kvlab/error.h"

namespace kvlab::bench {
namespace {

// rope off by 1e-2 in the last element of the output: far outside rope's budget.
class WrongRope final : public harness::ForwardingBackend {
 public:
  std::string name() const override { return "wrong_rope"; }
  void rope(const RopeArgs& a) override {
    ref_.rope(a);
    const TensorView v = host_view(a.out);
    v.store(v.numel() - 1, v.load(v.numel() - 1) + 1e-2f);
  }
};

// A right rope of the backend's own (here the oracle's arithmetic, called as a kernel of
// this backend: a ForwardingBackend's forwarded ops are delegated, and a delegated op is
// never verified as the backend's, kvlab/backend.h).
class RightRope final : public harness::ForwardingBackend {
 public:
  std::string name() const override { return "right_rope"; }
  void rope(const RopeArgs& a) override { ref_.rope(a); }
};

// rope not written yet, like the SIMD kernels other helpers are still writing.
class UnsupportedRope final : public harness::ForwardingBackend {
 public:
  std::string name() const override { return "unsupported_rope"; }
  void rope(const RopeArgs&) override {
    fail(ErrorKind::unsupported, "unsupported_rope: rope is not implemented");
  }
};

void register_test_backends() {
  harness::register_backend({"wrong_rope", "test", "rope off by 1e-2",
                             [](std::string_view) -> std::unique_ptr<Backend> { return std::make_unique<WrongRope>(); }});
  harness::register_backend({"unsupported_rope", "test", "rope throws unsupported", [](std::string_view) -> std::unique_ptr<Backend> {
                               return std::make_unique<UnsupportedRope>();
                             }});
  harness::register_backend({"right_rope", "test", "a right rope", [](std::string_view) -> std::unique_ptr<Backend> {
                               return std::make_unique<RightRope>();
                             }});
  harness::register_backend({"forwarding", "test", "the reference behind a wrapper (every op delegated)",
                             [](std::string_view) -> std::unique_ptr<Backend> {
                               return std::make_unique<harness::ForwardingBackend>();
                             }});
}

const harness::Problem kRope = harness::parse_problem("rope B=1 H=2 T=3 D=64 dims=64 dtype=f32");

TEST(Verification, AWrongKernelIsAFailureNamingTheOutputAndTheRepro) {
  register_test_backends();
  const TimedCase& tc = acquire_timed_case("rope/wrong_rope/x", kRope, "wrong_rope");
  EXPECT_TRUE(tc.skip.empty());
  EXPECT_NE(tc.failure.find("FAILED"), std::string::npos) << tc.failure;
  EXPECT_NE(tc.failure.find("out"), std::string::npos) << tc.failure;
  EXPECT_NE(tc.failure.find("kvlab repro --backend wrong_rope"), std::string::npos) << tc.failure;
  EXPECT_EQ(tc.backend, nullptr);  // never timed: the backend is gone
  release_timed_case();
}

TEST(Verification, AnUnsupportedKernelIsASkipWithTheReason) {
  register_test_backends();
  const TimedCase& tc = acquire_timed_case("rope/unsupported_rope/x", kRope, "unsupported_rope");
  EXPECT_TRUE(tc.failure.empty()) << tc.failure;
  EXPECT_NE(tc.skip.find("rope is not implemented"), std::string::npos) << tc.skip;
  release_timed_case();
}

TEST(Verification, ARightKernelIsTimedOnItsUploadedBuffers) {
  register_test_backends();
  TimedCase& tc = acquire_timed_case("rope/right_rope/x", kRope, "right_rope");
  EXPECT_TRUE(tc.failure.empty()) << tc.failure;
  EXPECT_TRUE(tc.skip.empty()) << tc.skip;
  ASSERT_NE(tc.backend, nullptr);
  // The same key returns the same live case: no second upload or verification.
  EXPECT_EQ(&acquire_timed_case("rope/right_rope/x", kRope, "right_rope"), &tc);
  tc.invoke();
  const Tensor out = tc.backend->download(tc.out.tensors[0]);
  EXPECT_FALSE(std::isnan(out.view().load(0)));  // the poison was overwritten
  release_timed_case();
}

TEST(Verification, TheOracleRunsOncePerProblemAndItsReplayStillCatchesAWrongKernel) {
  register_test_backends();
  const harness::Problem p = harness::parse_problem("rope B=2 H=2 T=5 D=32 dims=32 dtype=bf16 offset=9");
  const int before = oracle_calls_computed();
  EXPECT_TRUE(acquire_timed_case("a", p, "right_rope").failure.empty());
  EXPECT_TRUE(acquire_timed_case("b", p, "right_rope").failure.empty());
  // The third verification compares against the replayed oracle output, and fails.
  EXPECT_NE(acquire_timed_case("c", p, "wrong_rope").failure.find("FAILED"), std::string::npos);
  EXPECT_EQ(oracle_calls_computed() - before, 1);
  // Another problem computes again.
  EXPECT_TRUE(acquire_timed_case("d", kRope, "right_rope").failure.empty());
  EXPECT_EQ(oracle_calls_computed() - before, 2);
  release_timed_case();
}

// A backend that hands the op to the oracle is never timed as if the oracle were its
// kernel: the row is skipped, naming the delegation.
TEST(Verification, ADelegatedOpIsASkipNotATimedRow) {
  register_test_backends();
  const TimedCase& tc = acquire_timed_case("rope/forwarding/x", kRope, "forwarding");
  EXPECT_TRUE(tc.failure.empty()) << tc.failure;
  EXPECT_NE(tc.skip.find("delegated to the reference"), std::string::npos) << tc.skip;
  release_timed_case();
}

TEST(Verification, TheSuiteExitsNonZeroWhenAVerificationFails) {
  register_test_backends();
  std::vector<std::string> args{"kvlab_bench", "--kvlab_tier=smoke", "--kvlab_ops=rope",
                                "--kvlab_backends=right_rope,wrong_rope,unsupported_rope"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::size_t failures = suite_outcome().failures.size(), skips = suite_outcome().skipped.size();
  EXPECT_EQ(run_suite_main(static_cast<int>(args.size()), argv.data()), 1);
  // Every rope line of the smoke file fails on wrong_rope and is skipped on
  // unsupported_rope; right_rope passes them all.
  const std::size_t lines = harness::load_case_file(harness::default_cases_dir() / "rope" / "smoke").size();
  ASSERT_GT(lines, 0u);
  EXPECT_EQ(suite_outcome().failures.size() - failures, lines);
  EXPECT_EQ(suite_outcome().skipped.size() - skips, lines);
}

}  // namespace
}  // namespace kvlab::bench
