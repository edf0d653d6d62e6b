#include "harness/report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <ostream>

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

std::string xml_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
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

JsonlWriter::JsonlWriter(const std::string& path, RunInfo info) : info_(std::move(info)) {
  if (path.empty()) return;
  out_.open(path, std::ios::trunc);
  KVLAB_REQUIRE(out_.good(), io, "cannot write JSON Lines file ", path);
}

void JsonlWriter::write(const CaseResult& r) {
  if (!out_.is_open()) return;
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
  out_ << "{\"case\":" << json_escape(r.line) << ",\"op\":" << json_escape(r.op)
       << ",\"backend\":" << json_escape(info_.backend) << ",\"target\":" << json_escape(info_.target)
       << ",\"commit\":" << json_escape(info_.commit) << ",\"tier\":" << json_escape(info_.tier)
       << ",\"seed\":" << seed << ",\"status\":" << json_escape(status_name(r.status))
       << ",\"reason\":" << json_escape(r.reason) << ",\"seconds\":" << num(r.seconds) << ",\"metrics\":{"
       << "\"output\":" << json_escape(r.output) << ",\"max_abs_err\":" << num(r.cmp.max_abs_err)
       << ",\"rel_err\":" << num(r.cmp.rel_err) << ",\"nmse\":" << num(r.cmp.nmse)
       << ",\"budget\":" << num(r.cmp.budget) << ",\"mismatches\":" << r.cmp.mismatches
       << ",\"worst_index\":" << r.cmp.worst_index << ",\"worst\":" << json_escape(r.worst_coords)
       << ",\"backend_value\":" << json_escape(r.cmp.backend_value)
       << ",\"reference_value\":" << json_escape(r.cmp.reference_value) << "},\"notes\":" << notes
       << ",\"shrunk\":" << json_escape(r.shrunk_line) << "}\n";
  out_.flush();
}

void write_junit(const std::string& path, const RunInfo& info, const std::vector<CaseResult>& results,
                 double seconds) {
  std::ofstream out(path, std::ios::trunc);
  KVLAB_REQUIRE(out.good(), io, "cannot write JUnit file ", path);
  std::size_t failures = 0, skipped = 0;
  for (const CaseResult& r : results) {
    failures += r.status == Status::failed || r.status == Status::invalid;
    skipped += r.status == Status::skipped || r.status == Status::unimplemented;
  }
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<testsuites name=\"kvlab check\" tests=\"" << results.size() << "\" failures=\"" << failures
      << "\" time=\"" << num(seconds) << "\">\n"
      << "  <testsuite name=\"kvlab check " << xml_escape(info.backend) << " " << xml_escape(info.tier)
      << "\" tests=\"" << results.size() << "\" failures=\"" << failures << "\" skipped=\"" << skipped
      << "\" time=\"" << num(seconds) << "\">\n"
      << "    <properties><property name=\"commit\" value=\"" << xml_escape(info.commit)
      << "\"/><property name=\"target\" value=\"" << xml_escape(info.target) << "\"/></properties>\n";
  for (const CaseResult& r : results) {
    out << "    <testcase classname=\"" << xml_escape(r.op) << "\" name=\"" << xml_escape(r.line) << "\" time=\""
        << num(r.seconds) << "\">";
    if (r.status == Status::failed || r.status == Status::invalid) {
      out << "<failure message=\"" << xml_escape(cat(status_name(r.status), ": ", r.reason)) << "\">"
          << xml_escape(describe(r)) << "</failure>";
    } else if (r.status == Status::skipped || r.status == Status::unimplemented) {
      out << "<skipped message=\"" << xml_escape(cat(status_name(r.status), ": ", r.reason)) << "\"/>";
    }
    out << "</testcase>\n";
  }
  out << "  </testsuite>\n</testsuites>\n";
}

ProgressLine::ProgressLine(std::ostream& out, bool enabled, std::size_t total)
    : out_(out), enabled_(enabled), total_(total) {}

void ProgressLine::update(std::size_t done, const CaseResult& last, std::size_t failed) {
  if (!enabled_) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "\r[%5zu/%zu] %-16s %zu failed   ", done, total_, last.op.c_str(), failed);
  out_ << buf << std::flush;
}

void ProgressLine::clear() {
  if (enabled_) out_ << "\r" << std::string(60, ' ') << "\r" << std::flush;
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
}

}  // namespace kvlab::harness
