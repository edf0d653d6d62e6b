#include "tools/kvlab/golden_select.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "golden/files/inputs.h"
#include "kvlab/error.h"

#ifndef KVLAB_GOLDEN_DIR
#define KVLAB_GOLDEN_DIR "golden"
#endif
#ifndef KVLAB_GOLDEN_MODELS_DIR
#define KVLAB_GOLDEN_MODELS_DIR "golden-models"
#endif

namespace kvlab::tools::golden_cli {
namespace {

namespace fs = std::filesystem;

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// <prefix>/share/kvlab/golden beside the running binary, or "" when this kvlab is not
// installed (a build tree has no share/ beside its tools/).
fs::path installed_golden_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const fs::path dir = exe.parent_path().parent_path() / "share" / "kvlab" / "golden";
  return fs::is_directory(dir, ec) ? dir : fs::path();
}

std::vector<std::string> names_of(const std::vector<golden::Scenario>& scenarios) {
  std::vector<std::string> out;
  for (const auto& s : scenarios) out.push_back(s.name);
  return out;
}

}  // namespace

fs::path default_golden_dir() {
  if (const std::string e = env_value("KVLAB_GOLDEN_DIR"); !e.empty()) return e;
  if (const fs::path installed = installed_golden_dir(); !installed.empty()) return installed;
  return KVLAB_GOLDEN_DIR;
}

fs::path default_models_dir() {
  if (const std::string e = env_value("KVLAB_GOLDEN_MODELS_DIR"); !e.empty()) return e;
  if (installed_golden_dir().empty()) return KVLAB_GOLDEN_MODELS_DIR;
  if (const std::string xdg = env_value("XDG_CACHE_HOME"); !xdg.empty()) return fs::path(xdg) / "kvlab" / "golden-models";
  if (const std::string home = env_value("HOME"); !home.empty()) return fs::path(home) / ".cache" / "kvlab" / "golden-models";
  return fs::temp_directory_path() / cat("kvlab-golden-models-", ::getuid());
}

std::vector<std::string> model_ids(const fs::path& golden_dir) {
  std::vector<std::string> out;
  const fs::path dir = golden_dir / "models";
  std::error_code ec;
  KVLAB_REQUIRE(fs::is_directory(dir, ec), io, "no models folder '", dir.string(), "' (set --golden-dir)");
  for (const auto& e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "config.json", ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

fs::path scenario_file(const fs::path& golden_dir, const std::string& model) { return golden_dir / "scenarios" / model; }

void require_model(const fs::path& golden_dir, const std::string& id) {
  const auto ids = model_ids(golden_dir);
  if (std::find(ids.begin(), ids.end(), id) == ids.end())
    fail(ErrorKind::invalid_argument, cat(golden::unknown_name_message("model", id, ids), " in ", golden_dir.string()));
}

golden::Scenario find_scenario(const fs::path& file, const std::string& model, const std::string& name) {
  const auto scenarios = golden::read_scenarios(file);
  for (const auto& s : scenarios)
    if (s.name == name) return s;
  fail(ErrorKind::invalid_argument, cat("model '", model, "' has no scenario '", name, "' ",
                                        golden::known_names_hint("scenario", name, names_of(scenarios)), " in ",
                                        file.string()));
}

Selection select(const fs::path& golden_dir, const std::vector<std::string>& models,
                 const std::vector<std::string>& scenarios, bool allow_empty) {
  const auto ids = model_ids(golden_dir);
  for (const auto& m : models)
    KVLAB_REQUIRE(std::find(ids.begin(), ids.end(), m) != ids.end(), invalid_argument, "--model: ",
                  golden::unknown_name_message("model", m, ids), " in ", golden_dir.string());
  Selection out;
  std::vector<std::string> known;  // every scenario name of the selected models
  for (const auto& id : ids) {
    if (!models.empty() && std::find(models.begin(), models.end(), id) == models.end()) continue;
    std::vector<golden::Scenario> picked;
    for (auto& s : golden::read_scenarios(scenario_file(golden_dir, id))) {
      if (std::find(known.begin(), known.end(), s.name) == known.end()) known.push_back(s.name);
      if (scenarios.empty() || std::find(scenarios.begin(), scenarios.end(), s.name) != scenarios.end())
        picked.push_back(std::move(s));
    }
    if (!picked.empty() || scenarios.empty()) out.emplace_back(id, std::move(picked));
  }
  for (const auto& s : scenarios)
    KVLAB_REQUIRE(std::find(known.begin(), known.end(), s) != known.end(), invalid_argument, "--scenario: ",
                  golden::unknown_name_message("scenario", s, known), " of the selected models");
  std::size_t count = 0;
  for (const auto& [id, picked] : out) count += picked.size();
  KVLAB_REQUIRE(count > 0 || allow_empty, invalid_argument, "no golden selected in ", golden_dir.string(),
                " (", ids.size(), " model(s) found; --allow-empty accepts an empty selection)");
  return out;
}

std::optional<double> tolerance_flag(const std::string& flag, const std::string& value) {
  if (value.empty()) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  KVLAB_REQUIRE(ec == std::errc() && end == value.data() + value.size() && std::isfinite(v) && v >= 0 && v <= 1e30,
                invalid_argument, flag, " ", value, " is not a finite number >= 0 (as the scenario key)");
  KVLAB_REQUIRE(flag != "--min-top1" || v <= 1, invalid_argument, flag, " ", value, " is above 1 (a fraction of the steps)");
  return v;
}

}  // namespace kvlab::tools::golden_cli
