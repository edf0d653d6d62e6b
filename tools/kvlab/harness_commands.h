// `kvlab check` (with --vectors), `kvlab list`, `kvlab repro` and `kvlab vectors write`:
// the CLI face of harness/.
#pragma once

#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

#include "harness/check.h"
#include "harness/vectors_check.h"

namespace kvlab::tools {

class HarnessCommands {
 public:
  void add_to(CLI::App& app);
  // Runs whichever subcommand was parsed; 0 when none was.
  int run(std::ostream& out);

 private:
  harness::CheckOptions check_;
  std::vector<std::string> check_backends_;  // --backend, repeatable
  std::string ops_, shard_, progress_ = "auto", max_memory_;
  std::uint64_t max_work_ = harness::kDefaultMaxWork, repro_max_work_ = harness::kDefaultMaxWork;
  std::string repro_line_, repro_backend_ = "reference", repro_max_memory_;
  bool no_known_ = false;
  bool repro_shrink_ = false, repro_rerun_ = false, repro_allow_unavailable_ = false;
  std::string list_tier_ = "full";
  CLI::App* check_cmd_ = nullptr;
  CLI::App* list_cmd_ = nullptr;
  CLI::App* repro_cmd_ = nullptr;

  harness::VectorsCheckOptions vectors_check_;
  std::int64_t vectors_problem_ = -1;
  CLI::Option* vectors_opt_ = nullptr;
  harness::CheckOptions vectors_write_;
  std::string vectors_ops_, vectors_out_, vectors_max_memory_;
  CLI::App* vectors_write_cmd_ = nullptr;
};

}  // namespace kvlab::tools
