// `kvlab golden models|record|diff|check|update` (golden/README.md): the tiny models,
// recording a scenario on a backend, diffing two goldens (text, --json, --html), checking
// every checked-in golden on a backend, and rewriting them (only with --accept).
//
// Gates that cannot pass by accident: a model or scenario name that names nothing is an
// error (with the nearest known name), so is an empty selection (unless --allow-empty);
// a recording that ended in an error exits 1; a diff refuses goldens of different
// weights and takes its tolerance from the checked-in scenario or explicit flags, never
// from the files it judges.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "golden/files/golden_file.h"
#include "golden/model/model.h"
#include "golden/files/scenario.h"
#include "kvlab/backend.h"

namespace kvlab::tools {

class GoldenCommands {
 public:
  void add_to(CLI::App& app);
  bool parsed() const;
  // Exit status: 0 all within tolerance, 1 a golden moved / failed / a recording ended in
  // an error, 2 errors (thrown).
  int run(std::ostream& out);

 private:
  struct Where {  // where models, scenarios and goldens live
    std::string golden_dir, models_dir;
  };
  int run_models(std::ostream& out);
  int run_record(std::ostream& out);
  int run_diff(std::ostream& out);
  int run_check_or_update(std::ostream& out);  // golden_check.cc
  // One scenario of a loaded model on a backend (the scratch folder made and removed).
  golden::Golden record_one(const golden::Model& model, const std::string& id, const std::string& sha256,
                            const golden::Scenario& s, Backend& backend, const golden::Golden* teacher) const;

  CLI::App *golden_ = nullptr, *models_ = nullptr, *record_ = nullptr, *diff_ = nullptr, *check_ = nullptr,
           *update_ = nullptr;
  Where where_;
  std::string backend_ = "reference", model_, scenario_, out_, html_, report_dir_, summary_json_, teacher_, model_dir_,
              scenarios_file_;
  std::vector<std::string> models_filter_, scenarios_filter_, diff_files_;
  bool json_ = false, accept_ = false, allow_empty_ = false;
  std::string max_dlogit_, max_mean_kld_, min_top1_, attn_rel_;  // diff overrides; "" when not given
};

}  // namespace kvlab::tools
