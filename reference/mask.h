// Reference attention masks (docs/kernels.md §Masks, and the structured causal mask of
// docs/kernels.md §Attention).
//
// create_causal_mask(N, offset, window, left_padding, right_padding, form):
//   Query rows are positions offset..offset+N−1; key columns 0..offset+N−1.
//   keep[b,i,j] = (offset+i >= j)
//               && (window == 0 || offset+i < j + window)     // exactly min(W, pos+1) keys
//               && j >= left_padding[b]                        // when given
//               && j < offset+N − right_padding[b]             // when given
//   Shape (N, offset+N) without padding; (B, 1, N, offset+N) with either padding
//   (both given: equal lengths B). Form boolean: u8 1 = keep. Form additive: 0 for keep,
//   −inf otherwise, in `additive_dtype`.
// causal_visible(): the same predicate for SDPA's structured MaskKind::causal, which
//   is aligned to the lower right: offset = Lk − Lq.
// Invalid: N <= 0; offset < 0; window < 0; padding values negative; left and right
// padding of different lengths; additive_dtype not float.
#pragma once

#include <cstdint>
#include <span>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

enum class MaskForm : std::uint8_t { boolean, additive };

Tensor create_causal_mask(std::int64_t n, std::int64_t offset, int window,
                          std::span<const std::int32_t> left_padding,
                          std::span<const std::int32_t> right_padding, MaskForm form,
                          DType additive_dtype = DType::f32);

// Whether key j is visible to query i of batch row b under a structured causal mask
// for Lq queries over Lk keys. Assumes spec.kind == MaskKind::causal.
bool causal_visible(const MaskSpec& spec, std::int64_t b, std::int64_t i, std::int64_t j,
                    std::int64_t lq, std::int64_t lk);

// Validates a MaskSpec for batch size B (padding lengths, window >= 0, …).
void validate_mask_spec(const MaskSpec& spec, std::int64_t batch);

}  // namespace kvlab::ref
