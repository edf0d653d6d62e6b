// `kvlab check --vectors` and `kvlab vectors write` as library calls: judging an
// engine's recorded outputs with each op's own policy, and exporting kvlab's inputs and
// outputs for an engine to check itself against (harness/vectors.h has the format).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/spine.h"
#include "harness/vectors.h"

namespace kvlab::harness {

struct VectorsCheckOptions {
  std::vector<std::string> files;
  std::string judge = "reference";       // the backend whose outputs are the truth
  std::optional<std::size_t> problem;    // only this problem of each file
  std::string json_path, junit_path;
  RunOptions run;
  // Registers of known divergences (harness/known_divergences.h), matched against each
  // file's engine name; stale entries fail the run when every problem of the files ran.
  std::vector<std::string> known_files;
};

// Opens (and so validates) every file first, then judges each problem, printing one line
// per output with its distances (max|err|/|ref|inf, NMSE, max ulps), the describe()
// report of every FAILED or INVALID problem with a repro line that runs verbatim, and a
// summary per file. Throws Error for an unreadable or malformed file or a bad option.
CheckSummary run_vectors_check(const VectorsCheckOptions& options, std::ostream& out);

// Runs the cases `selection` picks (as kvlab check would) on selection.backend alone and
// writes their inputs and outputs to `path`. Problems that do not pass for the run's caps
// (SKIPPED, INVALID, UNIMPLEMENTED, FAILED) are left out and counted; so are cache cases
// in a tier (op cache has no vectors form; naming it with --op is an Error). Throws Error
// when nothing is left to write or the vectors would exceed kMaxVectorsWriteBytes.
void run_vectors_write(const CheckOptions& selection, const std::string& path, std::ostream& out);

// How the CLI names a file's engine: "<engine> <engine_version> [<flavour>]".
std::string engine_label(const VectorsInfo& info);

}  // namespace kvlab::harness
