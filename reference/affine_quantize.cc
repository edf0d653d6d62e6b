// STUB: replaced by the real oracle.
#include "reference/affine_quantize.h"

#include "kvlab/error.h"

namespace kvlab::ref {
AffineGroupParams affine_group_params(std::span<const float>, int, Rounding) { fail(ErrorKind::unsupported, "affine_group_params: not implemented yet"); }
std::uint8_t affine_code(float, const AffineGroupParams&, int, Rounding) { fail(ErrorKind::unsupported, "affine_code: not implemented yet"); }
void affine_quantize(const ConstTensorView&, const QuantSpec&, Rounding, const TensorView&, const TensorView&, const TensorView&) { fail(ErrorKind::unsupported, "affine_quantize: not implemented yet"); }
void affine_dequantize(const ConstTensorView&, const ConstTensorView&, const ConstTensorView&, const QuantSpec&, const TensorView&) { fail(ErrorKind::unsupported, "affine_dequantize: not implemented yet"); }
QuantizedTensor affine_quantize(const Tensor&, const QuantSpec&, Rounding) { fail(ErrorKind::unsupported, "affine_quantize: not implemented yet"); }
Tensor affine_dequantize(const QuantizedTensor&) { fail(ErrorKind::unsupported, "affine_dequantize: not implemented yet"); }
Tensor affine_dequantize(const QuantizedTensor&, DType) { fail(ErrorKind::unsupported, "affine_dequantize: not implemented yet"); }

}  // namespace kvlab::ref
