#include "kernels/simd/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kvlab::simd {

namespace {

thread_local bool t_inside_task = false;

int threads_from_env() {
  if (const char* env = std::getenv("KVLAB_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n <= 1024) return static_cast<int>(n);
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// One job at a time: the caller publishes it, workers and the caller claim task
// indices from a shared counter, the caller waits until every claimed task finished.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void run(std::int64_t n, const std::function<void(std::int64_t)>& task) {
    const std::lock_guard job_lock(job_mutex_);  // concurrent callers queue up
    {
      const std::lock_guard lock(mutex_);
      task_ = &task;
      n_ = n;
      next_.store(0);
      done_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    // Also wait for every worker that joined this job to leave it, so none can touch
    // task_/n_/next_ of the next job.
    finished_.wait(lock, [&] { return done_ == n_ && active_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void drain() {
    t_inside_task = true;
    for (std::int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
      std::exception_ptr error;
      try {
        (*task_)(i);
      } catch (...) {
        error = std::current_exception();
      }
      const std::lock_guard lock(mutex_);
      if (error && !error_) error_ = error;
      if (++done_ == n_) finished_.notify_all();
    }
    t_inside_task = false;
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || (generation_ != seen && task_ != nullptr); });
        if (stop_) return;
        seen = generation_;
        ++active_;
      }
      drain();
      const std::lock_guard lock(mutex_);
      if (--active_ == 0) finished_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_, mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void(std::int64_t)>* task_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::int64_t done_ = 0;
  int active_ = 0;  // workers inside drain() of the current job
  std::exception_ptr error_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(worker_count());
  return p;
}

}  // namespace

int worker_count() {
  static const int n = threads_from_env();
  return n;
}

void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& task) {
  if (n <= 0) return;
  if (n == 1 || t_inside_task || worker_count() == 1) {
    for (std::int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  pool().run(n, task);
}

}  // namespace kvlab::simd
