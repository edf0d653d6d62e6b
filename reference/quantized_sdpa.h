// Reference attention over quantized K and V (spec §2.2, mlx-lm's
// quantized_scaled_dot_product_attention), as a contract rather than a copy.
//
// q (B, Hq, Lq, Dk) float; K packed as (B, Hkv, Lk, Dk·bits/32) codes with scales (and
// biases, affine) (B, Hkv, Lk, Dk/group); V likewise with Dv; out (B, Hq, Lq, Dv) in
// q's dtype. Any QuantSpec (affine: every bits/group; fp modes without biases); K and
// V may use different specs.
// Semantics: exactly reference sdpa() over K and V dequantized to f32 (no rounding to
// a storage dtype in between), with the same params, masks and sinks. Unlike mlx-lm,
// Dv != Dk works (mlx-lm reshapes with the query D) and sinks are accepted.
// Invalid: everything sdpa() rejects, plus packed shapes that do not match the spec
// (words != D·bits/32, scales != D/group), biases missing for affine, Hkv or Lk
// differing between codes, scales and biases.
#pragma once

#include "kvlab/ops.h"
#include "kvlab/tensor.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

struct QuantizedView {
  ConstTensorView wq, scales, biases;  // biases.data == nullptr for fp modes
  QuantSpec spec;
};

void quantized_sdpa(const ConstTensorView& q, const QuantizedView& k, const QuantizedView& v,
                    const AttentionParams& params, const ConstTensorView* mask_array,
                    const ConstTensorView* sinks, const TensorView& out);

Tensor quantized_sdpa(const Tensor& q, const QuantizedTensor& k, const QuantizedTensor& v,
                      const AttentionParams& params, const Tensor* mask_array = nullptr,
                      const Tensor* sinks = nullptr);

// K or V dequantized to f32 (the values attention sees), shape (..., D).
Tensor dequantize_to_f32(const QuantizedView& q);

}  // namespace kvlab::ref
