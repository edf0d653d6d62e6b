// Reporters of `kvlab check`: a console progress line and summary, JSON Lines (one
// record per case × backend, written as each case finishes so a crash keeps what ran)
// and JUnit XML (for CI dashboards).
#pragma once

#include <fstream>
#include <iosfwd>
#include <string>
#include <vector>

#include "harness/spine.h"

namespace kvlab::harness {

struct RunInfo {
  std::string commit;   // KVLAB_COMMIT from the environment, else HEAD at build time (git describe --dirty)
  std::string backend;  // as requested ("reference", "simd:AVX3")
  std::string target;   // device / ISA description
  std::string tier;
};

std::string commit_id();
std::string json_escape(std::string_view s);

class JsonlWriter {
 public:
  JsonlWriter(const std::string& path, RunInfo info);  // empty path: disabled
  void write(const CaseResult& r);

 private:
  std::ofstream out_;
  RunInfo info_;
};

void write_junit(const std::string& path, const RunInfo& info, const std::vector<CaseResult>& results,
                 double seconds);

// "\r[ 12/340] sdpa        3 failed" on a terminal; nothing otherwise (logs stay clean).
class ProgressLine {
 public:
  ProgressLine(std::ostream& out, bool enabled, std::size_t total);
  void update(std::size_t done, const CaseResult& last, std::size_t failed);
  void clear();

 private:
  std::ostream& out_;
  bool enabled_;
  std::size_t total_;
};

// Per-op table of statuses and time, then the totals line.
void print_summary(std::ostream& out, const RunInfo& info, const std::vector<CaseResult>& results, double seconds);

}  // namespace kvlab::harness
