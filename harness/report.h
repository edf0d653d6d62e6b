// Reporters of `kvlab check`: a console progress line and summary, JSON Lines (one
// record per case × backend, written as each case finishes so a crash keeps what ran)
// and JUnit XML (for CI dashboards).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
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

// A report file written under a temporary name beside the target and renamed over it by
// commit(), so a reader never sees half a report and a failed run leaves the old one. A
// target that exists and is not a regular file (/dev/null, /dev/full, a FIFO) is written
// in place. Opening, writing, flushing, closing and renaming are all checked: any
// failure is Error{io} naming the path. Without commit() the temporary is removed.
class OutputFile {
 public:
  explicit OutputFile(std::string path);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();
  std::ostream& stream() { return out_; }
  void flush();   // throws Error{io} when the bytes written so far could not be written
  void commit();

 private:
  std::string path_, temp_;  // temp_ empty: written in place
  std::ofstream out_;
  bool committed_ = false;
};

class JsonlWriter {
 public:
  JsonlWriter(const std::string& path, RunInfo info);  // empty path: disabled
  void write(const CaseResult& r);  // flushed per case: a crash keeps what ran (in the temporary)
  void commit();

 private:
  std::unique_ptr<OutputFile> file_;
  RunInfo info_;
};

void write_junit(const std::string& path, const RunInfo& info, const std::vector<CaseResult>& results,
                 double seconds);

// Progress of a run on stderr. terminal: "\r[ 12/340] sdpa        3 failed" rewritten in
// place; log (CI logs, files): a line every kLogSeconds with op, done/total, failed so far
// and elapsed time, and one line per finished op; off: nothing.
class ProgressLine {
 public:
  enum class Mode : std::uint8_t { off, terminal, log };
  static constexpr double kLogSeconds = 5;
  ProgressLine(std::ostream& out, Mode mode, std::size_t total);
  void update(std::size_t done, const CaseResult& last, std::size_t failed);
  void clear();   // before other output (terminal mode)
  void finish();  // the last op's line (log mode), or clear

 private:
  void op_done();
  std::ostream& out_;
  Mode mode_;
  std::size_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_line_ = start_;
  std::string op_;
  std::size_t op_cases_ = 0, op_failed_ = 0, failed_ = 0, done_ = 0;
  std::chrono::steady_clock::time_point op_start_ = start_;
};

// Per-op table of statuses and time, then the totals line.
void print_summary(std::ostream& out, const RunInfo& info, const std::vector<CaseResult>& results, double seconds);

}  // namespace kvlab::harness
