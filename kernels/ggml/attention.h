// Internal to kernels/ggml: attention through ggml_flash_attn_ext on ggml's CPU backend,
// shared by sdpa (f32/f16/bf16 K/V) and quantized_sdpa (ggml's block formats).
//
// Operands map onto ggml's tensors as ggml_flash_attn_ext documents them (ggml.h):
//   q (B, Hq, Lq, Dk) → [Dk, Lq, Hq, B] f32 (ggml reads q as f32: widened exactly);
//   K (B, Hkv, Lk, Dk) → [Dk, Lk, Hkv, B], V likewise — kvlab's own buffers when their
//   rows are ggml's (f32/f16/bf16), else rows of ggml blocks (quantized_sdpa);
//   mask → ggml's only mask: an additive f16 array [Lk, Lq, 1|Hq, 1|B] (a causal or
//   boolean mask is 0 / −inf, exact; an additive one must hold f16 values: one that does
//   not is UNIMPLEMENTED, since rounding it would change the scores the oracle adds);
//   sinks → f32 [Hq] (ggml_flash_attn_ext_add_sinks), softcap → logit_softcap, scale →
//   scale, no ALiBi (max_bias 0);
//   result [Dv, Hq, Lq, B] f32 (permuted) → out (B, Hq, Lq, Dv), rounded once to T.
// ggml gives a fully masked row 0 (its sum S is 0): FullyMaskedRow::zero. A call asking for
// mean_of_values on a problem with such a row is UNIMPLEMENTED.
//
// Arithmetic (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16 and its two
// kernels), which the returned Arithmetic declares:
//  * q is converted to K's vec_dot type and the dot product K·q runs in f32 over exact
//    products: for f32/f16/bf16 K that type is K's own dtype, which q already has (the
//    harness's q and K share a dtype), so nothing is rounded; for a block K it is
//    q8_0 (q8_1 for q4_1/q5_1): q is quantized to 8 bits per 32-element block — declared
//    as `scaled_q` (q rounded before the dot; the quantization is coarser than a rounding to T).
//  * scale, softcap (s·scale/cap, tanhf, ·cap) and the mask add in f32; softmax with
//    expf in f32; P is never rounded; a dequantized V row is exact in f32.
//  * the P·V accumulator: with f16 V and fewer than 64 query rows (the one-row kernel; a
//    decode of ≥ 512 keys splits the keys over threads, each chunk the same kernel)
//    it is an f16 vector, rounded to f16 at every key (ggml_vec_mad_f16) — declared as
//    f16 accumulation; else f32 (f32/bf16/block V, and the tiled kernel that f32/f16 K=V
//    with ≥ 64 query rows take).
#pragma once

#include <cstdint>

#include "kernels/ggml/ggml_ops.h"
#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ggmlk {

// K or V as ggml rows: `data` holds (B, Hkv, Lk) rows of `d` elements of ggml type `type`.
struct KvRows {
  ggml_type type = GGML_TYPE_F16;
  const void* data = nullptr;
  std::int64_t d = 0;
};

// Operands already validated by the op's oracle checks; q gives B, Hq, Lq, Dk, out Dv.
Arithmetic attend(Engine& e, const ConstTensorView& q, const KvRows& k, const KvRows& v, std::int64_t hkv,
                  std::int64_t lk, const AttentionParams& params, const ConstTensorView* mask,
                  const ConstTensorView* sinks, const TensorView& out, const char* what);

}  // namespace kvlab::ggmlk
