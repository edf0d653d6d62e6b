// STUB: replaced by the real oracle.
#include "reference/quantized_sdpa.h"

#include "kvlab/error.h"

namespace kvlab::ref {
void quantized_sdpa(const ConstTensorView&, const QuantizedView&, const QuantizedView&, const AttentionParams&, const ConstTensorView*, const ConstTensorView*, const TensorView&) { fail(ErrorKind::unsupported, "quantized_sdpa: not implemented yet"); }
Tensor quantized_sdpa(const Tensor&, const QuantizedTensor&, const QuantizedTensor&, const AttentionParams&, const Tensor*, const Tensor*) { fail(ErrorKind::unsupported, "quantized_sdpa: not implemented yet"); }
Tensor dequantize_to_f32(const QuantizedView&) { fail(ErrorKind::unsupported, "dequantize_to_f32: not implemented yet"); }

}  // namespace kvlab::ref
