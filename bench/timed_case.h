// One kernel benchmark's state, built once and reused by every timed run of it: the
// backend (a SIMD one pinned to its target), the problem's inputs uploaded once, output
// buffers, and the verdict of the one verification against the reference.
//
// Only one TimedCase lives at a time (benchmarks run one after the other, each with all
// its repetitions): a SIMD target pin is process-global, so the previous backend — and
// its pin — must be gone before the next one is made, and the largest perf problems
// (hundreds of MiB with the verification's copies) must not pile up. A Vulkan backend is
// the exception: it is kept for the next case of the same backend name, as `kvlab check`
// keeps one backend for a whole run, because a new one would compile every pipeline
// again (lavapipe JIT-compiles each: most of a smoke row's time).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/vulkan_bench.h"
#include "harness/op.h"
#include "harness/problem.h"
#include "kvlab/backend.h"

namespace kvlab::bench {

struct TimedCase {
  std::string key;  // the benchmark name
  harness::Problem problem;
  const harness::OpInfo* op = nullptr;
  // Shared: a Vulkan backend outlives its case for the next case of the same backend
  // name (timed_case.cc); a host backend is this case's alone.
  std::shared_ptr<Backend> backend;
  harness::Prepared prep;
  std::vector<std::string> output_names;
  harness::Bound in, out;
  std::string skip;     // not timed, and why (unsupported kernel, unattainable target)
  std::string failure;  // not timed because wrong: FAILED/INVALID verification, a throw
  // Timed although it differs from the oracle: a divergence the backend's register
  // (harness/known/<backend>) explains, e.g. real MLX's f16 RoPE; shown in the label.
  std::string known;
  // Vulkan backends (made with timestamps on): device time and device cache flush,
  // made by the benchmark on its first run; null for host backends.
  std::unique_ptr<DeviceClock> clock;

  // One kernel call on the uploaded buffers, then backend.finish(): what is timed.
  void invoke();
};

// The TimedCase for `key`: the live one when it matches, else a new one (the old one is
// released first). Building it records a failure or a skip in the suite's outcome.
TimedCase& acquire_timed_case(const std::string& key, const harness::Problem& problem, const std::string& backend);
void release_timed_case();  // also drops the kept Vulkan backend
// Oracle calls the verifications made so far (bench/memo_reference.h replays the rest).
int oracle_calls_computed();

void record_failure(const std::string& what);  // bench_suite.cc
void record_skip(const std::string& name, const std::string& reason);

}  // namespace kvlab::bench
