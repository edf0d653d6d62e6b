// The reference for the verification step, computed once per problem instead of once per
// verified backend.
//
// Every SIMD target is verified against the oracle on the same perf problem, and at perf
// shapes the oracle is what costs (sdpa with Lq=512, Lk=4096 is ~34 Gflop in double, far
// more than any verified kernel). harness::run_case places identical inputs for a problem each time
// (the fill is keyed by the problem line) and makes the same reference calls (no rerun),
// so the oracle's outputs of the n-th call after expect(line) can be replayed byte for
// byte for the next backend verified on that line. Only the latest problem is kept:
// benchmarks of one problem run back to back.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kvlab/host_buffer.h"
#include "reference/reference_backend.h"

namespace kvlab::bench {

class MemoReference final : public HostMemoryBackend {
 public:
  std::string name() const override { return "reference"; }
  // The problem line the next kernel call belongs to.
  void expect(const std::string& problem_line) {
    pending_ = problem_line;
    call_ = 0;
  }
  int computed() const { return computed_; }  // oracle calls made (the rest were replays)

  KVLAB_OVERRIDE_ALL_OPS

 private:
  // Replays the outputs cached for the pending problem, or runs `compute` and caches
  // them. An oracle that throws caches nothing (the next call throws again).
  template <class Compute>
  void memo(const std::vector<const DTensor*>& outputs, Compute&& compute);

  ReferenceBackend oracle_;
  std::string pending_, cached_key_;
  std::size_t call_ = 0;                                 // calls since expect()
  std::vector<std::vector<std::vector<std::byte>>> cached_;  // [call][output] bytes
  int computed_ = 0;
};

}  // namespace kvlab::bench
