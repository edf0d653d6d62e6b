// The operands of an sdpa / quantized_sdpa call as host views, checked by the oracle's
// validation (its errors and messages): what a backend that hands attention to another
// engine (ggml, MLX, a plugin) does before anything else.
#pragma once

#include <type_traits>

#include "kvlab/host_buffer.h"
#include "kvlab/op_list.h"
#include "reference/quantized_sdpa.h"
#include "reference/sdpa.h"

namespace kvlab::ref {

// Views of K and V: plain tensors for sdpa, packed ones for quantized_sdpa.
template <class Args, class KV>
struct AttentionOperands {
  explicit AttentionOperands(const Args& a)
      : q(host_cview(a.q)), k(host_cview(a.k)), v(host_cview(a.v)), out(host_view(a.out)),
        mask(host_cview(a.mask, mask_storage_)), sinks(host_cview(a.sinks, sinks_storage_)) {
    if constexpr (std::is_same_v<KV, QuantizedView>) {
      validate_quantized_sdpa(q, k, v, a.params, mask, sinks, out);
    } else {
      validate_sdpa(q, k, v, a.params, mask, sinks, out);
    }
  }
  AttentionOperands(const AttentionOperands&) = delete;  // mask/sinks point into this object
  AttentionOperands& operator=(const AttentionOperands&) = delete;

 private:
  ConstTensorView mask_storage_, sinks_storage_;  // before the pointers: initialized first

 public:
  const ConstTensorView q;
  const KV k, v;
  const TensorView out;
  const ConstTensorView* const mask;
  const ConstTensorView* const sinks;
};

using SdpaOperands = AttentionOperands<SdpaArgs, ConstTensorView>;
using QuantizedSdpaOperands = AttentionOperands<QuantizedSdpaArgs, QuantizedView>;

}  // namespace kvlab::ref
