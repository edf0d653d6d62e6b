#include "tools/kvlab/harness_commands.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>

#include "harness/backends.h"
#include "harness/op.h"
#include "kvlab/error.h"

namespace kvlab::tools {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A whole decimal integer in [0, max]: no sign, no trailing characters.
std::int64_t whole_number(std::string_view text, std::int64_t max, const std::string& what) {
  std::int64_t v = -1;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  KVLAB_REQUIRE(!text.empty() && ec == std::errc() && ptr == text.data() + text.size() && v >= 0 && v <= max,
                invalid_argument, what);
  return v;
}

void parse_shard(const std::string& s, harness::CheckOptions& o) {
  if (s.empty()) return;
  const std::string what = cat("--shard ", s, " is not i/n with 0 <= i < n");
  const std::size_t slash = s.find('/');
  KVLAB_REQUIRE(slash != std::string::npos, invalid_argument, what);
  o.shard_index = static_cast<int>(whole_number(std::string_view(s).substr(0, slash), 1 << 30, what));
  o.shard_count = static_cast<int>(whole_number(std::string_view(s).substr(slash + 1), 1 << 30, what));
  KVLAB_REQUIRE(o.shard_index < o.shard_count, invalid_argument, what);
}

// "4G", "512M", "64K" or a number of bytes; empty: the default (half the memory).
std::uint64_t parse_memory(const std::string& s) {
  if (s.empty()) return harness::default_max_bytes();
  const std::string what = cat("--max-memory ", s, " is not a size (bytes, or a number with K, M or G)");
  std::string_view digits = s;
  int shift = 0;
  switch (s.back()) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    default: break;
  }
  if (shift != 0) digits.remove_suffix(1);
  const std::int64_t v = whole_number(digits, (std::int64_t{1} << (62 - shift)), what);
  KVLAB_REQUIRE(v > 0, invalid_argument, what, " (it must be positive)");
  return static_cast<std::uint64_t>(v) << shift;
}

}  // namespace

void HarnessCommands::add_to(CLI::App& app) {
  check_cmd_ = app.add_subcommand("check", "Compare a backend with the reference over the case files of a tier");
  check_cmd_->add_option("--backend", check_backends_,
                         "Backend under test (reference, simd[:TARGET], ...); repeat it to check several in one run "
                         "over the same prepared inputs and reference outputs (report files then get the backend's "
                         "name before their extension)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  check_cmd_->add_option("--op", ops_, "Only these ops (comma separated)");
  check_cmd_->add_option("--tier", check_.tier, "smoke | ci | lavapipe | full")
      ->check(CLI::IsMember({"smoke", "ci", "lavapipe", "full"}));
  check_cmd_->add_option("--cases", check_.case_files, "Case file(s) to run instead of the tier's");
  check_cmd_->add_option("--known", check_.known_files,
                         "Known-divergence file(s) (harness/known_divergences.h); by default the backend's own "
                         "register, harness/known/<backend>, when it exists");
  check_cmd_->add_flag("--no-known", no_known_, "Do not apply the backend's register of known divergences");
  check_cmd_->add_option("--json", check_.json_path, "Write JSON Lines (one record per case) to this file");
  check_cmd_->add_option("--junit", check_.junit_path, "Write JUnit XML to this file");
  check_cmd_->add_option("--shard", shard_, "Run shard i of n (i/n, cases k with k mod n == i)");
  check_cmd_->add_flag("--rerun", check_.run.rerun, "Run the backend twice; outputs must match bitwise");
  check_cmd_->add_flag("!--no-shrink", check_.shrink, "Do not shrink failures");
  check_cmd_->add_option("--progress", progress_,
                         "auto (a line on a terminal, else a line every few seconds and per op) | always | never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  check_cmd_->add_flag("--allow-empty", check_.allow_empty, "Selecting no case is not an error");
  check_cmd_->add_flag("--allow-unavailable", check_.allow_unavailable,
                       "A backend unavailable here (no device, ISA not supported) is a skip, not a failure");
  check_cmd_->add_option("--max-memory", max_memory_,
                         "Skip cases needing more memory than this (bytes, or with K/M/G; default half the RAM)");
  check_cmd_->add_option("--max-work", max_work_,
                         "Skip cases needing more elementary operations than this (default 1e12)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 62));
  check_cmd_->add_option("--max-cases", check_.max_cases, "Refuse a selection of more cases than this")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  // --vectors judges an engine's recorded outputs instead of running a backend: the
  // selection flags have nothing to select then.
  vectors_opt_ = check_cmd_->add_option("--vectors", vectors_check_.files,
                                        "Judge the outputs recorded in these vectors files (safetensors) against "
                                        "the reference, or --backend");
  for (const char* flag : {"--op", "--tier", "--cases", "--shard", "--rerun", "--no-shrink"})
    vectors_opt_->excludes(check_cmd_->get_option(flag));
  check_cmd_->add_option("--vectors-problem", vectors_problem_, "Only problem K of each --vectors file")
      ->needs(vectors_opt_)
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));

  CLI::App* vectors_cmd = app.add_subcommand("vectors", "Engine-neutral vectors files (safetensors)");
  vectors_cmd->require_subcommand(1);
  vectors_write_cmd_ =
      vectors_cmd->add_subcommand("write", "Write the inputs and outputs of selected cases to a vectors file");
  vectors_write_cmd_->add_option("--tier", vectors_write_.tier, "smoke | ci | lavapipe | full")
      ->check(CLI::IsMember({"smoke", "ci", "lavapipe", "full"}));
  vectors_write_cmd_->add_option("--op", vectors_ops_, "Only these ops (comma separated)");
  vectors_write_cmd_->add_option("--cases", vectors_write_.case_files, "Case file(s) to use instead of the tier's");
  vectors_write_cmd_->add_option("--backend", vectors_write_.backend,
                                 "Backend whose outputs are written (default: the reference oracle)");
  vectors_write_cmd_->add_option("-o,--output", vectors_out_, "The vectors file to write")->required();
  vectors_write_cmd_->add_option("--max-memory", vectors_max_memory_,
                                 "Leave out cases needing more memory than this (bytes, or with K/M/G)");

  list_cmd_ = app.add_subcommand("list", "List ops (parameters, defaults, case counts per tier) and backends");

  repro_cmd_ = app.add_subcommand("repro", "Run one problem line (as printed by a failure) verbosely");
  repro_cmd_->add_option("line", repro_line_, "The problem line, e.g. 'sdpa B=1 Hq=4 ... seed=1'")->required();
  repro_cmd_->add_option("--backend", repro_backend_, "Backend under test");
  repro_cmd_->add_flag("--shrink", repro_shrink_, "Shrink a failure to its smallest line");
  repro_cmd_->add_flag("--rerun", repro_rerun_, "Run the backend twice; outputs must match bitwise");
  repro_cmd_->add_flag("--allow-unavailable", repro_allow_unavailable_,
                       "A backend unavailable here is a skip, not a failure");
  repro_cmd_->add_option("--max-memory", repro_max_memory_, "Skip a problem needing more memory than this");
  repro_cmd_->add_option("--max-work", repro_max_work_, "Skip a problem needing more operations than this")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 62));
}

int HarnessCommands::run(std::ostream& out) {
  if (!check_backends_.empty()) {
    check_.backend = check_backends_.front();
    check_.more_backends.assign(check_backends_.begin() + 1, check_backends_.end());
  }
  if (*check_cmd_ && vectors_opt_->count() > 0) {
    KVLAB_REQUIRE(check_.more_backends.empty(), invalid_argument,
                  "--vectors judges with one backend; got --backend ", check_backends_.size(), " times");
    vectors_check_.judge = check_.backend;
    if (vectors_problem_ >= 0) vectors_check_.problem = static_cast<std::size_t>(vectors_problem_);
    vectors_check_.json_path = check_.json_path;
    vectors_check_.junit_path = check_.junit_path;
    vectors_check_.known_files = check_.known_files;  // explicit --known only: a file names its engine, not a register
    vectors_check_.run.max_bytes = parse_memory(max_memory_);
    vectors_check_.run.max_work = max_work_;
    return harness::run_vectors_check(vectors_check_, out).ok ? 0 : 1;
  }
  if (*vectors_write_cmd_) {
    vectors_write_.ops = split_commas(vectors_ops_);
    KVLAB_REQUIRE(vectors_ops_.empty() || !vectors_write_.ops.empty(), invalid_argument, "--op '", vectors_ops_,
                  "' names no op");
    vectors_write_.run.max_bytes = parse_memory(vectors_max_memory_);
    harness::run_vectors_write(vectors_write_, vectors_out_, out);
    return 0;
  }
  if (*check_cmd_) {
    check_.ops = split_commas(ops_);
    // Each backend's register beside the case files (harness/known/mlx for `--backend mlx`).
    check_.own_registers = !no_known_;
    KVLAB_REQUIRE(ops_.empty() || !check_.ops.empty(), invalid_argument, "--op '", ops_, "' names no op");
    parse_shard(shard_, check_);
    check_.progress = harness::progress_from_name(progress_);
    check_.run.max_bytes = parse_memory(max_memory_);
    check_.run.max_work = max_work_;
    return harness::run_check(check_, out).ok ? 0 : 1;
  }
  if (*repro_cmd_) {
    harness::RunOptions run;
    run.rerun = repro_rerun_;
    run.max_bytes = parse_memory(repro_max_memory_);
    run.max_work = repro_max_work_;
    return harness::run_repro(repro_line_, repro_backend_, repro_shrink_, run, out, repro_allow_unavailable_) ? 0 : 1;
  }
  if (*list_cmd_) {
    out << "ops (parameters with defaults; case counts per tier):\n";
    for (const harness::OpInfo* op : harness::all_ops()) {
      std::string counts;
      for (const char* tier : {"smoke", "ci", "lavapipe", "full"}) {
        harness::CheckOptions o;
        o.tier = tier;
        o.ops = {std::string(op->name())};
        counts += cat(" ", tier, "=", harness::collect_cases(o).size());
      }
      out << "  " << op->name() << " — " << op->summary() << " [" << counts.substr(1) << "]\n    ";
      for (const harness::ParamSpec& p : op->params()) out << " " << p.key << "=" << p.default_value;
      out << "\n";
    }
    out << "backends:\n";
    for (const harness::BackendEntry& e : harness::backend_entries()) {
      out << "  " << e.name << " — " << e.description << " (" << e.target << ")\n";
      // What the default variant resolves to on this machine (device, ISA target), or why
      // it is unavailable.
      std::string here;
      try {
        here = harness::make_backend(e.name)->name();
      } catch (const Error& err) {
        here = cat("unavailable: ", err.what());
      }
      out << "    here: " << here << "\n";
    }
    out << "tiers: smoke, ci, lavapipe (ci sized for a CPU Vulkan driver), full (case files in "
        << harness::default_cases_dir().string() << ")\n";
    return 0;
  }
  return 0;
}

}  // namespace kvlab::tools
