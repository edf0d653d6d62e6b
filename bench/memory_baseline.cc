// Memory baselines. The sum kernel is compiled per Highway target (foreach_target) and
// dispatched to the best one, like the SIMD kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/memory_baseline.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four independent accumulators: one add chain per vector would make the loop
// latency-bound (4-cycle adds) instead of load-bound, and the baseline would understate
// the bandwidth a kernel can reach.
float SumF32(const float* HWY_RESTRICT p, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * N));
  }
  float tail = 0;
  for (; i < n; ++i) tail += p[i];
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)))) + tail;
}

}  // namespace kvlab::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "bench/arith_baseline.h"
#include "bench/memory_baseline.h"
#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_backend.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"

namespace kvlab::bench {

HWY_EXPORT(SumF32);

namespace {

constexpr std::size_t kPage = 4096;
// Fixed chunking (1 MiB): enough chunks for the pool to balance, each long enough that
// the per-task overhead is noise against its streaming time
// (docs/benchmarks.md §Measurements behind kernel choices).
constexpr std::size_t kChunk = std::size_t{1} << 20;

std::size_t chunk_count(std::size_t bytes) { return (bytes + kChunk - 1) / kChunk; }

void for_chunks(std::size_t bytes, bool use_pool, const std::function<void(std::int64_t)>& task) {
  const auto n = static_cast<std::int64_t>(chunk_count(bytes));
  if (use_pool) {
    simd::parallel_for(n, task);
  } else {
    for (std::int64_t i = 0; i < n; ++i) task(i);
  }
}

}  // namespace

void BigBuffer::Free::operator()(std::byte* p) const { free_host_bytes(p, bytes); }

BigBuffer::BigBuffer(std::size_t bytes) : size_(bytes) {
  KVLAB_REQUIRE(bytes > 0 && bytes % kPage == 0, invalid_argument, "baseline buffer of ", bytes,
                " bytes: expected a positive multiple of ", kPage);
  // The kernels' page policy (kvlab/host_buffer.h).
  data_ = std::unique_ptr<std::byte, Free>(allocate_host_bytes(bytes), Free{bytes});
  if (!data_) throw std::bad_alloc();
  // Touch every page now (pattern 0x3F: 0.75f as f32, finite sums).
  std::memset(data_.get(), 0x3F, bytes);
}

float streaming_read(const BigBuffer& buffer, bool use_pool) {
  std::vector<float> partial(chunk_count(buffer.size()));
  const std::size_t floats_per_chunk = kChunk / sizeof(float);
  const auto* base = reinterpret_cast<const float*>(buffer.data());
  const std::size_t total = buffer.size() / sizeof(float);
  for_chunks(buffer.size(), use_pool, [&](std::int64_t c) {
    const std::size_t first = static_cast<std::size_t>(c) * floats_per_chunk;
    partial[static_cast<std::size_t>(c)] =
        HWY_DYNAMIC_DISPATCH(SumF32)(base + first, std::min(floats_per_chunk, total - first));
  });
  float sum = 0;
  for (const float s : partial) sum += s;
  return sum;
}

void chunked_memcpy(const BigBuffer& src, BigBuffer& dst, bool use_pool) {
  KVLAB_REQUIRE(src.size() == dst.size(), shape_mismatch, "memcpy baseline: ", src.size(), " vs ", dst.size(),
                " bytes");
  for_chunks(src.size(), use_pool, [&](std::int64_t c) {
    const std::size_t first = static_cast<std::size_t>(c) * kChunk;
    std::memcpy(dst.data() + first, src.data() + first, std::min(kChunk, src.size() - first));
  });
}

BaselineSample sample_baselines(const BigBuffer& src, BigBuffer& dst) {
  using Clock = std::chrono::steady_clock;
  // The faster of two passes: the first pass over buffers left idle while a kernel ran
  // can be slowed many-fold by the host bringing their pages back
  // (docs/benchmarks.md §Measurements behind kernel choices), which no streaming kernel
  // that reuses its buffers pays; the second pass reads what the machine's bandwidth is now.
  const auto best_of_two = [](const auto& pass) {
    double best = 0;
    for (int i = 0; i < 2; ++i) {
      const Clock::time_point start = Clock::now();
      pass();
      best = std::max(best, 1 / std::chrono::duration<double>(Clock::now() - start).count());
    }
    return best;  // passes per second
  };
  const std::vector<std::string> targets = simd_targets();  // best first
  KVLAB_REQUIRE(!targets.empty(), unsupported, "no attainable SIMD target for the read baseline");
  const auto bytes = static_cast<double>(src.size());
  BaselineSample sample;
  {
    const ScopedSimdTarget best(targets.front());  // lifts a kernel's pin for the read only
    volatile float sum = 0;                         // volatile: the reads must happen
    sample.read_gbps = bytes * best_of_two([&] { sum = streaming_read(src, true); }) / 1e9;
    (void)sum;
    // 2^17 rounds: under a millisecond at the FMA rates of these machines.
    double lanes = 0;
    sample.fma_glanes = best_of_two([&] { lanes = fma_lanes(std::int64_t{1} << 17, true); }) * lanes / 1e9;
  }
  sample.memcpy_gbps = 2 * bytes * best_of_two([&] { chunked_memcpy(src, dst, true); }) / 1e9;
  return sample;
}

}  // namespace kvlab::bench
#endif  // HWY_ONCE
