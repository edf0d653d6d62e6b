// Reference affine quantization and dequantization, MLX's algorithm bit for bit
// (spec §1.2–1.4).
//
// quantize: x (..., D) in f32/f16/bf16, rank >= 1, D % group_size == 0, D > 0.
//   wq     (..., D·bits/32) u32  — LSB-first bitstream per row (reference/bitpack.h)
//   scales (..., D/group)   x.dtype
//   biases (..., D/group)   x.dtype
// Per group, in float32 whatever the input dtype (spec §1.2):
//   n = 2^bits − 1; alpha = max g (mlx_gpu: max(0, max g)); beta = min g
//   s0 = max((alpha − beta)/n, 1e-7); side = |beta| > |alpha|; s1 = side ? s0 : −s0
//   edge = side ? beta : alpha; q0 = R(edge/s1)
//   q0 != 0: scale = edge/q0, bias = edge; else scale = s1, bias = 0
//   code = clamp(R((g − bias)/scale), 0, n)   (mlx_gpu: no lower clamp — min(R, n) then
//          uint8 wrap, which the reference reproduces as a wrap modulo 256 then min n)
//   R = rint (ties to even) for mlx_cpu, round (ties away from zero) for mlx_gpu.
//   Codes use the f32 scale/bias; the stored scale/bias are rounded (RNE) to x.dtype.
// dequantize: out[i] = code_i·scale_g + bias_g computed in f32 from the stored
//   scale/bias and rounded once to out.dtype (spec §1.3 recommends this; it is within
//   1 ulp of either MLX backend).
// Invalid: spec not affine or failing QuantSpec::validate; non-float x; D not a
// multiple of group_size; any output of the wrong shape or dtype.
#pragma once

#include <cstdint>
#include <span>

#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

struct AffineGroupParams {
  float scale = 0;  // float32, before storage rounding
  float bias = 0;
};

// The per-group parameters of spec §1.2 for one group (any length >= 1).
AffineGroupParams affine_group_params(std::span<const float> group, int bits, Rounding rounding);
// The code of one value given the f32 group parameters (includes the clamp rules).
std::uint8_t affine_code(float value, const AffineGroupParams& p, int bits, Rounding rounding);

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                     const TensorView& wq, const TensorView& scales, const TensorView& biases);
void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales,
                       const ConstTensorView& biases, const QuantSpec& spec, const TensorView& out);

// Owning conveniences.
struct QuantizedTensor {
  Tensor wq, scales, biases;  // biases empty for fp modes
  QuantSpec spec;
};
QuantizedTensor affine_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding);
// out dtype defaults to the scales' dtype (MLX: result_type(scales, biases)).
Tensor affine_dequantize(const QuantizedTensor& q);
Tensor affine_dequantize(const QuantizedTensor& q, DType out_dtype);

}  // namespace kvlab::ref
