// The SIMD worker pool (kernels/simd/parallel.h): every task index runs exactly once per
// call, errors reach the caller, and no job is lost between the pool's two ways of
// waiting (threads poll for a while after a job, then sleep on a condition variable):
// calls back to back, calls after idle gaps longer than the poll, and callers on several
// threads at once. A lost wake-up shows as a hang, which the test's CTest timeout turns
// into a failure. A task may claim the one its thread runs next (claim_next_task): that
// index then runs next on the same thread, once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/simd/parallel.h"

namespace kvlab::simd {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_parallel {
namespace {

// Runs n tasks and checks that each index ran once.
void expect_each_index_once(std::int64_t n) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
  parallel_for(n, [&](std::int64_t i) { runs[static_cast<std::size_t>(i)].fetch_add(1); });
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "task " << i << " of " << n;
}

TEST(SimdPool, EveryTaskRunsOnceBackToBack) {
  for (std::int64_t n : {1, 2, 3, 7, 64, 1000})
    for (int rep = 0; rep < 200; ++rep) expect_each_index_once(n);
}

TEST(SimdPool, JobsAfterIdleGapsLongerThanThePoll) {
  // Gaps from well inside the poll to well past it: the workers are caught polling,
  // falling asleep, and asleep.
  for (int gap_us : {0, 100, 400, 600, 2000, 10000}) {
    for (int rep = 0; rep < 5; ++rep) {
      std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
      expect_each_index_once(16);
    }
  }
}

TEST(SimdPool, TasksRunOnMoreThanOneThreadWhenThePoolHasThem) {
  if (worker_count() < 2) GTEST_SKIP() << "a pool of " << worker_count() << " thread";
  // Each task waits (bounded) until a second thread has run one, so a pool whose
  // workers never join leaves a single thread id.
  std::mutex m;
  std::set<std::thread::id> ids;
  parallel_for(64, [&](std::int64_t) {
    {
      const std::lock_guard lock(m);
      ids.insert(std::this_thread::get_id());
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (std::chrono::steady_clock::now() < until) {
      const std::lock_guard lock(m);
      if (ids.size() > 1) break;
    }
  });
  EXPECT_GT(ids.size(), 1u);
}

TEST(SimdPool, FirstErrorReachesTheCallerAndThePoolGoesOn) {
  EXPECT_THROW(parallel_for(32, [](std::int64_t i) { if (i == 5) throw std::runtime_error("task 5"); }), std::runtime_error);
  expect_each_index_once(32);
}

TEST(SimdPool, CallersOnSeveralThreadsEachGetTheirOwnTasks) {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&failures] {
      for (int rep = 0; rep < 100; ++rep) {
        std::vector<std::atomic<int>> runs(50);
        parallel_for(50, [&](std::int64_t i) { runs[static_cast<std::size_t>(i)].fetch_add(1); });
        for (auto& r : runs)
          if (r.load() != 1) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(SimdPool, CallInsideATaskRunsSeriallyOnThatThread) {
  std::atomic<int> foreign{0};
  parallel_for(4, [&](std::int64_t) {
    const auto me = std::this_thread::get_id();
    parallel_for(8, [&](std::int64_t) {
      if (std::this_thread::get_id() != me) foreign.fetch_add(1);
    });
  });
  EXPECT_EQ(foreign.load(), 0);
}

TEST(SimdPool, AClaimedTaskRunsNextOnTheClaimingThreadAndOnlyThere) {
  for (std::int64_t n : {2, 3, 7, 64, 1000}) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
      std::atomic<int> broken{0};
      thread_local std::int64_t promised = -1;  // what this thread's previous task claimed
      parallel_for(n, [&](std::int64_t i) {
        if (promised >= 0 && promised != i) broken.fetch_add(1);
        runs[static_cast<std::size_t>(i)].fetch_add(1);
        promised = claim_next_task();
        if (claim_next_task() != promised) broken.fetch_add(1);  // a second call: the same index
        if (promised >= n || promised == i) broken.fetch_add(1);
      });
      EXPECT_EQ(promised, -1);  // a thread's last task had nothing left to claim
      EXPECT_EQ(broken.load(), 0) << n << " tasks";
      for (auto& r : runs) ASSERT_EQ(r.load(), 1) << n << " tasks";
    }
  }
}

TEST(SimdPool, NoClaimOutsideALoopOrPastItsLastTask) {
  EXPECT_EQ(claim_next_task(), -1);
  std::vector<std::int64_t> claimed;
  // Inside a pool task a loop runs serially: its next index is known, -1 after the last.
  parallel_for(2, [&](std::int64_t i) {
    if (i == 0) parallel_for(3, [&](std::int64_t) { claimed.push_back(claim_next_task()); });
  });
  EXPECT_EQ(claimed, (std::vector<std::int64_t>{1, 2, -1}));
  EXPECT_EQ(claim_next_task(), -1);
}

TEST(SimdPool, NoClaimOnceFewerTasksAreLeftThanThreads) {
  if (worker_count() < 2) GTEST_SKIP() << "a pool of " << worker_count() << " thread";
  // With every task claiming, a claim granted while fewer unclaimed tasks than threads
  // remain could leave a thread idle: the last worker_count() - 1 tasks are never promised.
  const std::int64_t n = 4 * worker_count();
  std::vector<std::atomic<int>> promised(static_cast<std::size_t>(n));
  parallel_for(n, [&](std::int64_t) {
    const std::int64_t next = claim_next_task();
    if (next >= 0) promised[static_cast<std::size_t>(next)].fetch_add(1);
  });
  for (std::int64_t i = n - worker_count() + 1; i < n; ++i) {
    EXPECT_EQ(promised[static_cast<std::size_t>(i)].load(), 0) << "task " << i << " of " << n;
  }
}

}  // namespace
}  // namespace test_simd_parallel
}  // namespace kvlab::simd
