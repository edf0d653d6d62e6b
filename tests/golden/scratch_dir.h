// A per-process scratch directory for the golden tests that write files.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "kvlab/error.h"

namespace kvlab::golden::test {

// <tmp>/<prefix><pid>: created on first use and removed, with everything in it, when the
// process exits. Per process because ctest runs a test binary's cases side by side; removed
// because each run used to leave its directory behind in /tmp. The prefix of the first call
// names it for the whole process.
inline const std::filesystem::path& process_scratch_dir(const char* prefix) {
  static const struct Scratch {
    std::filesystem::path dir;
    explicit Scratch(const char* p) : dir(std::filesystem::temp_directory_path() / cat(p, ::getpid())) {
      std::filesystem::create_directories(dir);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() {
      std::error_code ignored;  // nothing to report from a destructor at exit
      std::filesystem::remove_all(dir, ignored);
    }
  } scratch(prefix);
  return scratch.dir;
}

}  // namespace kvlab::golden::test
