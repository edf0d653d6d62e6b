// Shared bits of the libFuzzer targets (fuzz/README.md).
//
// The contract every target enforces: kvlab::Error is the expected answer to bad input
// and is caught by the target; a property that does not hold calls check() and aborts,
// which libFuzzer reports as a crash. Anything else escaping (std::bad_alloc, another
// exception, a sanitizer report, a leak) is a bug as well.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace kvlab::fuzz {

// Aborts with the property's name when it does not hold (the fuzzer's crash signal);
// always on, NDEBUG or not.
#define KVLAB_FUZZ_CHECK(cond)                                                        \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (false)

// A file of this process for the APIs that read and write paths. It lives in /dev/shm
// (RAM, so millions of runs never touch a disk) when there is one, and its name carries
// the pid so parallel fuzzers (-jobs, ctest -j) never share it.
class ScratchFile {
 public:
  explicit ScratchFile(std::string_view tag) {
    const std::filesystem::path dir =
        std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                  : std::filesystem::temp_directory_path();
    path_ = dir / ("kvlab-fuzz-" + std::to_string(::getpid()) + "-" + std::string(tag));
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }

  void write(std::string_view bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) std::abort();  // the harness of the target failed, not the code under test
  }

  std::string read() const {
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

 private:
  std::filesystem::path path_;
};

}  // namespace kvlab::fuzz
