#include "kernels/simd/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kvlab::simd {

namespace {

thread_local bool t_inside_task = false;

// The loop running tasks on this thread (claim_next_task): the pool's counter, or a
// serial loop's next index.
struct TaskLoop {
  std::atomic<std::int64_t>* counter;  // null: a serial loop
  std::int64_t n, threads;
  std::int64_t next;  // claimed (or, serially, the next) index; kUnclaimed: none yet
};
constexpr std::int64_t kUnclaimed = -2;
thread_local TaskLoop* t_loop = nullptr;

// Sets t_loop for the lifetime of a loop, restoring the enclosing one (a nested serial loop).
class LoopScope {
 public:
  explicit LoopScope(TaskLoop* loop) : outer_(t_loop) { t_loop = loop; }
  ~LoopScope() { t_loop = outer_; }
  LoopScope(const LoopScope&) = delete;
  LoopScope& operator=(const LoopScope&) = delete;

 private:
  TaskLoop* outer_;
};

// How long a thread polls before it sleeps on a condition variable: a worker after its
// last task, waiting for the next job; the caller after its last task, waiting for the
// workers to finish theirs. A sleeping thread's vCPU halts, and on this kind of host
// waking it took as long as a whole short task (a 1 MiB cache append), or longer: measured
// with a 2-task job whose second task records when the worker started it
// (docs/benchmarks.md §Measurements behind kernel choices). Polling that long
// costs nothing the kernels need (the pool has one thread per core), and a spinning
// thread yields the core every few microseconds to any other runnable thread.
constexpr auto kPollFor = std::chrono::microseconds(500);

// Polls ready() for up to kPollFor; true when it turned true.
template <class Ready>
bool poll(Ready&& ready) {
  const auto until = std::chrono::steady_clock::now() + kPollFor;
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::yield();
    }
  }
}

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
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    drain();
    // Also wait for every worker that joined this job to leave it, so none can touch
    // task_/n_/next_ of the next job.
    const auto finished = [&] { return done_.load() == n_ && active_.load() == 0; };
    poll(finished);
    std::unique_lock lock(mutex_);
    finished_.wait(lock, finished);
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void drain() {
    t_inside_task = true;
    TaskLoop loop{&next_, n_, static_cast<std::int64_t>(workers_.size()) + 1, kUnclaimed};
    const LoopScope scope(&loop);
    for (std::int64_t i = next_.fetch_add(1); i < n_;) {
      loop.next = kUnclaimed;
      std::exception_ptr error;
      try {
        (*task_)(i);
      } catch (...) {
        error = std::current_exception();
      }
      {
        const std::lock_guard lock(mutex_);
        if (error && !error_) error_ = error;
        if (++done_ == n_) finished_.notify_all();
      }
      i = loop.next != kUnclaimed ? loop.next : next_.fetch_add(1);
    }
    t_inside_task = false;
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      // Changes of generation_ and stop_ are published under mutex_ (so the wait below
      // misses none); the poll only decides whether to sleep first.
      poll([&] { return generation_.load() != seen || stop_.load(); });
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
        if (stop_) return;
        seen = generation_.load();
        if (task_ == nullptr) continue;  // the caller finished that job alone
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
  // Written under mutex_; atomic so that a polling thread may read them without it.
  std::atomic<std::int64_t> done_{0};
  std::atomic<int> active_{0};  // workers inside drain() of the current job
  std::exception_ptr error_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
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
    TaskLoop loop{nullptr, n, 1, 0};
    const LoopScope scope(&loop);
    for (std::int64_t i = 0; i < n; ++i) {
      loop.next = i + 1;
      task(i);
    }
    return;
  }
  pool().run(n, task);
}

std::int64_t claim_next_task() {
  TaskLoop* loop = t_loop;
  if (loop == nullptr) return -1;
  if (loop->next == kUnclaimed) {
    std::int64_t at = loop->counter->load();
    do {
      if (loop->n - at < loop->threads) return -1;
    } while (!loop->counter->compare_exchange_weak(at, at + 1));
    loop->next = at;
  }
  return loop->next < loop->n ? loop->next : -1;
}

}  // namespace kvlab::simd
