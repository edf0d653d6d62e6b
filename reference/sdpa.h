// Reference scaled dot-product attention (docs/kernels.md §Attention).
//
// q (B, Hq, Lq, Dk), k (B, Hkv, Lk, Dk), v (B, Hkv, Lk, Dv), out (B, Hq, Lq, Dv); q, k,
// v and out share one float dtype. Hq % Hkv == 0; query head h reads kv head ⌊h/R⌋,
// R = Hq/Hkv (consecutive query heads share a kv head). Dv may differ from Dk.
//   s[j] = scale·<q_i, k_j>;  softcap > 0: s[j] = softcap·tanh(s[j]/softcap)
//   mask: none | causal (lower right, window, paddings: reference/mask.h) |
//         boolean array (u8, nonzero keeps) | additive array (any float dtype, its
//         values added exactly to the capped s; −inf hides the key); array shape
//         (1|B, 1|Hq, Lq, Lk), size-1 axes broadcast.
//   sinks (Hq,) float, optional: an extra logit per head in the denominator with no
//   value: o = Σ e^{s_j−m} v_j / (e^{sink−m} + Σ e^{s_j−m}), m = max(sink, max s_j).
//   The sink is not softcapped.
// Everything accumulates in double; out is rounded once to the dtype (for f16/bf16 the
// f32 intermediate is rounded to odd, so there is no double rounding).
// Hidden keys are never read: NaN poison in a masked-out K or V slot cannot reach the
// output (except through mean_of_values below, which averages every key by definition).
// Fully masked row (every key hidden, or every additive score −inf): out = 0 for
// FullyMaskedRow::zero (MLX fused kernel), mean of v over all Lk keys for
// FullyMaskedRow::mean_of_values (MLX fallback, finfo.min fill). Sinks do not change
// this: the policy depends on the mask alone, so a backend needs no sink special case.
// (With sinks MLX's fallback would give ≈0, since the sink takes all the weight; pick
// FullyMaskedRow::zero to match that.) These rows are unspecified in MLX anyway.
// Invalid (kvlab::Error naming the value): ranks not 4; batch, head, Lk or Dk dims
// disagreeing; Hq % Hkv != 0; dtypes differing or not float; any size <= 0 (Lk == 0
// included); out not (B, Hq, Lq, Dv); mask array of a non-broadcastable shape or wrong
// dtype; a mask kind that needs an array given none, or an array given with kind none /
// causal; window or paddings on a non-causal kind, negative, or padding vectors of a
// length other than B; sinks not (Hq,) float; scale not finite; softcap negative or not
// finite; a view with no data.
#pragma once

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

void sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
          const AttentionParams& params, const ConstTensorView* mask_array,
          const ConstTensorView* sinks, const TensorView& out);

// The checks sdpa makes, in its order and with its messages, for other backends.
void validate_sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                   const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
                   const ConstTensorView& out);

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
            const Tensor* mask_array = nullptr, const Tensor* sinks = nullptr);

}  // namespace kvlab::ref
