// The machine's memory ceilings, measured in the same process and run as the kernels:
// a streaming read (SIMD sum) and a memcpy over buffers far larger than the caches, split
// over the SIMD kernels' own worker pool (kernels/simd/parallel.h) so both use the
// thread count the kernels get. Every kernel's GB/s is read as a fraction of these: the
// run-start rows, and a sample taken right before and after each host kernel's timed loop
// (sample_baselines), since this machine's bandwidth drifts severalfold within minutes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvlab::bench {

// A page-aligned buffer, allocated like the kernels' tensors (kvlab::allocate_host_bytes:
// huge pages where offered), whose pages are touched at construction (so no page fault lands
// inside a timed region) and filled with a non-zero pattern.
class BigBuffer {
 public:
  explicit BigBuffer(std::size_t bytes);
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    std::size_t bytes;  // what was allocated: free_host_bytes needs it
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
};

// Sums the buffer as f32 with the best Highway target (several accumulators, so the
// loop is load-bound), in fixed chunks spread over the pool (use_pool) or on the calling
// thread alone. Returns the sum so the compiler must do the reads.
float streaming_read(const BigBuffer& buffer, bool use_pool);

// memcpy of src into dst (same size) in fixed chunks over the pool (or the caller).
void chunked_memcpy(const BigBuffer& src, BigBuffer& dst, bool use_pool);

// Each baseline over the pool, the faster of two passes timed by std::chrono::steady_clock.
struct BaselineSample {
  double read_gbps = 0;    // src bytes / read time, in 1e9 bytes per second
  double memcpy_gbps = 0;  // 2 x src bytes (read + written, like the kernels' bytes model) / copy time
  // f32 FMA lanes per second over the pool, in 1e9 (arith_baseline.h's chains, briefly):
  // the arithmetic the host gave the pool just then. On a Zen 4 VM it fell to half beside
  // some rows, which halves an arithmetic-bound kernel's % of the read
  // (docs/benchmarks.md §How a row is measured).
  double fma_glanes = 0;
};

// Streaming reads of src, then FMA chains, then memcpys of src into dst, over the pool
// (two passes each). The read and the FMAs run on the best attainable Highway target even
// while a SIMD backend pins another one (the pin is process-global and outlives the
// sample): with no pin, dispatch picks that same target (the lowest supported bit of the
// compiled set), so the sample reads like the run-start baseline_read and baseline_fma rows.
BaselineSample sample_baselines(const BigBuffer& src, BigBuffer& dst);

}  // namespace kvlab::bench
