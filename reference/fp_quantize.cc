#include "reference/fp_quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <vector>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "reference/bitpack.h"

namespace kvlab::ref {

namespace {

// E2M1 value of each 4-bit code; bit 3 is the sign, so index 8 is −0.0. The CPU fallback
// takes the argmin over this table in this order, which is why its ties go to the lower
// index (smaller magnitude, and +0 before −0).
constexpr std::array<float, 16> kE2M1Lut = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
// nvfp4's global scale maps the tensor amax onto E4M3 max · E2M1 max.
constexpr float kNvfp4Range = kE4M3Max * kE2M1Max;  // 2688

// MLX's Metal E2M1 encoder: round to nearest, ties to even, written as the threshold
// table of docs/quantization.md §Microscaling formats. `<` vs `<=` at each boundary is exactly the
// tie rule: the even mantissa (codes 0, 2, 4, 6) owns both of its boundaries.
std::uint8_t e2m1_encode_gpu(float x) {
  if (std::isnan(x)) return 0x7;  // NaN has no sign test in Metal: it becomes +6
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  std::uint8_t magnitude = 0;
  if (a > 5.0f) magnitude = 7;
  else if (a >= 3.5f) magnitude = 6;
  else if (a > 2.5f) magnitude = 5;
  else if (a >= 1.75f) magnitude = 4;
  else if (a > 1.25f) magnitude = 3;
  else if (a >= 0.75f) magnitude = 2;
  else if (a > 0.25f) magnitude = 1;
  return static_cast<std::uint8_t>(sign | magnitude);
}

// The CPU fallback graph: argmin over |x − lut| (in float32, as the graph does for f32
// input). A strict `<` keeps the first minimum, i.e. the lower index on ties; a NaN
// distance never compares less, so NaN (and ±inf, where every distance is inf) stay at
// index 0 — what MLX's argmin returns when the first element is not beaten.
std::uint8_t e2m1_encode_cpu(float x) {
  std::uint8_t best = 0;
  float best_distance = std::fabs(x - kE2M1Lut[0]);
  for (std::size_t i = 1; i < kE2M1Lut.size(); ++i) {
    const float distance = std::fabs(x - kE2M1Lut[i]);
    if (distance < best_distance) {
      best_distance = distance;
      best = static_cast<std::uint8_t>(i);
    }
  }
  return best;
}

// Rounding::mlx's E2M1: the CPU graph's argmin, its distances |y − lut| computed in the
// input dtype t (y is already in t), so two entries can tie in t where f32 would not.
std::uint8_t e2m1_encode_mlx(float y, DType t) {
  std::uint8_t best = 0;
  float best_distance = round_to_dtype(std::fabs(y - kE2M1Lut[0]), t);
  for (std::size_t i = 1; i < kE2M1Lut.size(); ++i) {
    const float distance = round_to_dtype(std::fabs(y - kE2M1Lut[i]), t);
    if (distance < best_distance) {
      best_distance = distance;
      best = static_cast<std::uint8_t>(i);
    }
  }
  return best;
}

// The encoder reads each format's encodings from its table row (kvlab/quant_spec.h), so a
// new microscaling format with known encodings is a table row, not an edit here.
// Power-of-two (E8M0) group scales: the MX formats.
bool e8m0_scales(const QuantSpec& spec) { return spec.format().scale == ScaleEncoding::e8m0; }

std::string fp_mode_names() {
  std::string out;
  for (const QuantFormat& f : quant_formats()) {
    if (f.encoder == QuantEncoder::fp) out += (out.empty() ? "" : ", ") + std::string(f.name);
  }
  return out;
}

void require_fp_spec(const QuantSpec& spec, const char* who) {
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::fp, invalid_argument, who, ": mode ",
                quant_mode_name(spec.mode), " is not an fp mode (expected ", fp_mode_names(),
                "; affine has its own kernel)");
  spec.validate();
}

void require_global_scale(const QuantSpec& spec, std::optional<float> global_scale, const char* who) {
  if (!global_scale) return;
  KVLAB_REQUIRE(spec.format().takes_global_scale, invalid_argument, who, ": global_scale ", *global_scale,
                " is only allowed for nvfp4, not for mode ", quant_mode_name(spec.mode));
  // MLX accepts any float32 here; a NaN/inf global scale can only produce NaN garbage,
  // so the oracle rejects it rather than define a meaningless result. Zero stays
  // allowed: for an all-zero tensor (global amax 0) MLX's arithmetic still dequantizes to 0.
  KVLAB_REQUIRE(std::isfinite(*global_scale), invalid_argument, who, ": global_scale ", *global_scale,
                " is not finite");
}

// The element encoder of a format, applied to a value already divided by its scale.
std::uint8_t encode_element(float y, const QuantSpec& spec, Rounding rounding) {
  return spec.format().element == ElementEncoding::e4m3 ? e4m3_encode(y) : e2m1_encode(y, rounding);
}

float decode_element(std::uint8_t code, const QuantSpec& spec) {
  return spec.format().element == ElementEncoding::e4m3 ? e4m3_decode(code) : e2m1_decode(code);
}

float element_max(const QuantSpec& spec) {
  return spec.format().element == ElementEncoding::e4m3 ? kE4M3Max : kE2M1Max;
}

// An mx group in Rounding::mlx (MLX 0.32.4's CPU, measured): s = amax/max rounded to the
// input dtype t; exponent e = ceil(log2 s) (0 when s is 0), stored as (e + 127) mod 256 —
// no clamp, so a scale below 2^-127 wraps (f32 amax 1e-38 for mxfp4 stores 255); the
// elements are w / 2^e rounded to t (2^e itself taken in t), then encoded. The exponent
// is rounded up, so |w|/2^e never exceeds the element max and no element saturates.
// Non-finite amax is undefined in MLX (a float-to-int conversion of ±inf); the oracle
// keeps mlx_cpu's 0xFF scale there.
std::uint8_t quantize_group_mx_mlx(std::span<const float> group, const QuantSpec& spec, DType t, float amax,
                                   std::span<std::uint8_t> codes) {
  if (!std::isfinite(amax)) {
    const std::uint8_t scale_code = e8m0_encode(amax, Rounding::mlx_cpu);
    for (std::size_t i = 0; i < group.size(); ++i) codes[i] = encode_element(group[i] / INFINITY, spec, Rounding::mlx_cpu);
    return scale_code;
  }
  const float s = round_to_dtype(amax / element_max(spec), t);
  const int e = s == 0.0f ? 0 : static_cast<int>(std::ceil(std::log2(s)));
  const float step = round_to_dtype(std::ldexp(1.0f, e), t);
  for (std::size_t i = 0; i < group.size(); ++i) {
    const float y = round_to_dtype(group[i] / step, t);
    codes[i] = spec.format().element == ElementEncoding::e4m3 ? e4m3_encode(y) : e2m1_encode_mlx(y, t);
  }
  return static_cast<std::uint8_t>((e + 127) & 0xFF);
}

// Quantizes one group: writes its element codes and returns its scale code.
std::uint8_t quantize_group(std::span<const float> group, const QuantSpec& spec, Rounding rounding, DType t,
                            std::optional<float> global_scale, std::span<std::uint8_t> codes) {
  // fmax ignores NaN, so a NaN element poisons only itself (MLX leaves this unspecified).
  float amax = 0.0f;
  for (float w : group) amax = std::fmax(amax, std::fabs(w));

  if (e8m0_scales(spec) && rounding == Rounding::mlx) return quantize_group_mx_mlx(group, spec, t, amax, codes);
  if (e8m0_scales(spec)) {
    const std::uint8_t scale_code = e8m0_encode(amax / element_max(spec), rounding);
    // decode(scale_code) is a power of two (or +inf for a non-finite amax), so the
    // division is exact barring f32 underflow; the rounded exponent puts |w|/scale
    // anywhere up to max·√2, and the element encoders saturate what lands above the max.
    const float scale = e8m0_decode(scale_code);
    for (std::size_t i = 0; i < group.size(); ++i) codes[i] = encode_element(group[i] / scale, spec, rounding);
    return scale_code;
  }

  const float enc = global_scale ? kNvfp4Range / *global_scale : 1.0f;
  if (rounding == Rounding::mlx) {
    // MLX 0.32.4's CPU graph: amax/6 and w/s in the input dtype t, the f32 factor enc
    // applied after each (promoting to f32), the argmin in f32.
    const std::uint8_t scale_code = e4m3_encode(round_to_dtype(amax / kE2M1Max, t) * enc);
    const float scale = round_to_dtype(e4m3_decode(scale_code), t);
    for (std::size_t i = 0; i < group.size(); ++i) {
      codes[i] = scale == 0.0f ? std::uint8_t{0} : e2m1_encode(round_to_dtype(group[i] / scale, t) * enc, rounding);
    }
    return scale_code;
  }
  // E4M3 group scales (nvfp4). Operation order as in docs/quantization.md §Microscaling formats:
  // (amax/6)·enc, then (w·enc)/s.
  const std::uint8_t scale_code = e4m3_encode(amax / kE2M1Max * enc);
  const float scale = e4m3_decode(scale_code);
  for (std::size_t i = 0; i < group.size(); ++i) {
    codes[i] = scale == 0.0f ? std::uint8_t{0} : e2m1_encode(group[i] * enc / scale, rounding);
  }
  return scale_code;
}

}  // namespace

std::uint8_t e2m1_encode(float x, Rounding rounding) {
  // mlx (f32 distances) is mlx_cpu's argmin; quantize_group_mx_mlx rounds them to t itself.
  return rounding == Rounding::mlx_gpu ? e2m1_encode_gpu(x) : e2m1_encode_cpu(x);
}

float e2m1_decode(std::uint8_t code) {
  KVLAB_REQUIRE(code < 16, invalid_argument, "E2M1 code ", static_cast<int>(code), " does not fit in 4 bits");
  return kE2M1Lut[code];
}

// Same results as PyTorch's Float8_e4m3fn bit trick with MLX's saturation, written as
// arithmetic: find the binade of |x| (clamped to the subnormal binade below 2^-6), round
// |x| to a multiple of that binade's quantum 2^(e−3) with ties to even, and read the code
// off the multiple. With q = multiple (8..16 for normals, 0..8 in the subnormal binade)
// the code is (e+6)·8 + q for every e ≥ −6: q = 16 carries into the next binade and the
// subnormal binade (e = −6) is the code q itself, both for free.
std::uint8_t e4m3_encode(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  // MLX replaced PyTorch's NaN output by saturation: the bit trick compares the magnitude
  // bits with those of 448, and inf and every NaN pattern compare above. !(a < 448) is
  // that test (true for NaN).
  if (!(a < kE4M3Max)) return static_cast<std::uint8_t>(sign | 0x7E);
  int e = -6;
  if (a >= 0x1p-6f) {
    int frexp_exponent = 0;
    std::frexp(a, &frexp_exponent);  // a = f·2^exp with f in [0.5, 1)
    e = frexp_exponent - 1;
  }
  const float quantum = std::ldexp(1.0f, e - 3);
  // a/quantum is exact (a power-of-two rescale of a value below 2^10); rint rounds half to
  // even in the default rounding mode, which the lab never changes. Below 448 the result
  // tops out at 448 itself (e = 8, q = 14), so no overflow path is needed.
  const int q = static_cast<int>(std::rint(a / quantum));
  return static_cast<std::uint8_t>(sign | ((e + 6) * 8 + q));
}

// MLX's decoder: the 7 magnitude bits shifted left by 7 are an fp16 bit pattern whose
// exponent field holds the E4M3 exponent (bias 15 instead of 7) and whose mantissa starts
// with the 3 E4M3 mantissa bits; subnormals land on fp16 subnormals. The pattern's value
// is the E4M3 value / 2^8, so ×256 (exact) restores it. 0x7F reads as 1.875·2^8 = 480.
float e4m3_decode(std::uint8_t code) {
  const auto half_bits = static_cast<std::uint16_t>((code & 0x7Fu) << 7);
  const float magnitude = f16_bits_to_f32(half_bits) * 256.0f;
  return (code & 0x80u) != 0 ? -magnitude : magnitude;
}

std::uint8_t e8m0_encode(float x, Rounding rounding) {
  if (!std::isfinite(x)) return 0xFF;
  if (x < 0.0f) return 0x00;
  // The CPU graph replaces a zero scale (an all-zero group) by exponent 0 before taking
  // log2; Metal takes log2(0) = −inf, whose integer conversion clamps to −127 (code 0).
  if (x == 0.0f && rounding != Rounding::mlx_gpu) return 127;
  const float log2_x = std::log2(x);  // −inf for ±0; finite otherwise (x is finite, >= 0)
  // mlx_gpu: Metal's round (half away from zero); mlx_cpu: mx.round, which is rint.
  const float exponent = rounding == Rounding::mlx_gpu ? std::round(log2_x) : std::rint(log2_x);
  // Clamp while still a float: converting −inf to int would be UB.
  const float clamped = std::clamp(exponent, -127.0f, 127.0f);
  return static_cast<std::uint8_t>(static_cast<int>(clamped) + 127);
}

float e8m0_decode(std::uint8_t code) {
  if (code == 0xFF) return INFINITY;
  return std::ldexp(1.0f, static_cast<int>(code) - 127);  // code 0 gives 2^-127, an f32 subnormal
}

std::int64_t validate_fp_quantize(const ConstTensorView& x, const QuantSpec& spec, std::optional<float> global_scale,
                                  const ConstTensorView& wq, const ConstTensorView& scales) {
  require_fp_spec(spec, "fp_quantize");
  require_global_scale(spec, global_scale, "fp_quantize");
  const PackedShapes shapes = packed_shapes(x, spec, "fp_quantize input x");
  require_dtype(wq, DType::u32, "fp_quantize output wq");
  require_shape(wq, shapes.wq, "fp_quantize output wq");
  require_dtype(scales, DType::u8, "fp_quantize output scales");
  require_shape(scales, shapes.scales, "fp_quantize output scales");
  return shapes.d;
}

void fp_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                 std::optional<float> global_scale, const TensorView& wq, const TensorView& scales) {
  const std::int64_t d = validate_fp_quantize(x, spec, global_scale, wq, scales);
  const std::int64_t words_per_row = wq.dim(-1);
  const std::int64_t groups_per_row = scales.dim(-1);
  const auto gs = static_cast<std::size_t>(spec.group_size);
  const std::int64_t rows = x.numel() / d;
  if (rows == 0) return;  // the row scratch is sized by D alone (see affine_quantize)
  std::vector<float> row(static_cast<std::size_t>(d));
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(d));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < d; ++i) row[static_cast<std::size_t>(i)] = x.load(r * d + i);
    for (std::int64_t g = 0; g < groups_per_row; ++g) {
      const std::size_t begin = static_cast<std::size_t>(g) * gs;
      const std::uint8_t scale_code = quantize_group(std::span(row).subspan(begin, gs), spec, rounding, x.dtype, global_scale,
                                                     std::span(codes).subspan(begin, gs));
      scales.store_int(r * groups_per_row + g, scale_code);
    }
    pack_codes(codes, spec.bits,
               std::span(wq.as<std::uint32_t>() + r * words_per_row, static_cast<std::size_t>(words_per_row)));
  }
}

std::int64_t validate_fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                                    std::optional<float> global_scale, const ConstTensorView& out) {
  require_fp_spec(spec, "fp_dequantize");
  require_global_scale(spec, global_scale, "fp_dequantize");
  require_dtype(wq, DType::u32, "fp_dequantize input wq");
  require_dtype(scales, DType::u8, "fp_dequantize input scales");
  require_float(out, "fp_dequantize output");
  KVLAB_REQUIRE(wq.rank() >= 1, shape_mismatch, "fp_dequantize input wq has rank 0; it needs a packed last axis");
  KVLAB_REQUIRE(scales.rank() == wq.rank() &&
                    std::equal(wq.shape.begin(), wq.shape.end() - 1, scales.shape.begin()),
                shape_mismatch, "fp_dequantize: scales shape ", shape_str(scales.shape),
                " does not share the leading dims of wq shape ", shape_str(wq.shape));
  const std::int64_t words_per_row = wq.dim(-1);
  const std::int64_t groups_per_row = scales.dim(-1);
  const std::int64_t d = words_per_row * 32 / spec.bits;
  KVLAB_REQUIRE(d == groups_per_row * spec.group_size, shape_mismatch, "fp_dequantize: wq last dim ",
                words_per_row, " holds ", d, " codes of ", spec.bits, " bits, but scales last dim ", groups_per_row,
                " × group_size ", spec.group_size, " covers ", groups_per_row * spec.group_size);
  require_shape(out, shape_with_last(wq.shape, d), "fp_dequantize output");
  return d;
}

void fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                   std::optional<float> global_scale, const TensorView& out) {
  const std::int64_t d = validate_fp_dequantize(wq, scales, spec, global_scale, out);
  const std::int64_t words_per_row = wq.dim(-1);
  const std::int64_t groups_per_row = scales.dim(-1);

  // nvfp4's second-level factor; docs/quantization.md §Microscaling formats applies it after
  // lut·scale.
  const float global_factor = global_scale ? *global_scale / kNvfp4Range : 1.0f;
  const std::int64_t rows = d == 0 ? 0 : out.numel() / d;
  const auto gs = static_cast<std::int64_t>(spec.group_size);
  if (rows == 0) return;  // the row scratch is sized by D alone (see affine_quantize)
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(d));
  for (std::int64_t r = 0; r < rows; ++r) {
    unpack_codes(std::span(wq.as<const std::uint32_t>() + r * words_per_row, static_cast<std::size_t>(words_per_row)),
                 spec.bits, codes);
    for (std::int64_t i = 0; i < d; ++i) {
      const auto scale_code = static_cast<std::uint8_t>(scales.load_int(r * groups_per_row + i / gs));
      const float element = decode_element(codes[static_cast<std::size_t>(i)], spec);
      float value = 0.0f;
      if (e8m0_scales(spec)) {
        value = element * e8m0_decode(scale_code);  // exact (power of two) unless it overflows
      } else {
        value = element * e4m3_decode(scale_code);  // exact: at most 2 + 4 significant bits
        if (global_scale) value *= global_factor;
      }
      out.store(r * d + i, value);  // the single rounding to out.dtype
    }
  }
}

QuantizedTensor fp_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding,
                            std::optional<float> global_scale) {
  require_fp_spec(spec, "fp_quantize");
  const PackedShapes shapes = packed_shapes(x.view(), spec, "fp_quantize input x");
  QuantizedTensor q{Tensor(DType::u32, shapes.wq), Tensor(DType::u8, shapes.scales), Tensor(), spec};
  fp_quantize(x.view(), spec, rounding, global_scale, q.wq.view(), q.scales.view());
  return q;
}

Tensor fp_dequantize(const QuantizedTensor& q, std::optional<float> global_scale, DType out_dtype) {
  require_fp_spec(q.spec, "fp_dequantize");
  KVLAB_REQUIRE(q.wq.rank() >= 1, shape_mismatch, "fp_dequantize input wq has rank 0; it needs a packed last axis");
  require_float(ConstTensorView{nullptr, out_dtype, {}}, "fp_dequantize output");
  Tensor out(out_dtype, shape_with_last(q.wq.shape(), q.wq.dim(-1) * 32 / q.spec.bits));
  fp_dequantize(q.wq.view(), q.scales.view(), q.spec, global_scale, out.view());
  return out;
}

}  // namespace kvlab::ref
