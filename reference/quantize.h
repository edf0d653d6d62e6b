// Quantize and dequantize in any format of the format table (kvlab/quant_spec.h): the
// one place the oracle dispatches on the format. Each format's encoder documents its
// contract: reference/affine_quantize.h (affine), reference/fp_quantize.h (mxfp4,
// mxfp8, nvfp4), reference/ggml_quantize.h (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl: one
// arithmetic, ggml's C reference, whatever the Rounding asked for).
#pragma once

#include <optional>
#include <string>

#include <optional>

#include "kvlab/quantized_view.h"
#include "reference/affine_quantize.h"

namespace kvlab::ref {

// What the format table says of the operands beyond the encoder's own checks: biases only
// where the format has them (a missing one is the encoder's error), a global scale only
// where the format takes one. Every backend calls it before dispatching.
// The rounding flavours a format takes: Rounding::ggml_ref / ggml_cpu only for the ggml
// block formats (kvlab/quant_spec.h); Error{invalid_argument} naming both otherwise.
void validate_rounding(const QuantSpec& spec, Rounding rounding, const char* who);
void validate_format_operands(const QuantSpec& spec, const ConstTensorView& biases,
                              std::optional<float> global_scale, const char* who);

// For backends that implement the mlx_cpu / mlx_gpu arithmetic only: the flavour their
// kernels should compute for a call, or nullopt when `rounding` asks for arithmetic they
// do not have (then they throw Error{unsupported} with unsupported_flavour()). Rounding::mlx
// is mlx_cpu's arithmetic except for fp-format quantize, affine dequantize with f16/bf16
// metadata, and 1-bit affine quantize (kvlab/quant_spec.h). For the ggml block formats:
// their C reference, except q8_0 quantize with Rounding::ggml_cpu (nullopt).
std::optional<Rounding> host_quantize_flavour(const QuantSpec& spec, Rounding rounding);
std::optional<Rounding> host_dequantize_flavour(const QuantSpec& spec, DType scales_dtype, Rounding flavour);
std::string unsupported_flavour(const char* backend, const char* op, const QuantSpec& spec, Rounding rounding);

// x (..., D) float -> out's codes, scales (and biases) in out.spec's format.
void quantize(const ConstTensorView& x, Rounding rounding, const QuantizedMutView& out);
// in's codes -> out (..., D) float; flavour: see kvlab/quant_spec.h (Rounding).
void dequantize(const QuantizedView& in, const TensorView& out, Rounding flavour = Rounding::mlx_cpu);

// Owning convenience: x quantized in spec's format (no global scale).
QuantizedTensor quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding);

}  // namespace kvlab::ref
