// Internal: the worker pool the SIMD kernels use to split work across cores (attention
// heads, flash-decoding over the KV length).
//
// Results must not depend on the thread count: callers split work into a number of tasks
// fixed by the problem (never by worker_count()) and combine partial results in task
// order, so a 1-thread and a 16-thread run give the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace kvlab::simd {

// Elements per task of a kernel that streams its input once (quantize, dequantize): the
// problem's over kStreamingTasks, within [64K, 256K]. Each task pays the pool's claim, its
// own pipeline ramp and a new input stream whose first lines no prefetch has asked for:
// smaller tasks measured slower, for affine_quantize 16K against 64K and 64K against 256K
// elements, for fp_quantize 8K against 256K
// (docs/benchmarks.md §Measurements behind kernel choices). The floor keeps small
// problems split (128K elements still make two tasks); from 1M to 4M elements there are
// 16 tasks, one each on a machine of 16 cores.
// Depends on the problem only, never on the pool's size.
inline constexpr std::int64_t kMinStreamingElementsPerTask = 65536, kMaxStreamingElementsPerTask = 262144,
                              kStreamingTasks = 16;
inline std::int64_t streaming_elements_per_task(std::int64_t elements) {
  return std::clamp(elements / kStreamingTasks, kMinStreamingElementsPerTask, kMaxStreamingElementsPerTask);
}

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
