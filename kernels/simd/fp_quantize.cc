// SIMD mxfp4 / mxfp8 / nvfp4 quantize and dequantize (contract: reference/fp_quantize.h),
// bit-exact with the oracle on every Highway target.
//
// Vectorized, N groups at a time: f16/bf16 → f32, the group amax (NaN lanes zeroed, then
// Max), the scale codes (E8M0 from the exponent bits, see E8M0Encode; E4M3 by the element
// encoder), the scaling, the E2M1 (both roundings) and E4M3 element encoders, the nibble
// packing, and dequantize's decode·scale. Scalar: only the E8M0 codes of the rare scales
// E8M0Encode sends to the oracle's ref::e8m0_encode.
//
// Exactness argument, per encoder (y = w/scale, computed as the exact w·(1/scale) for the
// power-of-two mx scales, or (w·enc)/s for nvfp4, single correctly rounded vector ops in
// the oracle's order; -ffp-contract=off):
// * E2M1 mlx_gpu is the oracle's threshold chain; the thresholds are increasing, so the
//   magnitude is the number of thresholds passed. NaN → 7 (no sign) as the oracle.
// * E2M1 mlx_cpu is the oracle's argmin over the 16-entry LUT, restated over magnitudes:
//   for a = |y|, f32 RNE is symmetric and monotone, so the distance to an entry of the
//   opposite sign, round(a + v), is never below a = the distance to +0 (index 0, which
//   wins ties). Hence: argmin over {0, .5, …, 6} of round(|a − v|), first minimum kept,
//   starting from a (the +0 entry), and the sign bit only when that magnitude is nonzero
//   (−0 and every tie with +0 give code 0). NaN/inf distances never compare less: code 0.
//   Groups with no NaN and |y| <= 12 take the equivalent table of E2M1CpuQuarters.
// * E4M3 follows the oracle's arithmetic: e = max(⌊log2 a⌋, −6) from the exponent bits,
//   q = rint(a·2^(3−e)) (an exact power-of-two rescale), code = (e+6)·8 + q; !(a < 448)
//   (inf, NaN) saturates to 0x7E; the sign is y's sign bit.
// * Dequantize: E2M1 values come from a table (or their bits on narrow vectors); E4M3's decode is the oracle's f16
//   trick (magnitude bits << 7 as an f16, exact into f32 by ·2^112, then ·2^8, folded into
//   one exact ·2^120); then ·scale (and ·g/2688 as a separate multiply, as the oracle).
//   Outputs of kStreamBytes or more go out by streaming stores (Put): only bits that
//   would be stored anyway, written without the read-for-ownership of each line.
#ifndef KVLAB_SIMD_FP_COMMON
#define KVLAB_SIMD_FP_COMMON
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// What the block kernels need besides the data. The format's encodings come from its row of
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
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/affine_pack-inl.h"
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

// Lanes whose sign bit is set (−0.0 and negative NaNs included).
hn::Mask<DI> SignBitSet(VF y) { return hn::Lt(hn::BitCast(DI(), y), hn::Zero(DI())); }

HWY_INLINE VI E2M1Gpu(VF y) {
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

HWY_INLINE VI E2M1Cpu(VF y) {
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

HWY_INLINE VI E4M3(VF y) {
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

// E2M1 for the CPU rounding, from q = 4y, for a group whose |y| are all <= 12 (no NaN).
// There the argmin's f32 distances to the two entries around |y| are exact (Sterbenz: each
// entry is within a factor 2 of |y|, or |y| <= 0.25 and +0 wins), and every other
// distance rounds to a value no smaller than theirs, so the first minimum is the nearest
// entry with ties to the lower magnitude: the number of midpoints |y| lies strictly above.
// In quarters the midpoints are the integers of kE2M1QuarterMidpoints, and for an integer
// t, t < |q| exactly when t < c = ceil(|q|), so the magnitude is a table of c (c > 31 reads
// as 31: every midpoint passed). The sign goes on every nonzero magnitude: q < −1, i.e.
// y < −0.25. A y that is an f32 subnormal makes q differ from 4y by rounding, but c is 0
// or 1 either way, magnitude 0. Groups with a NaN or a larger |y| take E2M1Cpu.
constexpr int kE2M1QuarterMidpoints[7] = {1, 3, 5, 7, 10, 14, 20};

constexpr std::array<std::int32_t, 32> E2M1MagnitudeByCeilQuarter() {
  std::array<std::int32_t, 32> table{};
  for (int c = 0; c < 32; ++c) {
    for (const int t : kE2M1QuarterMidpoints) table[static_cast<std::size_t>(c)] += t < c ? 1 : 0;
  }
  return table;
}

HWY_INLINE VI E2M1CpuQuarters(VF q) {
  const DF df;
  const DI di;
  alignas(64) static constexpr std::array<std::int32_t, 32> kTable = E2M1MagnitudeByCeilQuarter();
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  // AVX-512: ceil and convert in one instruction, the 32-entry table in one two-source permute.
  const __m512i c = _mm512_cvt_roundps_epi32(hn::Abs(q).raw, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  const __m512i index = _mm512_min_epi32(c, _mm512_set1_epi32(31));
  const VI mag{_mm512_permutex2var_epi32(_mm512_load_si512(kTable.data()), index,
                                         _mm512_load_si512(kTable.data() + 16))};
#else
  (void)kTable;
  const VI c = hn::ConvertTo(di, hn::Ceil(hn::Abs(q)));
  VI mag = hn::Min(hn::ShiftRight<1>(c), hn::Set(di, 4));  // the midpoints 1 3 5 7
  mag = hn::Sub(mag, hn::VecFromMask(di, hn::Gt(c, hn::Set(di, 10))));
  mag = hn::Sub(mag, hn::VecFromMask(di, hn::Gt(c, hn::Set(di, 14))));
  mag = hn::Sub(mag, hn::VecFromMask(di, hn::Gt(c, hn::Set(di, 20))));
#endif
  return hn::IfThenElse(hn::RebindMask(di, hn::Lt(q, hn::Set(df, -1.0f))), hn::Or(mag, hn::Set(di, 8)), mag);
}

// E4M3 code bits (sign in bit 7) → f32, as the oracle's decode: the magnitude bits << 7
// read as an f16, ·2^112 (f16 → f32) ·2^8 (the oracle's ×256) folded into one exact ·2^120.
HWY_INLINE VF E4M3Decode(VI c) {
  const DF df;
  const DI di;
  const auto half = hn::ShiftLeft<20>(hn::And(c, hn::Set(di, 0x7F)));  // (<< 7) << 13
  const auto mag = hn::Mul(hn::BitCast(df, half), hn::Set(df, 0x1p120f));
  return hn::BitCast(df, hn::Or(hn::BitCast(di, mag), hn::ShiftLeft<24>(hn::And(c, hn::Set(di, 0x80)))));
}

// E2M1 code bits → f32: exponent field E = bits 1..2 of the magnitude, mantissa bit 0. E = 0
// is 0 or 0.5; else 2^(E−1)·(1 + m/2), i.e. f32 exponent E + 126 and mantissa bit 22.
HWY_INLINE VF E2M1Decode(VI c) {
  const DF df;
  const DI di;
  const auto m = hn::And(c, hn::Set(di, 7));
  const auto e = hn::ShiftRight<1>(m), low = hn::And(m, hn::Set(di, 1));
  const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 126))), hn::ShiftLeft<22>(low));
  const auto subnormal = hn::IfThenElseZero(hn::Eq(low, hn::Set(di, 1)), hn::Set(di, 0x3F000000));  // 0.5f
  const auto bits = hn::IfThenElse(hn::Eq(e, hn::Zero(di)), subnormal, normal);
  return hn::BitCast(df, hn::Or(bits, hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8)))));
}

// E2M1 codes → f32 by a table where a vector holds one: 16 lanes the signed values, 8
// lanes the magnitudes (the sign bit moved in); narrower vectors build the bits.
HWY_INLINE VF E2M1DecodeLut(VI c) {
  const DF df;
  const DI di;
  constexpr std::size_t kMaxN = hn::MaxLanes(DF());
  if constexpr (kMaxN >= 16) {
    alignas(64) static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return hn::TableLookupLanes(hn::LoadU(df, kValues), hn::IndicesFromVec(df, hn::And(c, hn::Set(di, 15))));
  } else if constexpr (kMaxN >= 8) {
    alignas(32) static constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const VF mag = hn::TableLookupLanes(hn::LoadU(df, kMagnitudes), hn::IndicesFromVec(df, hn::And(c, hn::Set(di, 7))));
    return hn::BitCast(df, hn::Or(hn::BitCast(di, mag), hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8)))));
  } else {
    return E2M1Decode(c);
  }
}

// E8M0 codes → 2^(c−127) as ref::e8m0_decode: code 0 is the subnormal 2^-127, 255 is +inf.
HWY_INLINE VF E8M0Decode(VI c) {
  const DF df;
  const DI di;
  const VF normal = hn::BitCast(df, hn::ShiftLeft<23>(c));
  const VF low = hn::IfThenElse(hn::RebindMask(df, hn::Eq(c, hn::Zero(di))), hn::Set(df, 0x1p-127f), normal);
  return hn::IfThenElse(hn::RebindMask(df, hn::Eq(c, hn::Set(di, 255))), hn::Set(df, HUGE_VALF), low);
}

// ref::e8m0_encode(x) for N lanes of x = amax/max. For a normal x = 2^e·m, log2 x lies in
// (e, e+1) and both roundings (rint, round half away) give e+1 exactly when m > √2; ties
// are impossible (√2 is irrational) but the oracle's log2f can round to e + 0.5 for m
// within a few ulp of √2, so m within 2^-11 of √2 (log2 ≥ 5e-4 from the tie, far beyond
// log2f's error) goes to the scalar code, as do zero, subnormal and non-finite x.
VI E8M0Encode(VF x, Rounding rounding) {
  const DF df;
  const DI di;
  const VI bits = hn::BitCast(di, x);
  const VI e = hn::Sub(hn::ShiftRight<23>(bits), hn::Set(di, 127));
  const VI mant = hn::And(bits, hn::Set(di, 0x7FFFFF));
  constexpr std::int32_t kSqrt2Mantissa = 0x3504F3, kWindow = 1 << 12;
  const VI up = hn::VecFromMask(di, hn::Gt(mant, hn::Set(di, kSqrt2Mantissa)));
  const VI code = hn::Min(hn::Sub(hn::Add(e, hn::Set(di, 127)), up), hn::Set(di, 254));  // clamp at 2^127
  const auto near_tie = hn::Lt(hn::Abs(hn::Sub(mant, hn::Set(di, kSqrt2Mantissa))), hn::Set(di, kWindow));
  const auto normal = hn::And(hn::Ge(x, hn::Set(df, 0x1p-126f)), hn::Lt(x, hn::Set(df, HUGE_VALF)));
  const auto fast = hn::AndNot(near_tie, hn::RebindMask(di, normal));
  if (hn::AllTrue(di, fast)) return code;
  alignas(64) float xs[hn::MaxLanes(df)];
  alignas(64) std::int32_t codes[hn::MaxLanes(di)];
  hn::Store(x, df, xs);
  hn::Store(hn::IfThenElse(fast, code, hn::Set(di, -1)), di, codes);
  for (std::size_t i = 0; i < hn::Lanes(di); ++i) {
    if (codes[i] < 0) codes[i] = ref::e8m0_encode(xs[i], rounding);
  }
  return hn::Load(di, codes);
}

}  // namespace fp_impl

// The scale codes of N groups from their amax, in the oracle's operation order, and what
// their elements are multiplied by (mx: the exact reciprocal of the power-of-two scale)
// or divided by (nvfp4: the decoded E4M3 scale).
fp_impl::VI ScaleCodes(const fd::RowJob& job, fp_impl::VF amax, float* HWY_RESTRICT factor) {
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  if (!job.e8m0_scales) {
    const fi::VI code = fi::E4M3(hn::Mul(hn::Div(amax, hn::Set(df, fd::kE2M1Max)), hn::Set(df, job.enc)));
    hn::StoreU(fi::E4M3Decode(code), df, factor);
    return code;
  }
  const Rounding rounding = job.gpu ? Rounding::mlx_gpu : Rounding::mlx_cpu;
  const fi::VI code =
      fi::E8M0Encode(hn::Div(amax, hn::Set(df, job.e4m3_elements ? fd::kE4M3Max : fd::kE2M1Max)), rounding);
  // 1/2^(c−127) = 2^(127−c) = decode(254 − c): exact for c in [0, 254] (2^-127 is an f32
  // subnormal); c = 255 (scale +inf) gives 0, and w·0 = w/inf for every w (±0, NaN for inf
  // and NaN).
  const fi::VF inv = fi::E8M0Decode(hn::Sub(hn::Set(di, 254), code));
  hn::StoreU(hn::IfThenZeroElse(hn::RebindMask(df, hn::Eq(code, hn::Set(di, 255))), inv), df, factor);
  return code;
}

// Stores N element codes (i32 lanes, each < 256): one byte each, or (kPacked, codes < 16)
// N/2 bytes with element 2k in the low nibble. Pairs are combined inside u64 lanes (the odd
// code sits at bit 32: >> 28 puts it at bit 4) and truncated to a byte. The SCALAR target
// (one lane) stores single bytes, and its caller packs them.
template <bool kPacked>
HWY_INLINE void StoreCodes(fp_impl::VI code, std::uint8_t* HWY_RESTRICT out) {
  const fp_impl::DI di;
#if HWY_TARGET == HWY_SCALAR
  *out = static_cast<std::uint8_t>(hn::GetLane(code));
  (void)di;
#else
  if constexpr (kPacked) {
    const hn::Repartition<std::uint64_t, fp_impl::DI> d64;
    const auto pairs = hn::BitCast(d64, code);
    const auto bytes = hn::Or(pairs, hn::ShiftRight<28>(pairs));
    const hn::Rebind<std::uint8_t, decltype(d64)> d8;
    hn::StoreU(hn::TruncateTo(d8, bytes), d8, out);
  } else {
    const hn::RebindToUnsigned<fp_impl::DI> du;
    const hn::Rebind<std::uint8_t, decltype(du)> d8;
    hn::StoreU(affine_pack::LowBytes(d8, hn::BitCast(du, code)), d8, out);
  }
#endif
}

// The element encoders, as types for the block kernel's template.
struct E2M1CpuCodes {  // the group-wise fast path of E2M1CpuQuarters, else E2M1Cpu
  static constexpr bool kPacked = true;
  static fp_impl::VI Encode(fp_impl::VF y) { return fp_impl::E2M1Cpu(y); }
};
struct E2M1GpuCodes {
  static constexpr bool kPacked = true;
  static fp_impl::VI Encode(fp_impl::VF y) { return fp_impl::E2M1Gpu(y); }
};
struct E4M3Codes {
  static constexpr bool kPacked = false;
  static fp_impl::VI Encode(fp_impl::VF y) { return fp_impl::E4M3(y); }
};

// Lanes(df) stored values from element i on → f32, exactly (an f16 NaN may come back
// quiet, which no encoder distinguishes: every NaN gives the same code).
template <DType kDtype>
HWY_INLINE fp_impl::VF LoadStored(const std::byte* HWY_RESTRICT src, std::size_t i) {
  const fp_impl::DF df;
  if constexpr (kDtype == DType::bf16) return LoadBF16(df, reinterpret_cast<const std::uint16_t*>(src) + i);
  else if constexpr (kDtype == DType::f16) return LoadF16QuietingNaN(df, reinterpret_cast<const std::uint16_t*>(src) + i);
  else return hn::LoadU(df, reinterpret_cast<const float*>(src) + i);
}

// The oracle's amax of a group that holds a NaN: the largest |w| of the others.
inline float AmaxIgnoringNaN(const float* w, std::size_t n) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(w[i]));
  return amax;
}

// `groups` consecutive groups of stored values (rows are contiguous, so a block of rows is
// a run of groups) → scale codes and element codes (E4M3: a byte each; E2M1: packed two
// to a byte). N groups at a time (N = Lanes): convert to f32 and take each amax, the N
// scale codes as one vector, then encode. kDivide: nvfp4's y = (w·enc)/s; else the mx
// formats' y = w·(1/scale), exact (ScaleCodes).
template <DType kDtype, bool kDivide, class Codes>
void QuantizeBlock(const fd::RowJob& job, const std::byte* HWY_RESTRICT src, std::size_t groups,
                   std::uint8_t* HWY_RESTRICT scale_codes, std::uint8_t* HWY_RESTRICT out) {
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  constexpr std::size_t kMaxN = hn::MaxLanes(fi::DF());
  constexpr std::size_t kMaxGroup = 32;
  constexpr std::size_t kStoredBytes = kDtype == DType::f32 ? 4 : 2;
  const std::size_t N = hn::Lanes(df);
  const auto gs = static_cast<std::size_t>(job.group_size);
  const std::size_t group_bytes = Codes::kPacked ? gs / 2 : gs;
  const auto venc = hn::Set(df, job.enc);
  alignas(64) float values[kMaxN * kMaxGroup];
  constexpr bool kQuarters = std::is_same_v<Codes, E2M1CpuCodes> && HWY_TARGET != HWY_SCALAR;  // one lane: no pairs
  alignas(64) float amax[kMaxN], factor[kMaxN], quarter_factor[kMaxN];
  alignas(64) std::int32_t codes32[kMaxN], small[kMaxN];
  bool has_nan[kMaxN];
  for (std::size_t g0 = 0; g0 < groups; g0 += N) {
    const std::size_t nb = std::min(N, groups - g0);
    const std::byte* const batch = src + g0 * gs * kStoredBytes;
    // amax on the magnitude bits (non-negative floats order as integers): above +inf's
    // pattern only when the group holds a NaN, whose amax the oracle takes without it.
    for (std::size_t g = 0; g < nb; ++g) {
      fi::VI m = hn::Zero(di);
      for (std::size_t i = g * gs; i < (g + 1) * gs; i += N) {
        const fi::VF v = LoadStored<kDtype>(batch, i);
        hn::Store(v, df, values + i);
        m = hn::Max(m, hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF)));
      }
      const std::int32_t bits = hn::GetLane(hn::MaxOfLanes(di, m));
      has_nan[g] = bits > 0x7F800000;
      amax[g] = has_nan[g] ? AmaxIgnoringNaN(values + g * gs, gs) : std::bit_cast<float>(bits);
    }
    for (std::size_t g = nb; g < N; ++g) amax[g] = 0.0f;
    const fi::VF vamax = hn::Load(df, amax);
    hn::Store(ScaleCodes(job, vamax, factor), di, codes32);
    for (std::size_t g = 0; g < nb; ++g) scale_codes[g0 + g] = static_cast<std::uint8_t>(codes32[g]);
    if constexpr (kQuarters) {
      // q = 4y directly: mx y·4 = w·(4/scale); nvfp4 (w·enc)/(s/4), s/4 exact (s >= 2^-9).
      // Every |q| is at most the same arithmetic on amax (monotone roundings), so a group
      // takes E2M1CpuQuarters when that bound is <= 48 (|y| <= 12) and it holds no NaN.
      const fi::VF vfactor = hn::Load(df, factor);
      const fi::VF quarter = kDivide ? hn::Mul(vfactor, hn::Set(df, 0.25f)) : hn::Mul(vfactor, hn::Set(df, 4.0f));
      const fi::VF bound = hn::Abs(kDivide ? hn::Div(hn::Mul(vamax, venc), quarter) : hn::Mul(vamax, quarter));
      hn::Store(quarter, df, quarter_factor);
      hn::Store(hn::VecFromMask(di, hn::RebindMask(di, hn::Le(bound, hn::Set(df, 48.0f)))), di, small);
    }
    for (std::size_t g = 0; g < nb; ++g) {
      std::uint8_t* const dst = out + (g0 + g) * group_bytes;
      const fi::VF vfactor = hn::Set(df, factor[g]);
      if constexpr (kDivide) {
        if (factor[g] == 0.0f) {  // the oracle's zero-scale rule
          std::memset(dst, 0, group_bytes);
          continue;
        }
      }
      if constexpr (kQuarters) {
        if (!has_nan[g] && small[g] != 0) {
          const fi::VF vq = hn::Set(df, quarter_factor[g]);
          for (std::size_t i = 0; i < gs; i += N) {
            const fi::VF w = hn::Load(df, values + g * gs + i);
            const fi::VF q = kDivide ? hn::Div(hn::Mul(w, venc), vq) : hn::Mul(w, vq);
            StoreCodes<true>(fi::E2M1CpuQuarters(q), dst + i / 2);
          }
          continue;
        }
      }
      const auto scaled = [&](fi::VF w) { return kDivide ? hn::Div(hn::Mul(w, venc), vfactor) : hn::Mul(w, vfactor); };
#if HWY_TARGET == HWY_SCALAR
      if constexpr (Codes::kPacked) {  // one lane: the pairs are joined here
        for (std::size_t i = 0; i < gs; i += 2) {
          const auto lo = hn::GetLane(Codes::Encode(scaled(hn::Load(df, values + g * gs + i))));
          const auto hi = hn::GetLane(Codes::Encode(scaled(hn::Load(df, values + g * gs + i + 1))));
          dst[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
        }
        continue;
      }
#endif
      for (std::size_t i = 0; i < gs; i += N) {
        StoreCodes<Codes::kPacked>(Codes::Encode(scaled(hn::Load(df, values + g * gs + i))),
                                   dst + (Codes::kPacked ? i / 2 : i));
      }
    }
  }
}

template <DType kDtype>
void QuantizeBlockFor(const fd::RowJob& job, const std::byte* src, std::size_t groups, std::uint8_t* scale_codes,
                      std::uint8_t* out) {
  if (job.e4m3_elements) return QuantizeBlock<kDtype, false, E4M3Codes>(job, src, groups, scale_codes, out);
  if (job.e8m0_scales) {
    if (job.gpu) return QuantizeBlock<kDtype, false, E2M1GpuCodes>(job, src, groups, scale_codes, out);
    return QuantizeBlock<kDtype, false, E2M1CpuCodes>(job, src, groups, scale_codes, out);
  }
  if (job.gpu) return QuantizeBlock<kDtype, true, E2M1GpuCodes>(job, src, groups, scale_codes, out);
  return QuantizeBlock<kDtype, true, E2M1CpuCodes>(job, src, groups, scale_codes, out);
}

void FpQuantizeBlock(const fd::RowJob& job, const std::byte* HWY_RESTRICT src, DType dtype, std::size_t groups,
                     std::uint8_t* HWY_RESTRICT scale_codes, std::uint8_t* HWY_RESTRICT out) {
  switch (dtype) {
    case DType::bf16: return QuantizeBlockFor<DType::bf16>(job, src, groups, scale_codes, out);
    case DType::f16: return QuantizeBlockFor<DType::f16>(job, src, groups, scale_codes, out);
    default: return QuantizeBlockFor<DType::f32>(job, src, groups, scale_codes, out);
  }
}

// Lanes(df) element codes from element i of a group's codes: a byte each, or (kPacked)
// two to a byte, element 2k in the low nibble. Packed: N/2 bytes widened to u64 lanes,
// b | b << 28 puts the high nibble at bit 32, and the mask leaves each code alone in its
// i32 lane.
template <bool kPacked>
HWY_INLINE fp_impl::VI LoadCodes(const std::uint8_t* HWY_RESTRICT codes, std::size_t i) {
  const fp_impl::DI di;
  if constexpr (!kPacked) {
    return hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::uint8_t, fp_impl::DI>(), codes + i));
  } else {
#if HWY_TARGET == HWY_SCALAR
    return hn::Set(di, (codes[i / 2] >> (4 * (i % 2))) & 0x0F);
#else
    const hn::Repartition<std::uint64_t, fp_impl::DI> d64;
    const hn::Rebind<std::uint32_t, decltype(d64)> d32;
    const hn::Rebind<std::uint8_t, decltype(d64)> d8;
    const auto b = hn::PromoteTo(d64, hn::PromoteTo(d32, hn::LoadU(d8, codes + i / 2)));
    return hn::BitCast(di, hn::And(hn::Or(b, hn::ShiftLeft<28>(b)), hn::Set(d64, 0x0000000F0000000Full)));
#endif
  }
}

// How a dequantized value is stored. kBF16High: the f32 value is a normal number of at
// most 8 significant bits (an E2M1 value has 2, E4M3 4, E8M0 scales 1, nvfp4's E4M3
// scale 4: products of at most 6 bits), so it is a bf16 value and its bf16 pattern is
// its high half, which RNE would give too.
enum class StoreAs { f32, f16, bf16, kBF16High };

// v to p, by a streaming (non-temporal) store where `stream` says so and the vector is at
// least 32 bytes: the line is written without first being read (no read-for-ownership),
// for outputs too large to be found in cache by their consumer anyway (kStreamBytes).
// Streaming 32-byte halves of a line measured faster than plain stores on Zen 4
// (docs/benchmarks.md §Measurements behind kernel choices); narrower vectors store as usual.
template <class D, typename T>
HWY_INLINE void Put(D d, hn::Vec<D> v, T* HWY_RESTRICT p, bool stream) {
  if (hn::Lanes(d) * sizeof(T) >= 32 && stream) {
    hn::Stream(v, d, p);
  } else {
    hn::StoreU(v, d, p);
  }
}

// One group: decode·scale (·global), stored as kStore (streamed where `stream`: f32 and
// the bf16 high halves; out then 64-byte aligned).
template <bool kE4M3, StoreAs kStore, bool kGlobal>
HWY_INLINE void DequantizeGroup(const std::uint8_t* HWY_RESTRICT codes, std::size_t gs, fp_impl::VF vscale,
                                fp_impl::VF vglobal, std::byte* HWY_RESTRICT out, bool stream) {
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  const hn::RebindToUnsigned<fi::DF> du;
  const hn::Rebind<std::uint16_t, fi::DF> du16;
  const std::size_t N = hn::Lanes(df);
  auto* const out_f32 = reinterpret_cast<float*>(out);
  auto* const out_half = reinterpret_cast<std::uint16_t*>(out);
  for (std::size_t i = 0; i < gs; i += N) {
    const auto c = LoadCodes<!kE4M3>(codes, i);  // E2M1 codes come packed
    fi::VF value = hn::Mul(kE4M3 ? fi::E4M3Decode(c) : fi::E2M1DecodeLut(c), vscale);
    if constexpr (kGlobal) value = hn::Mul(value, vglobal);  // a separate rounding, as the oracle
    if constexpr (kStore == StoreAs::kBF16High) {
      Put(du16, hn::DemoteTo(du16, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, value)))), out_half + i, stream);
    } else if constexpr (kStore == StoreAs::bf16) {
      StoreBF16(value, df, out_half + i);
    } else if constexpr (kStore == StoreAs::f16) {
      StoreF16(value, df, out_half + i);
    } else {
      Put(df, value, out_f32 + i, stream);
    }
  }
}

template <bool kE4M3, bool kGlobal>
HWY_INLINE void DequantizeGroupAs(StoreAs store, const std::uint8_t* codes, std::size_t gs, fp_impl::VF vscale,
                                  fp_impl::VF vglobal, std::byte* out, bool stream) {
  switch (store) {
    case StoreAs::kBF16High:
      return DequantizeGroup<kE4M3, StoreAs::kBF16High, kGlobal>(codes, gs, vscale, vglobal, out, stream);
    case StoreAs::bf16: return DequantizeGroup<kE4M3, StoreAs::bf16, kGlobal>(codes, gs, vscale, vglobal, out, stream);
    case StoreAs::f16: return DequantizeGroup<kE4M3, StoreAs::f16, kGlobal>(codes, gs, vscale, vglobal, out, stream);
    case StoreAs::f32: return DequantizeGroup<kE4M3, StoreAs::f32, kGlobal>(codes, gs, vscale, vglobal, out, stream);
  }
}

// `groups` consecutive groups: element codes (one byte each, or two to a byte for 4-bit
// formats) and scale codes → values in out's dtype (f32, or f16/bf16 by one RNE rounding
// of the f32 value, as the oracle's store). N groups at a time: N scales as one vector,
// then decode·scale (·global) group by group. stream: streaming stores (out 64-byte
// aligned), fenced before returning.
void FpDequantizeBlock(const fd::RowJob& job, const std::uint8_t* HWY_RESTRICT in,
                       const std::uint8_t* HWY_RESTRICT scale_codes, std::size_t groups, DType out_dtype,
                       std::byte* HWY_RESTRICT out, bool stream) {
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  constexpr std::size_t kMaxN = hn::MaxLanes(fi::DF());
  const std::size_t N = hn::Lanes(df);
  const auto gs = static_cast<std::size_t>(job.group_size);
  const bool packed = !job.e4m3_elements;
  const auto vglobal = hn::Set(df, job.global_factor);
  const std::size_t out_group_bytes = gs * dtype_size(out_dtype);
  const StoreAs store = out_dtype == DType::bf16 ? StoreAs::bf16 : out_dtype == DType::f16 ? StoreAs::f16 : StoreAs::f32;
  // Scale codes whose products with every element value are normal f32 numbers: E8M0
  // 2^(c−127) times the smallest nonzero element (E2M1 0.5, E4M3 2^-9) at least 2^-126 and
  // times the largest (6, 480) below 2^127; nvfp4's E4M3 scales (2^-9 … 480) always.
  const int lowest = job.e4m3_elements ? 10 : 2, highest = job.e4m3_elements ? 245 : 251;
  alignas(64) std::int32_t lane_codes[kMaxN];
  alignas(64) float scales[kMaxN];
  for (std::size_t g0 = 0; g0 < groups; g0 += N) {
    const std::size_t nb = std::min(N, groups - g0);
    for (std::size_t g = 0; g < N; ++g) lane_codes[g] = g < nb ? scale_codes[g0 + g] : 0;
    const fi::VI sc = hn::Load(di, lane_codes);
    hn::Store(job.e8m0_scales ? fi::E8M0Decode(sc) : fi::E4M3Decode(sc), df, scales);
    for (std::size_t g = 0; g < nb; ++g) {
      const int c = lane_codes[g];
      const bool normal_products = !job.e8m0_scales || (c >= lowest && c <= highest);
      const StoreAs as = store == StoreAs::bf16 && !job.has_global && normal_products ? StoreAs::kBF16High : store;
      const auto vscale = hn::Set(df, scales[g]);
      std::byte* const dst = out + (g0 + g) * out_group_bytes;
      const std::uint8_t* const group_codes = in + (g0 + g) * (packed ? gs / 2 : gs);
      if (job.e4m3_elements) {
        if (job.has_global) DequantizeGroupAs<true, true>(as, group_codes, gs, vscale, vglobal, dst, stream);
        else DequantizeGroupAs<true, false>(as, group_codes, gs, vscale, vglobal, dst, stream);
      } else {
        if (job.has_global) DequantizeGroupAs<false, true>(as, group_codes, gs, vscale, vglobal, dst, stream);
        else DequantizeGroupAs<false, false>(as, group_codes, gs, vscale, vglobal, dst, stream);
      }
    }
  }
  if (stream) hwy::FlushStream();  // the streamed lines visible before the task ends
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(FpQuantizeBlock);
HWY_EXPORT(FpDequantizeBlock);

namespace fp_detail {
namespace {

// Rows per parallel task: a fixed split (the ops are exact, so it cannot change bits).
constexpr std::int64_t kRowsPerTask = 64;
// Dequantized outputs at least this large are written with streaming stores (Put): an
// L2's worth, as kv_move's large copies; below it the consumer may still find them in
// cache.
constexpr std::size_t kStreamBytes = std::size_t{1} << 20;

RowJob make_job(const QuantSpec& spec, Rounding rounding, std::optional<float> global_scale, std::int64_t d) {
  // The block kernels hold N groups of at most 32 values on the stack (the format table's
  // fp group sizes are 16 and 32).
  KVLAB_REQUIRE(spec.group_size <= 32, internal, "SIMD fp kernels: group size ", spec.group_size, " above 32");
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

// Rows are independent and every array is row-major and contiguous, so a task's block of
// rows is a run of groups, read and written in place.
void fp_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding,
                 std::optional<float> global_scale, const TensorView& wq, const TensorView& scales) {
  namespace fd = fp_detail;
  const std::int64_t d = ref::validate_fp_quantize(x, spec, global_scale, wq, scales);
  const fd::RowJob job = fd::make_job(spec, rounding, global_scale, d);
  const std::int64_t rows = x.numel() / d;
  const auto n = static_cast<std::size_t>(d), groups_per_row = static_cast<std::size_t>(job.groups);
  const std::size_t row_bytes = n * dtype_size(x.dtype), wq_row_bytes = n * static_cast<std::size_t>(spec.bits) / 8;
  auto* const quantize_block = &HWY_DYNAMIC_DISPATCH(FpQuantizeBlock);
  auto* const wq_bytes = reinterpret_cast<std::uint8_t*>(wq.data);  // LSB-first words = byte order
  auto* const scale_bytes = reinterpret_cast<std::uint8_t*>(scales.data);
  parallel_for((rows + fd::kRowsPerTask - 1) / fd::kRowsPerTask, [&](std::int64_t task) {
    const std::int64_t r0 = task * fd::kRowsPerTask, r1 = std::min(rows, r0 + fd::kRowsPerTask);
    const auto u0 = static_cast<std::size_t>(r0), block_rows = static_cast<std::size_t>(r1 - r0);
    quantize_block(job, x.data + u0 * row_bytes, x.dtype, block_rows * groups_per_row,
                   scale_bytes + u0 * groups_per_row, wq_bytes + u0 * wq_row_bytes);
  });
}

void fp_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const QuantSpec& spec,
                   std::optional<float> global_scale, const TensorView& out) {
  namespace fd = fp_detail;
  const std::int64_t d = ref::validate_fp_dequantize(wq, scales, spec, global_scale, out);
  const std::int64_t rows = d == 0 ? 0 : out.numel() / d;
  const fd::RowJob job = fd::make_job(spec, Rounding::mlx_cpu, global_scale, d);
  const auto n = static_cast<std::size_t>(d), groups_per_row = static_cast<std::size_t>(scales.dim(-1));
  const std::size_t out_row_bytes = n * dtype_size(out.dtype), wq_row_bytes = n * static_cast<std::size_t>(spec.bits) / 8;
  auto* const dequantize_block = &HWY_DYNAMIC_DISPATCH(FpDequantizeBlock);
  const auto* const wq_bytes = reinterpret_cast<const std::uint8_t*>(wq.data);
  const auto* const scale_bytes = reinterpret_cast<const std::uint8_t*>(scales.data);
  // Streamed stores need aligned addresses: every group starts a multiple of 32 bytes
  // (16 or 32 bf16/f32 values) past an aligned start, so rows and tasks do too.
  const bool stream = static_cast<std::size_t>(out.numel()) * dtype_size(out.dtype) >= fd::kStreamBytes &&
                      reinterpret_cast<std::uintptr_t>(out.data) % 64 == 0 && out_row_bytes % 64 == 0;
  parallel_for((rows + fd::kRowsPerTask - 1) / fd::kRowsPerTask, [&](std::int64_t task) {
    const std::int64_t r0 = task * fd::kRowsPerTask, r1 = std::min(rows, r0 + fd::kRowsPerTask);
    const auto u0 = static_cast<std::size_t>(r0), block_rows = static_cast<std::size_t>(r1 - r0);
    dequantize_block(job, wq_bytes + u0 * wq_row_bytes, scale_bytes + u0 * groups_per_row,
                     block_rows * groups_per_row, out.dtype, out.data + u0 * out_row_bytes, stream);
  });
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
