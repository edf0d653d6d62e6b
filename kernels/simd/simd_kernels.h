// Internal: the view-level entry points of the SIMD kernels (one .cc per reference stem).
// Each validates exactly like its reference counterpart, then dispatches with Highway.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "kvlab/ops.h"
#include "kvlab/quant_spec.h"
#include "kvlab/quantized_view.h"
#include "kvlab/tensor.h"
#include "reference/quantized_sdpa.h"

namespace kvlab::simd {

// Any format of the table: the one place SIMD dispatches on QuantFormat::encoder
// (kernels/simd/quantize.cc).
void quantize(const ConstTensorView& x, Rounding rounding, const QuantizedMutView& out);
void dequantize(const QuantizedView& in, const TensorView& out, Rounding flavour = Rounding::mlx_cpu);

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding, const TensorView& wq,
                     const TensorView& scales, const TensorView& biases);
void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                       const QuantSpec& spec, const TensorView& out);

void fp_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                 std::optional<float> global_scale, const TensorView& wq, const TensorView& scales);
void fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                   std::optional<float> global_scale, const TensorView& out);

// ggml's block formats (q8_0 … iq4_nl): kernels/simd/ggml_quantize.cc.
void ggml_quantize(const ConstTensorView& x, const QuantSpec& spec, const TensorView& wq, const TensorView& scales,
                   const TensorView& biases);
void ggml_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                     const QuantSpec& spec, const TensorView& out);

void sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
          const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
          const TensorView& out);
void quantized_sdpa(const ConstTensorView& q, const ref::QuantizedView& k, const ref::QuantizedView& v,
                    const AttentionParams& params, const ConstTensorView* mask_array,
                    const ConstTensorView* sinks, const TensorView& out);
// Whether the calling thread's last sdpa/quantized_sdpa call rounded the softmax
// weights P to the output dtype before P·V (the bf16 decode's vdpbf16ps V side): what
// SimdBackend::attention_rounding() declares. Every other intermediate stays f32.
bool last_attention_rounded_probabilities();
// The dense multiply-adds of the calling thread's last sdpa/quantized_sdpa call (q·k and
// p·v over the keys its decode tasks read), by the instruction that carried them, in
// vector lanes: what the benchmarks' arithmetic floor divides by the same run's rate of
// each instruction (bench/arith_baseline.h). All zero for a call that did not take the
// decode kernel (the general attention kernel, the quantized fallback): the floor then
// counts the op's dense products as f32 FMAs.
struct ArithmeticMix {
  std::int64_t fma = 0;       // f32 FMA lanes: one product each
  std::int64_t bf16_dot = 0;  // vdpbf16ps lanes: two bf16 products each
  std::int64_t u8_dot = 0;    // vpdpbusd lanes: four u8·s8 products each (each q digit counts)
  std::int64_t amx_int8 = 0;  // tdpbsud lanes (one i32 element of C per A row): four products each
  std::int64_t s16_dot = 0;   // vpdpwssd lanes: two s16·s16 products each (the integer V side)
  std::int64_t s16_madd = 0;  // vpmaddwd + vpaddd lanes: the same two products (AVX2's integer V side)
  bool empty() const {
    return fma == 0 && bf16_dot == 0 && u8_dot == 0 && amx_int8 == 0 && s16_dot == 0 && s16_madd == 0;
  }
};
ArithmeticMix last_attention_mix();
// The K and V values the calling thread's last quantized_sdpa call dequantized a decode
// chunk at a time (formats the decode does not read as codes: nvfp4, mxfp8, …; the keys
// of chunks no query row sees are skipped); 0 where it read every side as codes, and for
// the fallback, which dequantizes whole tensors first.
std::int64_t last_attention_decoded_values();

void kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const TensorView& dst);
void kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index, const TensorView& dst);
void kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks, const TensorView& dst);
void kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const TensorView& dst);
void kv_cast(const ConstTensorView& src, const TensorView& dst);

void rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
          const std::optional<ConstTensorView>& per_row_offsets, const TensorView& out);

}  // namespace kvlab::simd
