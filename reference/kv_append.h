// Reference kernels for caches whose per-row offsets live in backend memory
// (cache/device_batch_kv_cache.h; docs/design.md §Observables, item 4: the offset-snapshot
// rule).
//
// kv_append_advance(k (B,H,S,Dk), v (B,H,S,Dv), left_padding i32 (B,) host,
//                   offsets i32 (B,) backend, k_cache (B,H,C,Dk), v_cache (B,H,C,Dv)):
//   for every b, h, t < S: k_cache[b,h,offsets[b] + left_padding[b] + t] = k[b,h,t] and the
//   same for v; then offsets[b] += S. Row b's offset counts its real tokens, so with left
//   padding it starts at −left_padding[b] and the first real token lands in column
//   left_padding[b]. Bytes are copied (NaN payloads survive). k, v and both caches share
//   one dtype of 2 or 4 bytes (f32, f16, bf16, i32, u32): the device shader moves 16- or
//   32-bit elements. The offsets are read from backend memory, not from a host mirror:
//   that is the point of the op, and why a backend validates them where they live.
//   Invalid (checked before anything is written, so a rejected call changes nothing):
//   shapes or dtypes that disagree (shape_mismatch / dtype_mismatch); left_padding[b] < 0;
//   a column range [offsets[b] + left_padding[b], … + S) outside [0, C); offsets[b] + S
//   past int32 (invalid_argument); the offsets or a cache overlapping another operand.
//   S = 0 is legal and changes nothing.
// kv_snapshot(src, dst): dst = src byte for byte; same dtype and shape, not overlapping.
//   A cache copies its live offsets into a snapshot before an append advances them, and
//   reads RoPE positions only from the snapshot (mlx-lm#1097 / #1806, vlm#966: positions
//   read from an offset the update had already advanced were S too far).
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/tensor.h"

namespace kvlab::ref {

// The checked geometry of one append, shared by every backend (same checks, same
// messages, in this order). `offsets` must be readable here.
struct KvAppendPlan {
  std::int64_t B = 0, H = 0, S = 0, C = 0, Dk = 0, Dv = 0;
  std::vector<std::int64_t> first_column;  // offsets[b] + left_padding[b], per row
};
KvAppendPlan validate_kv_append_advance(const ConstTensorView& k, const ConstTensorView& v,
                                        const ConstTensorView& left_padding, const ConstTensorView& offsets,
                                        const ConstTensorView& k_cache, const ConstTensorView& v_cache);
void validate_kv_snapshot(const ConstTensorView& src, const ConstTensorView& dst);

void kv_append_advance(const ConstTensorView& k, const ConstTensorView& v, const ConstTensorView& left_padding,
                       const TensorView& offsets, const TensorView& k_cache, const TensorView& v_cache);
void kv_snapshot(const ConstTensorView& src, const TensorView& dst);

}  // namespace kvlab::ref
