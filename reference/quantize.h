// Quantize and dequantize in any format of the format table (kvlab/quant_spec.h): the
// one place the oracle dispatches on the format. Each format's encoder documents its
// contract: reference/affine_quantize.h (affine), reference/fp_quantize.h (mxfp4,
// mxfp8, nvfp4).
#pragma once

#include <optional>

#include "kvlab/quantized_view.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

// What the format table says of the operands beyond the encoder's own checks: biases only
// where the format has them (a missing one is the encoder's error), a global scale only
// where the format takes one. Every backend calls it before dispatching.
void validate_format_operands(const QuantSpec& spec, const ConstTensorView& biases,
                              std::optional<float> global_scale, const char* who);

// x (..., D) float -> out's codes, scales (and biases) in out.spec's format.
void quantize(const ConstTensorView& x, Rounding rounding, const QuantizedMutView& out);
// in's codes -> out (..., D) float.
void dequantize(const QuantizedView& in, const TensorView& out);

// Owning convenience: x quantized in spec's format (no global scale).
QuantizedTensor quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding);

}  // namespace kvlab::ref
