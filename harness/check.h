// `kvlab check` and `kvlab repro` as library calls (the CLI parses flags into these;
// the harness tests call them directly).
//
// Tiers select case files by role: smoke = {smoke}; ci = {smoke, ci, shapes_edges,
// shapes_llama_decode}; full = ci + {perf}. Cases are deduplicated by canonical line,
// ordered by op then file then line, and sharded as case k → shard k mod n.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "harness/problem.h"
#include "harness/spine.h"

namespace kvlab::harness {

std::filesystem::path default_cases_dir();  // the source tree's harness/cases
std::vector<std::string> tier_roles(std::string_view tier);  // throws for an unknown tier
// The case files of one op directory in a tier (the lavapipe tier: its `lavapipe` file
// in place of the ci roles where the op has one).
std::vector<std::filesystem::path> tier_files(const std::filesystem::path& op_dir, std::string_view tier);

struct CheckOptions {
  std::string backend = "reference";
  std::vector<std::string> ops;         // empty: every op
  std::string tier = "ci";
  std::vector<std::string> case_files;  // when given, replace the tier's files
  std::filesystem::path cases_dir = default_cases_dir();
  std::string json_path, junit_path;
  int shard_index = 0, shard_count = 1;
  bool shrink = true;                   // shrink every failure to its smallest line
  bool progress = false;                // console progress line
  RunOptions run;
};

std::vector<Problem> collect_cases(const CheckOptions& options);

struct CheckSummary {
  std::vector<CaseResult> results;
  double seconds = 0;
  bool ok = true;  // no FAILED and no INVALID case
};

// Runs the cases, printing failure reports and the summary to `out`.
CheckSummary run_check(const CheckOptions& options, std::ostream& out);

// Runs every problem of `line` (product syntax allowed) verbosely; returns true when
// none FAILED or was INVALID.
bool run_repro(std::string_view line, const std::string& backend, bool shrink, const RunOptions& run,
               std::ostream& out);

}  // namespace kvlab::harness
