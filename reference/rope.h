// Reference RoPE (docs/kernels.md §RoPE).
//
// x: float tensor of rank >= 3 read as (B, *, T, D): batch is axis 0, the sequence is
// axis −2, features the last axis. out: same shape and dtype; x is never modified, and
// out may not overlap x (the oracle has no in-place mode).
// Position of token t in batch row b: p = scale·(t + offset_b), where offset_b is the
// scalar offset, or per_row_offsets[b] when given (int32, shape (B,)); the scalar must
// then be 0 (both at once is rejected as ambiguous). Negative offsets are legal (left padding gives padding tokens negative
// positions).
// For pair i in [0, dims/2): inv_i = base^(−2i/dims), or 1/freqs[i] when freqs is
// given (freqs are wavelengths); θ = p·inv_i; (x1, x2) -> (x1·cosθ − x2·sinθ,
// x1·sinθ + x2·cosθ) where traditional: x1 = x[2i], x2 = x[2i+1]; else x1 = x[i],
// x2 = x[i + dims/2]. Features [dims, D) are copied bit for bit.
// Positions, angles and products are computed in double and each output is rounded
// once (RNE) to the dtype. (MLX's Metal kernel works in float32, so it differs by
// more than rounding at large positions; backends are judged by rope's tolerance.)
// params.mlx_arithmetic: MLX 0.32.4's CPU arithmetic instead (measured against the real
// library: the distance drops to a few ulps): p = (f32(t) + f32(offset))·scale,
// inv_i = exp(−i·f32(ln(base)/(dims/2))) or 1/freqs[i], θ = p·inv_i, all in f32 (so the
// angle's error grows with the position); cos θ, sin θ in f32 rounded to T; each product
// and the difference/sum rounded to T; exp, cos and sin are MLX's own approximations
// (reference/mlx_math.h), so the bits are MLX's.
// Invalid (kvlab::Error naming the value): rank < 3; non-float x; dims not positive,
// odd or > D; freqs given with a size other than dims/2, or holding a value that is
// not positive and finite; without freqs, a base that is not positive and finite;
// per_row_offsets not int32 of shape (B,); out shape/dtype differing from x; out
// overlapping x.
#pragma once

#include <cstdint>
#include <optional>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

void rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
          const std::optional<ConstTensorView>& per_row_offsets, const TensorView& out);

Tensor rope(const Tensor& x, const RopeParams& params, std::int32_t offset);

// The checks above, in order, exactly as rope() applies them. Every backend calls this
// before touching memory, so all backends reject the same calls with the same message.
void validate_rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
                   const std::optional<ConstTensorView>& per_row_offsets, const ConstTensorView& out);
Tensor rope(const Tensor& x, const RopeParams& params, const Tensor& per_row_offsets);

}  // namespace kvlab::ref
