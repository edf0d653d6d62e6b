// `kvlab check` and `kvlab repro` as library calls (the CLI parses flags into these;
// the harness tests call them directly).
//
// Tiers select case files by role: smoke = {smoke}; ci = {smoke, ci, shapes_edges,
// shapes_llama_decode, conformance}; full = ci + {perf}. Cases are deduplicated by canonical line,
// ordered by op then file then line, and sharded as case k → shard k mod n.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "harness/problem.h"
#include "harness/spine.h"

namespace kvlab::harness {

// $KVLAB_CASES_DIR if set; else <dir of the running binary>/../share/kvlab/cases if it
// exists (an installed kvlab); else the source tree's harness/cases.
std::filesystem::path default_cases_dir();
std::vector<std::string> tier_roles(std::string_view tier);  // throws for an unknown tier
// The case files of one op directory in a tier (the lavapipe tier: its `lavapipe` file
// in place of the ci roles where the op has one).
std::vector<std::filesystem::path> tier_files(const std::filesystem::path& op_dir, std::string_view tier);

enum class Progress : std::uint8_t { never, auto_, always };
// "auto" | "always" | "never" -> Progress; throws invalid_argument naming the word.
Progress progress_from_name(std::string_view name);

// The default cap on the cases one run selects (they are streamed, but every result is
// kept for the summary and the JUnit file: ~1 KB each).
inline constexpr std::uint64_t kDefaultMaxCases = 200000;

struct CheckOptions {
  std::string backend = "reference";
  // Further backends checked in the same run (kvlab check with --backend repeated): each
  // case's inputs are prepared and the reference run once for all of them. Each backend
  // gets its own summary, known-divergence register and report files (with several
  // backends, json_path and junit_path get the backend's name before the extension:
  // "r.json" -> "r.simd_AVX2.json").
  std::vector<std::string> more_backends;
  std::vector<std::string> ops;         // empty: every op
  std::string tier = "ci";
  std::vector<std::string> case_files;  // when given, replace the tier's files
  // Known-divergence files (harness/known_divergences.h): a failure they explain is
  // SKIPPED with the reason; an entry that no longer reproduces fails the run.
  std::vector<std::string> known_files;
  // Also apply each backend's own register, harness/known/<backend up to ':'> beside the
  // case files, when it exists (the CLI's default; --no-known turns it off).
  bool own_registers = false;
  std::filesystem::path cases_dir = default_cases_dir();
  std::string json_path, junit_path;
  int shard_index = 0, shard_count = 1;
  bool shrink = true;                   // shrink every failure to its smallest line
  // never; auto: a progress line on a terminal, else a line every few seconds and one
  // per finished op (CI logs); always: those lines even on a terminal.
  Progress progress = Progress::never;
  bool allow_empty = false;        // selecting no case is not an error
  bool allow_unavailable = false;  // a backend unavailable here (unsupported) is a skip, not a failure
  std::uint64_t max_cases = kDefaultMaxCases;
  RunOptions run;
};

// The cases a run selects, streamed: every case file is read and each line parsed up
// front (a bad file fails before anything runs), the products are counted and capped
// (Error naming the count and --max-cases), then problems are made one at a time,
// deduplicated by canonical line, filtered by op and sharded.
class CaseSelection {
 public:
  explicit CaseSelection(const CheckOptions& options);
  std::uint64_t size() const { return size_; }  // after deduplication, filter and shard
  void for_each(const std::function<void(const Problem&)>& visit) const;

 private:
  std::vector<CaseLine> lines_;
  int shard_index_ = 0, shard_count_ = 1;
  std::uint64_t size_ = 0;
};

// Every selected problem, materialized (for listings and tests; runs stream instead).
std::vector<Problem> collect_cases(const CheckOptions& options);

struct CheckSummary {
  std::vector<CaseResult> results;  // with several backends: the first one's, then the next one's, ...
  double seconds = 0;
  std::string unavailable;  // why a backend cannot run here (the first such); empty when all can
  // No FAILED or INVALID case, and the backend available (or allow_unavailable).
  bool ok = true;
};

// The register of known divergences of `backend` (harness/known/<name up to ':'>), beside
// the case directory `cases_dir`; it may not exist.
std::filesystem::path own_register(const std::filesystem::path& cases_dir, const std::string& backend);

// Runs the cases, printing failure reports and the summary to `out`. Throws Error for
// a usage or input problem found before the run (unknown backend or op, bad or empty
// case selection) and Error{io} when a report file cannot be written (after the run:
// the console summary is printed first).
CheckSummary run_check(const CheckOptions& options, std::ostream& out);

// Runs every problem of `line` (product syntax allowed) verbosely; returns true when
// none FAILED or was INVALID. A backend unavailable here prints its reason and counts
// as a failure unless allow_unavailable.
bool run_repro(std::string_view line, const std::string& backend, bool shrink, const RunOptions& run,
               std::ostream& out, bool allow_unavailable = false);

}  // namespace kvlab::harness
