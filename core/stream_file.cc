#include "core/stream_file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "kvlab/error.h"

namespace kvlab {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

struct stat stat_or_fail(const std::filesystem::path& path, std::string_view noun) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    fail(ErrorKind::io, cat("cannot open ", noun, " '", path.string(), "': ", std::strerror(err)));
  }
  return st;
}

}  // namespace

void require_regular_file(const std::filesystem::path& path, std::string_view noun) {
  const struct stat st = stat_or_fail(path, noun);
  if (!S_ISREG(st.st_mode))
    fail(ErrorKind::io, cat(noun, " '", path.string(), "' is not a regular file (it is ", kind_of(st.st_mode), ")"));
}

InputKind input_kind(const std::filesystem::path& path, const std::string& noun) {
  const struct stat st = stat_or_fail(path, noun);
  if (S_ISREG(st.st_mode)) return InputKind::regular;
  if (S_ISFIFO(st.st_mode)) return InputKind::fifo;
  fail(ErrorKind::io, cat(noun, " '", path.string(), "' is ", kind_of(st.st_mode), ", not a regular file or a FIFO"));
}

std::string read_fifo(const std::filesystem::path& path, const std::string& noun, std::uint64_t max_bytes,
                      double wait_seconds) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(ErrorKind::io, cat("cannot read ", noun, " '", path.string(), "': ", std::strerror(errno)));
  std::string out;
  char buf[65536];
  bool heard = false;  // a writer has sent bytes: from then on, EOF means it closed
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  while (out.size() <= max_bytes) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      heard = true;
      out.append(buf, static_cast<std::size_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(n), max_bytes + 1 - out.size())));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) {
      const int err = errno;
      ::close(fd);
      fail(ErrorKind::io, cat("cannot read ", noun, " '", path.string(), "': ", std::strerror(err)));
    }
    if (n == 0 && heard) break;  // the writer closed
    // No bytes yet: before any writer opened (read gives 0) or between writes (EAGAIN).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!heard && left.count() <= 0) {
      ::close(fd);
      fail(ErrorKind::io, cat(noun, " '", path.string(), "' is a FIFO that nothing wrote to within ", wait_seconds, " s"));
    }
    pollfd p{fd, POLLIN, 0};
    (void)::poll(&p, 1, heard ? 1000 : static_cast<int>(std::min<long long>(left.count(), 50)));
  }
  ::close(fd);
  return out;
}

}  // namespace kvlab
