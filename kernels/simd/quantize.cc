// Quantize and dequantize in any format: the SIMD backend's one dispatch on the format
// table's encoder column (the oracle's is reference/quantize.cc).
#include "kernels/simd/simd_kernels.h"
#include "reference/quantize.h"

namespace kvlab::simd {

void quantize(const ConstTensorView& x, Rounding rounding, const QuantizedMutView& out) {
  ref::validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  switch (out.spec.format().encoder) {
    case QuantEncoder::affine: affine_quantize(x, out.spec, rounding, out.wq, out.scales, out.biases); return;
    case QuantEncoder::fp: fp_quantize(x, out.spec, rounding, out.global_scale, out.wq, out.scales); return;
  }
}

void dequantize(const QuantizedView& in, const TensorView& out) {
  ref::validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  switch (in.spec.format().encoder) {
    case QuantEncoder::affine: affine_dequantize(in.wq, in.scales, in.biases, in.spec, out); return;
    case QuantEncoder::fp: fp_dequantize(in.wq, in.scales, in.spec, in.global_scale, out); return;
  }
}

}  // namespace kvlab::simd
