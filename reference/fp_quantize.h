// Reference microscaling fp quantization: mxfp4, mxfp8 (e4m3) and nvfp4
// (docs/quantization.md §Microscaling formats).
//
// quantize: x (..., D) f32/f16/bf16, rank >= 1, D % group_size == 0 (32 for mx modes,
//   16 for nvfp4), D > 0.
//   wq     (..., D·bits/32) u32: fp4 two codes per byte (element 2k in the low nibble,
//          i.e. element j at bits [4j, 4j+4) of word ⌊j/8⌋), fp8 one byte per element
//          (element j at bits [8j, 8j+8) of word ⌊j/4⌋) — the LSB-first bitstream of affine.
//   scales (..., D/group) u8: E8M0 for mx modes, E4M3 for nvfp4.
// Per group, in float32 whatever the input dtype; amax = max |w| (NaN elements ignored):
//   mx:    code = E8M0(amax / (6 fp4 | 448 fp8)) — rounded in the log domain, not OCP's
//          floor — and element = E2M1/E4M3(w / decode(code)); as |w|/decode(code) can
//          reach max·√2 the element encoders saturate (E2M1 at 6, E4M3 at 448).
//   nvfp4: enc = global_scale ? 2688/global_scale : 1 (2688 = 448·6; MLX's global_scale
//          is the tensor amax); code = E4M3((amax/6)·enc); element = E2M1((w·enc)/s) with
//          s = decode(code), or code 0 when s == 0.
// Rounding::mlx_gpu reproduces Metal: E2M1 by the RNE threshold table (saturate at 6,
//   −0.0 → 0x8, NaN → 0x7), E8M0 exponent = round-half-away(log2 s), an all-zero group
//   stores scale code 0.
// Rounding::mlx_cpu reproduces the CPU fallback ops graph: E2M1 = argmin |x − lut| with
//   ties to the lower LUT index (0.75 → 0.5, −0.1 → +0; NaN, ±inf and |x| > 2^27 give
//   code 0, since every f32 distance is then NaN, inf or |x| and the first index wins),
//   E8M0 exponent = rint, an all-zero group stores scale code 127.
// Rounding::mlx is the pinned MLX 0.32.4 CPU, measured bit for bit: nvfp4 takes amax/6,
//   the decoded scale and w/s in the input dtype T, multiplying by the f32 factor enc
//   after each (so the older (w·enc)/s becomes T(w/s)·enc), argmin in f32;
//   mx modes (changed since MLX's older sources, which rounded the log): E8M0
//   exponent e = ceil(log2 s) of s = amax/max rounded to the input dtype T (e = 0 when
//   s is 0), stored as (e + 127) mod 256 without a clamp; elements w/2^e rounded to T;
//   E2M1 by the argmin with distances rounded to T. Non-finite amax is undefined in MLX
//   (it converts ±inf to int); the oracle keeps mlx_cpu's result there.
// E4M3 encode (both): RNE with denormals; |x| >= 448, ±inf and NaN saturate to ±448 (0x7E).
// E8M0 encode (both): non-finite → 0xFF, negative → 0, else clamp(R(log2 x), −127, 127)+127.
//
// dequantize: out = lut(code)·decode(scale) (nvfp4: ·(global_scale/2688) when given),
//   computed in f32 and rounded once to out.dtype (MLX's default output dtype is bf16).
//   E4M3 decode never special-cases NaN: 0x7F → 480. E8M0 0 → 2^-127, 0xFF → +inf.
//
// Invalid (kvlab::Error naming the value): an affine spec or one failing
// QuantSpec::validate; non-float x; D not a multiple of group_size; outputs of the wrong
// shape or dtype; global_scale with a mode other than nvfp4, or a non-finite one;
// dequantize inputs whose shapes do not fit together.
//
// Deliberate choices where MLX is unspecified or where its sources leave a gap:
// * The CPU graph evaluates amax/6, log2 and w/scale in the input dtype; here both
//   roundings use f32 (identical for f32 input; for f16/bf16 the graph may move a code
//   by one near a tie, or underflow a tiny f16 group's scale to 0).
// * The CPU graph neither clamps the E8M0 exponent nor special-cases NaN/inf; the
//   oracle clamps to [−127, 127] and maps non-finite/negative scales as above for both.
// * std::log2 (f32) can round to exactly k + 1/2 for s within a few ulps of 2^(k+1/2);
//   that is where mlx_gpu and mlx_cpu scale codes differ. Metal's log2 may round those
//   points differently, so a harness should tolerate ±1 scale code only there.
// * Non-finite input: NaN elements are skipped by amax and encoded alone (E2M1 gpu +6,
//   cpu +0; E4M3 ±448). A ±inf element makes an mx scale 0xFF (+inf), so its group
//   dequantizes to NaN/inf; in nvfp4 it saturates the E4M3 scale at 448.
// * nvfp4 evaluates (amax/6)·enc and (w·enc)/s left to right as
//   docs/quantization.md §Microscaling formats writes them (Metal may fold enc/s into one factor;
//   that can move a code only at a tie).
// * nvfp4 with a zero scale stores element code 0 in both modes (the CPU graph would
//   divide 0 by 0).
#pragma once

#include <cstdint>
#include <optional>

#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

std::uint8_t e2m1_encode(float x, Rounding rounding);  // 4-bit code, bit 3 = sign
float e2m1_decode(std::uint8_t code);
std::uint8_t e4m3_encode(float x);                     // PyTorch Float8_e4m3fn semantics (RNE, saturating)
float e4m3_decode(std::uint8_t code);                  // 0x7F decodes to 480 (no NaN case)
std::uint8_t e8m0_encode(float x, Rounding rounding);
float e8m0_decode(std::uint8_t code);                  // 0 -> 2^-127, 0xFF -> +inf

// The checks fp_quantize / fp_dequantize make, in their order and with their messages,
// for other backends to validate identically. Both return d, the codes per row.
std::int64_t validate_fp_quantize(const ConstTensorView& x, const QuantSpec& spec, std::optional<float> global_scale,
                                  const ConstTensorView& wq, const ConstTensorView& scales);
std::int64_t validate_fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                                    std::optional<float> global_scale, const ConstTensorView& out);

void fp_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                 std::optional<float> global_scale, const TensorView& wq, const TensorView& scales);
void fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                   std::optional<float> global_scale, const TensorView& out);

QuantizedTensor fp_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding,
                            std::optional<float> global_scale = {});
Tensor fp_dequantize(const QuantizedTensor& q, std::optional<float> global_scale = {},
                     DType out_dtype = DType::bf16);

}  // namespace kvlab::ref
