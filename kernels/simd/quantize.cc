// Quantize and dequantize in any format: the SIMD backend's one dispatch on the format
// table's encoder column (the oracle's is reference/quantize.cc).
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/quantize.h"

namespace kvlab::simd {

void quantize(const ConstTensorView& x, Rounding asked, const QuantizedMutView& out) {
  ref::validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  ref::validate_rounding(out.spec, asked, "quantize");
  const std::optional<Rounding> flavour = ref::host_quantize_flavour(out.spec, asked);
  KVLAB_REQUIRE(flavour.has_value(), unsupported, ref::unsupported_flavour("SimdBackend", "quantize", out.spec, asked));
  const Rounding rounding = *flavour;
  switch (out.spec.format().encoder) {
    case QuantEncoder::affine: affine_quantize(x, out.spec, rounding, out.wq, out.scales, out.biases); return;
    case QuantEncoder::fp: fp_quantize(x, out.spec, rounding, out.global_scale, out.wq, out.scales); return;
    // ggml's C reference (ggml_cpu's q8_0 quantizer is refused above as unsupported).
    case QuantEncoder::ggml: ggml_quantize(x, out.spec, out.wq, out.scales, out.biases); return;
  }
  fail(ErrorKind::internal, cat("SimdBackend: quantize: no encoder for ", to_string(out.spec)));
}

void dequantize(const QuantizedView& in, const TensorView& out, Rounding flavour) {
  ref::validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  ref::validate_rounding(in.spec, flavour, "dequantize");
  KVLAB_REQUIRE(ref::host_dequantize_flavour(in.spec, in.scales.dtype, flavour).has_value(), unsupported,
                ref::unsupported_flavour("SimdBackend", "dequantize", in.spec, flavour));
  switch (in.spec.format().encoder) {
    case QuantEncoder::affine: affine_dequantize(in.wq, in.scales, in.biases, in.spec, out); return;
    case QuantEncoder::fp: fp_dequantize(in.wq, in.scales, in.spec, in.global_scale, out); return;
    case QuantEncoder::ggml: ggml_dequantize(in.wq, in.scales, in.biases, in.spec, out); return;
  }
  fail(ErrorKind::internal, cat("SimdBackend: dequantize: no encoder for ", to_string(in.spec)));
}

}  // namespace kvlab::simd
