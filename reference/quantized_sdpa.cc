// Reference attention over quantized K and V. The contract is the header comment of
// quantized_sdpa.h: dequantize K and V to f32 exactly as the quantizers define it, then
// run the very same double-precision kernel as sdpa(). Nothing here re-derives
// attention math; this file only checks the packed layout and wires the dequantizers.
#include "reference/quantized_sdpa.h"

#include "reference/quantize.h"
#include "reference/attention_core.h"

#include <cstdint>
#include <optional>
#include <string>

#include "kvlab/error.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"

namespace kvlab::ref {

namespace {

std::string operand_part(const char* operand, const char* part) { return cat(operand, " ", part); }

void validate_spec(const QuantSpec& spec, const char* operand) {
  try {
    spec.validate();
  } catch (const Error& e) {
    // Say which operand carries the bad spec: K and V are validated independently.
    fail(e.kind(), cat(operand, " spec ", to_string(spec), " is invalid: ", e.what()));
  }
}

// The head dim D that a row of `words` u32 codes holds under `spec`.
std::int64_t head_dim_from_codes(const QuantizedView& x, const char* operand) {
  validate_spec(x.spec, operand);
  KVLAB_REQUIRE(x.wq.rank() >= 1, shape_mismatch, operand, " codes have rank 0; expected (..., D·bits/32)");
  const std::int64_t words = x.wq.dim(-1);
  KVLAB_REQUIRE(words > 0 && words * 32 % x.spec.bits == 0, shape_mismatch, operand, " codes have ", words,
                " words per row, which is not a whole number of ", x.spec.bits, "-bit elements");
  return x.spec.unpacked_dim(words);
}

// Checks one packed operand against the head dim D it must hold: codes
// (..., D·bits/32) u32, scales (..., D/group) and, for affine, q4_1 and q5_1, biases of
// the same shape and dtype as the scales. The leading axes must agree between the three arrays.
// Each check builds the name it reports only when it fails: the optimized backends run
// these checks on every decode step.
void validate_packed(const QuantizedView& x, const char* operand, std::int64_t d) {
  validate_spec(x.spec, operand);
  KVLAB_REQUIRE(!x.global_scale, invalid_argument, operand, " has a global scale ", x.global_scale.value_or(0.0f),
                "; quantized attention reads nvfp4 without one");
  const QuantSpec& spec = x.spec;
  KVLAB_REQUIRE(d > 0 && d % spec.group_size == 0, invalid_argument, operand, " head dim D = ", d,
                " is not a positive multiple of group_size ", spec.group_size, " (", to_string(spec), ")");
  if (x.wq.dtype != DType::u32) require_dtype(x.wq, DType::u32, operand_part(operand, "codes").c_str());
  KVLAB_REQUIRE(x.wq.rank() >= 1, shape_mismatch, operand, " codes have rank 0; expected (..., D·bits/32)");
  const std::int64_t words = d * spec.bits / 32;  // exact: group_size·bits is a multiple of 32
  KVLAB_REQUIRE(x.wq.dim(-1) == words, shape_mismatch, operand, " codes have ", x.wq.dim(-1),
                " words per row, expected D·bits/32 = ", d, "·", spec.bits, "/32 = ", words, " (",
                to_string(spec), ")");
  Shape meta = x.wq.shape;
  meta.back() = d / spec.group_size;
  if (x.scales.shape != meta) {
    require_shape(x.scales, meta, operand_part(operand, "scales (codes' leading axes, D/group_size)").c_str());
  }
  // Scales in a float dtype (affine: the data's), f16 (ggml's blocks) or u8 codes.
  switch (spec.format().scale) {
    case ScaleEncoding::input_dtype:
      if (!is_float(x.scales.dtype)) require_float(x.scales, operand_part(operand, "scales").c_str());
      break;
    case ScaleEncoding::f16:
      if (x.scales.dtype != DType::f16) require_dtype(x.scales, DType::f16, operand_part(operand, "scales").c_str());
      break;
    case ScaleEncoding::e8m0:
    case ScaleEncoding::e4m3:
      if (x.scales.dtype != DType::u8) require_dtype(x.scales, DType::u8, operand_part(operand, "scales").c_str());
      break;
  }
  if (spec.has_biases()) {
    KVLAB_REQUIRE(x.biases.data != nullptr, invalid_argument, operand, " biases are missing; mode ",
                  quant_mode_name(spec.mode), " needs them");
    if (x.biases.shape != meta) {
      require_shape(x.biases, meta, operand_part(operand, "biases (same shape as the scales)").c_str());
    }
    if (x.biases.dtype != x.scales.dtype) {
      require_dtype(x.biases, x.scales.dtype, operand_part(operand, "biases (same dtype as the scales)").c_str());
    }
  } else {
    KVLAB_REQUIRE(x.biases.data == nullptr, invalid_argument, operand, " biases of shape ",
                  shape_str(x.biases.shape), " were given, but mode ", quant_mode_name(spec.mode), " has none");
  }
  KVLAB_REQUIRE(x.wq.data != nullptr && x.scales.data != nullptr, invalid_argument, operand,
                " codes or scales have no data");
}

Tensor dequantize_checked(const QuantizedView& x, std::int64_t d) {
  Shape shape = x.wq.shape;
  shape.back() = d;
  Tensor out(DType::f32, shape);
  // f32 output: the dequantizers compute code·scale (+ bias) in f32 and round once to
  // the output dtype, so f32 keeps exactly the values they compute.
  dequantize(x, out.view());
  return out;
}

// A QuantizedTensor keeps "no biases" as an empty Tensor.
ConstTensorView optional_view(const Tensor& t) {
  if (t.rank() == 0 || t.numel() == 0) return {};
  return t.view();
}

QuantizedView view_of(const QuantizedTensor& x) {
  return {x.wq.view(), x.scales.view(), optional_view(x.biases), x.spec};
}

}  // namespace

Tensor dequantize_to_f32(const QuantizedView& x) {
  const std::int64_t d = head_dim_from_codes(x, "quantized operand");
  validate_packed(x, "quantized operand", d);
  return dequantize_checked(x, d);
}

void validate_quantized_sdpa(const ConstTensorView& q, const QuantizedView& k, const QuantizedView& v,
                             const AttentionParams& params, const ConstTensorView* mask_array,
                             const ConstTensorView* sinks, const TensorView& out) {
  require_rank(q, 4, "quantized_sdpa q");
  require_rank(out, 4, "quantized_sdpa out");
  require_rank(k.wq, 4, "quantized_sdpa K codes");
  require_rank(v.wq, 4, "quantized_sdpa V codes");
  // K must hold q's head dim; V holds the output's, which may differ (MLA-style heads).
  const std::int64_t dk = q.dim(3), dv = out.dim(3);
  validate_packed(k, "K", dk);
  validate_packed(v, "V", dv);

  // Everything sdpa() checks (batch, Hq % Hkv, K/V agreement on Hkv and Lk, masks,
  // sinks, params), on the shapes the dequantized K and V will have, before any work.
  const ConstTensorView k_shape{nullptr, DType::f32, {k.wq.dim(0), k.wq.dim(1), k.wq.dim(2), dk}};
  const ConstTensorView v_shape{nullptr, DType::f32, {v.wq.dim(0), v.wq.dim(1), v.wq.dim(2), dv}};
  detail::validate_attention("quantized_sdpa", q, k_shape, v_shape, params, mask_array, sinks, out,
                             detail::KvDtype::any_float);
}

void quantized_sdpa(const ConstTensorView& q, const QuantizedView& k, const QuantizedView& v,
                    const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
                    const TensorView& out) {
  validate_quantized_sdpa(q, k, v, params, mask_array, sinks, out);
  const std::int64_t dk = q.dim(3), dv = out.dim(3);
  const Tensor k_values = dequantize_checked(k, dk);
  const Tensor v_values = dequantize_checked(v, dv);
  detail::attend(q, k_values.view(), v_values.view(), params, mask_array, sinks, out);
}

Tensor quantized_sdpa(const Tensor& q, const QuantizedTensor& k, const QuantizedTensor& v,
                      const AttentionParams& params, const Tensor* mask_array, const Tensor* sinks) {
  // The output shape needs q's rank and V's head dim, which only V's code width gives.
  require_rank(q.view(), 4, "quantized_sdpa q");
  const QuantizedView kv = view_of(k), vv = view_of(v);
  const std::int64_t dv = head_dim_from_codes(vv, "V");
  Tensor out(q.dtype(), {q.dim(0), q.dim(1), q.dim(2), dv});
  ConstTensorView mask_view, sinks_view;
  if (mask_array != nullptr) mask_view = mask_array->view();
  if (sinks != nullptr) sinks_view = sinks->view();
  quantized_sdpa(q.view(), kv, vv, params, mask_array ? &mask_view : nullptr, sinks ? &sinks_view : nullptr,
                 out.view());
  return out;
}

}  // namespace kvlab::ref
