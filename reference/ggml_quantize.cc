#include "reference/ggml_quantize.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "reference/bitpack.h"

namespace kvlab::ref {

namespace ggml_detail {

constexpr std::size_t kBlock = kGgmlBlock;

// One f32 operation each, rounded on its own: computed in double and rounded to float,
// which is the correctly rounded f32 result for +, −, ·, / (53 ≥ 2·24 + 2), and which no
// compiler can contract into an fma. ggml's C reference is compiled without contraction
// on x86-64 baseline (no FMA) and numpy never fuses, so this is the arithmetic both write.
float f32_mul_(float a, float b) { return static_cast<float>(double{a} * double{b}); }
float f32_add_(float a, float b) { return static_cast<float>(double{a} + double{b}); }
float f32_sub_(float a, float b) { return static_cast<float>(double{a} - double{b}); }
float f32_div_(float a, float b) { return static_cast<float>(double{a} / double{b}); }

// C's float-to-integer conversion (truncation toward zero) into [lo, hi]. NaN and values
// outside the type are undefined in C; the oracle gives 0 and saturates
// (reference/ggml_quantize.h).
int c_convert(float v, int lo, int hi) {
  if (std::isnan(v)) return 0;
  const float t = std::trunc(v);
  if (t <= static_cast<float>(lo)) return lo;
  if (t >= static_cast<float>(hi)) return hi;
  return static_cast<int>(t);
}

bool ggml_has_min(QuantMode mode) { return mode == QuantMode::q4_1 || mode == QuantMode::q5_1; }

std::string ggml_mode_names() {
  std::string out;
  for (const QuantFormat& f : quant_formats()) {
    if (f.encoder == QuantEncoder::ggml) out += (out.empty() ? "" : ", ") + std::string(f.name);
  }
  return out;
}

void require_ggml_spec(const QuantSpec& spec, const char* who) {
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::ggml, invalid_argument, who, ": mode ",
                quant_mode_name(spec.mode), " is not a ggml block format (expected ", ggml_mode_names(), ")");
  spec.validate();
}

// The first element of largest magnitude, 0 when every element is 0 (q4_0, q5_0, iq4_nl:
// `if (amax < fabsf(v))`, so NaN is skipped and a tie keeps the earlier element).
float ggml_signed_max(std::span<const float, kGgmlBlock> x, float* amax_out) {
  float amax = 0.0f, max = 0.0f;
  for (const float v : x) {
    if (amax < std::fabs(v)) {
      amax = std::fabs(v);
      max = v;
    }
  }
  if (amax_out != nullptr) *amax_out = amax;
  return max;
}

// ggml's best_index_int8: the nearest table value, ties to the upper one, the distances
// taken in f32.
int iq4nl_best_index(float x) {
  const auto& v = kIq4nlValues;
  if (x <= static_cast<float>(v[0])) return 0;
  if (x >= static_cast<float>(v[15])) return 15;
  std::size_t lo = 0, hi = 15;
  while (hi - lo > 1) {
    const std::size_t mid = (lo + hi) / 2;
    if (x < static_cast<float>(v[mid])) hi = mid;
    else lo = mid;
  }
  return static_cast<int>(f32_sub_(x, static_cast<float>(v[hi - 1])) < f32_sub_(static_cast<float>(v[hi]), x) ? hi - 1 : hi);
}

// q8_0 (quantize_row_q8_0_ref).
GgmlBlock quantize_q8_0(std::span<const float, kGgmlBlock> x) {
  float amax = 0.0f;
  // MAX(a, b) is (a > b ? a : b): a NaN becomes amax, and the next element replaces it.
  for (const float v : x) amax = amax > std::fabs(v) ? amax : std::fabs(v);
  const float d = f32_div_(amax, 127.0f);
  const float id = d != 0.0f ? f32_div_(1.0f, d) : 0.0f;
  GgmlBlock b;
  for (std::size_t j = 0; j < kBlock; ++j) {
    const int q = c_convert(std::round(f32_mul_(x[j], id)), -128, 127);  // roundf: half away from zero
    b.codes[j] = static_cast<std::uint8_t>(q & 0xFF);
  }
  b.d = ggml_fp16_bits(d);
  return b;
}

// q8_0 as ggml-cpu quantizes it on x86 with AVX/AVX2 (quantize_row_q8_0 of
// ggml-cpu/arch/x86/quants.c): amax by MAXPS over |x| in its lane order (MAXPS(a, b) is
// a > b ? a : b, so a NaN operand yields b), id = 127/amax (not 1/(amax/127)), codes by
// round-to-nearest-even of x·id, NaN and out-of-range by CVTPS2DQ's 0x80000000 saturated
// to −128 by the packs; d stored by F16C (RNE; a NaN keeps its top payload bits).
std::uint16_t f16c_bits(float x) {
  if (!std::isnan(x)) return ggml_fp16_bits(x);
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<std::uint16_t>(((u >> 16) & 0x8000U) | 0x7E00U | ((u >> 13) & 0x3FFU));
}

GgmlBlock quantize_q8_0_cpu(std::span<const float, kGgmlBlock> x) {
  const auto maxps = [](float a, float b) { return a > b ? a : b; };
  std::array<float, 8> lane{};
  for (std::size_t j = 0; j < 8; ++j) lane[j] = std::fabs(x[j]);
  for (std::size_t v = 1; v < 4; ++v)
    for (std::size_t j = 0; j < 8; ++j) lane[j] = maxps(lane[j], std::fabs(x[8 * v + j]));
  std::array<float, 4> four{};
  for (std::size_t k = 0; k < 4; ++k) four[k] = maxps(lane[4 + k], lane[k]);  // high half, low half
  const float two0 = maxps(four[0], four[2]), two1 = maxps(four[1], four[3]);  // with movehl
  const float amax = maxps(two0, two1);                                         // max_ss with movehdup
  GgmlBlock b;
  b.d = f16c_bits(f32_div_(amax, 127.0f));
  const float id = amax != 0.0f ? f32_div_(127.0f, amax) : 0.0f;
  for (std::size_t j = 0; j < kBlock; ++j) {
    const float r = std::nearbyint(f32_mul_(x[j], id));
    const int q = std::isnan(r) || r >= 0x1p31f || r < -0x1p31f ? -128 : std::clamp(static_cast<int>(r), -128, 127);
    b.codes[j] = static_cast<std::uint8_t>(q & 0xFF);
  }
  return b;
}

// q4_0 and q5_0 (quantize_row_q4_0_ref, quantize_row_q5_0_ref): n = 8 or 16.
GgmlBlock quantize_offset(std::span<const float, kGgmlBlock> x, int n) {
  const float max = ggml_signed_max(x, nullptr);
  const float d = f32_div_(max, static_cast<float>(-n));
  const float id = d != 0.0f ? f32_div_(1.0f, d) : 0.0f;
  const float half_up = static_cast<float>(n) + 0.5f;  // 8.5f, 16.5f
  const int top = 2 * n - 1;
  GgmlBlock b;
  for (std::size_t j = 0; j < kBlock; ++j) {
    const int q = std::min(top, c_convert(f32_add_(f32_mul_(x[j], id), half_up), -128, 127));  // (int8_t) then MIN
    b.codes[j] = static_cast<std::uint8_t>(std::max(q, 0));
  }
  b.d = ggml_fp16_bits(d);
  return b;
}

// q4_1 and q5_1 (quantize_row_q4_1_ref, quantize_row_q5_1_ref): top = 15 or 31.
GgmlBlock quantize_min(std::span<const float, kGgmlBlock> x, int top) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (const float v : x) {
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const float d = f32_div_(f32_sub_(max, min), static_cast<float>(top));
  const float id = d != 0.0f ? f32_div_(1.0f, d) : 0.0f;
  GgmlBlock b;
  for (std::size_t j = 0; j < kBlock; ++j) {
    const float y = f32_add_(f32_mul_(f32_sub_(x[j], min), id), 0.5f);
    // q4_1: MIN(15, (int8_t)y); q5_1: (uint8_t)y with no clamp, of which the block keeps
    // 5 bits (4 in qs, 1 in qh).
    const int q = top == 15 ? std::clamp(c_convert(y, -128, 127), 0, 15) : c_convert(y, 0, 255) & 0x1F;
    b.codes[j] = static_cast<std::uint8_t>(q);
  }
  b.d = ggml_fp16_bits(d);
  b.m = ggml_fp16_bits(min);
  return b;
}

// iq4_nl (quantize_row_iq4_nl_ref → quantize_row_iq4_nl_impl with one block of 32, no
// importance weights and ntry = −1).
GgmlBlock quantize_iq4_nl(std::span<const float, kGgmlBlock> x) {
  GgmlBlock b;
  float amax = 0.0f;
  float max = 0.0f;
  for (const float v : x) {
    if (std::fabs(v) > amax) {
      amax = std::fabs(v);
      max = v;
    }
  }
  if (amax < 1e-15f) {  // GROUP_MAX_EPS: scale 0; ggml leaves the codes stale, kvlab writes 8
    b.codes.fill(static_cast<std::uint8_t>(iq4nl_best_index(0.0f)));
    b.d = ggml_fp16_bits(0.0f);
    return b;
  }
  const float d0 = f32_div_(max, static_cast<float>(kIq4nlValues[0]));  // ntry <= 0: max/values[0]
  const float id = f32_div_(1.0f, d0);
  float sumqx = 0.0f, sumq2 = 0.0f;
  for (std::size_t j = 0; j < kBlock; ++j) {
    const int l = iq4nl_best_index(f32_mul_(id, x[j]));
    b.codes[j] = static_cast<std::uint8_t>(l);
    const float q = static_cast<float>(kIq4nlValues[static_cast<std::size_t>(l)]);
    const float w = f32_mul_(x[j], x[j]);
    sumqx = f32_add_(sumqx, f32_mul_(f32_mul_(w, q), x[j]));
    sumq2 = f32_add_(sumq2, f32_mul_(f32_mul_(w, q), q));
  }
  const float d = sumq2 > 0.0f ? f32_div_(sumqx, sumq2) : 0.0f;
  b.d = ggml_fp16_bits(d);
  return b;
}

}  // namespace ggml_detail

using namespace ggml_detail;


std::uint16_t ggml_fp16_bits(float x) {
  if (std::isnan(x)) return static_cast<std::uint16_t>((std::signbit(x) ? 0x8000u : 0u) | 0x7E00u);
  return f32_to_f16_bits(x);
}

GgmlBlock ggml_quantize_block(QuantMode mode, std::span<const float, kGgmlBlock> x, Rounding rounding) {
  switch (mode) {
    case QuantMode::q8_0: return rounding == Rounding::ggml_cpu ? quantize_q8_0_cpu(x) : quantize_q8_0(x);
    case QuantMode::q4_0: return quantize_offset(x, 8);
    case QuantMode::q5_0: return quantize_offset(x, 16);
    case QuantMode::q4_1: return quantize_min(x, 15);
    case QuantMode::q5_1: return quantize_min(x, 31);
    case QuantMode::iq4_nl: return quantize_iq4_nl(x);
    case QuantMode::affine:
    case QuantMode::mxfp4:
    case QuantMode::mxfp8:
    case QuantMode::nvfp4: break;
  }
  fail(ErrorKind::invalid_argument,
       cat("ggml_quantize_block: mode ", quant_mode_name(mode), " is not a ggml block format (expected ",
           ggml_mode_names(), ")"));
}

float ggml_block_value(QuantMode mode, const GgmlBlock& block, int i) {
  KVLAB_REQUIRE(i >= 0 && i < kGgmlBlock, invalid_argument, "ggml_block_value: element ", i, " is outside a block of 32");
  const float d = f16_bits_to_f32(block.d);
  const std::uint8_t c = block.codes[static_cast<std::size_t>(i)];
  switch (mode) {
    case QuantMode::q8_0: return f32_mul_(static_cast<float>(static_cast<std::int8_t>(c)), d);
    case QuantMode::q4_0: return f32_mul_(static_cast<float>(static_cast<int>(c & 0x0F) - 8), d);
    case QuantMode::q5_0: return f32_mul_(static_cast<float>(static_cast<int>(c & 0x1F) - 16), d);
    case QuantMode::q4_1: return f32_add_(f32_mul_(static_cast<float>(c & 0x0F), d), f16_bits_to_f32(block.m));
    case QuantMode::q5_1: return f32_add_(f32_mul_(static_cast<float>(c & 0x1F), d), f16_bits_to_f32(block.m));
    case QuantMode::iq4_nl: return f32_mul_(d, static_cast<float>(kIq4nlValues[c & 0x0Fu]));
    case QuantMode::affine:
    case QuantMode::mxfp4:
    case QuantMode::mxfp8:
    case QuantMode::nvfp4: break;
  }
  fail(ErrorKind::invalid_argument,
       cat("ggml_block_value: mode ", quant_mode_name(mode), " is not a ggml block format (expected ",
           ggml_mode_names(), ")"));
}

std::size_t ggml_block_bytes(QuantMode mode) {
  require_ggml_spec(QuantSpec::make(mode), "ggml_block_bytes");
  // 2 bytes of d, 2 of m where there is a min, 4 of high bits for 5-bit codes, 32·bits/8
  // of (low) codes: 34, 18, 20, 22, 24, 18.
  const int bits = quant_format(mode).default_bits;
  return static_cast<std::size_t>(2 + (ggml_has_min(mode) ? 2 : 0) + (bits == 5 ? 4 : 0) + (bits == 5 ? 16 : 32 * bits / 8));
}

std::vector<std::uint8_t> ggml_block_to_bytes(QuantMode mode, const GgmlBlock& block) {
  std::vector<std::uint8_t> out(ggml_block_bytes(mode), 0);
  std::size_t at = 0;
  const auto put16 = [&](std::uint16_t v) {
    out[at++] = static_cast<std::uint8_t>(v & 0xFF);
    out[at++] = static_cast<std::uint8_t>(v >> 8);
  };
  put16(block.d);
  if (ggml_has_min(mode)) put16(block.m);
  if (mode == QuantMode::q8_0) {
    for (std::size_t j = 0; j < kBlock; ++j) out[at++] = block.codes[j];
    return out;
  }
  if (quant_format(mode).default_bits == 5) {  // qh: bit j is bit 4 of element j's code
    std::uint32_t qh = 0;
    for (std::size_t j = 0; j < kBlock; ++j) qh |= static_cast<std::uint32_t>((block.codes[j] >> 4) & 1u) << j;
    for (int k = 0; k < 4; ++k) out[at++] = static_cast<std::uint8_t>(qh >> (8 * k));
  }
  // qs[j]: element j in the low nibble, element j + 16 in the high nibble.
  for (std::size_t j = 0; j < kBlock / 2; ++j) {
    const auto lo = static_cast<std::uint8_t>(block.codes[j] & 0x0F);
    const auto hi = static_cast<std::uint8_t>(block.codes[j + 16] & 0x0F);
    out[at++] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  return out;
}

GgmlBlock ggml_block_from_bytes(QuantMode mode, std::span<const std::uint8_t> bytes) {
  const std::size_t size = ggml_block_bytes(mode);
  KVLAB_REQUIRE(bytes.size() == size, shape_mismatch, "ggml_block_from_bytes: a ", quant_mode_name(mode),
                " block is ", size, " bytes, got ", bytes.size());
  GgmlBlock b;
  std::size_t at = 0;
  const auto get16 = [&] {
    const auto v = static_cast<std::uint16_t>(bytes[at] | (bytes[at + 1] << 8));
    at += 2;
    return v;
  };
  b.d = get16();
  if (ggml_has_min(mode)) b.m = get16();
  if (mode == QuantMode::q8_0) {
    for (std::size_t j = 0; j < kBlock; ++j) b.codes[j] = bytes[at++];
    return b;
  }
  std::uint32_t qh = 0;
  if (quant_format(mode).default_bits == 5) {
    for (int k = 0; k < 4; ++k) qh |= static_cast<std::uint32_t>(bytes[at++]) << (8 * k);
  }
  for (std::size_t j = 0; j < kBlock / 2; ++j) {
    const std::uint8_t q = bytes[at++];
    b.codes[j] = static_cast<std::uint8_t>((q & 0x0F) | (((qh >> j) & 1u) << 4));
    b.codes[j + 16] = static_cast<std::uint8_t>((q >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
  return b;
}

void validate_ggml_quantize(const ConstTensorView& x, const QuantSpec& spec, const ConstTensorView& wq,
                            const ConstTensorView& scales, const ConstTensorView& biases) {
  require_ggml_spec(spec, "ggml_quantize");
  const PackedShapes shapes = packed_shapes(x, spec, "ggml_quantize input x");
  require_dtype(wq, DType::u32, "ggml_quantize output wq");
  require_shape(wq, shapes.wq, "ggml_quantize output wq");
  require_dtype(scales, DType::f16, "ggml_quantize output scales");
  require_shape(scales, shapes.scales, "ggml_quantize output scales");
  if (spec.has_biases()) {
    // A missing biases output fails here naming itself (its dtype or rank is wrong).
    require_dtype(biases, DType::f16, "ggml_quantize output biases");
    require_shape(biases, shapes.scales, "ggml_quantize output biases");
  } else {
    KVLAB_REQUIRE(biases.data == nullptr, invalid_argument, "ggml_quantize: mode ", quant_mode_name(spec.mode),
                  " has no biases, but biases of shape ", shape_str(biases.shape), " were given");
  }
}

void validate_ggml_dequantize(const ConstTensorView& wq, const ConstTensorView& scales,
                              const ConstTensorView& biases, const QuantSpec& spec, const ConstTensorView& out) {
  require_ggml_spec(spec, "ggml_dequantize");
  require_dtype(wq, DType::u32, "ggml_dequantize input wq");
  require_dtype(scales, DType::f16, "ggml_dequantize input scales");
  require_float(out, "ggml_dequantize output");
  KVLAB_REQUIRE(wq.rank() >= 1, shape_mismatch, "ggml_dequantize input wq has rank 0; it needs a packed last axis");
  KVLAB_REQUIRE(scales.rank() == wq.rank() && std::equal(wq.shape.begin(), wq.shape.end() - 1, scales.shape.begin()),
                shape_mismatch, "ggml_dequantize: scales shape ", shape_str(scales.shape),
                " does not share the leading dims of wq shape ", shape_str(wq.shape));
  if (spec.has_biases()) {
    require_dtype(biases, DType::f16, "ggml_dequantize input biases");
    require_shape(biases, scales.shape, "ggml_dequantize input biases");
  } else {
    KVLAB_REQUIRE(biases.data == nullptr, invalid_argument, "ggml_dequantize: mode ", quant_mode_name(spec.mode),
                  " has no biases, but biases of shape ", shape_str(biases.shape), " were given");
  }
  const std::int64_t words = wq.dim(-1), groups = scales.dim(-1);
  KVLAB_REQUIRE(words * 32 == groups * kGgmlBlock * spec.bits, shape_mismatch, "ggml_dequantize: wq has ", words,
                " words per row (", words * 32, " bits) but scales have ", groups, " blocks of 32 × ", spec.bits,
                "-bit codes (", groups * kGgmlBlock * spec.bits, " bits)");
  require_shape(out, shape_with_last(wq.shape, groups * kGgmlBlock), "ggml_dequantize output");
}

void ggml_quantize(const ConstTensorView& x, const QuantSpec& spec, const TensorView& wq, const TensorView& scales,
                   const TensorView& biases, Rounding rounding) {
  validate_ggml_quantize(x, spec, wq, scales, biases);
  const std::int64_t d = x.dim(-1);
  const std::int64_t rows = x.numel() / d;
  const std::int64_t words_per_row = wq.dim(-1), blocks_per_row = d / kGgmlBlock;
  if (rows == 0) return;
  std::vector<float> row(static_cast<std::size_t>(d));
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(d));
  auto* scale_bits = scales.as<std::uint16_t>();
  auto* min_bits = spec.has_biases() ? biases.as<std::uint16_t>() : nullptr;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < d; ++i) row[static_cast<std::size_t>(i)] = x.load(r * d + i);
    for (std::int64_t g = 0; g < blocks_per_row; ++g) {
      const auto begin = static_cast<std::size_t>(g * kGgmlBlock);
      const GgmlBlock b =
          ggml_quantize_block(spec.mode, std::span<const float, kGgmlBlock>(row.data() + begin, kGgmlBlock), rounding);
      std::copy(b.codes.begin(), b.codes.end(), codes.begin() + static_cast<std::ptrdiff_t>(begin));
      scale_bits[r * blocks_per_row + g] = b.d;
      if (min_bits != nullptr) min_bits[r * blocks_per_row + g] = b.m;
    }
    pack_codes(codes, spec.bits,
               std::span(wq.as<std::uint32_t>() + r * words_per_row, static_cast<std::size_t>(words_per_row)));
  }
}

void ggml_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                     const QuantSpec& spec, const TensorView& out) {
  validate_ggml_dequantize(wq, scales, biases, spec, out);
  const std::int64_t words_per_row = wq.dim(-1), blocks_per_row = scales.dim(-1);
  const std::int64_t d = blocks_per_row * kGgmlBlock;
  const std::int64_t rows = d == 0 ? 0 : out.numel() / d;
  if (rows == 0) return;
  const auto* scale_bits = scales.as<const std::uint16_t>();
  const auto* min_bits = spec.has_biases() ? biases.as<const std::uint16_t>() : nullptr;
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(d));
  for (std::int64_t r = 0; r < rows; ++r) {
    unpack_codes(std::span(wq.as<const std::uint32_t>() + r * words_per_row, static_cast<std::size_t>(words_per_row)),
                 spec.bits, codes);
    for (std::int64_t g = 0; g < blocks_per_row; ++g) {
      GgmlBlock b;
      b.d = scale_bits[r * blocks_per_row + g];
      b.m = min_bits != nullptr ? min_bits[r * blocks_per_row + g] : 0;
      std::copy_n(codes.begin() + static_cast<std::ptrdiff_t>(g * kGgmlBlock), kGgmlBlock, b.codes.begin());
      for (int i = 0; i < kGgmlBlock; ++i) {
        out.store(r * d + g * kGgmlBlock + i, ggml_block_value(spec.mode, b, i));  // one rounding to out.dtype
      }
    }
  }
}

QuantizedTensor ggml_quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding) {
  require_ggml_spec(spec, "ggml_quantize");
  const PackedShapes shapes = packed_shapes(x.view(), spec, "ggml_quantize input x");
  QuantizedTensor q{Tensor(DType::u32, shapes.wq), Tensor(DType::f16, shapes.scales),
                    spec.has_biases() ? Tensor(DType::f16, shapes.scales) : Tensor(), spec};
  ggml_quantize(x.view(), spec, q.wq.view(), q.scales.view(), spec.has_biases() ? q.biases.view() : TensorView{},
                rounding);
  return q;
}

Tensor ggml_dequantize(const QuantizedTensor& q, DType out_dtype) {
  require_ggml_spec(q.spec, "ggml_dequantize");
  KVLAB_REQUIRE(q.wq.rank() >= 1, shape_mismatch, "ggml_dequantize input wq has rank 0; it needs a packed last axis");
  require_float(ConstTensorView{nullptr, out_dtype, {}}, "ggml_dequantize output");
  Tensor out(out_dtype, shape_with_last(q.wq.shape(), q.scales.dim(-1) * kGgmlBlock));
  ggml_dequantize(q.wq.view(), q.scales.view(), q.spec.has_biases() ? q.biases.view() : ConstTensorView{}, q.spec,
                  out.view());
  return out;
}

}  // namespace kvlab::ref
