// The spine every case goes through, whatever the op and backend:
//   create → fill (Prepared, counter-based RNG) → run the backend → run the reference
//   → compare with the op's numerics policy → optional bitwise rerun.
// Outputs sit between sentinel guard bands and start as NaN poison (or the op's initial
// content); inputs are checked unchanged afterwards. On failure, shrink() searches for
// the smallest problem that still fails, and its line runs verbatim in `kvlab repro`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "harness/compare.h"
#include "harness/op.h"
#include "harness/problem.h"
#include "kvlab/backend.h"

namespace kvlab::harness {

enum class Status : std::uint8_t { passed, skipped, unimplemented, invalid, failed };
std::string_view status_name(Status s);  // PASSED, SKIPPED, UNIMPLEMENTED, INVALID, FAILED

// Half the machine's physical memory (or 4 GiB when it cannot be read): the default
// memory cap of a run.
std::uint64_t default_max_bytes();

// A run holds several copies of a problem's tensors at once: the host inputs, the images
// placed on the backend and on the reference (host copy + device buffer each), the
// outputs read back, and the per-element budget (8 bytes per output element). Eight
// times the footprint bounds that.
inline constexpr std::uint64_t kRunCopies = 8;
inline constexpr std::uint64_t kDefaultMaxWork = 1'000'000'000'000;

struct RunOptions {
  bool rerun = false;  // run the backend twice, outputs must match bitwise
  // A problem whose footprint (OpInfo::footprint) times kRunCopies exceeds this is
  // SKIPPED before anything is allocated.
  std::uint64_t max_bytes = default_max_bytes();
  // A problem whose work (OpInfo::work) exceeds this is SKIPPED likewise. The default,
  // 10^12, is hours of the reference's time and above every shape of the full tier.
  std::uint64_t max_work = kDefaultMaxWork;
};

// The comparison of one output slot (every slot of a case, in Prepared order).
struct OutputComparison {
  std::string name;
  bool bit_exact = true;
  Comparison cmp;
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
  std::vector<OutputComparison> outputs;  // every output compared (empty when none was)
  // The command that reruns this case when it is not `kvlab repro --backend B 'line'`
  // (a problem of a vectors file); describe() prints it instead.
  std::string repro;
};

// Never throws: an exception escaping the op, a backend or the comparison (std::bad_alloc
// included) makes the case INVALID with the reason.
CaseResult run_case(const Problem& problem, Backend& backend, Backend& reference, const RunOptions& options);
// run_case for several backends at once: the inputs are prepared and the reference run
// once, then each backend runs and is judged on them (kvlab check with several
// --backend: the oracle's work is shared). One result per backend, in order; each the
// same as run_case's (its seconds include the shared part). Never throws.
std::vector<CaseResult> run_case_on_each(const Problem& problem, std::span<Backend* const> backends,
                                         Backend& reference, const RunOptions& options);

// What an engine recorded for a problem (a vectors file, harness/vectors.h): the inputs
// it ran on and the outputs it produced, both in Prepared order.
struct Recorded {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
};

// Judges recorded outputs: prepare() as run_case does, the recorded inputs in place of
// the generated ones (same names, dtypes and shapes, else INVALID), the judge run on them
// with guard bands, and the recorded outputs compared with the judge's under the op's
// policy, as a backend's would be. `engine` names the side under test in the result.
// A judge that rejects the problem makes it INVALID (UNIMPLEMENTED when it lacks the
// kernel: Error unsupported). Never throws, like run_case.
CaseResult run_recorded_case(const Problem& problem, Recorded recorded, const std::string& engine, Backend& judge,
                             const RunOptions& options);

// One backend's run alone, for exporting vectors: PASSED with the prepared inputs and the
// outputs read back, or the status and reason why not (SKIPPED over a cap, INVALID or
// UNIMPLEMENTED when rejected, FAILED when it wrote outside an output). Never throws.
struct Produced {
  CaseResult result;
  Prepared prep;
  std::vector<Tensor> outputs;
};
Produced produce_case(const Problem& problem, Backend& backend, const RunOptions& options);

struct ShrinkResult {
  Problem smallest;
  CaseResult result;  // of `smallest`
  int trials = 0;
};
// Greedy descent over OpInfo::shrink_candidates: take the first candidate that still
// FAILS, repeat until none does or `max_trials` runs were spent. Never throws (a
// candidate that cannot be formed ends the descent where it is).
ShrinkResult shrink(const Problem& failing, Backend& backend, Backend& reference, const RunOptions& options,
                    int max_trials = 300);

// Multi-line failure report: worst element coordinates, both values, budget, mismatch
// count, metrics and the repro line(s).
std::string describe(const CaseResult& r);

}  // namespace kvlab::harness
