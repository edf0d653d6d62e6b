#include "tools/kvlab/golden_commands.h"

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "golden/files/diff.h"
#include "golden/html/html_report.h"
#include "golden/files/inputs.h"
#include "golden/model/model_folder.h"
#include "golden/runner/runner.h"
#include "harness/backends.h"
#include "kvlab/error.h"
#include "tools/kvlab/golden_select.h"

namespace kvlab::tools {
namespace {

namespace fs = std::filesystem;
using golden::Golden;

void write_report_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  KVLAB_REQUIRE(out, io, "cannot write '", path.string(), "'");
}

// A model id from a golden's metadata names a folder only when it is a plain name.
bool plain_name(const std::string& id) {
  return !id.empty() && id != "." && id != ".." && id.find('/') == std::string::npos;
}

}  // namespace

void GoldenCommands::add_to(CLI::App& app) {
  golden_ = app.add_subcommand("golden", "Tiny real-architecture models: record, diff, check and update goldens");
  golden_->require_subcommand(1);
  const auto where = [this](CLI::App* c) {
    c->add_option("--golden-dir", where_.golden_dir, "Folder with models/, scenarios/, data/, known/")
        ->default_val(golden_cli::default_golden_dir().string());
    c->add_option("--models", where_.models_dir, "Where the generated model folders live (made on demand)")
        ->default_val(golden_cli::default_models_dir().string());
  };
  const auto allow_empty = [this](CLI::App* c) {
    c->add_flag("--allow-empty", allow_empty_, "Exit 0 when --model/--scenario select no golden (an error otherwise)");
  };
  models_ = golden_->add_subcommand("models", "Write every tiny model as a folder mlx-lm loads, and check its hash");
  where(models_);
  models_->add_option("--model", models_filter_, "Only these model ids")->delimiter(',');
  allow_empty(models_);

  record_ = golden_->add_subcommand(
      "record", "Run one scenario of one model on a backend and write its golden (exit 1 if the run ended in an error)");
  where(record_);
  record_->add_option("--model", model_, "Model id (golden/models/<id>; with --model-dir, the id written in the golden)");
  record_->add_option("--model-dir", model_dir_,
                      "Your own model folder (config.json, model.safetensors), read as it is; the id defaults to the "
                      "--scenarios file's name");
  record_->add_option("--scenarios", scenarios_file_, "Scenario file (default: <golden-dir>/scenarios/<model>)");
  record_->add_option("--scenario", scenario_, "Scenario name")->required();
  record_->add_option("--backend", backend_, "reference, simd[:T], vulkan, mlx, plugin:PATH")->default_val("reference");
  record_->add_option("-o,--out", out_, "Golden file to write")->required();
  record_->add_option("--teacher", teacher_,
                      "Feed this golden's tokens as inputs (teacher forcing): KLD over every step, as llama.cpp's "
                      "--kl-divergence");

  diff_ = golden_->add_subcommand("diff", "Where two goldens part: first divergence, top-1, |dlogit|, KLD");
  diff_->add_option("goldens", diff_files_, "A B")->required()->expected(2);
  diff_->add_flag("--json", json_, "Print the JSON report instead of text");
  diff_->add_option("--html", html_, "Also write a self-contained HTML report here");
  diff_->add_option("--golden-dir", where_.golden_dir, "Where the checked-in scenarios (the tolerance) are")
      ->default_val(golden_cli::default_golden_dir().string());
  diff_->add_option("--scenarios", scenarios_file_,
                    "Take the tolerance from this scenario file (default: <golden-dir>/scenarios/<model>)");
  // The tolerance is the checked-in scenario's (golden/README.md "Tolerance"); these
  // override it field by field.
  diff_->add_option("--max-dlogit", max_dlogit_, "Override the scenario's max |dlogit| (a number >= 0)");
  diff_->add_option("--max-mean-kld", max_mean_kld_, "Override the scenario's max mean KLD (a number >= 0)");
  diff_->add_option("--min-top1", min_top1_, "Override the scenario's min top-1 agreement (in [0, 1])");
  diff_->add_option("--attn-rel", attn_rel_, "Override the localization threshold (a number >= 0)");

  check_ = golden_->add_subcommand("check", "Re-run every checked-in golden on a backend and diff it");
  where(check_);
  check_->add_option("--backend", backend_, "Backend to check")->default_val("reference");
  check_->add_option("--model", models_filter_, "Only these model ids (comma-separated or repeated)")->delimiter(',');
  check_->add_option("--scenario", scenarios_filter_, "Only these scenarios (comma-separated or repeated)")->delimiter(',');
  check_->add_option("--report-dir", report_dir_, "Write each failing run's golden, JSON and HTML report here");
  check_->add_option("--summary-json", summary_json_, "Write one summary row per golden (tools/golden_table.py table)");
  allow_empty(check_);

  update_ = golden_->add_subcommand("update", "Re-record the checked-in goldens; rewrites only with --accept");
  where(update_);
  update_->add_option("--backend", backend_, "Backend to record on")->default_val("reference");
  update_->add_option("--model", models_filter_, "Only these model ids (comma-separated or repeated)")->delimiter(',');
  update_->add_option("--scenario", scenarios_filter_, "Only these scenarios (comma-separated or repeated)")->delimiter(',');
  update_->add_flag("--accept", accept_, "Rewrite the goldens that moved (atomically)");
  allow_empty(update_);
}

bool GoldenCommands::parsed() const { return golden_ != nullptr && golden_->parsed(); }

int GoldenCommands::run(std::ostream& out) {
  if (models_->parsed()) return run_models(out);
  if (record_->parsed()) return run_record(out);
  if (diff_->parsed()) return run_diff(out);
  return run_check_or_update(out);
}

int GoldenCommands::run_models(std::ostream& out) {
  const fs::path golden_dir = where_.golden_dir, models_dir = where_.models_dir;
  for (const auto& [id, scenarios] : golden_cli::select(golden_dir, models_filter_, {}, true)) {
    const golden::ModelFolder f = golden::ensure_model_folder(golden_dir, id, models_dir);
    const auto m = golden::Model::load(f.dir);
    out << id << ": " << f.dir.string() << " sha256 " << f.sha256 << " (" << m->model_type() << ", "
        << m->layers().size() << " layers, vocab " << m->vocab_size() << (f.generated ? "; generated" : "") << ")\n";
  }
  return 0;
}

int GoldenCommands::run_record(std::ostream& out) {
  const fs::path golden_dir = where_.golden_dir;
  KVLAB_REQUIRE(!model_.empty() || !model_dir_.empty(), invalid_argument,
                "golden record needs --model ID (a checked-in model) or --model-dir DIR (your own)");
  KVLAB_REQUIRE(model_dir_.empty() || !model_.empty() || !scenarios_file_.empty(), invalid_argument,
                "--model-dir needs --scenarios FILE (or --model ID for the checked-in scenarios of ID)");
  const std::string id = !model_.empty() ? model_ : fs::path(scenarios_file_).filename().string();
  if (model_dir_.empty()) golden_cli::require_model(golden_dir, id);
  const fs::path scenarios = scenarios_file_.empty() ? golden_cli::scenario_file(golden_dir, id) : fs::path(scenarios_file_);
  const golden::Scenario s = golden_cli::find_scenario(scenarios, id, scenario_);
  std::optional<Golden> teacher;
  if (!teacher_.empty()) teacher = golden::read_golden(teacher_);
  auto backend = harness::make_backend(backend_);
  std::unique_ptr<golden::Model> model;
  std::string sha256;
  if (model_dir_.empty()) {
    const golden::ModelFolder f = golden::ensure_model_folder(golden_dir, id, where_.models_dir);
    model = golden::Model::load(f.dir);
    sha256 = f.sha256;
  } else {  // the user's folder: read, never written
    model = golden::Model::load(model_dir_);
    sha256 = golden::sha256_file(fs::path(model_dir_) / "model.safetensors");
  }
  const Golden g = record_one(*model, id, sha256, s, *backend, teacher ? &*teacher : nullptr);
  // Written even when a sequence ended in an error: the steps before it are the evidence.
  golden::write_golden(out_, g);
  out << out_ << ": " << g.sequences.size() << " sequence(s)";
  std::size_t errors = 0;
  for (const auto& q : g.sequences) {
    out << " [" << q.steps() << " steps, " << q.status << "]";
    errors += q.status == "ok" ? 0u : 1u;
  }
  out << "\n";
  if (errors == 0) return 0;
  out << "ERROR: " << errors << " of " << g.sequences.size() << " sequence(s) of " << id << "." << s.name << " on "
      << backend_ << " ended in an error; the golden holds the steps before it\n";
  return 1;
}

int GoldenCommands::run_diff(std::ostream& out) {
  // Flags first: a bad override is a usage error whatever the files hold.
  const auto max_dlogit = golden_cli::tolerance_flag("--max-dlogit", max_dlogit_);
  const auto max_mean_kld = golden_cli::tolerance_flag("--max-mean-kld", max_mean_kld_);
  const auto min_top1 = golden_cli::tolerance_flag("--min-top1", min_top1_);
  const auto attn_rel = golden_cli::tolerance_flag("--attn-rel", attn_rel_);
  const Golden a = golden::read_golden(diff_files_[0]);
  const Golden b = golden::read_golden(diff_files_[1]);
  const fs::path golden_dir = where_.golden_dir;
  golden::ToleranceChoice tol = golden::scenario_tolerance(a, b, [&](const Golden& g) -> fs::path {
    if (!scenarios_file_.empty()) return scenarios_file_;
    return plain_name(g.get("model")) ? golden_cli::scenario_file(golden_dir, g.get("model")) : fs::path();
  });
  std::string flags;
  const auto apply = [&](const std::optional<double>& v, double& field, const char* flag) {
    if (!v) return;
    field = *v;
    flags += cat(flags.empty() ? "" : ", ", flag);
  };
  apply(max_dlogit, tol.tolerance.max_dlogit, "--max-dlogit");
  apply(max_mean_kld, tol.tolerance.max_mean_kld, "--max-mean-kld");
  apply(min_top1, tol.tolerance.min_top1, "--min-top1");
  apply(attn_rel, tol.tolerance.attn_rel, "--attn-rel");
  if (!flags.empty()) tol.from = cat(flags, " from the command line; the rest ", tol.from);
  auto report = golden::diff_goldens({&a, diff_files_[0]}, {&b, diff_files_[1]}, tol.tolerance);
  report["tolerance_from"] = tol.from;
  if (!html_.empty()) write_report_file(html_, golden::render_diff_html(report));
  out << (json_ ? report.dump(1) + "\n" : golden::diff_text(report));
  return golden::diff_passed(report) ? 0 : 1;
}

}  // namespace kvlab::tools
