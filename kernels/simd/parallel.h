// Internal: the worker pool the SIMD kernels use to split work across cores (attention
// heads, flash-decoding over the KV length).
//
// Results must not depend on the thread count: callers split work into a number of tasks
// fixed by the problem (never by worker_count()) and combine partial results in task
// order, so a 1-thread and a 16-thread run give the same bits.
#pragma once

#include <cstdint>
#include <functional>

namespace kvlab::simd {

// Threads that run tasks (the caller included): KVLAB_THREADS when set to a positive
// integer, else std::thread::hardware_concurrency().
int worker_count();

// Runs task(i) for every i in [0, n), spread over the pool, and returns when all are
// done. The first exception a task throws is rethrown here (the others are dropped).
// A call made from inside a task runs its tasks serially on that thread.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& task);

// From inside a task: the index of the task this thread runs right after the current one,
// claimed now so that the current task can prefetch its data; -1 when there is none to
// promise: the last task, outside parallel_for, or in the pool once fewer unclaimed tasks
// are left than there are threads (so that no thread idles while another holds a task).
// Calling it again returns the same index.
std::int64_t claim_next_task();

}  // namespace kvlab::simd
