// quantize / dequantize through mx::quantize and mx::dequantize, every format of
// kvlab's table. kvlab's packed layout is MLX's (wq u32 LSB-first per row, scales and
// biases per group), so MLX's outputs are copied as they come; the harness compares them
// bit for bit with the oracle.
#include <optional>
#include <string>

#include "kernels/mlx/mlx_array.h"
#include "kernels/mlx/mlx_ops.h"
#include "kvlab/host_buffer.h"
#include "reference/fp_quantize.h"
#include "reference/ggml_quantize.h"
#include "reference/quantize.h"

namespace kvlab::mlxk {

// MLX computes its own arithmetic: kvlab's mlx flavour, which the oracle matches bit for
// bit (reference/*_quantize.h). Cases asking for mlx_cpu or mlx_gpu are another
// contract, so they are UNIMPLEMENTED here rather than failures of MLX.
bool mlx_computes(Rounding r) { return r == Rounding::mlx; }

namespace {

std::string mode_name(const QuantSpec& spec) { return std::string(quant_mode_name(spec.mode)); }

std::optional<mx::array> global_scale_array(std::optional<float> g) {
  if (!g) return std::nullopt;
  return mx::array(*g, mx::float32);
}

// MLX has no ggml block formats: those calls are UNIMPLEMENTED here, after the oracle's
// own checks so that bad calls still fail as they do everywhere.
void require_mlx_format(const QuantSpec& spec, const char* op) {
  KVLAB_REQUIRE(spec.format().encoder != QuantEncoder::ggml, unsupported, "MlxBackend: ", op, " of ",
                to_string(spec), " (a ggml block format) is not an MLX format");
}

// The reference's checks, in its order, so the same calls fail the same way.
void validate_quantize(const ConstTensorView& x, const QuantizedMutView& out) {
  ref::validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  switch (out.spec.format().encoder) {
    case QuantEncoder::affine: ref::validate_affine_quantize(x, out.spec, out.wq, out.scales, out.biases); return;
    case QuantEncoder::fp: ref::validate_fp_quantize(x, out.spec, out.global_scale, out.wq, out.scales); return;
    case QuantEncoder::ggml:
      ref::validate_ggml_quantize(x, out.spec, out.wq, out.scales, out.biases);
      require_mlx_format(out.spec, "quantize");
      return;
  }
}

void validate_dequantize(const QuantizedView& in, const ConstTensorView& out) {
  ref::validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  switch (in.spec.format().encoder) {
    case QuantEncoder::affine: ref::validate_affine_dequantize(in.wq, in.scales, in.biases, in.spec, out); return;
    case QuantEncoder::fp: ref::validate_fp_dequantize(in.wq, in.scales, in.spec, in.global_scale, out); return;
    case QuantEncoder::ggml:
      ref::validate_ggml_dequantize(in.wq, in.scales, in.biases, in.spec, out);
      require_mlx_format(in.spec, "dequantize");
      return;
  }
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  const ConstTensorView x = host_cview(a.x);
  const QuantizedMutView out = host_view(a.out);
  validate_quantize(x, out);
  ref::validate_rounding(out.spec, a.rounding, "quantize");
  KVLAB_REQUIRE(mlx_computes(a.rounding), unsupported,
                "MLX's CPU backend computes the mlx flavour (rounding=mlx), not ", rounding_name(a.rounding),
                " (a contract of kvlab's; mlx_gpu is Metal's arithmetic, absent from this CPU-only wheel)");
  if (x.numel() == 0) return;  // nothing to encode; MLX is not asked about empty rows
  guarded("quantize", [&] {
    // MLX quantizes along the last axis of a matrix: rows are independent, so the
    // leading axes are flattened into one and restored on the way out.
    const std::int64_t d = x.shape.back();
    const mx::array w = mx::reshape(to_array(x), {static_cast<int>(x.numel() / d), static_cast<int>(d)}, cpu());
    std::vector<mx::array> r = mx::quantize(w, out.spec.group_size, out.spec.bits, mode_name(out.spec),
                                            global_scale_array(out.global_scale), cpu());
    const std::size_t expected = out.spec.has_biases() ? 3 : 2;
    KVLAB_REQUIRE(r.size() == expected, internal, "mlx quantize: MLX returned ", r.size(), " arrays for mode ",
                  mode_name(out.spec), ", expected ", expected);
    copy_out(mx::reshape(r[0], to_mx_shape(out.wq.shape), cpu()), out.wq, "quantize wq");
    copy_out(mx::reshape(r[1], to_mx_shape(out.scales.shape), cpu()), out.scales, "quantize scales");
    if (expected == 3) copy_out(mx::reshape(r[2], to_mx_shape(out.biases.shape), cpu()), out.biases, "quantize biases");
  });
}

void dequantize(const DequantizeArgs& a) {
  const QuantizedView in = host_cview(a.in);
  const TensorView out = host_view(a.out);
  validate_dequantize(in, out);
  ref::validate_rounding(in.spec, a.flavour, "dequantize");
  // Another flavour is answered only where its arithmetic is MLX's (fp formats, f32 data).
  KVLAB_REQUIRE(mlx_computes(a.flavour) || ref::host_dequantize_flavour(in.spec, in.scales.dtype, Rounding::mlx) ==
                                              ref::host_dequantize_flavour(in.spec, in.scales.dtype, a.flavour),
                unsupported, "MLX's dequantize computes the mlx flavour, which differs from ",
                rounding_name(a.flavour), " for ", to_string(in.spec), " with ", dtype_name(in.scales.dtype),
                " scales");
  if (out.numel() == 0) return;
  guarded("dequantize", [&] {
    const std::int64_t rows = out.numel() / out.shape.back();
    const auto flat = [&](const ConstTensorView& v) {
      return mx::reshape(to_array(v), {static_cast<int>(rows), static_cast<int>(v.shape.back())}, cpu());
    };
    std::optional<mx::array> biases;
    if (in.spec.has_biases()) biases = flat(in.biases);
    const mx::array r = mx::dequantize(flat(in.wq), flat(in.scales), biases, in.spec.group_size, in.spec.bits,
                                       mode_name(in.spec), global_scale_array(in.global_scale), to_mx(out.dtype),
                                       cpu());
    // MLX 0.32.4 ignores the requested dtype when a global scale is given (the f32
    // scale promotes its result to float32). Casting that f32 result is the single
    // rounding to T that the contract asks for, not a correction of MLX's values.
    mx::array result = r;
    if (in.global_scale && result.dtype() == mx::float32) result = mx::astype(result, to_mx(out.dtype), cpu());
    copy_out(mx::reshape(result, to_mx_shape(out.shape), cpu()), out, "dequantize");
  });
}

}  // namespace kvlab::mlxk
