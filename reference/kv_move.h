// Reference cache data movement: the kernels the cache types are built on.
//
// Every tensor here is a 4-D cache block (B, H, L, W) of any dtype: W is D for plain
// rows, or the packed word count (codes) / group count (scales, biases) for quantized
// rows, so one kernel moves plain and packed data alike. Copies are exact (bytes).
// Source and destination must share dtype, H and W, and may not alias.
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
//   t < length. Concatenation along batch or sequence and left-padding shifts (extend,
//   merge, extract) are lists of blocks. Other rows of dst are untouched. Invalid: a
//   block out of range on either side; negative length; blocks whose destinations
//   overlap.
// kv_roll(src (B,H,L,W), shifts i32 (B,), dst (B,H,L,W)):
//   dst[b,h,i] = src[b,h,(i − shifts[b]) mod L] — mlx-lm's dynamic_roll, used by
//   right-padding finalize (spec §4.8). Any integer shift (negative too) is legal.
#pragma once

#include <span>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

void kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const TensorView& dst);
void kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index, const TensorView& dst);
void kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks, const TensorView& dst);
void kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const TensorView& dst);

}  // namespace kvlab::ref
