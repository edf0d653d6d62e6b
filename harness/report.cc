#include "harness/report.h"

#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <map>
#include <ostream>

#include "core/markup.h"
#include "kvlab/error.h"

#ifndef KVLAB_GIT_COMMIT
#define KVLAB_GIT_COMMIT "unknown"
#endif

namespace kvlab::harness {

namespace {

std::string num(double v) {
  if (!std::isfinite(v)) return "null";  // JSON has no NaN/inf
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}


}  // namespace

const char* build_commit();  // generated at build time (cmake/WriteCommit.cmake)

std::string commit_id() {
  if (const char* env = std::getenv("KVLAB_COMMIT"); env != nullptr && *env != '\0') return env;
  return build_commit();
}

std::string json_escape(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  KVLAB_REQUIRE(!path_.empty(), invalid_argument, "empty output file name");
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path_, ec);
  KVLAB_REQUIRE(!std::filesystem::is_directory(st), io, "cannot write ", path_, ": it is a directory");
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    out_.open(path_, std::ios::binary);
  } else {
    temp_ = cat(path_, ".tmp.", getpid());
    out_.open(temp_, std::ios::binary | std::ios::trunc);
  }
  KVLAB_REQUIRE(out_.is_open() && out_.good(), io, "cannot write ", path_, ": ", std::strerror(errno));
}

OutputFile::~OutputFile() {
  if (!committed_ && !temp_.empty()) {
    out_.close();
    std::remove(temp_.c_str());
  }
}

void OutputFile::flush() {
  out_.flush();
  KVLAB_REQUIRE(out_.good(), io, "cannot write ", path_, ": ", std::strerror(errno));
}

void OutputFile::commit() {
  flush();
  out_.close();
  KVLAB_REQUIRE(!out_.fail(), io, "cannot write ", path_, ": closing failed: ", std::strerror(errno));
  if (!temp_.empty() && std::rename(temp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(temp_.c_str());
    fail(ErrorKind::io, cat("cannot write ", path_, ": rename failed: ", why));
  }
  committed_ = true;
}

JsonlWriter::JsonlWriter(const std::string& path, RunInfo info) : info_(std::move(info)) {
  if (!path.empty()) file_ = std::make_unique<OutputFile>(path);
}

void JsonlWriter::commit() {
  if (file_) file_->commit();
}

void JsonlWriter::write(const CaseResult& r) {
  if (!file_) return;
  std::ostream& out = file_->stream();
  std::string notes = "[";
  for (const std::string& n : r.notes) notes += (notes.size() > 1 ? "," : "") + json_escape(n);
  notes += "]";
  const std::uint64_t seed = [&] {
    try {
      return parse_problem(r.line).seed();
    } catch (const Error&) {
      return std::uint64_t{0};
    }
  }();
  out << "{\"case\":" << json_escape(r.line) << ",\"op\":" << json_escape(r.op)
       << ",\"backend\":" << json_escape(info_.backend) << ",\"target\":" << json_escape(info_.target)
       << ",\"commit\":" << json_escape(info_.commit) << ",\"tier\":" << json_escape(info_.tier)
       << ",\"seed\":" << seed << ",\"status\":" << json_escape(status_name(r.status))
       << ",\"reason\":" << json_escape(r.reason) << ",\"seconds\":" << num(r.seconds) << ",\"metrics\":{"
       << "\"output\":" << json_escape(r.output) << ",\"max_abs_err\":" << num(r.cmp.max_abs_err)
       << ",\"rel_err\":" << num(r.cmp.rel_err) << ",\"nmse\":" << num(r.cmp.nmse)
       << ",\"nmse_max\":" << num(r.cmp.nmse_max) << ",\"precision_nmse_max\":" << num(r.cmp.precision_nmse_max) << ",\"max_ulps\":" << num(static_cast<double>(r.cmp.max_ulps))
       << ",\"budget\":" << num(r.cmp.budget) << ",\"mismatches\":" << r.cmp.mismatches
       << ",\"worst_index\":" << r.cmp.worst_index << ",\"worst\":" << json_escape(r.worst_coords)
       << ",\"backend_value\":" << json_escape(r.cmp.backend_value)
       << ",\"reference_value\":" << json_escape(r.cmp.reference_value) << "},\"notes\":" << notes
       << ",\"shrunk\":" << json_escape(r.shrunk_line) << "}\n";
  file_->flush();
}

void write_junit(const std::string& path, const RunInfo& info, const std::vector<CaseResult>& results,
                 double seconds) {
  OutputFile file(path);
  std::ostream& out = file.stream();
  std::size_t failures = 0, skipped = 0;
  for (const CaseResult& r : results) {
    failures += r.status == Status::failed || r.status == Status::invalid;
    skipped += r.status == Status::skipped || r.status == Status::unimplemented;
  }
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<testsuites name=\"kvlab check\" tests=\"" << results.size() << "\" failures=\"" << failures
      << "\" time=\"" << num(seconds) << "\">\n"
      << "  <testsuite name=\"kvlab check " << escape_markup(info.backend) << " " << escape_markup(info.tier)
      << "\" tests=\"" << results.size() << "\" failures=\"" << failures << "\" skipped=\"" << skipped
      << "\" time=\"" << num(seconds) << "\">\n"
      << "    <properties><property name=\"commit\" value=\"" << escape_markup(info.commit)
      << "\"/><property name=\"target\" value=\"" << escape_markup(info.target) << "\"/></properties>\n";
  for (const CaseResult& r : results) {
    out << "    <testcase classname=\"" << escape_markup(r.op) << "\" name=\"" << escape_markup(r.line) << "\" time=\""
        << num(r.seconds) << "\">";
    if (r.status == Status::failed || r.status == Status::invalid) {
      out << "<failure message=\"" << escape_markup(cat(status_name(r.status), ": ", r.reason)) << "\">"
          << escape_markup(describe(r)) << "</failure>";
    } else if (r.status == Status::skipped || r.status == Status::unimplemented) {
      out << "<skipped message=\"" << escape_markup(cat(status_name(r.status), ": ", r.reason)) << "\"/>";
    }
    out << "</testcase>\n";
  }
  out << "  </testsuite>\n</testsuites>\n";
  file.commit();
}

ProgressLine::ProgressLine(std::ostream& out, Mode mode, std::size_t total)
    : out_(out), mode_(mode), total_(total) {}

void ProgressLine::update(std::size_t done, const CaseResult& last, std::size_t failed) {
  if (mode_ == Mode::off) return;
  char buf[200];
  if (mode_ == Mode::terminal) {
    std::snprintf(buf, sizeof buf, "\r[%5zu/%zu] %-16s %zu failed   ", done, total_, last.op.c_str(), failed);
    out_ << buf << std::flush;
    return;
  }
  if (last.op != op_) {
    if (!op_.empty()) op_done();
    op_ = last.op;
    op_cases_ = op_failed_ = 0;
    op_start_ = std::chrono::steady_clock::now();
  }
  ++op_cases_;
  op_failed_ += failed - failed_;
  failed_ = failed;
  done_ = done;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_line_).count() >= kLogSeconds) {
    last_line_ = now;
    std::snprintf(buf, sizeof buf, "kvlab check: [%zu/%zu] %s, %zu failed so far, %.0f s\n", done, total_,
                  op_.c_str(), failed, std::chrono::duration<double>(now - start_).count());
    out_ << buf << std::flush;
  }
}

void ProgressLine::op_done() {
  char buf[200];
  std::snprintf(buf, sizeof buf, "kvlab check: %s done: %zu cases, %zu failed, %.1f s [%zu/%zu]\n", op_.c_str(),
                op_cases_, op_failed_,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - op_start_).count(), done_, total_);
  out_ << buf << std::flush;
}

void ProgressLine::clear() {
  if (mode_ == Mode::terminal) out_ << "\r" << std::string(60, ' ') << "\r" << std::flush;
}

void ProgressLine::finish() {
  if (mode_ == Mode::log && !op_.empty()) op_done();
  clear();
}

void print_summary(std::ostream& out, const RunInfo& info, const std::vector<CaseResult>& results, double seconds) {
  struct Row {
    std::size_t counts[5] = {0, 0, 0, 0, 0};
    double seconds = 0;
  };
  std::map<std::string, Row> rows;
  Row total;
  for (const CaseResult& r : results) {
    Row& row = rows[r.op];
    ++row.counts[static_cast<int>(r.status)];
    ++total.counts[static_cast<int>(r.status)];
    row.seconds += r.seconds;
  }
  char buf[200];
  std::snprintf(buf, sizeof buf, "%-16s %7s %7s %7s %7s %7s %8s\n", "op", "passed", "skipped", "unimpl", "invalid",
                "failed", "seconds");
  out << buf;
  for (const auto& [op, row] : rows) {
    std::snprintf(buf, sizeof buf, "%-16s %7zu %7zu %7zu %7zu %7zu %8.2f\n", op.c_str(), row.counts[0],
                  row.counts[1], row.counts[2], row.counts[3], row.counts[4], row.seconds);
    out << buf;
  }
  out << "kvlab check: backend " << info.backend << " (" << info.target << "), tier " << info.tier << ", commit "
      << info.commit << ": " << results.size() << " cases, " << total.counts[0] << " passed, " << total.counts[1]
      << " skipped, " << total.counts[2] << " unimplemented, " << total.counts[3] << " invalid, "
      << total.counts[4] << " failed in " << num(seconds) << " s\n";
  // The reference backend runs the oracle's own code: its values are compared with
  // themselves, so its passes say nothing about them (only guard bands, untouched inputs,
  // errors on invalid problems and, with --rerun, determinism are checked).
  if (info.backend == "reference") {
    out << "kvlab check: backend reference is the oracle: a self-comparison, whose passes check guard bands, "
           "inputs, invalid problems and determinism, not values\n";
  }
}

}  // namespace kvlab::harness
