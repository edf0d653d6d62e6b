// `kvlab golden check` and `kvlab golden update`: every selected checked-in golden
// re-recorded on a backend and diffed with the checked-in file; check judges failures
// against the backend's register (golden/known/<backend>), update rewrites what moved.
#include <unistd.h>

#include <fstream>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "golden/files/diff.h"
#include "golden/html/html_report.h"
#include "golden/files/known_goldens.h"
#include "golden/model/model_folder.h"
#include "golden/runner/runner.h"
#include "harness/backends.h"
#include "kvlab/error.h"
#include "tools/kvlab/golden_commands.h"
#include "tools/kvlab/golden_select.h"

namespace kvlab::tools {
namespace {

namespace fs = std::filesystem;
using golden::Golden;

fs::path checked_in_golden(const fs::path& golden_dir, const std::string& model, const std::string& scenario) {
  return golden_dir / "data" / cat(model, ".", scenario, ".kvlab.safetensors");
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  KVLAB_REQUIRE(out, io, "cannot write '", path.string(), "'");
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

// What a register entry's raise~= searches: the reasons and the first divergence.
std::string finding_of(const nlohmann::json& report) {
  std::string out;
  for (const auto& r : report.at("reasons")) out += (out.empty() ? "" : " | ") + r.get<std::string>();
  return out + " | " + golden::diff_line(report);
}

bool any_error(const Golden& g) {
  for (const auto& s : g.sequences)
    if (s.status != "ok") return true;
  return false;
}

}  // namespace

Golden GoldenCommands::record_one(const golden::Model& model, const std::string& id, const std::string& sha256,
                                  const golden::Scenario& s, Backend& backend, const Golden* teacher) const {
  golden::RunContext ctx;
  ctx.backend = &backend;
  ctx.backend_name = backend_;
  ctx.model_id = id;
  ctx.model_sha256 = sha256;
  ctx.teacher = teacher;
  ctx.scratch = fs::temp_directory_path() / cat("kvlab-golden-", ::getpid());
  Golden g = golden::run_scenario(model, s, ctx);
  std::error_code ignored;
  fs::remove_all(ctx.scratch, ignored);
  return g;
}

int GoldenCommands::run_check_or_update(std::ostream& out) {
  const fs::path golden_dir = where_.golden_dir, models_dir = where_.models_dir;
  const bool checking = check_->parsed();
  // Names first: a typo is an error before any backend starts or model is written.
  const golden_cli::Selection selection = golden_cli::select(golden_dir, models_filter_, scenarios_filter_, allow_empty_);
  std::unique_ptr<Backend> backend;
  try {
    backend = harness::make_backend(backend_);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    out << "SKIPPED: backend " << backend_ << " is unavailable here: " << e.message() << "\n";
    return 0;
  }
  const fs::path register_file = golden_dir / "known" / backend_.substr(0, backend_.find(':'));
  std::error_code ec;
  golden::KnownGoldens known;
  if (checking && fs::exists(register_file, ec)) known = golden::KnownGoldens(register_file);
  int moved = 0, total = 0, explained = 0, errored = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [id, scenarios] : selection) {
    if (scenarios.empty()) continue;
    const golden::ModelFolder folder = golden::ensure_model_folder(golden_dir, id, models_dir);
    const auto model = golden::Model::load(folder.dir);
    for (const auto& s : scenarios) {
      const fs::path path = checked_in_golden(golden_dir, id, s.name);
      const bool exists = fs::exists(path, ec);
      ++total;
      if (checking && !exists) {
        out << "FAIL " << id << "." << s.name << ": no golden " << path.string()
            << " (record it with `kvlab golden update --accept`)\n";
        ++moved;
        continue;
      }
      const Golden now = record_one(*model, id, folder.sha256, s, *backend, nullptr);
      nlohmann::json report;
      if (exists) {
        const Golden old = golden::read_golden(path);
        report = golden::diff_goldens({&old, path.string()}, {&now, cat(backend_, " run")}, s.tolerance);
        rows.push_back(summary_row(id, s.name, backend_, report));
      }
      const bool same = exists && golden::diff_passed(report);
      const golden::KnownGolden* why =
          checking ? known.judge(backend_, id, s.name, !same, finding_of(report)) : nullptr;
      const char* head = same ? "ok   " : why != nullptr ? "KNOWN " : checking ? "FAIL " : "MOVED ";
      out << head << id << "." << s.name << " [" << backend_ << "] "
          << (exists ? golden::diff_line(report) : std::string("new golden")) << "\n";
      if (why != nullptr) {
        out << "     known divergence (" << why->klass << ", " << why->where << "): " << why->note << "\n";
        ++explained;
        continue;
      }
      if (!same) ++moved;
      if (!same && checking && !report_dir_.empty()) {
        fs::create_directories(report_dir_);
        const fs::path base = fs::path(report_dir_) / cat(id, ".", s.name, ".", backend_);
        golden::write_golden(base.string() + ".safetensors", now);
        write_text_file(base.string() + ".json", report.dump(1));
        write_text_file(base.string() + ".html", golden::render_diff_html(report));
        out << "     report: " << base.string() << ".{safetensors,json,html}\n";
      }
      if (!checking && !same && any_error(now)) {
        // A run that ended in an error is no new truth: it is never written.
        out << "     not rewritten: the run ended in an error\n";
        ++errored;
        continue;
      }
      if (!checking && !same && accept_) golden::write_golden(path, now);
    }
  }
  if (!summary_json_.empty()) write_text_file(summary_json_, rows.dump(1));
  if (checking) {
    const auto stale = known.stale();
    for (const golden::KnownGolden* e : stale)
      out << "STALE register entry " << e->where << ": its goldens ran and none failed as it says: " << e->note << "\n";
    out << (total - moved - explained) << " of " << total << " goldens within tolerance on " << backend_;
    if (explained > 0) out << ", " << explained << " known divergence(s) (" << register_file.string() << ")";
    out << "\n";
    return moved == 0 && stale.empty() ? 0 : 1;
  }
  out << moved << " of " << total << " goldens moved"
      << (accept_ && moved > errored ? " and were rewritten" : moved ? "; rerun with --accept to rewrite them" : "");
  if (errored > 0) out << " (" << errored << " ended in an error and stay as they were)";
  out << "\n";
  return (moved > 0 && !accept_) || errored > 0 ? 1 : 0;
}

}  // namespace kvlab::tools
