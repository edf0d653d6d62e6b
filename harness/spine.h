// The spine every case goes through, whatever the op and backend:
//   create → fill (Prepared, counter-based RNG) → run the backend → run the reference
//   → compare with the op's numerics policy → optional bitwise rerun.
// Outputs sit between sentinel guard bands and start as NaN poison (or the op's initial
// content); inputs are checked unchanged afterwards. On failure, shrink() searches for
// the smallest problem that still fails, and its line runs verbatim in `kvlab repro`.
#pragma once

#include <string>
#include <vector>

#include "harness/compare.h"
#include "harness/op.h"
#include "harness/problem.h"
#include "kvlab/backend.h"

namespace kvlab::harness {

enum class Status : std::uint8_t { passed, skipped, unimplemented, invalid, failed };
std::string_view status_name(Status s);  // PASSED, SKIPPED, UNIMPLEMENTED, INVALID, FAILED

struct RunOptions {
  bool rerun = false;                         // run the backend twice, outputs must match bitwise
  std::int64_t max_elements = 1ll << 28;      // larger problems are SKIPPED (memory cap)
};

struct CaseResult {
  std::string line;      // canonical problem line
  std::string op;
  std::string backend;
  Status status = Status::passed;
  std::string reason;    // why it is not PASSED
  std::string output;    // the output the metrics describe (the worst one)
  Shape output_shape;
  Comparison cmp;        // metrics of that output
  std::string worst_coords;
  std::vector<std::string> notes;  // e.g. zero-trust warnings
  double seconds = 0;
  std::string shrunk_line;  // FAILED + shrinking: the smallest failing line
  int shrink_trials = 0;
};

CaseResult run_case(const Problem& problem, Backend& backend, Backend& reference, const RunOptions& options);

struct ShrinkResult {
  Problem smallest;
  CaseResult result;  // of `smallest`
  int trials = 0;
};
// Greedy descent over OpInfo::shrink_candidates: take the first candidate that still
// FAILS, repeat until none does or `max_trials` runs were spent.
ShrinkResult shrink(const Problem& failing, Backend& backend, Backend& reference, const RunOptions& options,
                    int max_trials = 300);

// Multi-line failure report: worst element coordinates, both values, budget, mismatch
// count, metrics and the repro line(s).
std::string describe(const CaseResult& r);

}  // namespace kvlab::harness
