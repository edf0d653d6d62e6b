#include "reference/quantize.h"

#include "kvlab/error.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/ggml_quantize.h"

namespace kvlab::ref {

void validate_format_operands(const QuantSpec& spec, const ConstTensorView& biases,
                              std::optional<float> global_scale, const char* who) {
  const QuantFormat& f = spec.format();
  KVLAB_REQUIRE(f.has_biases || biases.data == nullptr, invalid_argument, who, ": mode ", f.name,
                " has no biases, but biases of shape ", shape_str(biases.shape), " were given");
  KVLAB_REQUIRE(f.takes_global_scale || !global_scale, invalid_argument, who, ": global_scale ",
                global_scale.value_or(0.0f), " is only defined for nvfp4, not mode ", f.name);
}

void validate_rounding(const QuantSpec& spec, Rounding rounding, const char* who) {
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::ggml || !is_ggml_rounding(rounding), invalid_argument, who,
                ": rounding ", rounding_name(rounding), " is for the ggml block formats, not mode ", spec.format().name);
}

void quantize(const ConstTensorView& x, Rounding rounding, const QuantizedMutView& out) {
  validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  validate_rounding(out.spec, rounding, "quantize");
  switch (out.spec.format().encoder) {
    case QuantEncoder::affine: affine_quantize(x, out.spec, rounding, out.wq, out.scales, out.biases); return;
    case QuantEncoder::fp: fp_quantize(x, out.spec, rounding, out.global_scale, out.wq, out.scales); return;
    // ggml's C reference, or with Rounding::ggml_cpu its CPU backend's quantizer; the MLX
    // flavours mean the C reference (kvlab/quant_spec.h).
    case QuantEncoder::ggml: ggml_quantize(x, out.spec, out.wq, out.scales, out.biases, rounding); return;
  }
}

void dequantize(const QuantizedView& in, const TensorView& out, Rounding flavour) {
  validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  validate_rounding(in.spec, flavour, "dequantize");
  switch (in.spec.format().encoder) {
    case QuantEncoder::affine: affine_dequantize(in.wq, in.scales, in.biases, in.spec, out, flavour); return;
    // lut·2^e is exact, so the fp formats' one rounding is every flavour's.
    case QuantEncoder::fp: fp_dequantize(in.wq, in.scales, in.spec, in.global_scale, out); return;
    case QuantEncoder::ggml: ggml_dequantize(in.wq, in.scales, in.biases, in.spec, out); return;
  }
}

std::optional<Rounding> host_quantize_flavour(const QuantSpec& spec, Rounding rounding) {
  // ggml's blocks: the C reference, which ggml_cpu is too except for q8_0.
  if (spec.format().encoder == QuantEncoder::ggml)
    return rounding == Rounding::ggml_cpu && spec.mode == QuantMode::q8_0 ? std::nullopt
                                                                         : std::optional(Rounding::ggml_ref);
  // The 1-bit rule (reference/affine_quantize.h) exists only in the oracle so far.
  if (spec.format().encoder == QuantEncoder::affine && spec.bits == 1) return std::nullopt;
  if (rounding != Rounding::mlx) return rounding;
  // The fp formats' mlx arithmetic rounds to the input dtype at steps of its own.
  if (spec.format().encoder == QuantEncoder::fp) return std::nullopt;
  return Rounding::mlx_cpu;
}

std::optional<Rounding> host_dequantize_flavour(const QuantSpec& spec, DType scales_dtype, Rounding flavour) {
  if (spec.format().encoder == QuantEncoder::ggml) return Rounding::ggml_ref;  // one arithmetic
  if (flavour != Rounding::mlx) return flavour;
  if (spec.format().encoder == QuantEncoder::affine && scales_dtype != DType::f32) return std::nullopt;
  return Rounding::mlx_cpu;
}

std::string unsupported_flavour(const char* backend, const char* op, const QuantSpec& spec, Rounding rounding) {
  return cat(backend, ": ", op, " of ", to_string(spec), " in the ", rounding_name(rounding),
             " flavour is computed by the oracle only (its arithmetic is not vectorized here)");
}

QuantizedTensor quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding) {
  validate_rounding(spec, rounding, "quantize");
  switch (spec.format().encoder) {
    case QuantEncoder::affine: return affine_quantize(x, spec, rounding);
    case QuantEncoder::fp: return fp_quantize(x, spec, rounding);
    case QuantEncoder::ggml: return ggml_quantize(x, spec, rounding);
  }
  fail(ErrorKind::internal, cat("no encoder for mode ", quant_mode_name(spec.mode)));
}

}  // namespace kvlab::ref
