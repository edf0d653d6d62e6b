// Reference affine quantize/dequantize
// (docs/quantization.md §Affine parameters, §Affine dequantization, §Bit packing). Plain loops over
// rows and groups; the per-group arithmetic is float32 on purpose (MLX computes the group
// parameters and the codes in float32 whatever the input dtype, ml-explore/mlx#1925), so a double
// here would drift off MLX's bits.
#include "reference/affine_quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/error.h"
#include "reference/bitpack.h"

namespace kvlab::ref {

namespace {

// MLX's floor on the group step: s0 = max((alpha − beta)/n, eps). `float eps = 1e-7`
// in the CPU kernel; the nearest float to 1e-7 either way.
constexpr float kScaleFloor = 1e-7f;

void require_code_width(int bits) {
  // The per-group helpers accept any width a uint8 code can hold; the tensor entry
  // points restrict further to MLX's table through QuantSpec::validate().
  KVLAB_REQUIRE(bits >= 1 && bits <= 8, invalid_argument, "code width ", bits, " bits is outside 1..8");
}

float largest_code(int bits) { return static_cast<float>((1 << bits) - 1); }

// R of docs/quantization.md §Affine parameters. rint honours the current rounding direction; kvlab
// never changes the default (to nearest, ties to even), which is what MLX's CPU kernel relies on
// too.
float round_to_code(float v, Rounding rounding) {
  switch (rounding) {
    case Rounding::mlx_cpu:
    case Rounding::mlx: return std::rint(v);       // std::rint in mlx/backend/cpu/quantized.cpp
    case Rounding::mlx_gpu: return std::round(v);  // Metal/CUDA round(): ties away from zero
    case Rounding::ggml_ref:
    case Rounding::ggml_cpu: break;  // the ggml block formats' (refused up front by quantize)
  }
  fail(ErrorKind::invalid_argument, cat("unknown rounding ", static_cast<int>(rounding)));
}

// What Metal's `uint8_t val = min(round(v), n_bins)` leaves in this element's field for
// a negative r (header, "mlx_gpu and negative codes"): float→uint8 of a negative value
// is undefined in C++ and MSL, so the oracle spells out a two's-complement wrap modulo
// 256 and keeps the low `bits` bits, which is what `output |= val << (bits·i)` puts in
// this element's field. Unreachable from affine_quantize on finite input.
std::uint8_t gpu_wrapped_code(float r, int bits) {
  // Floats below −2^31 are integers with ulp ≥ 256, hence multiples of 256: wrap → 0.
  // Checking the range first keeps the int conversion defined (no UB for −inf).
  if (!(r >= -0x1p31f)) return 0;
  const auto as_int = static_cast<std::int64_t>(r);
  const std::int64_t wrapped = as_int & 0xFF;
  return static_cast<std::uint8_t>(wrapped & ((std::int64_t{1} << bits) - 1));
}

// IEEE f32 multiply and add, spelled so that no compiler can fuse them into an fma
// (-ffp-contract would otherwise change bits with the build flags). The double result
// of two floats, rounded to float, is the correctly rounded f32 result because
// 53 ≥ 2·24 + 2 (double rounding is innocuous; Figueroa 1995). Mul then add is what
// MLX's CPU dequantize graph does for f32 data, so f32 outputs match it bit for bit.
// For f16/bf16 metadata MLX 0.32.4 computes in T: code·scale rounded to T, then + bias
// rounded to T (Rounding::mlx). That is not within 1 ulp of the single rounding, as a reading
// of the source once assumed (docs/quantization.md §Affine dequantization): with cancellation
// against the bias, measured up to 6 ulps of f16.
float f32_mul(float a, float b) { return static_cast<float>(double{a} * double{b}); }
float f32_add(float a, float b) { return static_cast<float>(double{a} + double{b}); }

void require_affine(const QuantSpec& spec, const char* who) {
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::affine, invalid_argument, who, ": mode ", quant_mode_name(spec.mode),
                " is not affine (use fp_quantize for mxfp4/mxfp8/nvfp4)");
  spec.validate();
}

void require_rank_at_least_1(const ConstTensorView& v, const char* what) {
  KVLAB_REQUIRE(v.rank() >= 1, shape_mismatch, what, " has rank 0 (shape ", shape_str(v.shape),
                "); quantization needs a last axis");
}

// The last dim D that a (wq, scales) pair describes, after checking that the word count
// and the group count agree: words·32/bits == groups·group_size
// (docs/quantization.md §Format table).
std::int64_t dequantized_dim(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec) {
  const std::int64_t words = wq.dim(-1), groups = scales.dim(-1);
  // Compared in bits so that a word count not divisible by bits/32 is caught, not truncated.
  KVLAB_REQUIRE(words * 32 == groups * spec.group_size * spec.bits, shape_mismatch, "wq has ", words,
                " words per row (", words * 32, " bits) but scales have ", groups, " groups of ", spec.group_size,
                " x ", spec.bits, "-bit codes (", groups * spec.group_size * spec.bits, " bits)");
  return groups * spec.group_size;
}

}  // namespace

AffineGroupParams affine_group_params(std::span<const float> group, int bits, Rounding rounding) {
  require_code_width(bits);
  KVLAB_REQUIRE(!group.empty(), invalid_argument, "affine_group_params: empty group");
  const float n = largest_code(bits);

  // alpha: the GPU kernels start the running max at 0 (ml-explore/mlx#1282 onwards), so
  // an all-negative group is quantized over [min, 0] (the GPU's running maximum,
  // docs/quantization.md §Affine parameters). beta: the GPU starts at Limits<T>::max, which equals
  // the true min for any finite T input. `>`/`<` comparisons skip NaN like MLX's std::max/min
  // reductions (NaN is unspecified).
  float alpha = rounding == Rounding::mlx_gpu ? 0.0f : -std::numeric_limits<float>::infinity();
  float beta = std::numeric_limits<float>::infinity();
  for (const float g : group) {
    if (g > alpha) alpha = g;
    if (g < beta) beta = g;
  }

  const float s0 = std::max((alpha - beta) / n, kScaleFloor);
  // 1 bit (accepted since MLX 0.32.4): min and range, no anchoring — scale = max(max −
  // min, 1e-7) > 0, bias = min, so a value decodes to min or max (measured against MLX's
  // CPU; Metal's 1-bit arithmetic is not measured here, the rule is shared).
  if (bits == 1) return {s0, beta};
  // Anchor on the larger-magnitude extreme; strict '>' so a tie picks alpha
  // (docs/quantization.md §Affine parameters).
  const bool anchor_on_min = std::abs(beta) > std::abs(alpha);
  const float s1 = anchor_on_min ? s0 : -s0;
  const float edge = anchor_on_min ? beta : alpha;
  // Rescale so that edge is exactly code 0 and zero lands on the integer code −q0.
  const float q0 = round_to_code(edge / s1, rounding);
  if (q0 != 0.0f) return {edge / q0, edge};
  return {s1, 0.0f};  // |edge/s1| <= 1/2: only groups within ~5e-8 of zero get here
}

std::uint8_t affine_code(float value, const AffineGroupParams& p, int bits, Rounding rounding) {
  require_code_width(bits);
  const float n = largest_code(bits);
  const float r = round_to_code((value - p.bias) / p.scale, rounding);
  // NaN/Inf input is unspecified upstream (docs/quantization.md §Affine parameters); NaN would make
  // the integer conversion below UB, so the oracle pins it to code 0.
  if (std::isnan(r)) return 0;
  switch (rounding) {
    case Rounding::mlx_cpu:
    case Rounding::mlx: return static_cast<std::uint8_t>(std::min(std::max(r, 0.0f), n));
    case Rounding::mlx_gpu: {
      const float capped = std::min(r, n);  // no lower clamp on the GPU (docs/quantization.md §Rounding flavours)
      if (capped >= 0.0f) return static_cast<std::uint8_t>(capped);
      return gpu_wrapped_code(capped, bits);
    }
    case Rounding::ggml_ref:
    case Rounding::ggml_cpu: break;
  }
  fail(ErrorKind::invalid_argument, cat("unknown rounding ", static_cast<int>(rounding)));
}

void validate_affine_quantize(const ConstTensorView& x, const QuantSpec& spec, const ConstTensorView& wq,
                              const ConstTensorView& scales, const ConstTensorView& biases) {
  require_affine(spec, "affine_quantize");
  require_float(x, "x");
  require_rank_at_least_1(x, "x");
  const std::int64_t d = x.dim(-1);
  const std::int64_t words_per_row = spec.packed_words(d);  // validates D > 0 and D % group_size
  const std::int64_t groups_per_row = spec.groups(d);
  const Shape lead = shape_leading(x.shape);
  require_dtype(wq, DType::u32, "wq");
  require_shape(wq, shape_appended(lead, words_per_row), "wq");
  require_dtype(scales, x.dtype, "scales");  // MLX: scales and biases in the input dtype
  require_shape(scales, shape_appended(lead, groups_per_row), "scales");
  require_dtype(biases, x.dtype, "biases");
  require_shape(biases, shape_appended(lead, groups_per_row), "biases");
}

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding, const TensorView& wq,
                     const TensorView& scales, const TensorView& biases) {
  validate_affine_quantize(x, spec, wq, scales, biases);
  const std::int64_t d = x.dim(-1);
  const std::int64_t words_per_row = spec.packed_words(d);
  const std::int64_t groups_per_row = spec.groups(d);
  const Shape lead = shape_leading(x.shape);

  const std::int64_t rows = shape_numel(lead);
  // No rows, no work: the row scratch below is sized by D alone, which an empty tensor
  // may still give as 2^31 (fuzzed: quantized_sdpa B=0 Dv=2147483648).
  if (rows == 0) return;
  const auto gs = static_cast<std::size_t>(spec.group_size);
  std::vector<float> group(gs);
  std::vector<std::uint8_t> row_codes(static_cast<std::size_t>(d));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups_per_row; ++g) {
      const std::int64_t first = r * d + g * spec.group_size;
      for (std::size_t j = 0; j < gs; ++j) group[j] = x.load(first + static_cast<std::int64_t>(j));
      const AffineGroupParams p = affine_group_params(group, spec.bits, rounding);
      // Codes come from the f32 parameters; only the stored copies are rounded (RNE) to
      // x.dtype, exactly like MLX (docs/quantization.md §Affine parameters, step 6).
      scales.store(r * groups_per_row + g, p.scale);
      biases.store(r * groups_per_row + g, p.bias);
      for (std::size_t j = 0; j < gs; ++j) {
        row_codes[static_cast<std::size_t>(g) * gs + j] = affine_code(group[j], p, spec.bits, rounding);
      }
    }
    std::span<std::uint32_t> row_words(wq.as<std::uint32_t>() + r * words_per_row,
                                       static_cast<std::size_t>(words_per_row));
    pack_codes(row_codes, spec.bits, row_words);
  }
}

void validate_affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales,
                                const ConstTensorView& biases, const QuantSpec& spec, const ConstTensorView& out) {
  require_affine(spec, "affine_dequantize");
  require_dtype(wq, DType::u32, "wq");
  require_rank_at_least_1(wq, "wq");
  require_float(scales, "scales");
  require_dtype(biases, scales.dtype, "biases");
  require_shape(biases, scales.shape, "biases");
  const Shape lead = shape_leading(wq.shape);
  KVLAB_REQUIRE(scales.rank() == wq.rank() && shape_leading(scales.shape) == lead, shape_mismatch, "scales shape ",
                shape_str(scales.shape), " does not share the leading axes of wq shape ", shape_str(wq.shape));
  const std::int64_t d = dequantized_dim(wq, scales, spec);
  require_float(out, "out");
  require_shape(out, shape_appended(lead, d), "out");
}

void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                       const QuantSpec& spec, const TensorView& out, Rounding flavour) {
  validate_affine_dequantize(wq, scales, biases, spec, out);
  const Shape lead = shape_leading(wq.shape);
  const std::int64_t d = out.dim(-1);

  const std::int64_t rows = shape_numel(lead);
  const std::int64_t words_per_row = wq.dim(-1), groups_per_row = scales.dim(-1);
  // The metadata dtype T of MLX's arithmetic under Rounding::mlx (a no-op for f32).
  const DType t = scales.dtype;
  const bool in_t = flavour == Rounding::mlx && t != DType::f32;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::span<const std::uint32_t> row_words(wq.as<const std::uint32_t>() + r * words_per_row,
                                                   static_cast<std::size_t>(words_per_row));
    for (std::int64_t g = 0; g < groups_per_row; ++g) {
      const float scale = scales.load(r * groups_per_row + g);
      const float bias = biases.load(r * groups_per_row + g);
      for (std::int64_t j = 0; j < spec.group_size; ++j) {
        const std::int64_t i = g * spec.group_size + j;
        const auto code = static_cast<float>(code_at(row_words, spec.bits, i));
        // f32 multiply, f32 add, then one storage rounding to out.dtype
        // (docs/quantization.md §Affine dequantization); the mlx flavour rounds the product and the
        // sum to T, as MLX computes in T.
        const float value = in_t ? round_to_dtype(f32_add(round_to_dtype(f32_mul(code, scale), t), bias), t)
                                 : f32_add(f32_mul(code, scale), bias);
        out.store(r * d + i, value);
      }
    }
  }
}

QuantizedTensor affine_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding) {
  require_affine(spec, "affine_quantize");
  require_float(x.view(), "x");
  require_rank_at_least_1(x.view(), "x");
  const std::int64_t d = x.dim(-1);
  const Shape lead = shape_leading(x.shape());
  const Shape params_shape = shape_appended(lead, spec.groups(d));
  QuantizedTensor q{Tensor(DType::u32, shape_appended(lead, spec.packed_words(d))), Tensor(x.dtype(), params_shape),
                    Tensor(x.dtype(), params_shape), spec};
  affine_quantize(x.view(), spec, rounding, q.wq.view(), q.scales.view(), q.biases.view());
  return q;
}

Tensor affine_dequantize(const QuantizedTensor& q) {
  // MLX: result_type(scales, biases); both carry the input dtype here.
  require_float(q.scales.view(), "scales");
  return affine_dequantize(q, q.scales.dtype());
}

Tensor affine_dequantize(const QuantizedTensor& q, DType out_dtype) {
  require_affine(q.spec, "affine_dequantize");
  require_dtype(q.wq.view(), DType::u32, "wq");
  require_rank_at_least_1(q.wq.view(), "wq");
  require_rank_at_least_1(q.scales.view(), "scales");
  require_float(ConstTensorView{nullptr, out_dtype, {}}, "out");
  const std::int64_t d = dequantized_dim(q.wq.view(), q.scales.view(), q.spec);
  Tensor out(out_dtype, shape_appended(shape_leading(q.wq.shape()), d));
  affine_dequantize(q.wq.view(), q.scales.view(), q.biases.view(), q.spec, out.view());
  return out;
}

}  // namespace kvlab::ref
