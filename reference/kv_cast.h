// Reference kernel for a cache that receives K/V of another float dtype than its own
// (ggml copies f32 K/V into an f16 cache with ggml_cpy; a prompt cache saved in one
// dtype is loaded into a cache of another).
//
// kv_cast(src, dst): dst[i] = src[i] converted from src's dtype to dst's, for every
// element, each dtype one of f32, f16, bf16 (docs/kernels.md §Dtype cast).
//   Same shape (any rank, empty included), dense row-major, not overlapping.
//   Numerics: the value is widened exactly to f32 (every f16 and bf16 value is an f32)
//   and rounded once to dst's dtype by kvlab's conversions (kvlab/dtype.h): round to
//   nearest, ties to even, subnormals kept, magnitudes past dst's largest finite value
//   (f16: 65520 and above) become ±inf, ±inf stays ±inf, −0 stays −0. A NaN stays a NaN
//   with exactly the bits those conversions give (quiet when narrowed, sign and high
//   payload bits kept), so a backend's result is compared bit for bit.
//   src and dst of one dtype: dst is src byte for byte (NaN payloads, signalling ones
//   included, are not touched).
//   Invalid (checked before anything is written): a dtype other than f32/f16/bf16
//   (dtype_mismatch, naming the operand and its dtype); shapes that differ
//   (shape_mismatch, naming both); src and dst overlapping (invalid_argument).
#pragma once

#include "kvlab/tensor.h"

namespace kvlab::ref {

// The checks above, shared by every backend (same checks, same messages, in this order).
void validate_kv_cast(const ConstTensorView& src, const ConstTensorView& dst);

void kv_cast(const ConstTensorView& src, const TensorView& dst);

}  // namespace kvlab::ref
