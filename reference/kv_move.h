// Reference cache data movement: the kernels the cache types are built on.
//
// Every tensor here is a 4-D cache block (B, H, L, W) of any dtype: W is D for plain
// rows, or the packed word count (codes) / group count (scales, biases) for quantized
// rows, so one kernel moves plain and packed data alike (a quantized cache calls it
// once per component). Copies are exact (bytes): NaN payloads and padding bits survive.
// Index tensors (slots, batch_index, shifts) are int32.
//
// Common rules, checked before the first byte of dst is written, so a rejected call
// leaves dst unchanged (kvlab::Error names the bad value):
//  * source and destination share dtype, H and W (shape_mismatch / dtype_mismatch);
//  * dst may not overlap the source or the index tensor in memory (invalid_argument):
//    with overlap, the result would depend on copy order, which optimized backends are
//    free to change. So no kernel works in place; a cache shifting or rolling its own
//    buffer writes into a second buffer (and may then swap the two).
//
// kv_scatter(src (B,H,S,W), slots i32 (B,S), dst (B,H,L,W)):
//   dst[b,h,slots[b,s]] = src[b,h,s]. Writes S new rows at the given slots, e.g. a
//   contiguous run at the cache cursor, or ring positions wrapping past L. Other rows of
//   dst are untouched. Invalid: slot < 0 or >= L; a slot repeated within a row.
// kv_gather(src (Bs,H,L,W), batch_index i32 (Bd,), dst (Bd,H,L,W)):
//   dst[d] = src[batch_index[d]] (filter). Repeats are allowed here; the cache layer
//   decides whether duplicates are legal. Invalid: index < 0 or >= Bs.
// kv_copy_blocks(src (Bs,H,Ls,W), blocks, dst (Bd,H,Ld,W)):
//   for each block: dst[dst_batch, :, dst_seq + t] = src[src_batch, :, src_seq + t],
//   t < length. Other rows of dst are untouched; blocks may overlap in the source.
//   Invalid: negative length; a batch index out of range on either side; rows past
//   either side's sequence length (checked even for length 0); two blocks whose
//   destination rows overlap (the message names both).
// kv_roll(src (B,H,L,W), shifts i32 (B,), dst (B,H,L,W)):
//   dst[b,h,i] = src[b,h,(i − shifts[b]) mod L] (mathematical mod, result in [0, L)) —
//   mlx-lm's dynamic_roll (docs/kernels.md §Cache data movement). Any int32 shift is legal,
//   negative (a left roll) or beyond L; L == 0 is a no-op. src and dst have the same shape and
//   dtype.
//
// How the cache operations of docs/semantics.md map onto these kernels (tested in
// tests/unit/test_kv_move.cc, CacheOps.*):
//   append S rows at the cursor / ring write ........ kv_scatter (slots (cursor+s) mod L)
//   grow, trim oldest columns, extract(i), merge,
//   extend (left shift to max_idx), filter's shift ... kv_copy_blocks into a new buffer
//   filter (batch selection) ........................ kv_gather (or copy_blocks directly)
//   finalize (roll right by right padding),
//   _temporal_order (roll left by _idx) ............. kv_roll
//   RotatingKVCache temporal order with keep > 0 .... kv_copy_blocks (three blocks)
// Fresh buffers (zeros, NaN poison) come from Backend::fill. Not covered: casting
// incoming rows to another dtype (KVCache casts on update), and caches with different
// H or D being merged or extended together; both are rejected here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

// The validation of each kernel, shared by every backend: the oracle's checks, in order
// and with its messages, done before anything is written (so every backend rejects the
// same calls the same way). Each returns the checked geometry and the loaded indices, so
// a backend's kernel is only its copy loop.
struct KvBlock {
  std::int64_t B = 0, H = 0, L = 0, W = 0;
  std::size_t row_bytes = 0;  // one (b, h, t) row: W elements (0 when the block is empty)
  std::size_t bytes = 0;      // the whole block; fits in ptrdiff_t (checked)
  std::size_t row_offset(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return static_cast<std::size_t>((b * H + h) * L + t) * row_bytes;
  }
};
struct KvMovePlan {
  KvBlock src, dst;
  std::vector<std::int64_t> indices;  // slots (B·S), batch_index (Bd) or shifts (B); empty for copy_blocks
};
KvMovePlan validate_kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const ConstTensorView& dst);
KvMovePlan validate_kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index,
                              const ConstTensorView& dst);
KvMovePlan validate_kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks,
                                   const ConstTensorView& dst);
KvMovePlan validate_kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const ConstTensorView& dst);
// (i mod n) in [0, n) for any i (n > 0): the roll amount of kv_roll.
std::int64_t kv_roll_amount(std::int64_t shift, std::int64_t n);

void kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const TensorView& dst);
void kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index, const TensorView& dst);
void kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks, const TensorView& dst);
void kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const TensorView& dst);

}  // namespace kvlab::ref
