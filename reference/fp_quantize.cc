// STUB: replaced by the real oracle.
#include "reference/fp_quantize.h"

#include "kvlab/error.h"

namespace kvlab::ref {
std::uint8_t e2m1_encode(float, Rounding) { fail(ErrorKind::unsupported, "e2m1_encode: not implemented yet"); }
float e2m1_decode(std::uint8_t) { fail(ErrorKind::unsupported, "e2m1_decode: not implemented yet"); }
std::uint8_t e4m3_encode(float) { fail(ErrorKind::unsupported, "e4m3_encode: not implemented yet"); }
float e4m3_decode(std::uint8_t) { fail(ErrorKind::unsupported, "e4m3_decode: not implemented yet"); }
std::uint8_t e8m0_encode(float, Rounding) { fail(ErrorKind::unsupported, "e8m0_encode: not implemented yet"); }
float e8m0_decode(std::uint8_t) { fail(ErrorKind::unsupported, "e8m0_decode: not implemented yet"); }
void fp_quantize(const ConstTensorView&, const QuantSpec&, Rounding, std::optional<float>, const TensorView&, const TensorView&) { fail(ErrorKind::unsupported, "fp_quantize: not implemented yet"); }
void fp_dequantize(const ConstTensorView&, const ConstTensorView&, const QuantSpec&, std::optional<float>, const TensorView&) { fail(ErrorKind::unsupported, "fp_dequantize: not implemented yet"); }
QuantizedTensor fp_quantize(const Tensor&, const QuantSpec&, Rounding, std::optional<float>) { fail(ErrorKind::unsupported, "fp_quantize: not implemented yet"); }
Tensor fp_dequantize(const QuantizedTensor&, std::optional<float>, DType) { fail(ErrorKind::unsupported, "fp_dequantize: not implemented yet"); }

}  // namespace kvlab::ref
