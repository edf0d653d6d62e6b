#include "reference/quantize.h"

#include "kvlab/error.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"

namespace kvlab::ref {

void validate_format_operands(const QuantSpec& spec, const ConstTensorView& biases,
                              std::optional<float> global_scale, const char* who) {
  const QuantFormat& f = spec.format();
  KVLAB_REQUIRE(f.has_biases || biases.data == nullptr, invalid_argument, who, ": mode ", f.name,
                " has no biases, but biases of shape ", shape_str(biases.shape), " were given");
  KVLAB_REQUIRE(f.takes_global_scale || !global_scale, invalid_argument, who, ": global_scale ",
                global_scale.value_or(0.0f), " is only defined for nvfp4, not mode ", f.name);
}

void quantize(const ConstTensorView& x, Rounding rounding, const QuantizedMutView& out) {
  validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  switch (out.spec.format().encoder) {
    case QuantEncoder::affine: affine_quantize(x, out.spec, rounding, out.wq, out.scales, out.biases); return;
    case QuantEncoder::fp: fp_quantize(x, out.spec, rounding, out.global_scale, out.wq, out.scales); return;
  }
}

void dequantize(const QuantizedView& in, const TensorView& out) {
  validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  switch (in.spec.format().encoder) {
    case QuantEncoder::affine: affine_dequantize(in.wq, in.scales, in.biases, in.spec, out); return;
    case QuantEncoder::fp: fp_dequantize(in.wq, in.scales, in.spec, in.global_scale, out); return;
  }
}

QuantizedTensor quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding) {
  switch (spec.format().encoder) {
    case QuantEncoder::affine: return affine_quantize(x, spec, rounding);
    case QuantEncoder::fp: return fp_quantize(x, spec, rounding);
  }
  fail(ErrorKind::internal, cat("no encoder for mode ", quant_mode_name(spec.mode)));
}

}  // namespace kvlab::ref
