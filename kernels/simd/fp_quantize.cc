// Placeholder: the SIMD fp-format kernels are being written (issue 4).
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"

namespace kvlab::simd {
void fp_quantize(const ConstTensorView&, const QuantSpec&, Rounding, std::optional<float>, const TensorView&,
                 const TensorView&) {
  fail(ErrorKind::unsupported, "SimdBackend: fp_quantize is not implemented by the SIMD backend yet");
}
void fp_dequantize(const ConstTensorView&, const ConstTensorView&, const QuantSpec&, std::optional<float>,
                   const TensorView&) {
  fail(ErrorKind::unsupported, "SimdBackend: fp_dequantize is not implemented by the SIMD backend yet");
}
}  // namespace kvlab::simd
