#include "harness/isolated_call.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "kvlab/error.h"

namespace kvlab {
namespace {

class SharedHostBuffer final : public Buffer {
 public:
  explicit SharedHostBuffer(std::size_t bytes) : size_(bytes), mapped_(bytes == 0 ? 1 : bytes) {
    void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<std::byte*>(p);
  }
  ~SharedHostBuffer() override { ::munmap(data_, mapped_); }
  SharedHostBuffer(const SharedHostBuffer&) = delete;
  SharedHostBuffer& operator=(const SharedHostBuffer&) = delete;
  std::size_t size() const override { return size_; }
  std::byte* host_data() override { return data_; }

 private:
  std::size_t size_, mapped_;
  std::byte* data_ = nullptr;
};

// The child's whole answer: status, then the message. Written once, before _exit.
void child_main(int fd, const std::function<std::int32_t(char*, std::size_t)>& body, std::size_t cap) {
  std::vector<char> out(sizeof(std::int32_t) + cap, '\0');
  const std::int32_t status = body(out.data() + sizeof status, cap);
  std::memcpy(out.data(), &status, sizeof status);
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);
    done += static_cast<std::size_t>(n);
  }
  ::_exit(0);
}

std::string signal_text(int sig) {
  const char* name = ::strsignal(sig);
  return cat("signal ", sig, " (", name != nullptr ? name : "unknown", ")");
}

}  // namespace

BufferPtr make_shared_host_buffer(std::size_t bytes) { return std::make_shared<SharedHostBuffer>(bytes); }

std::int32_t run_isolated(const std::function<std::int32_t(char*, std::size_t)>& body, char* msg, std::size_t cap,
                          double timeout_seconds, const std::string& what) {
  int fds[2];
  KVLAB_REQUIRE(::pipe2(fds, O_CLOEXEC) == 0, device, what, ": cannot create a pipe for the child: ", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail(ErrorKind::device, cat(what, ": cannot fork the child that runs it: ", std::strerror(err)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], body, cap);
  }
  ::close(fds[1]);
  std::vector<char> in(sizeof(std::int32_t) + cap);
  std::size_t got = 0;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = ::read(fds[0], in.data() + got, in.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child answered or died
    got += static_cast<std::size_t>(n);
    if (got == in.size()) break;
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    fail(ErrorKind::device, cat(what, " did not return within ", timeout_seconds, " s (hung; the child was killed)"));
  if (WIFSIGNALED(wstatus)) fail(ErrorKind::device, cat(what, " crashed: ", signal_text(WTERMSIG(wstatus))));
  if (got != in.size() || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
    fail(ErrorKind::device, cat(what, " crashed: its process exited with status ",
                                WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1, " without returning"));
  std::int32_t status = 0;
  std::memcpy(&status, in.data(), sizeof status);
  std::memcpy(msg, in.data() + sizeof status, cap);
  return status;
}

}  // namespace kvlab
