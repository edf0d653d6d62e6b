// Internal to reference/: the attention kernel shared by sdpa.cc and quantized_sdpa.cc.
// Quantized attention needs the same kernel with f32 K/V under a q of any float dtype
// (the one combination the public sdpa() forbids), so the kernel and its validator
// live here rather than in the public contract headers.
#pragma once

#include <cstdint>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref::detail {

enum class KvDtype : std::uint8_t { same_as_q, any_float };

void validate_attention(const char* op, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                        const AttentionParams& params, const ConstTensorView* mask_array,
                        const ConstTensorView* sinks, const ConstTensorView& out, KvDtype kv_dtype);
void attend(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const AttentionParams& params,
            const ConstTensorView* mask_array, const ConstTensorView* sinks, const TensorView& out);

}  // namespace kvlab::ref::detail
