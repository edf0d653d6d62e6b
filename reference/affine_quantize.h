// Reference affine quantization and dequantization, MLX's algorithm bit for bit
// (docs/quantization.md §Affine parameters, §Affine dequantization, §Bit packing). The code's
// behaviour, not the mx.quantize docstring.
//
// quantize: x (..., D) in f32/f16/bf16, rank >= 1, D % group_size == 0, D > 0.
//   wq     (..., D·bits/32) u32  — LSB-first bitstream per row (reference/bitpack.h)
//   scales (..., D/group)   x.dtype
//   biases (..., D/group)   x.dtype
// Leading axes are independent rows; groups are consecutive elements of a row.
// Per group, in float32 whatever the input dtype (docs/quantization.md §Affine parameters):
//   n = 2^bits − 1; alpha = max g (mlx_gpu: max(0, max g)); beta = min g
//   s0 = max((alpha − beta)/n, 1e-7); side = |beta| > |alpha|; s1 = side ? s0 : −s0
//   edge = side ? beta : alpha; q0 = R(edge/s1)
//   q0 != 0: scale = edge/q0, bias = edge; else scale = s1, bias = 0
//   code = clamp(R((g − bias)/scale), 0, n)   (mlx_gpu: min(R, n), no lower clamp)
//   R = rint (ties to even) for mlx_cpu, round (ties away from zero) for mlx_gpu.
//   bits = 1 (MLX 0.32.4): scale = s0 > 0, bias = beta, no anchoring on the edge.
//   Codes use the f32 scale/bias; the stored scale/bias are rounded (RNE) to x.dtype.
// Consequences the tests pin: code 0 decodes to edge (the larger-magnitude extreme);
// bias is a group element or 0, so storing it in x.dtype is exact; zero maps to code
// −q0; scale < 0 when the max dominates; constant groups reconstruct exactly.
// Error: |x̂ − x| ≤ |scale|/2 except at the far end of the range, where the edge/q0
// rescale can leave the far extreme up to one full step past code n and the clamp
// costs up to |scale| (e.g. 2 bits, group {1, −1, …}: scale −0.5, −1 decodes to −0.5).
//
// mlx_gpu and negative codes: on finite input a group value never yields R < 0. It
// lies between bias and the far extreme, so (g − bias)/scale ≥ 0 or −0 (f32 subtraction
// and division keep the exact sign); when q0 = 0, bias = 0 and |g/scale| ≤ |edge/s1|,
// which is < 1/2 for round and ≤ 1/2 for rint, so R gives ±0. affine_code can still be
// asked about an out-of-group value; Metal's `uint8_t val = min(round(v), n)` then
// converts a negative float to uint8, which C++ and MSL leave undefined. The oracle
// models it as a two's-complement wrap modulo 256 (int cast, & 0xFF; below −2^31 every
// float is a multiple of 256, so 0) and keeps the low `bits` bits, the part that
// Metal's `output |= val << shift` puts in this element's field. (PTX float→integer
// conversions saturate, so CUDA would likely give 0.) A NaN argument gives code 0.
//
// dequantize: out[i] = code_i·scale_g + bias_g computed in f32 (multiply, then add,
//   never fused) from the stored scale/bias and rounded once to out.dtype. For f32 data
//   that is MLX's CPU graph bit for bit; otherwise it is the single rounding of
//   docs/quantization.md §Affine dequantization.
//   The mlx flavour is MLX 0.32.4's CPU for f16/bf16 metadata T: T(T(code·scale) + bias),
//   then out.dtype; it can differ from the single rounding by several ulps of T where
//   code·scale and bias cancel (measured: 6 ulps of f16). out dtype: any float dtype.
// Invalid (kvlab::Error naming the value): spec not affine or failing
// QuantSpec::validate; non-float x; rank-0 x; D not a positive multiple of group_size;
// any output of the wrong shape or dtype; for dequantize: wq not u32, scales not float,
// biases not of the scales' shape and dtype, leading axes differing, or
// words·32/bits != groups·group_size.
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

// The per-group parameters (docs/quantization.md §Affine parameters) of one group (any
// length >= 1).
AffineGroupParams affine_group_params(std::span<const float> group, int bits, Rounding rounding);
// The code of one value given the f32 group parameters (includes the clamp rules).
std::uint8_t affine_code(float value, const AffineGroupParams& p, int bits, Rounding rounding);

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                     const TensorView& wq, const TensorView& scales, const TensorView& biases);
// flavour: Rounding::mlx computes in the metadata dtype T as MLX 0.32.4 does (two
// roundings for f16/bf16, see the header comment); the others round once.
void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales,
                       const ConstTensorView& biases, const QuantSpec& spec, const TensorView& out,
                       Rounding flavour = Rounding::mlx_cpu);

// The checks of affine_quantize / affine_dequantize, in order. Every backend calls these
// before touching memory, so all backends reject the same calls with the same message.
void validate_affine_quantize(const ConstTensorView& x, const QuantSpec& spec, const ConstTensorView& wq,
                              const ConstTensorView& scales, const ConstTensorView& biases);
void validate_affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales,
                                const ConstTensorView& biases, const QuantSpec& spec, const ConstTensorView& out);

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
