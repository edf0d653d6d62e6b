// SIMD mxfp4 / mxfp8 / nvfp4 quantize and dequantize (contract: reference/fp_quantize.h),
// bit-exact with the oracle on every Highway target.
//
// Vectorized: f16/bf16 → f32 rows, the group amax (NaN lanes zeroed, then Max), the
// division by the group scale, the E2M1 (both roundings) and E4M3 element encoders, the
// nibble packing, and dequantize's decode·scale. Scalar, once per group: the scale code,
// with the oracle's own ref::e8m0_encode / ref::e4m3_encode, so scale codes cannot differ.
//
// Exactness argument, per encoder (y = w/scale, or (w·enc)/s for nvfp4, both single
// correctly rounded vector ops in the oracle's order; -ffp-contract=off):
// * E2M1 mlx_gpu is the oracle's threshold chain; the thresholds are increasing, so the
//   magnitude is the number of thresholds passed. NaN → 7 (no sign) as the oracle.
// * E2M1 mlx_cpu is the oracle's argmin over the 16-entry LUT, restated over magnitudes:
//   for a = |y|, f32 RNE is symmetric and monotone, so the distance to an entry of the
//   opposite sign, round(a + v), is never below a = the distance to +0 (index 0, which
//   wins ties). Hence: argmin over {0, .5, …, 6} of round(|a − v|), first minimum kept,
//   starting from a (the +0 entry), and the sign bit only when that magnitude is nonzero
//   (−0 and every tie with +0 give code 0). NaN/inf distances never compare less: code 0.
// * E4M3 follows the oracle's arithmetic: e = max(⌊log2 a⌋, −6) from the exponent bits,
//   q = rint(a·2^(3−e)) (an exact power-of-two rescale), code = (e+6)·8 + q; !(a < 448)
//   (inf, NaN) saturates to 0x7E; the sign is y's sign bit.
// * Dequantize: E2M1 values are built from their bits; E4M3's decode is the oracle's f16
//   trick (magnitude bits << 7 as an f16, exact into f32 by ·2^112, then ·2^8, folded into
//   one exact ·2^120); then ·scale (and ·g/2688 as a separate multiply, as the oracle).
#ifndef KVLAB_SIMD_FP_COMMON
#define KVLAB_SIMD_FP_COMMON
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/fp_quantize.h"

namespace kvlab::simd::fp_detail {

static_assert(std::endian::native == std::endian::little,
              "the packing writes the LSB-first bitstream as little-endian bytes");

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
constexpr float kNvfp4Range = kE4M3Max * kE2M1Max;  // 2688, as the oracle

// What a row's kernel needs besides the data. The format's encodings come from its row of
// the format table (kvlab/quant_spec.h), not from its name.
struct RowJob {
  bool e8m0_scales = true;   // power-of-two group scales (MX formats); else E4M3 (nvfp4)
  bool e4m3_elements = false;  // E4M3 element codes (mxfp8); else E2M1
  bool gpu = false;          // Rounding::mlx_gpu (anything else is mlx_cpu, as the oracle)
  int group_size = 32;
  std::int64_t groups = 0;   // per row
  float enc = 1.0f;          // nvfp4: 2688/global_scale, else 1
  float global_factor = 1.0f;
  bool has_global = false;
};

}  // namespace kvlab::simd::fp_detail
#endif  // KVLAB_SIMD_FP_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/fp_quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace fd = kvlab::simd::fp_detail;

namespace fp_impl {

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// n stored f16/bf16/f32 elements → f32, exactly (f16/bf16 by the shared conversions of
// half_convert-inl.h).
void RowToF32(const std::byte* src, DType dtype, std::size_t n, float* HWY_RESTRICT dst) {
  if (dtype == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  HalfRowToF32(reinterpret_cast<const std::uint16_t*>(src), dtype == DType::bf16, n, dst);
}

// Lanes whose sign bit is set (−0.0 and negative NaNs included).
hn::Mask<DI> SignBitSet(VF y) { return hn::Lt(hn::BitCast(DI(), y), hn::Zero(DI())); }

VI E2M1Gpu(VF y) {
  const DF df;
  const DI di;
  const VF a = hn::Abs(y), one = hn::Set(df, 1.0f);
  VF mag = hn::IfThenElseZero(hn::Gt(a, hn::Set(df, 0.25f)), one);
  mag = hn::Add(mag, hn::IfThenElseZero(hn::Ge(a, hn::Set(df, 0.75f)), one));
  mag = hn::Add(mag, hn::IfThenElseZero(hn::Gt(a, hn::Set(df, 1.25f)), one));
  mag = hn::Add(mag, hn::IfThenElseZero(hn::Ge(a, hn::Set(df, 1.75f)), one));
  mag = hn::Add(mag, hn::IfThenElseZero(hn::Gt(a, hn::Set(df, 2.5f)), one));
  mag = hn::Add(mag, hn::IfThenElseZero(hn::Ge(a, hn::Set(df, 3.5f)), one));
  mag = hn::Add(mag, hn::IfThenElseZero(hn::Gt(a, hn::Set(df, 5.0f)), one));
  const VI code = hn::Or(hn::ConvertTo(di, mag), hn::IfThenElseZero(SignBitSet(y), hn::Set(di, 8)));
  return hn::IfThenElse(hn::RebindMask(di, hn::IsNaN(y)), hn::Set(di, 7), code);  // NaN → +6
}

VI E2M1Cpu(VF y) {
  const DF df;
  const DI di;
  static constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const VF a = hn::Abs(y);
  VF best = a, mag = hn::Zero(df);  // the +0 entry: distance a
  for (int k = 1; k < 8; ++k) {
    const VF d = hn::Abs(hn::Sub(a, hn::Set(df, kMagnitudes[k])));
    const auto closer = hn::Lt(d, best);  // strict: the first (lower) index keeps ties
    best = hn::IfThenElse(closer, d, best);
    mag = hn::IfThenElse(closer, hn::Set(df, static_cast<float>(k)), mag);
  }
  const auto negative = hn::And(SignBitSet(y), hn::RebindMask(di, hn::Gt(mag, hn::Zero(df))));
  return hn::Or(hn::ConvertTo(di, mag), hn::IfThenElseZero(negative, hn::Set(di, 8)));
}

VI E4M3(VF y) {
  const DF df;
  const DI di;
  const VF abs = hn::Abs(y);
  const auto in_range = hn::Lt(abs, hn::Set(df, fd::kE4M3Max));  // false for inf and NaN
  const VF a = hn::IfThenElseZero(in_range, abs);  // saturated lanes: 0, so no NaN reaches ConvertTo
  // e = max(⌊log2 a⌋, −6): the exponent field, with the subnormal binade (and zero) at −6.
  const VI e = hn::Max(hn::Sub(hn::ShiftRight<23>(hn::BitCast(di, a)), hn::Set(di, 127)), hn::Set(di, -6));
  const VF rescale = hn::BitCast(df, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 127 + 3), e)));  // 2^(3−e)
  const VI q = hn::ConvertTo(di, hn::Round(hn::Mul(a, rescale)));  // exact product, RNE
  const VI finite = hn::Add(hn::ShiftLeft<3>(hn::Add(e, hn::Set(di, 6))), q);
  const VI mag = hn::IfThenElse(hn::RebindMask(di, in_range), finite, hn::Set(di, 0x7E));
  return hn::Or(mag, hn::IfThenElseZero(SignBitSet(y), hn::Set(di, 0x80)));
}

// amax of one group: max |w| with NaN lanes ignored (the oracle's fmax from 0).
float GroupAmax(const float* HWY_RESTRICT w, std::size_t n) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF m = hn::Zero(df);
  for (std::size_t i = 0; i < n; i += N) {
    const VF a = hn::Abs(hn::LoadU(df, w + i));
    m = hn::Max(m, hn::IfThenZeroElse(hn::IsNaN(a), a));
  }
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

}  // namespace fp_impl

void RowToF32Fp(const std::byte* src, DType dtype, std::size_t n, float* HWY_RESTRICT dst) {
  fp_impl::RowToF32(src, dtype, n, dst);
}

// One row of groups·gs f32 values → element codes (one byte each) and scale codes.
void FpQuantizeRow(const fd::RowJob& job, const float* HWY_RESTRICT x, std::uint8_t* HWY_RESTRICT scale_codes,
                   std::uint8_t* HWY_RESTRICT codes) {
  namespace fi = fp_impl;
  const fi::DF df;
  const hn::Rebind<std::uint8_t, fi::DF> du8;
  const std::size_t N = hn::Lanes(df);
  const auto gs = static_cast<std::size_t>(job.group_size);
  const Rounding rounding = job.gpu ? Rounding::mlx_gpu : Rounding::mlx_cpu;
  for (std::int64_t g = 0; g < job.groups; ++g) {
    const float* w = x + static_cast<std::size_t>(g) * gs;
    std::uint8_t* out = codes + static_cast<std::size_t>(g) * gs;
    const float amax = fi::GroupAmax(w, gs);
    std::uint8_t scale_code = 0;
    float scale = 0.0f;
    if (job.e8m0_scales) {
      scale_code = ref::e8m0_encode(amax / (job.e4m3_elements ? fd::kE4M3Max : fd::kE2M1Max), rounding);
      scale = ref::e8m0_decode(scale_code);  // a power of two, or +inf
    } else {
      scale_code = ref::e4m3_encode(amax / fd::kE2M1Max * job.enc);
      scale = ref::e4m3_decode(scale_code);
    }
    scale_codes[g] = scale_code;
    if (!job.e8m0_scales && scale == 0.0f) {  // the oracle's zero-scale rule
      std::memset(out, 0, gs);
      continue;
    }
    const auto vscale = hn::Set(df, scale), venc = hn::Set(df, job.enc);
    for (std::size_t i = 0; i < gs; i += N) {
      const auto v = hn::LoadU(df, w + i);
      const auto y = !job.e8m0_scales ? hn::Div(hn::Mul(v, venc), vscale) : hn::Div(v, vscale);
      const auto code = job.e4m3_elements ? fi::E4M3(y) : job.gpu ? fi::E2M1Gpu(y) : fi::E2M1Cpu(y);
      hn::StoreU(hn::DemoteTo(du8, code), du8, out + i);
    }
  }
}

// Two 4-bit codes per byte, element 2k in the low nibble (n even).
void PackNibbles(const std::uint8_t* HWY_RESTRICT codes, std::size_t n, std::uint8_t* HWY_RESTRICT bytes) {
  const hn::ScalableTag<std::uint8_t> d8;
  const std::size_t N = hn::Lanes(d8);
  std::size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    hn::Vec<decltype(d8)> even, odd;
    hn::LoadInterleaved2(d8, codes + i, even, odd);
    hn::StoreU(hn::Or(even, hn::ShiftLeft<4>(odd)), d8, bytes + i / 2);
  }
  for (; i < n; i += 2) bytes[i / 2] = static_cast<std::uint8_t>(codes[i] | (codes[i + 1] << 4));
}

// One row: element codes (one byte each, already unpacked) and scale codes → f32 values.
void FpDequantizeRow(const fd::RowJob& job, const std::uint8_t* HWY_RESTRICT codes,
                     const std::uint8_t* HWY_RESTRICT scale_codes, float* HWY_RESTRICT out) {
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  const hn::Rebind<std::uint8_t, fi::DF> du8;
  const std::size_t N = hn::Lanes(df);
  const auto gs = static_cast<std::size_t>(job.group_size);
  const auto vglobal = hn::Set(df, job.global_factor);
  for (std::int64_t g = 0; g < job.groups; ++g) {
    const std::uint8_t sc = scale_codes[g];
    const auto vscale = hn::Set(df, job.e8m0_scales ? ref::e8m0_decode(sc) : ref::e4m3_decode(sc));
    const std::size_t base = static_cast<std::size_t>(g) * gs;
    for (std::size_t i = 0; i < gs; i += N) {
      const auto c = hn::PromoteTo(di, hn::LoadU(du8, codes + base + i));
      fi::VF element;
      if (job.e4m3_elements) {
        // E4M3 magnitude bits << 7 read as an f16, ·2^112 (f16 → f32) ·2^8 (the oracle's ×256).
        const auto half = hn::ShiftLeft<20>(hn::And(c, hn::Set(di, 0x7F)));  // (<< 7) << 13
        const auto mag = hn::Mul(hn::BitCast(df, half), hn::Set(df, 0x1p120f));
        element = hn::BitCast(df, hn::Or(hn::BitCast(di, mag), hn::ShiftLeft<24>(hn::And(c, hn::Set(di, 0x80)))));
      } else {
        // E2M1: exponent field E = bits 1..2 of the magnitude, mantissa bit 0. E = 0 is 0 or
        // 0.5; else 2^(E−1)·(1 + m/2), i.e. f32 exponent E + 126 and mantissa bit 22.
        const auto m = hn::And(c, hn::Set(di, 7));
        const auto e = hn::ShiftRight<1>(m), low = hn::And(m, hn::Set(di, 1));
        const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 126))), hn::ShiftLeft<22>(low));
        const auto subnormal = hn::IfThenElseZero(hn::Eq(low, hn::Set(di, 1)), hn::Set(di, 0x3F000000));  // 0.5f
        const auto bits = hn::IfThenElse(hn::Eq(e, hn::Zero(di)), subnormal, normal);
        element = hn::BitCast(df, hn::Or(bits, hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8)))));
      }
      auto value = hn::Mul(element, vscale);
      if (job.has_global) value = hn::Mul(value, vglobal);  // a separate rounding, as the oracle
      hn::StoreU(value, df, out + base + i);
    }
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(FpQuantizeRow);
HWY_EXPORT(PackNibbles);
HWY_EXPORT(FpDequantizeRow);
HWY_EXPORT(RowToF32Fp);

namespace fp_detail {
namespace {

// Rows per parallel task: a fixed split (the ops are exact, so it cannot change bits).
constexpr std::int64_t kRowsPerTask = 64;

RowJob make_job(const QuantSpec& spec, Rounding rounding, std::optional<float> global_scale, std::int64_t d) {
  RowJob job;
  job.e8m0_scales = spec.format().scale == ScaleEncoding::e8m0;
  job.e4m3_elements = spec.format().element == ElementEncoding::e4m3;
  job.gpu = rounding == Rounding::mlx_gpu;
  job.group_size = spec.group_size;
  job.groups = d / spec.group_size;
  job.has_global = global_scale.has_value();
  job.enc = global_scale ? kNvfp4Range / *global_scale : 1.0f;
  job.global_factor = global_scale ? *global_scale / kNvfp4Range : 1.0f;
  return job;
}

}  // namespace
}  // namespace fp_detail

void fp_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                 std::optional<float> global_scale, const TensorView& wq, const TensorView& scales) {
  namespace fd = fp_detail;
  const std::int64_t d = ref::validate_fp_quantize(x, spec, global_scale, wq, scales);
  const Shape& wq_shape = wq.shape;

  const fd::RowJob job = fd::make_job(spec, rounding, global_scale, d);
  const std::int64_t rows = x.numel() / d;
  const auto n = static_cast<std::size_t>(d);
  const std::size_t row_bytes = n * dtype_size(x.dtype);
  const std::size_t wq_row_bytes = static_cast<std::size_t>(wq_shape.back()) * sizeof(std::uint32_t);
  auto* const quantize_row = &HWY_DYNAMIC_DISPATCH(FpQuantizeRow);
  auto* const to_f32 = &HWY_DYNAMIC_DISPATCH(RowToF32Fp);
  auto* const pack = &HWY_DYNAMIC_DISPATCH(PackNibbles);
  auto* const wq_bytes = reinterpret_cast<std::uint8_t*>(wq.data);
  auto* const scale_bytes = reinterpret_cast<std::uint8_t*>(scales.data);
  parallel_for((rows + fd::kRowsPerTask - 1) / fd::kRowsPerTask, [&](std::int64_t task) {
    std::vector<float> row(n);
    std::vector<std::uint8_t> codes(n);
    const std::int64_t r1 = std::min(rows, (task + 1) * fd::kRowsPerTask);
    for (std::int64_t r = task * fd::kRowsPerTask; r < r1; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      to_f32(x.data + ur * row_bytes, x.dtype, n, row.data());
      quantize_row(job, row.data(), scale_bytes + ur * static_cast<std::size_t>(job.groups), codes.data());
      // The LSB-first bitstream in little-endian words is plain byte order.
      std::uint8_t* dst = wq_bytes + ur * wq_row_bytes;
      if (spec.bits == 8) std::memcpy(dst, codes.data(), n);
      else pack(codes.data(), n, dst);
    }
  });
}

void fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                   std::optional<float> global_scale, const TensorView& out) {
  namespace fd = fp_detail;
  const std::int64_t d = ref::validate_fp_dequantize(wq, scales, spec, global_scale, out);
  const std::int64_t words_per_row = wq.dim(-1);
  const std::int64_t groups_per_row = scales.dim(-1);

  const std::int64_t rows = d == 0 ? 0 : out.numel() / d;
  const fd::RowJob job = fd::make_job(spec, Rounding::mlx_cpu, global_scale, d);
  const auto n = static_cast<std::size_t>(d);
  auto* const dequantize_row = &HWY_DYNAMIC_DISPATCH(FpDequantizeRow);
  const auto* const wq_bytes = reinterpret_cast<const std::uint8_t*>(wq.data);
  const auto* const scale_bytes = reinterpret_cast<const std::uint8_t*>(scales.data);
  const std::size_t wq_row_bytes = static_cast<std::size_t>(words_per_row) * sizeof(std::uint32_t);
  parallel_for((rows + fd::kRowsPerTask - 1) / fd::kRowsPerTask, [&](std::int64_t task) {
    std::vector<std::uint8_t> codes(n);
    std::vector<float> values(out.dtype == DType::f32 ? 0 : n);
    const std::int64_t r1 = std::min(rows, (task + 1) * fd::kRowsPerTask);
    for (std::int64_t r = task * fd::kRowsPerTask; r < r1; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const std::uint8_t* src = wq_bytes + ur * wq_row_bytes;
      if (spec.bits == 8) {
        std::memcpy(codes.data(), src, n);
      } else {
        for (std::size_t i = 0; i < n; i += 2) {
          codes[i] = src[i / 2] & 0x0F;
          codes[i + 1] = static_cast<std::uint8_t>(src[i / 2] >> 4);
        }
      }
      float* dst = out.dtype == DType::f32 ? out.as<float>() + r * d : values.data();
      dequantize_row(job, codes.data(), scale_bytes + ur * static_cast<std::size_t>(groups_per_row), dst);
      if (out.dtype != DType::f32) {  // the single rounding (RNE) to out.dtype, as the oracle
        for (std::size_t i = 0; i < n; ++i) out.store(r * d + static_cast<std::int64_t>(i), values[i]);
      }
    }
  });
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
