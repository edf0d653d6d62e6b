// Reference scaled dot-product attention (spec §2.1).
//
// q (B, Hq, Lq, Dk), k (B, Hkv, Lk, Dk), v (B, Hkv, Lk, Dv), out (B, Hq, Lq, Dv); q, k,
// v and out share one float dtype. Hq % Hkv == 0; query head h reads kv head ⌊h/R⌋,
// R = Hq/Hkv (consecutive query heads share a kv head).
//   s[j] = scale·<q_i, k_j>;  softcap > 0: s[j] = softcap·tanh(s[j]/softcap)
//   mask: none | causal (lower right, window, paddings: reference/mask.h) |
//         boolean array (nonzero keeps) | additive array (added to s); array shape
//         (1|B, 1|Hq, Lq, Lk).
//   sinks (Hq,) float, optional: an extra logit per head in the denominator with no
//   value: o = Σ e^{s_j−m} v_j / (e^{sink−m} + Σ e^{s_j−m}), m = max(sink, max s_j).
// Everything accumulates in double; out is rounded once to the dtype.
// Fully masked row (every key hidden, or every additive score −inf): out = 0 for
// FullyMaskedRow::zero (MLX fused kernel), mean of v over all Lk keys for
// FullyMaskedRow::mean_of_values (MLX fallback, finfo.min fill). Sinks do not change this.
// Invalid: ranks not 4; batch or head dims disagreeing; Hq % Hkv != 0; Dk mismatch;
// dtypes differing; Lk == 0 or any size <= 0; mask array of a non-broadcastable shape
// or wrong dtype; a mask kind that needs an array given none; sinks not (Hq,) float;
// softcap < 0; padding vectors of a length other than B.
#pragma once

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

void sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
          const AttentionParams& params, const ConstTensorView* mask_array,
          const ConstTensorView* sinks, const TensorView& out);

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
            const Tensor* mask_array = nullptr, const Tensor* sinks = nullptr);

}  // namespace kvlab::ref
