#include "harness/check.h"

#include "harness/known_divergences.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <ostream>
#include <iostream>
#include <set>
#include <unordered_set>
#include <unistd.h>

#include "harness/backends.h"
#include "harness/report.h"
#include "kvlab/error.h"

#ifndef KVLAB_CASES_DIR
#define KVLAB_CASES_DIR "harness/cases"
#endif

namespace kvlab::harness {

// KVLAB_CASES_DIR in the environment; else the installed layout beside the running
// binary (<prefix>/bin/kvlab -> <prefix>/share/kvlab/cases); else the source tree's
// harness/cases compiled in, so build-tree binaries need no setup.
std::filesystem::path default_cases_dir() {
  if (const char* env = std::getenv("KVLAB_CASES_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed = exe.parent_path().parent_path() / "share" / "kvlab" / "cases";
    if (std::filesystem::is_directory(installed, ec)) return installed;
  }
  return KVLAB_CASES_DIR;
}

std::vector<std::string> tier_roles(std::string_view tier) {
  if (tier == "smoke") return {"smoke"};
  if (tier == "ci" || tier == "lavapipe") return {"smoke", "ci", "shapes_edges", "shapes_llama_decode", "conformance"};
  if (tier == "full") return {"smoke", "ci", "shapes_edges", "shapes_llama_decode", "conformance", "perf"};
  fail(ErrorKind::invalid_argument, cat("unknown tier '", tier, "' (smoke, ci, lavapipe, full)"));
}

std::vector<std::filesystem::path> tier_files(const std::filesystem::path& op_dir, std::string_view tier) {
  std::vector<std::filesystem::path> files;
  const auto add = [&](const char* role) {
    if (std::filesystem::exists(op_dir / role)) files.push_back(op_dir / role);
  };
  // The lavapipe tier is the ci tier sized for a CPU Vulkan driver (several times slower
  // than native code, and each small dispatch waits on its worker threads): an op whose ci files
  // are too slow there supplies a `lavapipe` file that stands in for ci, edges and decode shapes.
  if (tier == "lavapipe" && std::filesystem::exists(op_dir / "lavapipe")) {
    add("smoke");
    add("lavapipe");
    return files;
  }
  for (const std::string& role : tier_roles(tier)) add(role.c_str());
  return files;
}

Progress progress_from_name(std::string_view name) {
  if (name == "never") return Progress::never;
  if (name == "auto") return Progress::auto_;
  if (name == "always") return Progress::always;
  fail(ErrorKind::invalid_argument, cat("--progress=", name, " is not auto, always or never"));
}

CaseSelection::CaseSelection(const CheckOptions& o) : shard_index_(o.shard_index), shard_count_(o.shard_count) {
  KVLAB_REQUIRE(o.shard_count >= 1 && o.shard_index >= 0 && o.shard_index < o.shard_count, invalid_argument,
                "shard ", o.shard_index, "/", o.shard_count, " is not i/n with 0 <= i < n");
  std::vector<std::filesystem::path> files;
  if (!o.case_files.empty()) {
    for (const std::string& f : o.case_files) files.emplace_back(f);
  } else {
    for (const OpInfo* op : all_ops()) {
      for (std::filesystem::path& f : tier_files(o.cases_dir / op->name(), o.tier)) files.push_back(std::move(f));
    }
  }
  std::set<std::string> op_filter(o.ops.begin(), o.ops.end());
  for (const std::string& name : op_filter) find_op(name);  // unknown op names fail loudly
  std::uint64_t total = 0;
  for (const auto& f : files) {
    for (CaseLine& l : read_case_file(f)) {
      if (!op_filter.empty() && !op_filter.count(l.expansion.op())) continue;
      total = l.expansion.size() > o.max_cases - std::min(total, o.max_cases) ? o.max_cases + 1
                                                                             : total + l.expansion.size();
      KVLAB_REQUIRE(total <= o.max_cases, invalid_argument, "the selected case files expand to more than ",
                    o.max_cases, " cases (at ", l.where, "); raise --max-cases or split the files");
      lines_.push_back(std::move(l));
    }
  }
  for_each([&](const Problem&) { ++size_; });
}

void CaseSelection::for_each(const std::function<void(const Problem&)>& visit) const {
  // Deduplication by a 64-bit hash of the canonical line: at most max_cases hashes are
  // kept, and a collision among a million lines has a probability of ~3e-8.
  std::unordered_set<std::uint64_t> seen;
  std::uint64_t index = 0;
  for (const CaseLine& l : lines_) {
    for (std::uint64_t k = 0; k < l.expansion.size(); ++k) {
      Problem p = l.expansion.at(k);
      if (!seen.insert(std::hash<std::string>{}(p.line())).second) continue;
      if (index++ % static_cast<std::uint64_t>(shard_count_) == static_cast<std::uint64_t>(shard_index_)) visit(p);
    }
  }
}

std::vector<Problem> collect_cases(const CheckOptions& o) {
  const CaseSelection selection(o);
  std::vector<Problem> out;
  selection.for_each([&](const Problem& p) { out.push_back(p); });
  return out;
}

namespace {

// A backend that cannot be created here (no Vulkan device, an ISA this CPU lacks) throws
// Error(unsupported): every case is then UNIMPLEMENTED with that reason — a skip, not a
// failure (harness/backends.h).
std::unique_ptr<Backend> make_backend_or_reason(const std::string& name, std::string& reason) {
  try {
    return make_backend(name);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    reason = e.what();
    return nullptr;
  }
}

CaseResult unavailable(const Problem& p, const std::string& backend, const std::string& reason) {
  CaseResult r;
  r.line = p.line();
  r.op = p.op();
  r.backend = backend;
  r.status = Status::unimplemented;
  r.reason = reason;
  return r;
}

}  // namespace

std::filesystem::path own_register(const std::filesystem::path& cases_dir, const std::string& backend) {
  return cases_dir.parent_path() / "known" / backend.substr(0, backend.find(':'));
}

namespace {

// With several backends, report file `path` is written once per backend: "check.xml" ->
// "check.simd_AVX2.xml" (characters other than letters, digits, '-' and '_' become '_').
std::string lane_path(const std::string& path, const std::string& backend, bool several) {
  if (path.empty() || !several) return path;
  std::string tag;
  for (const char c : backend) tag += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  const std::filesystem::path p(path);
  return (p.parent_path() / cat(p.stem().string(), ".", tag, p.extension().string())).string();
}

// One backend of a run: its results, reports and known divergences.
struct Lane {
  std::string name;
  std::unique_ptr<Backend> backend;  // null: unavailable here, for `unavailable`
  std::string unavailable;
  RunInfo info;
  std::unique_ptr<JsonlWriter> jsonl;
  std::unique_ptr<KnownDivergences> known;
  std::vector<CaseResult> results;
  bool ok = true;
};

}  // namespace

CheckSummary run_check(const CheckOptions& o, std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  const CaseSelection cases(o);
  KVLAB_REQUIRE(cases.size() > 0 || o.allow_empty, invalid_argument,
                "no case selected (tier ", o.tier, o.case_files.empty() ? "" : ", --cases files",
                o.ops.empty() ? "" : ", --op filter", o.shard_count > 1 ? ", shard" : "",
                "); pass --allow-empty if that is expected");
  std::vector<std::string> names{o.backend};
  names.insert(names.end(), o.more_backends.begin(), o.more_backends.end());
  for (const std::string& name : names) {
    KVLAB_REQUIRE(std::count(names.begin(), names.end(), name) == 1, invalid_argument, "backend '", name,
                  "' is named twice");
  }
  const bool several = names.size() > 1;
  std::vector<Lane> lanes(names.size());
  std::vector<Backend*> available;
  std::vector<std::size_t> available_lane;
  for (std::size_t i = 0; i < names.size(); ++i) {
    Lane& l = lanes[i];
    l.name = names[i];
    l.info = {commit_id(), l.name, backend_target(l.name), o.case_files.empty() ? o.tier : "files"};
    l.backend = make_backend_or_reason(l.name, l.unavailable);
    if (!l.backend) {
      out << "kvlab check: backend " << l.name << " is unavailable here: " << l.unavailable
          << (o.allow_unavailable ? " (every case UNIMPLEMENTED; --allow-unavailable)\n"
                                  : " (a failure; --allow-unavailable makes it a skip)\n");
      l.ok = o.allow_unavailable;
    } else {
      available.push_back(l.backend.get());
      available_lane.push_back(i);
    }
    l.jsonl = std::make_unique<JsonlWriter>(lane_path(o.json_path, l.name, several), l.info);
    std::vector<std::filesystem::path> known(o.known_files.begin(), o.known_files.end());
    if (o.own_registers && std::filesystem::is_regular_file(own_register(o.cases_dir, l.name))) {
      known.push_back(own_register(o.cases_dir, l.name));
    }
    l.known = std::make_unique<KnownDivergences>(known);
  }
  std::unique_ptr<Backend> reference = make_backend("reference");
  const bool terminal = isatty(STDERR_FILENO) != 0;
  ProgressLine progress(std::cerr, o.progress == Progress::never ? ProgressLine::Mode::off
                                   : o.progress == Progress::auto_ && terminal ? ProgressLine::Mode::terminal
                                                                               : ProgressLine::Mode::log,
                        cases.size());
  std::size_t failed = 0, done = 0;
  cases.for_each([&](const Problem& p) {
    std::vector<CaseResult> ran = run_case_on_each(p, available, *reference, o.run);
    std::vector<CaseResult> by_lane(lanes.size());
    for (std::size_t k = 0; k < ran.size(); ++k) by_lane[available_lane[k]] = std::move(ran[k]);
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      Lane& l = lanes[i];
      CaseResult r = l.backend ? std::move(by_lane[i]) : unavailable(p, l.name, l.unavailable);
      if (l.backend) l.known->apply(p, l.name, r);
      if (r.status == Status::failed && o.shrink) {
        const ShrinkResult s = shrink(p, *l.backend, *reference, o.run);
        if (s.smallest.line() != r.line) r.shrunk_line = s.smallest.line();
        r.shrink_trials = s.trials;
      }
      if (r.status == Status::failed || r.status == Status::invalid) {
        ++failed;
        l.ok = false;
        progress.clear();
        out << describe(r) << std::flush;
      }
      l.jsonl->write(r);
      // The per-output comparisons serve the vectors report; a run of 10^5 cases keeps only
      // the worst output's, as before.
      r.outputs = {};
      l.results.push_back(std::move(r));
    }
    progress.update(++done, lanes.front().results.back(), failed);
  });
  progress.finish();
  CheckSummary summary;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Staleness is judged over a whole tier only: a selection of files or ops may hold
  // just the cases of an entry's domain that never diverged.
  const bool whole_tier = o.case_files.empty() && o.ops.empty() && o.shard_count == 1;
  for (Lane& l : lanes) {
    print_summary(out, l.info, l.results, summary.seconds);
    if (!l.known->empty()) {
      l.known->summarize(out, whole_tier);
      if (whole_tier && !l.known->stale().empty()) l.ok = false;
    }
  }
  for (Lane& l : lanes) {
    l.jsonl->commit();
    if (!o.junit_path.empty()) write_junit(lane_path(o.junit_path, l.name, several), l.info, l.results, summary.seconds);
    summary.ok = summary.ok && l.ok;
    if (summary.unavailable.empty()) summary.unavailable = l.unavailable;
    summary.results.insert(summary.results.end(), std::make_move_iterator(l.results.begin()),
                           std::make_move_iterator(l.results.end()));
  }
  return summary;
}

bool run_repro(std::string_view line, const std::string& backend_name, bool shrink_failures, const RunOptions& run,
               std::ostream& out, bool allow_unavailable) {
  const std::vector<Problem> problems = expand_line(line);
  std::string reason;
  std::unique_ptr<Backend> backend = make_backend_or_reason(backend_name, reason);
  if (!backend) {
    out << "kvlab repro: backend " << backend_name << " is unavailable here: " << reason << "\n";
    return allow_unavailable;
  }
  std::unique_ptr<Backend> reference = make_backend("reference");
  bool ok = true;
  for (const Problem& p : problems) {
    CaseResult r = run_case(p, *backend, *reference, run);
    if (r.status == Status::failed && shrink_failures) {
      const ShrinkResult s = shrink(p, *backend, *reference, run);
      if (s.smallest.line() != r.line) r.shrunk_line = s.smallest.line();
      r.shrink_trials = s.trials;
    }
    ok = ok && r.status != Status::failed && r.status != Status::invalid;
    out << describe(r);
    // describe() prints metrics only for failures' worst element; repro always shows them.
    if (r.status == Status::passed) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "  metrics:  output %s, max|err| %.3g, max|err|/|ref|inf %.3g, NMSE %.3g, budget %.3g, %.3f s\n",
                    r.output.c_str(), r.cmp.max_abs_err, r.cmp.rel_err, r.cmp.nmse, r.cmp.budget, r.seconds);
      out << buf;
    }
  }
  return ok;
}

}  // namespace kvlab::harness
