#include "tools/kvlab/golden_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "golden/diff.h"
#include "golden/html_report.h"
#include "golden/runner.h"
#include "harness/backends.h"
#include "kvlab/error.h"

#ifndef KVLAB_GOLDEN_DIR
#define KVLAB_GOLDEN_DIR "golden"
#endif
#ifndef KVLAB_GOLDEN_MODELS_DIR
#define KVLAB_GOLDEN_MODELS_DIR "golden-models"
#endif

namespace kvlab::tools {
namespace {

namespace fs = std::filesystem;
using golden::Golden;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  KVLAB_REQUIRE(in, io, "cannot open '", p.string(), "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// The model ids: the folders of <golden>/models with a config.json.
std::vector<std::string> model_ids(const fs::path& golden_dir) {
  std::vector<std::string> out;
  const fs::path dir = golden_dir / "models";
  KVLAB_REQUIRE(fs::is_directory(dir), io, "no models folder '", dir.string(), "' (set --golden-dir)");
  for (const auto& e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "config.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct LoadedModel {
  std::unique_ptr<golden::Model> model;
  std::string sha256;
};

// The model directory of `id` under models_dir, generated from the checked-in config when
// absent or stale, and verified against the checked-in hash: goldens are only comparable
// over the same weights.
LoadedModel ensure_model(const std::string& id, const fs::path& golden_dir, const fs::path& models_dir) {
  const fs::path config_path = golden_dir / "models" / id / "config.json";
  KVLAB_REQUIRE(fs::exists(config_path), invalid_argument, "unknown model '", id, "': no ", config_path.string());
  const std::string want = trim(read_text(golden_dir / "models" / id / "model.sha256"));
  const fs::path dir = models_dir / id;
  std::string have = fs::exists(dir / "model.safetensors") ? golden::sha256_file(dir / "model.safetensors") : "";
  const bool config_same = fs::exists(dir / "config.json") &&
                           nlohmann::json::parse(read_text(dir / "config.json")) == nlohmann::json::parse(read_text(config_path));
  if (have != want || !config_same) {
    fs::create_directories(dir);
    have = golden::write_tiny_model(nlohmann::json::parse(read_text(config_path)), id, dir);
  }
  KVLAB_REQUIRE(have == want, internal, "model '", id, "': generated weights hash ", have, " but ",
                (golden_dir / "models" / id / "model.sha256").string(), " says ", want,
                " (the generator changed: regenerate every golden with `kvlab golden update --accept` and the hash)");
  return {golden::Model::load(dir), have};
}

golden::Scenario find_scenario(const fs::path& golden_dir, const std::string& model, const std::string& name) {
  const auto ids = model_ids(golden_dir);
  if (std::find(ids.begin(), ids.end(), model) == ids.end()) {
    std::string known;
    for (const auto& id : ids) known += (known.empty() ? "" : ", ") + id;
    fail(ErrorKind::invalid_argument, cat("unknown model '", model, "' (models: ", known, ")"));
  }
  for (auto& s : golden::read_scenarios(golden_dir / "scenarios" / model))
    if (s.name == name) return s;
  fail(ErrorKind::invalid_argument, cat("model '", model, "' has no scenario '", name, "' in ",
                                        (golden_dir / "scenarios" / model).string()));
}

fs::path golden_path(const fs::path& golden_dir, const std::string& model, const std::string& scenario) {
  return golden_dir / "data" / cat(model, ".", scenario, ".kvlab.safetensors");
}

Golden record(const std::string& model_id, const golden::Scenario& s, Backend& backend, const std::string& backend_name,
              const fs::path& golden_dir, const fs::path& models_dir, const Golden* teacher = nullptr) {
  const LoadedModel m = ensure_model(model_id, golden_dir, models_dir);
  golden::RunContext ctx;
  ctx.backend = &backend;
  ctx.backend_name = backend_name;
  ctx.model_id = model_id;
  ctx.model_sha256 = m.sha256;
  ctx.teacher = teacher;
  ctx.scratch = fs::temp_directory_path() / cat("kvlab-golden-", ::getpid());
  Golden g = golden::run_scenario(*m.model, s, ctx);
  std::error_code ignored;
  fs::remove_all(ctx.scratch, ignored);
  return g;
}

bool selected(const std::vector<std::string>& filter, const std::string& name) {
  return filter.empty() || std::find(filter.begin(), filter.end(), name) != filter.end();
}

// One row of tools/golden_table.py's table.
nlohmann::json summary_row(const std::string& model, const std::string& scenario, const std::string& engine,
                           const nlohmann::json& report) {
  const nlohmann::json& s = report.at("summary");
  const nlohmann::json& f = report.at("first_divergence");
  nlohmann::json statuses = nlohmann::json::array();
  for (const auto& q : report.at("sequences"))
    if (q.at("status_b") != "ok") statuses.push_back(q.at("status_b"));
  return {{"model", model}, {"scenario", scenario}, {"engine", engine}, {"verdict", report.at("verdict")},
          {"top1", s.at("top1_agreement")}, {"max_dlogit", s.at("max_abs_dlogit")}, {"kld_mean", s.at("kld").at("mean")},
          {"first", f.is_null() ? nlohmann::json(nullptr)
                                : nlohmann::json(cat("seq ", f.at("sequence").get<std::int64_t>(), " step ",
                                                     f.at("step").get<std::int64_t>(),
                                                     f.at("layer").is_null() ? std::string()
                                                                             : cat(" layer ", f.at("layer").get<std::int64_t>()),
                                                     ": ", f.at("what").get<std::string>()))},
          {"statuses", statuses}, {"reasons", report.at("reasons")}};
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  KVLAB_REQUIRE(out, io, "cannot write '", path.string(), "'");
}

}  // namespace

void GoldenCommands::add_to(CLI::App& app) {
  golden_ = app.add_subcommand("golden", "Tiny real-architecture models: record, diff, check and update goldens");
  golden_->require_subcommand(1);
  const auto where = [this](CLI::App* c) {
    c->add_option("--golden-dir", where_.golden_dir, "Folder with models/, scenarios/, data/")
        ->default_val(std::string(KVLAB_GOLDEN_DIR));
    c->add_option("--models", where_.models_dir, "Where the generated model folders live (made on demand)")
        ->default_val(std::string(KVLAB_GOLDEN_MODELS_DIR));
  };
  models_ = golden_->add_subcommand("models", "Write every tiny model as a folder mlx-lm loads, and check its hash");
  where(models_);
  models_->add_option("--model", models_filter_, "Only these model ids");

  record_ = golden_->add_subcommand("record", "Run one scenario of one model on a backend and write its golden");
  where(record_);
  record_->add_option("--model", model_, "Model id (golden/models/<id>)")->required();
  record_->add_option("--scenario", scenario_, "Scenario name (golden/scenarios/<id>)")->required();
  record_->add_option("--backend", backend_, "reference, simd[:T], vulkan, plugin:PATH")->default_val("reference");
  record_->add_option("-o,--out", out_, "Golden file to write")->required();
  record_->add_option("--teacher", teacher_,
                      "Feed this golden's tokens as inputs (teacher forcing): KLD over every step, as llama.cpp's "
                      "--kl-divergence");

  diff_ = golden_->add_subcommand("diff", "Where two goldens part: first divergence, top-1, |dlogit|, KLD");
  diff_->add_option("goldens", diff_files_, "A B")->required()->expected(2);
  diff_->add_flag("--json", json_, "Print the JSON report instead of text");
  diff_->add_option("--html", html_, "Also write a self-contained HTML report here");
  // The tolerance is A's scenario line's (golden/README.md "Tolerance"); these override it.
  diff_->add_option("--max-dlogit", max_dlogit_, "Override the scenario's max |dlogit|");
  diff_->add_option("--max-mean-kld", max_mean_kld_, "Override the scenario's max mean KLD");
  diff_->add_option("--min-top1", min_top1_, "Override the scenario's min top-1 agreement");
  diff_->add_option("--attn-rel", attn_rel_, "Override the localization threshold");

  check_ = golden_->add_subcommand("check", "Re-run every checked-in golden on a backend and diff it");
  where(check_);
  check_->add_option("--backend", backend_, "Backend to check")->default_val("reference");
  check_->add_option("--model", models_filter_, "Only these model ids");
  check_->add_option("--scenario", scenarios_filter_, "Only these scenarios");
  check_->add_option("--report-dir", report_dir_, "Write each failing run's golden, JSON and HTML report here");
  check_->add_option("--summary-json", summary_json_, "Write one summary row per golden (tools/golden_table.py table)");

  update_ = golden_->add_subcommand("update", "Re-record the checked-in goldens; rewrites only with --accept");
  where(update_);
  update_->add_option("--backend", backend_, "Backend to record on")->default_val("reference");
  update_->add_option("--model", models_filter_, "Only these model ids");
  update_->add_option("--scenario", scenarios_filter_, "Only these scenarios");
  update_->add_flag("--accept", accept_, "Rewrite the goldens that moved (atomically)");
}

bool GoldenCommands::parsed() const { return golden_ != nullptr && golden_->parsed(); }

int GoldenCommands::run(std::ostream& out) {
  const fs::path golden_dir = where_.golden_dir, models_dir = where_.models_dir;
  if (models_->parsed()) {
    for (const auto& id : model_ids(golden_dir))
      if (selected(models_filter_, id)) {
        const LoadedModel m = ensure_model(id, golden_dir, models_dir);
        out << id << ": " << (models_dir / id).string() << " sha256 " << m.sha256 << " (" << m.model->model_type()
            << ", " << m.model->layers().size() << " layers, vocab " << m.model->vocab_size() << ")\n";
      }
    return 0;
  }
  if (record_->parsed()) {
    auto backend = harness::make_backend(backend_);
    std::optional<Golden> teacher;
    if (!teacher_.empty()) teacher = golden::read_golden(teacher_);
    const Golden g = record(model_, find_scenario(golden_dir, model_, scenario_), *backend, backend_, golden_dir,
                            models_dir, teacher ? &*teacher : nullptr);
    golden::write_golden(out_, g);
    out << out_ << ": " << g.sequences.size() << " sequence(s)";
    for (const auto& s : g.sequences) out << " [" << s.steps() << " steps, " << s.status << "]";
    out << "\n";
    return 0;
  }
  if (diff_->parsed()) {
    const Golden a = golden::read_golden(diff_files_[0]);
    const Golden b = golden::read_golden(diff_files_[1]);
    golden::Tolerance tol = golden::tolerance_of(a);
    if (max_dlogit_ >= 0) tol.max_dlogit = max_dlogit_;
    if (max_mean_kld_ >= 0) tol.max_mean_kld = max_mean_kld_;
    if (min_top1_ >= 0) tol.min_top1 = min_top1_;
    if (attn_rel_ >= 0) tol.attn_rel = attn_rel_;
    const auto report = golden::diff_goldens({&a, diff_files_[0]}, {&b, diff_files_[1]}, tol);
    if (!html_.empty()) write_file(html_, golden::render_diff_html(report));
    out << (json_ ? report.dump(1) + "\n" : golden::diff_text(report));
    return golden::diff_passed(report) ? 0 : 1;
  }
  // check / update: every checked-in golden of the selected models and scenarios.
  const bool checking = check_->parsed();
  std::unique_ptr<Backend> backend;
  try {
    backend = harness::make_backend(backend_);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    out << "SKIPPED: backend " << backend_ << " is unavailable here: " << e.message() << "\n";
    return 0;
  }
  int moved = 0, total = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& id : model_ids(golden_dir)) {
    if (!selected(models_filter_, id)) continue;
    for (const auto& s : golden::read_scenarios(golden_dir / "scenarios" / id)) {
      if (!selected(scenarios_filter_, s.name)) continue;
      const fs::path path = golden_path(golden_dir, id, s.name);
      const bool exists = fs::exists(path);
      if (checking && !exists) {
        out << "FAIL " << id << "." << s.name << ": no golden " << path.string() << " (record it with `kvlab golden update --accept`)\n";
        ++moved, ++total;
        continue;
      }
      const Golden now = record(id, s, *backend, backend_, golden_dir, models_dir);
      ++total;
      nlohmann::json report;
      if (exists) {
        const Golden old = golden::read_golden(path);
        report = golden::diff_goldens({&old, path.string()}, {&now, cat(backend_, " run")}, s.tolerance);
      }
      const bool same = exists && golden::diff_passed(report);
      if (exists) rows.push_back(summary_row(id, s.name, backend_, report));
      out << (same ? "ok   " : checking ? "FAIL " : "MOVED ") << id << "." << s.name << " [" << backend_ << "] "
          << (exists ? golden::diff_line(report) : std::string("new golden")) << "\n";
      if (!same) ++moved;
      if (!same && checking && !report_dir_.empty()) {
        fs::create_directories(report_dir_);
        const fs::path base = fs::path(report_dir_) / cat(id, ".", s.name, ".", backend_);
        golden::write_golden(base.string() + ".safetensors", now);
        write_file(base.string() + ".json", report.dump(1));
        write_file(base.string() + ".html", golden::render_diff_html(report));
        out << "     report: " << base.string() << ".{safetensors,json,html}\n";
      }
      if (!checking && !same && accept_) golden::write_golden(path, now);
    }
  }
  if (!summary_json_.empty()) write_file(summary_json_, rows.dump(1));
  if (checking) {
    out << (total - moved) << " of " << total << " goldens within tolerance on " << backend_ << "\n";
    return moved == 0 ? 0 : 1;
  }
  out << moved << " of " << total << " goldens moved" << (accept_ ? " and were rewritten" : moved ? "; rerun with --accept to rewrite them" : "")
      << "\n";
  return moved > 0 && !accept_ ? 1 : 0;
}

}  // namespace kvlab::tools
