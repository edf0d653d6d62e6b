#include "harness/check.h"

#include <chrono>
#include <cstdio>
#include <ostream>
#include <set>
#include <unistd.h>

#include "harness/backends.h"
#include "harness/report.h"
#include "kvlab/error.h"

#ifndef KVLAB_CASES_DIR
#define KVLAB_CASES_DIR "harness/cases"
#endif

namespace kvlab::harness {

std::filesystem::path default_cases_dir() { return KVLAB_CASES_DIR; }

std::vector<std::string> tier_roles(std::string_view tier) {
  if (tier == "smoke") return {"smoke"};
  if (tier == "ci" || tier == "lavapipe") return {"smoke", "ci", "shapes_edges", "shapes_llama_decode"};
  if (tier == "full") return {"smoke", "ci", "shapes_edges", "shapes_llama_decode", "perf"};
  fail(ErrorKind::invalid_argument, cat("unknown tier '", tier, "' (smoke, ci, lavapipe, full)"));
}

std::vector<std::filesystem::path> tier_files(const std::filesystem::path& op_dir, std::string_view tier) {
  std::vector<std::filesystem::path> files;
  const auto add = [&](const char* role) {
    if (std::filesystem::exists(op_dir / role)) files.push_back(op_dir / role);
  };
  // The lavapipe tier is the ci tier sized for a CPU Vulkan driver (~4x slower than native
  // code, and each small dispatch waits on its worker threads): an op whose ci files are
  // too slow there supplies a `lavapipe` file that stands in for ci, edges and decode shapes.
  if (tier == "lavapipe" && std::filesystem::exists(op_dir / "lavapipe")) {
    add("smoke");
    add("lavapipe");
    return files;
  }
  for (const std::string& role : tier_roles(tier)) add(role.c_str());
  return files;
}

std::vector<Problem> collect_cases(const CheckOptions& o) {
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
  std::vector<Problem> all;
  std::set<std::string> seen;
  for (const auto& f : files) {
    for (Problem& p : load_case_file(f)) {
      if (!op_filter.empty() && !op_filter.count(p.op())) continue;
      if (seen.insert(p.line()).second) all.push_back(std::move(p));
    }
  }
  std::vector<Problem> shard;
  for (std::size_t k = 0; k < all.size(); ++k) {
    if (static_cast<int>(k % static_cast<std::size_t>(o.shard_count)) == o.shard_index) shard.push_back(all[k]);
  }
  return shard;
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

CheckSummary run_check(const CheckOptions& o, std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Problem> cases = collect_cases(o);
  RunInfo info{commit_id(), o.backend, backend_target(o.backend), o.case_files.empty() ? o.tier : "files"};
  std::string unavailable_reason;
  std::unique_ptr<Backend> backend = make_backend_or_reason(o.backend, unavailable_reason);
  std::unique_ptr<Backend> reference = make_backend("reference");
  JsonlWriter jsonl(o.json_path, info);
  ProgressLine progress(std::cerr, o.progress && isatty(STDERR_FILENO), cases.size());
  CheckSummary summary;
  std::size_t failed = 0;
  for (const Problem& p : cases) {
    CaseResult r = backend ? run_case(p, *backend, *reference, o.run) : unavailable(p, o.backend, unavailable_reason);
    if (r.status == Status::failed && o.shrink) {
      const ShrinkResult s = shrink(p, *backend, *reference, o.run);
      if (s.smallest.line() != r.line) r.shrunk_line = s.smallest.line();
      r.shrink_trials = s.trials;
    }
    if (r.status == Status::failed || r.status == Status::invalid) {
      ++failed;
      summary.ok = false;
      progress.clear();
      out << describe(r);
    }
    jsonl.write(r);
    summary.results.push_back(std::move(r));
    progress.update(summary.results.size(), summary.results.back(), failed);
  }
  progress.clear();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.junit_path.empty()) write_junit(o.junit_path, info, summary.results, summary.seconds);
  print_summary(out, info, summary.results, summary.seconds);
  return summary;
}

bool run_repro(std::string_view line, const std::string& backend_name, bool shrink_failures, const RunOptions& run,
               std::ostream& out) {
  std::unique_ptr<Backend> backend = make_backend(backend_name);
  std::unique_ptr<Backend> reference = make_backend("reference");
  bool ok = true;
  for (const Problem& p : expand_line(line)) {
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
