#include "tools/kvlab/harness_commands.h"

#include <cstdio>
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

void parse_shard(const std::string& s, harness::CheckOptions& o) {
  if (s.empty()) return;
  const std::size_t slash = s.find('/');
  KVLAB_REQUIRE(slash != std::string::npos, invalid_argument, "--shard ", s, " is not i/n");
  try {
    o.shard_index = std::stoi(s.substr(0, slash));
    o.shard_count = std::stoi(s.substr(slash + 1));
  } catch (const std::exception&) {
    fail(ErrorKind::invalid_argument, cat("--shard ", s, " is not i/n"));
  }
}

}  // namespace

void HarnessCommands::add_to(CLI::App& app) {
  check_cmd_ = app.add_subcommand("check", "Compare a backend with the reference over the case files of a tier");
  check_cmd_->add_option("--backend", check_.backend, "Backend under test (reference, simd[:TARGET], ...)");
  check_cmd_->add_option("--op", ops_, "Only these ops (comma separated)");
  check_cmd_->add_option("--tier", check_.tier, "smoke | ci | lavapipe | full")
      ->check(CLI::IsMember({"smoke", "ci", "lavapipe", "full"}));
  check_cmd_->add_option("--cases", check_.case_files, "Case file(s) to run instead of the tier's");
  check_cmd_->add_option("--json", check_.json_path, "Write JSON Lines (one record per case) to this file");
  check_cmd_->add_option("--junit", check_.junit_path, "Write JUnit XML to this file");
  check_cmd_->add_option("--shard", shard_, "Run shard i of n (i/n, cases k with k mod n == i)");
  check_cmd_->add_flag("--rerun", check_.run.rerun, "Run the backend twice; outputs must match bitwise");
  check_cmd_->add_flag("!--no-shrink", check_.shrink, "Do not shrink failures");

  list_cmd_ = app.add_subcommand("list", "List ops (parameters, defaults, case counts per tier) and backends");

  repro_cmd_ = app.add_subcommand("repro", "Run one problem line (as printed by a failure) verbosely");
  repro_cmd_->add_option("line", repro_line_, "The problem line, e.g. 'sdpa B=1 Hq=4 ... seed=1'")->required();
  repro_cmd_->add_option("--backend", repro_backend_, "Backend under test");
  repro_cmd_->add_flag("--shrink", repro_shrink_, "Shrink a failure to its smallest line");
  repro_cmd_->add_flag("--rerun", repro_rerun_, "Run the backend twice; outputs must match bitwise");
}

int HarnessCommands::run(std::ostream& out) {
  if (*check_cmd_) {
    check_.ops = split_commas(ops_);
    parse_shard(shard_, check_);
    check_.progress = true;
    return harness::run_check(check_, out).ok ? 0 : 1;
  }
  if (*repro_cmd_) {
    harness::RunOptions run;
    run.rerun = repro_rerun_;
    return harness::run_repro(repro_line_, repro_backend_, repro_shrink_, run, out) ? 0 : 1;
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
