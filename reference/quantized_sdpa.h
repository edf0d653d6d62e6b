// Reference attention over quantized K and V (docs/kernels.md §Quantized attention, mlx-lm's
// quantized_scaled_dot_product_attention), as a contract rather than a copy.
//
// q (B, Hq, Lq, Dk) float; K packed as (B, Hkv, Lk, Dk·bits/32) u32 codes with scales
// (and biases, affine, q4_1, q5_1) (B, Hkv, Lk, Dk/group); V likewise with Dv; out
// (B, Hq, Lq, Dv) in q's dtype. Any QuantSpec (affine: every bits/group, scales and biases
// of one float dtype; fp modes: u8 scales and no biases, nvfp4 without a global scale;
// ggml's blocks: f16 scales, and f16 mins as biases for q4_1/q5_1); K and V may
// use different specs. Dv is out's last dim (the Tensor overload derives it from V's
// code width, Dv = words·32/bits).
// Semantics: exactly reference sdpa() over K and V dequantized to f32 (no rounding to
// a storage dtype in between), with the same params, masks and sinks; only q's dtype
// may differ from K/V's. Unlike mlx-lm, Dv != Dk works (mlx-lm reshapes with the query
// D), sinks are accepted and per-head masks broadcast with Hq > Hkv.
// Invalid: everything sdpa() rejects, plus, for K and V independently: a spec failing
// QuantSpec::validate; D not a multiple of its group size; codes not u32 or of a width
// != D·bits/32; scales not (B, Hkv, Lk, D/group) (so Hkv or Lk differing between codes,
// scales and biases is caught); biases missing, of another shape or dtype than the
// scales (affine, q4_1, q5_1), or present (the other formats); scales not u8 in fp modes,
// not f16 in ggml's. All of it is
// checked before anything is dequantized.
#pragma once

#include "kvlab/ops.h"
#include "kvlab/quantized_view.h"
#include "kvlab/tensor.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

using kvlab::QuantizedView;

void quantized_sdpa(const ConstTensorView& q, const QuantizedView& k, const QuantizedView& v,
                    const AttentionParams& params, const ConstTensorView* mask_array,
                    const ConstTensorView* sinks, const TensorView& out);

// The checks above, alone (the order and messages every backend reports; names are
// formatted only for the check that fails).
void validate_quantized_sdpa(const ConstTensorView& q, const QuantizedView& k, const QuantizedView& v,
                             const AttentionParams& params, const ConstTensorView* mask_array,
                             const ConstTensorView* sinks, const TensorView& out);

Tensor quantized_sdpa(const Tensor& q, const QuantizedTensor& k, const QuantizedTensor& v,
                      const AttentionParams& params, const Tensor* mask_array = nullptr,
                      const Tensor* sinks = nullptr);

// K or V dequantized to f32 (the values attention sees), shape (..., D) with
// D = words·32/bits; the same layout checks as above (any rank >= 1).
Tensor dequantize_to_f32(const QuantizedView& q);

}  // namespace kvlab::ref
