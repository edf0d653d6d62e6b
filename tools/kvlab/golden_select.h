// What the `kvlab golden` commands resolve before they run anything: where the golden
// folder and the generated models are, which models and scenarios a filter names (every
// name checked, with the nearest known one offered), and the diff's tolerance flags,
// validated as the scenario parser validates the same keys.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "golden/files/scenario.h"

namespace kvlab::tools::golden_cli {

// The golden folder (models/, scenarios/, data/, known/): $KVLAB_GOLDEN_DIR if set; else
// the installed layout beside the running binary (<prefix>/bin/kvlab ->
// <prefix>/share/kvlab/golden); else the source tree's golden/ compiled in.
std::filesystem::path default_golden_dir();
// Where generated model folders go: $KVLAB_GOLDEN_MODELS_DIR if set; for an installed
// kvlab a per-user cache ($XDG_CACHE_HOME or ~/.cache, /kvlab/golden-models), never the
// prefix, which may be read-only or shared; else the build tree's golden/models.
std::filesystem::path default_models_dir();

// The model ids of a golden folder: the folders of <golden>/models with a config.json.
std::vector<std::string> model_ids(const std::filesystem::path& golden_dir);
// <golden>/scenarios/<model>, and its scenarios.
std::filesystem::path scenario_file(const std::filesystem::path& golden_dir, const std::string& model);
// Scenario `name` of `file`; Error(invalid_argument) naming the model, the nearest name
// and the known ones when there is none.
golden::Scenario find_scenario(const std::filesystem::path& file, const std::string& model, const std::string& name);
// Error(invalid_argument) naming `id` with the nearest known model unless it is one.
void require_model(const std::filesystem::path& golden_dir, const std::string& id);

// The (model, scenarios) pairs that --model and --scenario select, in folder order. Every
// name given must exist (a typo is an error naming it, never an empty selection), and an
// empty selection is an error unless allow_empty.
using Selection = std::vector<std::pair<std::string, std::vector<golden::Scenario>>>;
Selection select(const std::filesystem::path& golden_dir, const std::vector<std::string>& models,
                 const std::vector<std::string>& scenarios, bool allow_empty);

// A tolerance flag's value ("" when the flag was not given): a finite number >= 0, at
// most 1 for --min-top1; Error(invalid_argument) naming the flag and the value otherwise.
std::optional<double> tolerance_flag(const std::string& flag, const std::string& value);

}  // namespace kvlab::tools::golden_cli
