// `kvlab golden models|record|diff|check|update` (golden/README.md): the tiny models,
// recording a scenario on a backend, diffing two goldens (text, --json, --html), checking
// every checked-in golden on a backend, and rewriting them (only with --accept).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace kvlab::tools {

class GoldenCommands {
 public:
  void add_to(CLI::App& app);
  bool parsed() const;
  // Exit status: 0 all within tolerance, 1 a golden moved / failed, 2 errors (thrown).
  int run(std::ostream& out);

 private:
  struct Where {  // where models, scenarios and goldens live
    std::string golden_dir, models_dir;
  };
  CLI::App *golden_ = nullptr, *models_ = nullptr, *record_ = nullptr, *diff_ = nullptr, *check_ = nullptr,
           *update_ = nullptr;
  Where where_;
  std::string backend_ = "reference", model_, scenario_, out_, html_, report_dir_, summary_json_, teacher_;
  std::vector<std::string> models_filter_, scenarios_filter_, diff_files_;
  bool json_ = false, accept_ = false;
  double max_dlogit_ = -1, max_mean_kld_ = -1, min_top1_ = -1, attn_rel_ = -1;
};

}  // namespace kvlab::tools
