// Reference microscaling fp quantization: mxfp4, mxfp8 (e4m3) and nvfp4 (spec §1.7).
//
// quantize: x (..., D) float, D % group_size == 0 (32 for mx modes, 16 for nvfp4).
//   wq     (..., D·bits/32) u32: fp4 two codes per byte (element 2k in the low nibble),
//          fp8 one byte per element — the same LSB-first bitstream as affine.
//   scales (..., D/group) u8: E8M0 for mx modes, E4M3 for nvfp4.
// global_scale is allowed for nvfp4 only (Error otherwise).
// Arithmetic is float32. Rounding::mlx_gpu reproduces Metal (RNE thresholds for E2M1,
// E8M0 exponent rounded half away from zero, an all-zero group stores scale code 0);
// Rounding::mlx_cpu the CPU fallback (E2M1 by argmin |x − lut| with ties to the lower
// LUT index, E8M0 via rint, all-zero group stores 127).
// dequantize: out = lut(code)·decode(scale) (nvfp4: ·global_scale/2688 when given),
// rounded once to out.dtype (MLX default bf16).
#pragma once

#include <cstdint>
#include <optional>

#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

std::uint8_t e2m1_encode(float x, Rounding rounding);  // 4-bit code, bit 3 = sign
float e2m1_decode(std::uint8_t code);
std::uint8_t e4m3_encode(float x);                     // PyTorch Float8_e4m3fn bit trick
float e4m3_decode(std::uint8_t code);                  // 0x7F decodes to 480 (no NaN case)
std::uint8_t e8m0_encode(float x, Rounding rounding);
float e8m0_decode(std::uint8_t code);                  // 0 -> 2^-127, 0xFF -> +inf

void fp_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                 std::optional<float> global_scale, const TensorView& wq, const TensorView& scales);
void fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                   std::optional<float> global_scale, const TensorView& out);

QuantizedTensor fp_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding,
                            std::optional<float> global_scale = {});
Tensor fp_dequantize(const QuantizedTensor& q, std::optional<float> global_scale = {},
                     DType out_dtype = DType::bf16);

}  // namespace kvlab::ref
