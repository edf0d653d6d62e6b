#include "harness/vectors_check.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>

#include "harness/backends.h"
#include "harness/known_divergences.h"
#include "harness/report.h"
#include "kvlab/error.h"

#ifndef KVLAB_VERSION
#define KVLAB_VERSION "unknown"
#endif

namespace kvlab::harness {

namespace {

// A path as a shell word: quoted unless it is plainly safe, so the repro line pastes.
std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("/._-+,:=@").find(c) != std::string_view::npos;
  });
  if (plain) return s;
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string repro_command(const std::string& file, std::size_t k, const std::string& judge) {
  return cat("kvlab check --vectors ", shell_word(file), " --vectors-problem ", k,
             judge == "reference" ? "" : cat(" --backend ", shell_word(judge)));
}

std::string format(const char* fmt, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// One row per output: the problem's index and status on its first row.
void print_rows(std::ostream& out, std::size_t k, const CaseResult& r) {
  char buf[256];
  if (r.outputs.empty()) {
    // The problem line goes to the stream, not the fixed buffer: a long line would be
    // cut there, newline and all.
    std::snprintf(buf, sizeof buf, "%6zu  %-7s  %-14s  ", k, std::string(status_name(r.status)).c_str(), "-");
    out << buf << r.line << "\n";
    return;
  }
  for (std::size_t o = 0; o < r.outputs.size(); ++o) {
    const OutputComparison& oc = r.outputs[o];
    const std::string rel = oc.bit_exact ? (oc.cmp.ok ? "bit-exact" : cat(oc.cmp.mismatches, " differ"))
                                         : format("%.3g", oc.cmp.rel_err);
    const std::string nmse = oc.bit_exact ? "-" : format("%.3g", oc.cmp.nmse);
    std::snprintf(buf, sizeof buf, "%6s  %-7s  %-14s %11s %11s %9llu  ", o == 0 ? std::to_string(k).c_str() : "",
                  o == 0 ? std::string(status_name(r.status)).c_str() : "", oc.name.c_str(), rel.c_str(), nmse.c_str(),
                  static_cast<unsigned long long>(oc.cmp.max_ulps));
    out << buf << (o == 0 ? r.line : std::string()) << "\n";
  }
}

// The worst distances per op over a file's compared problems.
void print_worst(std::ostream& out, const std::vector<CaseResult>& results) {
  struct Worst {
    double rel = 0, nmse = 0;
    std::uint64_t ulps = 0;
  };
  std::map<std::string, Worst> worst;
  for (const CaseResult& r : results) {
    for (const OutputComparison& oc : r.outputs) {
      Worst& w = worst[r.op];
      if (!oc.bit_exact) {
        w.rel = std::max(w.rel, oc.cmp.rel_err);
        w.nmse = std::max(w.nmse, oc.cmp.nmse);
      }
      w.ulps = std::max(w.ulps, oc.cmp.max_ulps);
    }
  }
  for (const auto& [op, w] : worst) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "worst %-16s max|err|/|ref|inf %.3g, NMSE %.3g, max ulps %llu\n", op.c_str(),
                  w.rel, w.nmse, static_cast<unsigned long long>(w.ulps));
    out << buf;
  }
}

}  // namespace

std::string engine_label(const VectorsInfo& info) {
  return cat(info.engine, " ", info.engine_version, " [", info.flavour, "]");
}

CheckSummary run_vectors_check(const VectorsCheckOptions& o, std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  KVLAB_REQUIRE(!o.files.empty(), invalid_argument, "no vectors file given");
  // Every file is validated before anything runs: a bad file fails the command at once.
  std::vector<std::unique_ptr<VectorsFile>> files;
  std::string engines;
  for (const std::string& f : o.files) {
    files.push_back(std::make_unique<VectorsFile>(f));
    const VectorsFile& v = *files.back();
    KVLAB_REQUIRE(!o.problem || *o.problem < v.size(), invalid_argument, "--vectors-problem ", *o.problem,
                  " is not a problem of ", f, " (it has ", v.size(), ")");
    engines += cat(engines.empty() ? "" : ", ", engine_label(v.info()));
  }
  std::unique_ptr<Backend> judge = make_backend(o.judge);
  const RunInfo combined{commit_id(), engines, cat("judged by ", judge->name()), "vectors"};
  JsonlWriter jsonl(o.json_path, combined);
  CheckSummary summary;
  KnownDivergences known(std::vector<std::filesystem::path>(o.known_files.begin(), o.known_files.end()));
  for (std::size_t f = 0; f < files.size(); ++f) {
    const VectorsFile& v = *files[f];
    const std::string engine = engine_label(v.info());
    const auto file_start = std::chrono::steady_clock::now();
    out << "kvlab check --vectors " << o.files[f] << ": " << engine << ", written by " << v.info().writer << ", "
        << v.size() << " problems, judged by " << judge->name() << "\n";
    char head[200];
    std::snprintf(head, sizeof head, "%6s  %-7s  %-14s %11s %11s %9s  %s\n", "k", "status", "output", "max|err|/|ref|",
                  "NMSE", "max ulps", "problem");
    out << head;
    std::vector<CaseResult> results;
    for (std::size_t k = o.problem.value_or(0); k < (o.problem ? *o.problem + 1 : v.size()); ++k) {
      VectorsCase c = v.load(k);
      CaseResult r = run_recorded_case(c.problem, Recorded{std::move(c.inputs), std::move(c.outputs)}, engine, *judge,
                                       o.run);
      r.repro = repro_command(o.files[f], k, o.judge);
      known.apply(c.problem, v.info().engine, r);
      print_rows(out, k, r);
      if (r.status == Status::failed || r.status == Status::invalid) {
        summary.ok = false;
        out << describe(r) << std::flush;
      }
      jsonl.write(r);
      results.push_back(std::move(r));
    }
    print_worst(out, results);
    const RunInfo info{commit_id(), engine, cat("judged by ", judge->name()), cat("vectors ", o.files[f])};
    print_summary(out, info, results,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - file_start).count());
    for (CaseResult& r : results) summary.results.push_back(std::move(r));
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!known.empty()) {
    // Staleness is judged when every problem of the files ran (not one --vectors-problem).
    known.summarize(out, !o.problem);
    if (!o.problem && !known.stale().empty()) summary.ok = false;
  }
  jsonl.commit();
  if (!o.junit_path.empty()) write_junit(o.junit_path, combined, summary.results, summary.seconds);
  return summary;
}

void run_vectors_write(const CheckOptions& o, const std::string& path, std::ostream& out) {
  const CaseSelection cases(o);
  std::unique_ptr<Backend> backend = make_backend(o.backend);
  std::vector<VectorsCase> written;
  std::map<Status, std::size_t> left_out;
  std::uint64_t bytes = 0;
  cases.for_each([&](const Problem& p) {
    Produced made = produce_case(p, *backend, o.run);
    if (made.result.status != Status::passed) {
      ++left_out[made.result.status];
      if (made.result.status == Status::failed) out << describe(made.result);
      return;
    }
    VectorsCase c{p, std::move(made.prep.input_names), {}, std::move(made.prep.inputs), std::move(made.outputs)};
    for (const OutputSlot& s : made.prep.outputs) c.output_names.push_back(s.name);
    for (const auto* list : {&c.inputs, &c.outputs})
      for (const Tensor& t : *list) bytes += t.nbytes();
    // Checked as the vectors grow, so a selection far over the cap stops early.
    KVLAB_REQUIRE(bytes <= kMaxVectorsWriteBytes, invalid_argument, "the selected cases need more than ",
                  kMaxVectorsWriteBytes, " bytes of vectors (at '", p.line(), "'); select fewer or smaller cases");
    KVLAB_REQUIRE(written.size() < kMaxVectorsProblems, invalid_argument, "the selection has more than ",
                  kMaxVectorsProblems, " problems, the most a vectors file holds; select fewer cases");
    written.push_back(std::move(c));
  });
  KVLAB_REQUIRE(!written.empty(), invalid_argument, "no problem to write: the selection has ", cases.size(),
                " cases and none ran");
  const std::string flavour = o.backend == "reference" ? "oracle" : backend->name();
  const VectorsInfo info{"kvlab", KVLAB_VERSION, flavour, cat("kvlab vectors write (commit ", commit_id(), ")")};
  write_vectors(path, info, written);
  out << "kvlab vectors write: " << written.size() << " problems, " << bytes << " bytes of tensors from "
      << backend->name() << " to " << path;
  std::string skipped;
  for (const auto& [status, n] : left_out) skipped += cat(skipped.empty() ? "" : ", ", n, " ", status_name(status));
  out << (skipped.empty() ? "" : cat("; left out ", skipped)) << "\n";
}

}  // namespace kvlab::harness
