// SIMD affine quantize/dequantize (contract: reference/affine_quantize.h), bit-exact
// with the oracle on every Highway target.
//
// What is vectorized: the group min/max (running Max/Min, then a lane reduction), the
// (g − bias)/scale division, both roundings, the clamp and the float→code conversion;
// f16/bf16 → f32 row conversion; dequantize's code·scale + bias. What stays scalar,
// per group or per 8 codes: the group parameters (a handful of flops per group, written
// like the oracle so the bits match), storing scales/biases and f16/bf16 dequantize
// outputs (kvlab's RNE conversions: Highway 1.0.3's bf16 DemoteTo truncates), and the
// bit packing (8 codes ↔ `bits` bytes through a u64, any width, see pack_row).
//
// Exactness argument: every vector op used is a correctly rounded IEEE op (Div, Sub,
// Mul, Add; Round = ties-to-even, Trunc, Min/Max, compares), the same ops the oracle
// performs in f32, in the same order. The build sets -ffp-contract=off so Mul+Add never
// fuses on the FMA targets. Min/Max may pick a different signed zero than the oracle's
// `>` scan; that never matters (a zero edge gives q0 = ±0 and bias 0.0f either way).
// Groups holding NaN/Inf (unspecified upstream) take a scalar path that mirrors the
// oracle element for element, because vector Min/Max do not skip NaN like `>` does.
#ifndef KVLAB_SIMD_AFFINE_COMMON
#define KVLAB_SIMD_AFFINE_COMMON
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/affine_quantize.h"

namespace kvlab::simd::affine_detail {

static_assert(std::endian::native == std::endian::little,
              "pack_row writes the LSB-first bitstream as little-endian bytes");

constexpr float kScaleFloor = 1e-7f;  // MLX's eps on the group step (as the oracle)

struct GroupParams {
  float scale = 0, bias = 0;
};

inline float largest_code(int bits) { return static_cast<float>((1 << bits) - 1); }

inline float round_to_code(float v, Rounding rounding) {
  return rounding == Rounding::mlx_cpu ? std::rint(v) : std::round(v);
}

// Spec §1.2 from the group's extremes, operation for operation as the oracle.
inline GroupParams group_params(float alpha, float beta, int bits, Rounding rounding) {
  const float s0 = std::max((alpha - beta) / largest_code(bits), kScaleFloor);
  const bool anchor_on_min = std::abs(beta) > std::abs(alpha);
  const float s1 = anchor_on_min ? s0 : -s0;
  const float edge = anchor_on_min ? beta : alpha;
  const float q0 = round_to_code(edge / s1, rounding);
  if (q0 != 0.0f) return {edge / q0, edge};
  return {s1, 0.0f};
}

// The oracle's affine_code, for the non-finite fallback (NaN → 0; GPU: wrap mod 256).
inline std::uint8_t scalar_code(float value, const GroupParams& p, int bits, Rounding rounding) {
  const float n = largest_code(bits);
  const float r = round_to_code((value - p.bias) / p.scale, rounding);
  if (std::isnan(r)) return 0;
  if (rounding == Rounding::mlx_cpu) return static_cast<std::uint8_t>(std::min(std::max(r, 0.0f), n));
  const float capped = std::min(r, n);
  if (capped >= 0.0f) return static_cast<std::uint8_t>(capped);
  if (!(capped >= -0x1p31f)) return 0;
  return static_cast<std::uint8_t>(static_cast<std::int64_t>(capped) & 0xFF & ((std::int64_t{1} << bits) - 1));
}

// One group with the oracle's scalar loop (NaN-skipping `>`/`<` scan).
inline GroupParams scalar_group(const float* g, int gs, int bits, Rounding rounding, std::uint8_t* codes) {
  float alpha = rounding == Rounding::mlx_gpu ? 0.0f : -std::numeric_limits<float>::infinity();
  float beta = std::numeric_limits<float>::infinity();
  for (int j = 0; j < gs; ++j) {
    if (g[j] > alpha) alpha = g[j];
    if (g[j] < beta) beta = g[j];
  }
  const GroupParams p = group_params(alpha, beta, bits, rounding);
  for (int j = 0; j < gs; ++j) codes[j] = scalar_code(g[j], p, bits, rounding);
  return p;
}

// LSB-first bitstream (reference/bitpack.h) of n codes, n % 8 == 0: 8 codes fill exactly
// `bits` bytes, so each 8-code chunk is assembled in a u64 and its low `bits` bytes are
// the next stream bytes (little-endian words). Codes are < 2^bits by construction.
inline void pack_row(const std::uint8_t* codes, std::int64_t n, int bits, std::uint32_t* words) {
  auto* out = reinterpret_cast<unsigned char*>(words);
  const auto nbytes = static_cast<std::size_t>(bits);
  for (std::int64_t i = 0; i < n; i += 8, out += nbytes) {
    std::uint64_t acc = 0;
    for (int k = 0; k < 8; ++k) acc |= std::uint64_t{codes[i + k]} << (k * bits);
    std::memcpy(out, &acc, nbytes);
  }
}

inline void unpack_row(const std::uint32_t* words, std::int64_t n, int bits, std::uint8_t* codes) {
  const auto* in = reinterpret_cast<const unsigned char*>(words);
  const auto nbytes = static_cast<std::size_t>(bits);
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  for (std::int64_t i = 0; i < n; i += 8, in += nbytes) {
    std::uint64_t acc = 0;
    std::memcpy(&acc, in, nbytes);
    for (int k = 0; k < 8; ++k) codes[i + k] = static_cast<std::uint8_t>((acc >> (k * bits)) & mask);
  }
}

}  // namespace kvlab::simd::affine_detail
#endif  // KVLAB_SIMD_AFFINE_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/affine_quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace ad = kvlab::simd::affine_detail;

// One row: `groups` groups of gs (a multiple of 32, hence of every lane count) values.
void QuantizeRow(const float* HWY_RESTRICT x, std::int64_t groups, int gs, int bits, Rounding rounding,
                 float* HWY_RESTRICT scales, float* HWY_RESTRICT biases, std::uint8_t* HWY_RESTRICT codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::uint8_t, decltype(df)> du8;
  const std::size_t N = hn::Lanes(df);
  const auto len = static_cast<std::size_t>(gs);
  const bool gpu = rounding == Rounding::mlx_gpu;
  const auto vzero = hn::Zero(df);
  const auto vn = hn::Set(df, ad::largest_code(bits));
  const auto vhalf = hn::Set(df, 0.5f);
  const auto vone = hn::Set(df, 1.0f);
  const auto vmask = hn::Set(di, (1 << bits) - 1);
  // GPU kernels start the running max at 0 (oracle header, spec §1.2 (a)).
  const auto max_init = hn::Set(df, gpu ? 0.0f : -std::numeric_limits<float>::infinity());
  const auto min_init = hn::Set(df, std::numeric_limits<float>::infinity());

  for (std::int64_t g = 0; g < groups; ++g) {
    const float* gp = x + static_cast<std::size_t>(g) * len;
    std::uint8_t* cp = codes + static_cast<std::size_t>(g) * len;
    auto vmax = max_init, vmin = min_init, probe = vzero;
    for (std::size_t i = 0; i < len; i += N) {
      const auto v = hn::LoadU(df, gp + i);
      vmax = hn::Max(vmax, v);
      vmin = hn::Min(vmin, v);
      probe = hn::Add(probe, hn::Mul(v, vzero));  // stays ±0 unless some v is NaN or ±inf
    }
    if (!hn::AllFalse(df, hn::IsNaN(probe))) {
      const ad::GroupParams p = ad::scalar_group(gp, gs, bits, rounding, cp);
      scales[g] = p.scale;
      biases[g] = p.bias;
      continue;
    }
    const ad::GroupParams p = ad::group_params(hn::GetLane(hn::MaxOfLanes(df, vmax)),
                                               hn::GetLane(hn::MinOfLanes(df, vmin)), bits, rounding);
    scales[g] = p.scale;
    biases[g] = p.bias;
    const auto vs = hn::Set(df, p.scale), vb = hn::Set(df, p.bias);
    for (std::size_t i = 0; i < len; i += N) {
      const auto q = hn::Div(hn::Sub(hn::LoadU(df, gp + i), vb), vs);
      hn::Vec<decltype(di)> ci;
      if (gpu) {
        // round(): ties away from zero, exactly. q − trunc(q) is exact (Sterbenz for
        // |q| >= 1, trivially below), so |frac| >= 0.5 is the true test; adding 0.5
        // then truncating would round 0.49999997 up (its sum rounds to 1.0f).
        const auto t = hn::Trunc(q);
        const auto frac = hn::Sub(q, t);
        const auto r = hn::IfThenElse(hn::Ge(hn::Abs(frac), vhalf), hn::Add(t, hn::CopySign(vone, q)), t);
        // min(r, n), no lower clamp; negative r (unreachable on finite groups) wraps like
        // the oracle: two's complement & (2^bits − 1); below −2^31 ConvertTo saturates to
        // INT32_MIN, whose low bits are 0, the oracle's answer there.
        ci = hn::And(hn::ConvertTo(di, hn::Min(r, vn)), vmask);
      } else {
        ci = hn::ConvertTo(di, hn::Min(hn::Max(hn::Round(q), vzero), vn));  // rint, clamp [0, n]
      }
      hn::StoreU(hn::DemoteTo(du8, ci), du8, cp + i);
    }
  }
}

// out[i] = code·scale + bias in f32, multiply then add (never fused; see CMakeLists).
void DequantRow(const std::uint8_t* HWY_RESTRICT codes, const float* HWY_RESTRICT scales,
                const float* HWY_RESTRICT biases, std::int64_t groups, int gs, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::uint8_t, decltype(df)> du8;
  const std::size_t N = hn::Lanes(df);
  const auto len = static_cast<std::size_t>(gs);
  for (std::int64_t g = 0; g < groups; ++g) {
    const auto vs = hn::Set(df, scales[g]), vb = hn::Set(df, biases[g]);
    const std::size_t base = static_cast<std::size_t>(g) * len;
    for (std::size_t i = 0; i < len; i += N) {
      const auto c = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(du8, codes + base + i)));
      hn::StoreU(hn::Add(hn::Mul(c, vs), vb), df, out + base + i);
    }
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(HalfRowToF32);
HWY_EXPORT(QuantizeRow);
HWY_EXPORT(DequantRow);

namespace {

Shape leading_axes(const Shape& shape) { return Shape(shape.begin(), shape.end() - 1); }

}  // namespace

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding, const TensorView& wq,
                     const TensorView& scales, const TensorView& biases) {
  ref::validate_affine_quantize(x, spec, wq, scales, biases);  // the oracle's checks and messages
  const std::int64_t d = x.dim(-1);
  const std::int64_t words_per_row = spec.packed_words(d);
  const std::int64_t groups_per_row = spec.groups(d);
  const Shape lead = leading_axes(x.shape);
  KVLAB_REQUIRE(rounding == Rounding::mlx_cpu || rounding == Rounding::mlx_gpu, invalid_argument,
                "unknown rounding ", static_cast<int>(rounding));

  const std::int64_t rows = shape_numel(lead);
  const auto n = static_cast<std::size_t>(d), ng = static_cast<std::size_t>(groups_per_row);
  std::vector<float> row_f32(x.dtype == DType::f32 ? 0 : n), sc(ng), bi(ng);
  std::vector<std::uint8_t> codes(n);
  const std::size_t row_bytes = n * dtype_size(x.dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* src = x.data + static_cast<std::size_t>(r) * row_bytes;
    const float* row = reinterpret_cast<const float*>(src);
    if (x.dtype != DType::f32) {
      HWY_DYNAMIC_DISPATCH(HalfRowToF32)(reinterpret_cast<const std::uint16_t*>(src), x.dtype == DType::bf16, n,
                                         row_f32.data());
      row = row_f32.data();
    }
    HWY_DYNAMIC_DISPATCH(QuantizeRow)(row, groups_per_row, spec.group_size, spec.bits, rounding, sc.data(),
                                      bi.data(), codes.data());
    // Codes come from the f32 parameters; the stored copies are rounded (RNE) to x.dtype.
    for (std::size_t g = 0; g < ng; ++g) {
      scales.store(r * groups_per_row + static_cast<std::int64_t>(g), sc[g]);
      biases.store(r * groups_per_row + static_cast<std::int64_t>(g), bi[g]);
    }
    affine_detail::pack_row(codes.data(), d, spec.bits, wq.as<std::uint32_t>() + r * words_per_row);
  }
}

void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                       const QuantSpec& spec, const TensorView& out) {
  ref::validate_affine_dequantize(wq, scales, biases, spec, out);  // the oracle's checks and messages
  const Shape lead = leading_axes(wq.shape);
  const std::int64_t d = out.dim(-1);

  const std::int64_t rows = shape_numel(lead);
  const std::int64_t words_per_row = wq.dim(-1), groups_per_row = scales.dim(-1);
  const auto n = static_cast<std::size_t>(d), ng = static_cast<std::size_t>(groups_per_row);
  std::vector<float> sc(ng), bi(ng), row_f32(n);
  std::vector<std::uint8_t> codes(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::size_t g = 0; g < ng; ++g) {
      sc[g] = scales.load(r * groups_per_row + static_cast<std::int64_t>(g));
      bi[g] = biases.load(r * groups_per_row + static_cast<std::int64_t>(g));
    }
    affine_detail::unpack_row(wq.as<const std::uint32_t>() + r * words_per_row, d, spec.bits, codes.data());
    float* dst = out.dtype == DType::f32 ? out.as<float>() + r * d : row_f32.data();
    HWY_DYNAMIC_DISPATCH(DequantRow)(codes.data(), sc.data(), bi.data(), groups_per_row, spec.group_size, dst);
    if (out.dtype != DType::f32) {  // one storage rounding (RNE) to out.dtype, as the oracle
      for (std::size_t i = 0; i < n; ++i) out.store(r * d + static_cast<std::int64_t>(i), row_f32[i]);
    }
  }
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
