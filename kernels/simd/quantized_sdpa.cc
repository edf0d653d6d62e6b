// Placeholder: the fused quantized decode attention kernel is being written (issue 4).
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"

namespace kvlab::simd {
void quantized_sdpa(const ConstTensorView&, const ref::QuantizedView&, const ref::QuantizedView&,
                    const AttentionParams&, const ConstTensorView*, const ConstTensorView*, const TensorView&) {
  fail(ErrorKind::unsupported, "SimdBackend: quantized_sdpa is not implemented by the SIMD backend yet");
}
}  // namespace kvlab::simd
