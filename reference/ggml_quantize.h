// Reference ggml block quantization: q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl, bit for bit
// the C reference of ggml (ggml/src/ggml-quants.c: quantize_row_<fmt>_ref and
// dequantize_row_<fmt>, as vendored by llama-cpp-python 0.3.36), stored in kvlab's packed
// layout (docs/quantization.md §ggml block formats).
//
// quantize: x (..., D) in f32/f16/bf16 (converted to f32 exactly, as ggml's quantizers take
//   f32), rank >= 1, D a positive multiple of 32. Every group of 32 consecutive elements
//   of a row is one ggml block.
//   wq     (..., D·bits/32) u32 — LSB-first bitstream per row (reference/bitpack.h), in
//          element order; the code of element i of a block is the ggml value below.
//   scales (..., D/32) f16 — the block's d, whatever the input dtype.
//   biases (..., D/32) f16 — q4_1 and q5_1 only: the block's m (the minimum).
// Codes (bits): q8_0 the int8 quant as a two's-complement byte (8); q4_0 and q5_0 the
//   unsigned quant, value = code − 8 (4) or code − 16 (5); q4_1 and q5_1 the unsigned
//   quant, value = code·d + m (4, 5); iq4_nl an index into ggml's table (4).
// Per block, in f32 with each operation rounded (never fused):
//   q8_0: amax = max |x| (ggml's MAX macro: a NaN is kept only until the next element);
//         d = amax/127; id = d ? 1/d : 0; code = roundf(x·id) (half away from zero).
//   q4_0 / q5_0 (n = 8 / 16, top = 15 / 31): max = the first element of largest |x|
//         (0 when all are 0); d = max/−n; id = d ? 1/d : 0;
//         code = min(top, trunc(x·id + (n + 0.5))) — the +n+0.5 is an f32 addition, then a
//         truncating conversion to int8, not a round-to-nearest.
//   q4_1 / q5_1 (top = 15 / 31): min, max of the block (NaN skipped); d = (max − min)/top;
//         id = d ? 1/d : 0; code = trunc((x − min)·id + 0.5), then min(15, ·) for q4_1; q5_1
//         has no clamp and keeps the low 5 bits. m = min.
//   iq4_nl (quantize_row_iq4_nl_ref: no importance weights, ntry = −1, so no scale search):
//         amax, max as q4_0 (strict >, NaN skipped); amax < 1e-15 → d = 0 and every code
//         8 (ggml leaves those codes stale: it skips the block's index pass); else
//         d0 = max/−127, id = 1/d0, code = best_index(id·x) — the nearest table value,
//         ties to the upper one; then with w = x², sumqx = Σ (w·v)·x, sumq2 = Σ (w·v)·v
//         summed in element order (v = the code's table value), d = sumq2 > 0 ?
//         sumqx/sumq2 : 0. The codes stay those of d0.
//   The codes come from the f32 d (and min); the stored d and m are then rounded to f16
//   to nearest even (GGML_FP32_TO_FP16: overflow gives ±inf, NaN gives sign|0x7E00).
// Rounding::ggml_cpu (kvlab/quant_spec.h) changes q8_0 alone, to ggml-cpu's x86 quantizer
//   (quantize_row_q8_0 under __AVX__/__AVX2__, what llama.cpp's K/V writes run): amax by
//   MAXPS over |x| in its lane order (lanes j, j+8, j+16, j+24; then the high half
//   against the low; then movehl and movehdup; MAXPS(a, b) = a > b ? a : b, so a NaN
//   operand gives b); id = 127/amax (0 when amax is 0); code = x·id rounded to nearest
//   even, and −128 for a NaN (CVTPS2DQ's 0x80000000 through the saturating packs);
//   d = amax/127 stored by F16C (RNE; a NaN keeps its top payload bits). Elsewhere the
//   CPU backend's from_float is the C reference.
// Float-to-integer conversions of NaN or out-of-range values are undefined in the C; on
//   finite input they never happen except where d is so small that id overflows. The
//   oracle gives code 0 for a NaN argument and saturates others to the integer type.
//
// dequantize: per element in f32 from the f16 d (and m): q8_0, q4_0, q5_0: value·d;
//   q4_1, q5_1: code·d + m; iq4_nl: d·table[code]. code·d is exact in f32 (≤ 8 + 11
//   significant bits), so the only roundings are q4_1/q5_1's sum — the same whether or
//   not a compiler fuses it into an fma — and the final one to out.dtype (ggml itself
//   only writes f32).
//
// Invalid (kvlab::Error naming the value): a spec whose encoder is not ggml or that
// fails QuantSpec::validate (bits other than the format's, group other than 32); non-float
// x; rank-0 x; D not a positive multiple of 32; outputs of the wrong shape or dtype;
// biases given to a format without them or missing for q4_1/q5_1; for dequantize: wq not
// u32, scales/biases not f16 of the same shape, leading axes differing, or
// words·32/bits != groups·32.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

inline constexpr int kGgmlBlock = 32;
// ggml's kvalues_iq4nl, the iq4_nl element values (ggml/src/ggml-common.h).
inline constexpr std::array<std::int8_t, 16> kIq4nlValues = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                             1,    13,   25,  38,  53,  69,  89,  113};

// GGML_FP32_TO_FP16: round to nearest even with subnormals, ±inf on overflow, and every
// NaN to sign|0x7E00.
std::uint16_t ggml_fp16_bits(float x);

// One block in kvlab's terms: its 32 codes (the values the wq bitstream holds) and the f16
// bit patterns of d and m (m is 0 for formats without a min).
struct GgmlBlock {
  std::array<std::uint8_t, kGgmlBlock> codes{};
  std::uint16_t d = 0, m = 0;
};

// rounding: Rounding::ggml_cpu gives q8_0 ggml-cpu's x86 quantizer (see the top); any
// other value ggml's C reference.
GgmlBlock ggml_quantize_block(QuantMode mode, std::span<const float, kGgmlBlock> x,
                              Rounding rounding = Rounding::ggml_ref);
// The value of element i of a block in f32 (the dequantizers' arithmetic).
float ggml_block_value(QuantMode mode, const GgmlBlock& block, int i);

// ggml's own bytes of a block (block_q8_0 … block_iq4_nl, little-endian; 34, 18, 20, 22,
// 24 and 18 bytes), and back: how kvlab's tensors map onto ggml's structs.
std::size_t ggml_block_bytes(QuantMode mode);
std::vector<std::uint8_t> ggml_block_to_bytes(QuantMode mode, const GgmlBlock& block);
GgmlBlock ggml_block_from_bytes(QuantMode mode, std::span<const std::uint8_t> bytes);

// The checks ggml_quantize / ggml_dequantize make, in order, for every backend.
void validate_ggml_quantize(const ConstTensorView& x, const QuantSpec& spec, const ConstTensorView& wq,
                            const ConstTensorView& scales, const ConstTensorView& biases);
void validate_ggml_dequantize(const ConstTensorView& wq, const ConstTensorView& scales,
                              const ConstTensorView& biases, const QuantSpec& spec, const ConstTensorView& out);

void ggml_quantize(const ConstTensorView& x, const QuantSpec& spec, const TensorView& wq, const TensorView& scales,
                   const TensorView& biases, Rounding rounding = Rounding::ggml_ref);
void ggml_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                     const QuantSpec& spec, const TensorView& out);

// Owning conveniences; dequantize's output dtype defaults to f32 (ggml's).
QuantizedTensor ggml_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding = Rounding::ggml_ref);
Tensor ggml_dequantize(const QuantizedTensor& q, DType out_dtype = DType::f32);

}  // namespace kvlab::ref
