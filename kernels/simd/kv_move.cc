// SIMD-backend cache data movement (contract: reference/kv_move.h). These kernels are
// byte copies of whole rows, so "vectorized" means: as few, as long memcpy calls as the
// layout allows (glibc's memcpy already dispatches to AVX2/AVX-512 copies, and a
// hand-written Highway loop would not beat it). kv_scatter merges runs of consecutive
// slots into one copy per (b, h, run): a decode-time append of S contiguous rows is one
// memcpy per head instead of S (the oracle copies row by row). No Highway dispatch,
// hence the same on every target.
//
// A large scatter (at least kStreamingBytes) stores with non-temporal stores: memcpy of
// a run that size uses ordinary stores, whose destination lines are first read from
// memory (read for ownership), so a copy moves three bytes per byte copied, where
// memcpy of larger buffers (and the memcpy baseline of kvlab_bench) streams with two.
// The rows written then are not in the cache; a scatter that large would not stay in L2
// anyway, and a decode step's append (S = 1) stays below the threshold.
//
// Validation is the oracle's own (ref::validate_kv_*), so both backends reject the same
// calls with the same messages before writing dst; only the copy loops live here.
#include "kernels/simd/simd_kernels.h"

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/simd/parallel.h"
#include "reference/kv_move.h"

namespace kvlab::simd {
namespace {

constexpr std::size_t kStreamingBytes = std::size_t{1} << 20;  // an L2's worth
// A streaming copy asks for its source this far ahead, one line per line copied: on the
// Intel Xeon of model 207 the perf scatter took 7.9 % less time with it
// (docs/benchmarks.md §Measurements behind kernel choices).
constexpr std::size_t kPrefetchBytes = 2048;

// memcpy with non-temporal stores for the 16-byte-aligned middle; the caller issues the
// store fence before its writes may be read by another thread.
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__SSE2__)
  const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
  if (n < head + 64) return (void)std::memcpy(dst, src, n);
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 64; n -= 64, dst += 64, src += 64) {
    if (n > kPrefetchBytes) _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetchBytes), _MM_HINT_T0);
    for (std::size_t i = 0; i < 64; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    }
  }
  std::memcpy(dst, src, n);
#else
  std::memcpy(dst, src, n);
#endif
}

void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace

void kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const TensorView& dst) {
  const ref::KvMovePlan plan = ref::validate_kv_scatter(src, slots, dst);
  const ref::KvBlock &s = plan.src, &d = plan.dst;
  if (s.bytes == 0) return;
  // Runs: positions p..p+len-1 going to slots t..t+len-1 (contiguous on both sides), found
  // once per batch row and shared by its heads.
  struct Run {
    std::int64_t p, t, len;
  };
  std::vector<std::vector<Run>> runs(static_cast<std::size_t>(s.B));
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t* row_slots = plan.indices.data() + static_cast<std::size_t>(b * s.L);
    for (std::int64_t p = 0; p < s.L;) {
      const std::int64_t t = row_slots[p];
      std::int64_t len = 1;
      while (p + len < s.L && row_slots[p + len] == t + len) ++len;
      runs[static_cast<std::size_t>(b)].push_back({p, t, len});
      p += len;
    }
  }
  // One task per (b, h): both cores stream rows (the validated slots of a batch row are
  // distinct, so tasks write disjoint bytes and the result does not depend on the split).
  const bool streaming = s.bytes >= kStreamingBytes;
  parallel_for(s.B * s.H, [&](std::int64_t task) {
    const std::int64_t b = task / s.H, h = task % s.H;
    for (const Run& r : runs[static_cast<std::size_t>(b)]) {
      std::byte* to = dst.data + d.row_offset(b, h, r.t);
      const std::byte* from = src.data + s.row_offset(b, h, r.p);
      const auto n = static_cast<std::size_t>(r.len) * s.row_bytes;
      if (streaming) copy_streaming(to, from, n);
      else std::memcpy(to, from, n);
    }
    if (streaming) store_fence();  // before parallel_for reports the task done
  });
}

// A gather, a block copy and a roll are already as few, as long memcpy calls as the
// layout allows in the oracle (one slab per batch row; one run per (block, head); two
// runs per (row, head)), so the SIMD backend uses those loops as they are — stated here
// rather than hidden: the harness comparison of these three is a self-comparison.
void kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index, const TensorView& dst) {
  ref::kv_gather(src, batch_index, dst);
}

void kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks, const TensorView& dst) {
  ref::kv_copy_blocks(src, blocks, dst);
}

void kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const TensorView& dst) {
  ref::kv_roll(src, shifts, dst);
}

}  // namespace kvlab::simd
