// SIMD mxfp4 / mxfp8 / nvfp4 quantize and dequantize (contract: reference/fp_quantize.h),
// bit-exact with the oracle on every Highway target.
//
// Vectorized, N groups (a batch) at a time: f16/bf16 → f32, the group amax, the scale
// codes (E8M0 from the exponent bits, see E8M0Encode; E4M3 by the element encoder), the
// scaling, the E2M1 (both roundings) and E4M3 element encoders, the nibble packing, and
// dequantize's decode·scale. Scalar: only the E8M0 codes of the rare scales E8M0Encode
// sends to the oracle's ref::e8m0_encode. The common batch (no NaN, no zero nvfp4 scale,
// E2M1 CPU rounding within E2M1CpuQuarters' range) takes the fast path: every amax from
// one reduction of the stored patterns (ReduceGroups), batches planned a chunk ahead of
// their encoding, bf16 read as even/odd pairs, nvfp4 without a division
// (E2M1CpuQuotient), large outputs streamed; any other batch the general path. bf16 mx
// groups are encoded on their stored patterns (kBF16Patterns), and on AVX3_DL and AVX2
// bf16 nvfp4 groups without a global scale two groups a step (EncodeBF16NarrowPairs).
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
//   Groups with no NaN and |y| <= 12 take the equivalent table of E2M1CpuQuarters
//   (nvfp4: E2M1CpuQuotient, E2M1CpuQuotientNarrow, with their own proofs).
// * E4M3 is the oracle's arithmetic: e = max(⌊log2 a⌋, −6), q = rint(a·2^(3−e)), code =
//   (e+6)·8 + q, done for a >= 2^-6 on the f32 pattern (RNE at 3 mantissa bits, rebias);
//   !(a < 448) (inf, NaN) saturates to 0x7E; the sign is y's sign bit.
// * Dequantize: E2M1 values come from a table (or their bits on narrow vectors); E4M3's
//   decode is the oracle's f16 trick (magnitude bits << 7 as an f16, exact into f32 by ·2^112, then ·2^8, folded into
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
  bool stream = false;  // quantize: the element codes go out by streaming stores (QuantizeBlock)
};

}  // namespace kvlab::simd::fp_detail
#endif  // KVLAB_SIMD_FP_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/fp_quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/affine_pack-inl.h"
#include "kernels/simd/group_reduce-inl.h"
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

// Integral f32 lanes with |v| < 2^31 → i32 by one truncating conversion: Highway 1.0.3's
// ConvertTo adds an overflow fix-up (four more ops on x86) that no such value needs.
HWY_INLINE VI IntegralToInt(VF v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return VI{_mm512_cvttps_epi32(v.raw)};
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return VI{_mm256_cvttps_epi32(v.raw)};
#elif HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  return VI{_mm_cvttps_epi32(v.raw)};
#else
  return hn::ConvertTo(DI(), v);
#endif
}

// rint(v) (ties to even) as i32, for |v| < 2^31: on AVX-512 one conversion with the
// rounding embedded (not MXCSR's).
HWY_INLINE VI RoundToInt(VF v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return VI{_mm512_cvt_roundps_epi32(v.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#else
  return IntegralToInt(hn::Round(v));
#endif
}

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
  const VI code = hn::Or(IntegralToInt(mag), hn::IfThenElseZero(SignBitSet(y), hn::Set(di, 8)));
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
  return hn::Or(IntegralToInt(mag), hn::IfThenElseZero(negative, hn::Set(di, 8)));
}

HWY_INLINE VI E4M3(VF y) {
  const DF df;
  const DI di;
  const VI bits = hn::BitCast(di, hn::Abs(y));
  // a >= 2^-6: (e+6)·8 + rint(a·2^(3−e)) is the f32 pattern with its 20 low mantissa bits
  // rounded off to even (a carry moves to the next binade, as q = 16 does) and the
  // exponent rebiased 127 → 7, i.e. less 120 << 23.
  const VI odd = hn::And(hn::ShiftRight<20>(bits), hn::Set(di, 1));
  const VI normal = hn::ShiftRight<20>(hn::Add(hn::Add(bits, odd), hn::Set(di, 0x7FFFF - (120 << 23))));
  // a < 2^-6 (e = −6): q = rint(a·2^9), an exact product. Min keeps the other lanes (inf,
  // NaN: Min gives its second operand) in range of the conversion, whose result they drop.
  const VF low = hn::Min(hn::BitCast(df, bits), hn::Set(df, 0x1p-6f));
  const VI subnormal = RoundToInt(hn::Mul(low, hn::Set(df, 512.0f)));
  const VI finite = hn::IfThenElse(hn::Lt(bits, hn::Set(di, 0x3C800000)), subnormal, normal);  // 2^-6
  // a >= 448 (inf and NaN too: their patterns are the largest) gives 0x7E or more: 0x7E.
  const VI mag = hn::Min(finite, hn::Set(di, 0x7E));
  return hn::Or(mag, hn::And(hn::ShiftRight<24>(hn::BitCast(di, y)), hn::Set(di, 0x80)));  // y's sign bit → bit 7
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

// ⌈v⌉ as an integer, for |v| < 2^31.
HWY_INLINE VI CeilToInt(VF v) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  return VI{_mm512_cvt_roundps_epi32(v.raw, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)};  // one instruction
#else
  return IntegralToInt(hn::Ceil(v));
#endif
}

// The E2M1 magnitude of c = ⌈|q|⌉ >= 0: table[min(c, 31)].
HWY_INLINE VI E2M1MagnitudeOfCeil(VI c) {
  const DI di;
  alignas(64) static constexpr std::array<std::int32_t, 32> kTable = E2M1MagnitudeByCeilQuarter();
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  // AVX-512: the 32-entry table in one two-source permute.
  const __m512i index = _mm512_min_epi32(c.raw, _mm512_set1_epi32(31));
  return VI{_mm512_permutex2var_epi32(_mm512_load_si512(kTable.data()), index, _mm512_load_si512(kTable.data() + 16))};
#else
  (void)kTable;
  VI mag = hn::Min(hn::ShiftRight<1>(c), hn::Set(di, 4));  // the midpoints 1 3 5 7
  mag = hn::Sub(mag, hn::VecFromMask(di, hn::Gt(c, hn::Set(di, 10))));
  mag = hn::Sub(mag, hn::VecFromMask(di, hn::Gt(c, hn::Set(di, 14))));
  return hn::Sub(mag, hn::VecFromMask(di, hn::Gt(c, hn::Set(di, 20))));
#endif
}

#if HWY_TARGET == HWY_AVX3_DL && HWY_ARCH_X86
// E2M1 codes by (sign, ⌈|q|⌉ below kSize/2, clamped to 31): the magnitude, with the sign
// bit on every nonzero one, shifted left by kShift (index 0 is code 0, which the zero
// bytes of each index lane read).
template <std::size_t kSize = 64, unsigned kShift = 0>
constexpr std::array<std::uint8_t, kSize> E2M1CodeBySignAndCeil() {
  std::array<std::uint8_t, kSize> table{};
  const std::array<std::int32_t, 32> mag = E2M1MagnitudeByCeilQuarter();
  for (std::size_t i = 0; i < kSize; ++i) {
    const auto m = static_cast<std::uint8_t>(mag[std::min<std::size_t>(i % (kSize / 2), 31)]);
    table[i] = static_cast<std::uint8_t>((i >= kSize / 2 && m != 0 ? m | 8 : m) << kShift);
  }
  return table;
}
#endif

// The E2M1 code of q from c = ⌈|q|⌉ and a value `src` of q's sign: the sign bit goes on
// every nonzero magnitude (|q| > 1), i.e. when src < neg_threshold, a value the caller
// gives as equivalent. AVX3_DL: one byte lookup (vpermb) indexed by c and src's sign bit
// (neg_threshold unused); else the magnitude table and a compare.
HWY_INLINE VI E2M1CodeOfCeil(VI c, VF src, VF neg_threshold) {
  const DI di;
#if HWY_TARGET == HWY_AVX3_DL && HWY_ARCH_X86
  (void)neg_threshold;
  alignas(64) static constexpr std::array<std::uint8_t, 64> kTable = E2M1CodeBySignAndCeil();
  const __m512i low = _mm512_min_epi32(c.raw, _mm512_set1_epi32(31));
  const __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(src.raw), 26);  // bit 31 → bit 5
  const __m512i index = _mm512_ternarylogic_epi32(low, sign, _mm512_set1_epi32(32), 0xF8);  // low | (sign & 32)
  (void)di;
  return VI{_mm512_permutexvar_epi8(index, _mm512_load_si512(kTable.data()))};
#else
  const VI mag = E2M1MagnitudeOfCeil(c);
  return hn::IfThenElse(hn::RebindMask(di, hn::Lt(src, neg_threshold)), hn::Or(mag, hn::Set(di, 8)), mag);
#endif
}

HWY_INLINE VI E2M1CpuQuarters(VF q) {
  return E2M1CodeOfCeil(CeilToInt(hn::Abs(q)), q, hn::Set(DF(), -1.0f));  // q < −1 iff |q| > 1 and q < 0
}

// E2M1CpuQuarters(q) of nvfp4's q = RN(x/(s/4)) without the division, from p = x·2^(5−e)
// (e = ⌊log2 s⌋; an exact power-of-two scaling) and the integer m = s·2^(3−e) in [8, 16)
// (s, an E4M3 value, has at most 4 significant bits), so that x/(s/4) = p/m exactly.
// * ⌈RN(y)⌉ = ⌈y⌉ for y = |p|/m <= 50: for an integer 1 <= t <= 64, RN(y) > t iff y > t:
//   RN(y) > t iff y exceeds t + ulp(t)/2 (the tie goes to t, whose last mantissa bit is
//   0), and |x| > (t + ulp(t)/2)·(s/4) iff |x| > t·(s/4), because t·(s/4) is an f32
//   (at most 10 significant bits) and the excess, ulp(t)/2·(s/4), is below its ulp. For
//   t = 0 they can differ only on a y below 2^-149, where both ceilings (0 or 1) give
//   magnitude 0 and no sign. A |p| below 2^-126 may lose bits to the scaling, but then
//   |q| < 1 too: magnitude 0 either way.
// * ⌈|p|/m⌉ = ⌈P/m⌉ for the integer P = ⌈|p|⌉ <= 800, = ⌈(P − 1/2)/m⌉, whose argument lies
//   at least 1/(2m) >= 1/32 from every integer, far beyond the error of RN(P·r − r/2)
//   with r = RN(1/m) (one FMA; r/2 exact; error < 2^-12 here): the ceiling is exact.
// * q < −1 iff RN(x/(s/4)) < −1 iff x < −s/4 (the same argument at t = 1) iff p < −m.
// The per-group constants: neg_m = −m, inv_m = RN(1/m), neg_half_inv_m = −inv_m/2.
HWY_INLINE VI E2M1CpuQuotient(VF p, VF neg_m, VF inv_m, VF neg_half_inv_m) {
  return E2M1CodeOfCeil(CeilToInt(hn::MulAdd(hn::Ceil(hn::Abs(p)), inv_m, neg_half_inv_m)), p, neg_m);
}

// E2M1CpuQuotient for an x of at most 11 significant bits (an f16/bf16 w; enc = 1), with
// K = 2^(5−e)·RN(1/m) (exact) and neg_quarter_s = −s/4: ⌈|x|·K − 2^-16⌉ in one FMA. For
// |p| >= 1, |p| = M·2^E with M < 2^11, so E >= −10 and |p| − k·m (a multiple of 2^E) is 0
// or at least 2^-10: y = |p|/m is an integer or at least 2^-14 from every integer, while
// RN(|x|·K − 2^-16) lies within 2^-17.5 of y − 2^-16 (y <= 50; |x|·K = |p|·RN(1/m)), so
// its ceiling is ⌈y⌉. For |p| < 1 both ceilings are 0 or 1: magnitude 0, no sign.
HWY_INLINE VI E2M1CpuQuotientNarrow(VF x, VF k, VF neg_quarter_s) {
  return E2M1CodeOfCeil(CeilToInt(hn::MulAdd(hn::Abs(x), k, hn::Set(DF(), -0x1p-16f))), x, neg_quarter_s);
}

// E2M1 CPU codes of 16-bit lanes holding bf16 patterns w of an mx group whose scale is
// 2^k, given shift = k << 7, for a group whose |y| = |w|·2^-k are all <= 12 (no NaN): the
// same nearest entry with ties to the lower magnitude as E2M1CpuQuarters, on the stored
// bits. s = (w & 0x7FFF) − shift is |y|'s bf16 pattern whenever |y| >= 2^-126 (the
// exponent field less k); otherwise s is below 0.25's pattern (fast plans have k >= −123,
// so even a subnormal w scaled up reads below 2^-3), as |y| is: magnitude 0 either way.
// Non-negative patterns order as their values, so:
// * |y| >= 1: the entries of each binade [2^e, 2^(e+1)) are its values of one mantissa
//   bit (1 1.5 | 2 3 | 4 6, and 8 saturates to 6), so the code 2(e+1) + m is s rounded to
//   one mantissa bit with ties down — (s + 31) >> 6 — less 2·126: exponent carries
//   included (1.75 < |y| < 2 → 2). Above 6 it is clamped to 7.
// * |y| < 1: the entries are 0, 0.5 and 1 with midpoints 0.25 and 0.75: the count of those
//   |y| lies strictly above, which for |y| >= 1 is 2, no more than the first rule's code,
//   and for |y| < 1 at least that code (<= 1 there), so the code is the larger of the two.
// * The sign goes on every nonzero magnitude, i.e. |y| > 0.25, from w's sign bit.
template <class D16>
HWY_INLINE hn::Vec<D16> E2M1CpuOfBF16(D16 d16, hn::Vec<D16> w, hn::Vec<D16> shift) {
  const auto s = hn::Sub(hn::And(w, hn::Set(d16, 0x7FFF)), shift);  // |s| < 2^15: no wrap-around
  const auto binade = hn::ShiftRight<6>(hn::Add(s, hn::Set(d16, 31 - 252 * 64)));  // arithmetic
  const auto above_quarter = hn::VecFromMask(d16, hn::Gt(s, hn::Set(d16, 0x3E80)));  // 0.25
  const auto above_three_quarters = hn::VecFromMask(d16, hn::Gt(s, hn::Set(d16, 0x3F40)));  // 0.75
  const auto below_one = hn::Sub(hn::Sub(hn::Zero(d16), above_quarter), above_three_quarters);
  const auto mag = hn::Max(hn::Min(binade, hn::Set(d16, 7)), below_one);
  const auto sign = hn::And(hn::And(hn::ShiftRight<15>(w), above_quarter), hn::Set(d16, 8));
  return hn::Or(mag, sign);
}

// E4M3 codes of 16-bit lanes holding bf16 patterns w of an mx group whose scale is 2^k
// (shift = k << 7, k >= −110), as E4M3(w·2^-k): s = (w & 0x7FFF) − shift is |y|'s bf16
// pattern for |y| >= 2^-126 and below 2^-10's pattern otherwise (a subnormal w scaled
// up by at most 2^110 stays below 2^-16). |y| >= 2^-6: the pattern rounded to three
// mantissa bits (ties to even: + 7 + the kept lowest bit, >> 4) and rebiased 127 → 7, a
// carry moving to the next binade, clamped to 0x7E (448; larger |y| saturate). |y| <=
// 2^-10: rint(|y|·2^9) = 0. The lanes between, E4M3's subnormals, are not handled here:
// `subnormal` reports whether any lane is one (the caller encodes those vectors again).
template <class D16>
HWY_INLINE hn::Vec<D16> E4M3OfBF16(D16 d16, hn::Vec<D16> w, hn::Vec<D16> shift, bool& subnormal) {
  const auto s = hn::Sub(hn::And(w, hn::Set(d16, 0x7FFF)), shift);
  const auto odd = hn::And(hn::ShiftRight<4>(s), hn::Set(d16, 1));
  const auto normal = hn::ShiftRight<4>(hn::Add(hn::Add(s, odd), hn::Set(d16, 7 - (120 << 7))));  // arithmetic
  const auto mag = hn::Min(hn::Max(normal, hn::Zero(d16)), hn::Set(d16, 0x7E));
  subnormal = !hn::AllFalse(d16, hn::And(hn::Gt(s, hn::Set(d16, 0x3A80)), hn::Lt(s, hn::Set(d16, 0x3C80))));
  const hn::RebindToUnsigned<D16> du16;
  return hn::Or(mag, hn::BitCast(d16, hn::And(hn::ShiftRight<8>(hn::BitCast(du16, w)), hn::Set(du16, 0x80))));
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
HWY_INLINE fp_impl::VI ScaleCodes(const fd::RowJob& job, fp_impl::VF amax, float* HWY_RESTRICT factor) {
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

#if HWY_TARGET != HWY_SCALAR  // QuantizeBatchFast's pieces (one lane: no pairs of 16-bit lanes)
// Stores the codes of 2N consecutive elements given as the even-indexed (`even`) and
// odd-indexed ones: packed (codes < 16), lane k's byte is even | odd << 4; else (codes
// < 256) lane k's two bytes, even first (little-endian u16).
template <bool kPacked>
HWY_INLINE void StorePairs(fp_impl::VI even, fp_impl::VI odd, std::uint8_t* HWY_RESTRICT out) {
  const fp_impl::DI di;
  if constexpr (kPacked) {
    const hn::Rebind<std::uint8_t, fp_impl::DI> d8;
    const auto bytes = hn::BitCast(hn::RebindToUnsigned<fp_impl::DI>(), hn::Or(even, hn::ShiftLeft<4>(odd)));
    hn::StoreU(affine_pack::LowBytes(d8, bytes), d8, out);
  } else {
    const hn::Rebind<std::uint16_t, fp_impl::DI> d16;
    hn::StoreU(hn::DemoteTo(d16, hn::Or(even, hn::ShiftLeft<8>(odd))), d16, reinterpret_cast<std::uint16_t*>(out));
    (void)di;
  }
}

// One prefetch per 64 bytes of the batch that group g's `stride` bytes cover (a group of
// 32 bytes every other time), `ahead` bytes past them, issued as the group is encoded:
// spread through the compute, they keep the next chunk's DRAM reads in flight while it
// runs; a burst of a batch's lines at once, before its plan, left compute and memory
// less overlapped (docs/benchmarks.md §Measurements behind kernel choices). An integer
// address: a prefetch never faults, past the input's end included.
HWY_INLINE void PrefetchPast(const std::byte* batch, std::size_t g, std::size_t stride, std::size_t ahead) {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(batch) + ahead;
  for (std::size_t b = (g * stride + 63) / 64 * 64; b < (g + 1) * stride; b += 64) {
    hwy::Prefetch(reinterpret_cast<const std::uint8_t*>(at + b));
  }
}

// The element codes of nb consecutive groups, encode(g, w) of Lanes(df) values w of group
// g at a time, stored; the loop shape chosen once per batch. bf16 groups of a multiple of
// 2N values are read 2N at a time as N u32 lanes, whose low and high halves are elements
// 2k and 2k+1, each made an f32 by one shift or mask and encoded in that order; the codes
// of both go out together (StorePairs). Groups of one vector take one pass each. Each
// group asks for the input `ahead` bytes past it (PrefetchPast).
template <DType kDtype, bool kPacked, class Encode>
HWY_INLINE void EncodeGroups(const std::byte* HWY_RESTRICT batch, std::size_t nb, std::size_t gs, std::size_t ahead,
                             std::uint8_t* HWY_RESTRICT out, const Encode& encode) {
  const fp_impl::DF df;
  const fp_impl::DI di;
  const std::size_t N = hn::Lanes(df);
  const std::size_t stride = gs * (kDtype == DType::f32 ? 4 : 2), group_bytes = kPacked ? gs / 2 : gs;
  if constexpr (kDtype == DType::bf16) {
    if (gs % (2 * N) == 0) {
      for (std::size_t g = 0; g < nb; ++g) {
        PrefetchPast(batch, g, stride, ahead);
        const auto* words = reinterpret_cast<const std::int32_t*>(batch + g * stride);
        for (std::size_t i = 0; i < gs; i += 2 * N) {
          const fp_impl::VI raw = hn::LoadU(di, words + i / 2);
          const fp_impl::VI even = encode(g, hn::BitCast(df, hn::ShiftLeft<16>(raw)));
          const fp_impl::VI odd = encode(g, hn::BitCast(df, hn::And(raw, hn::Set(di, -65536))));  // 0xFFFF0000
          StorePairs<kPacked>(even, odd, out + g * group_bytes + (kPacked ? i / 2 : i));
        }
      }
      return;
    }
  }
  if (gs == N) {
    for (std::size_t g = 0; g < nb; ++g) {
      PrefetchPast(batch, g, stride, ahead);
      StoreCodes<kPacked>(encode(g, LoadStored<kDtype>(batch + g * stride, 0)), out + g * group_bytes);
    }
    return;
  }
  for (std::size_t g = 0; g < nb; ++g) {
    PrefetchPast(batch, g, stride, ahead);
    for (std::size_t i = 0; i < gs; i += N) {
      StoreCodes<kPacked>(encode(g, LoadStored<kDtype>(batch + g * stride, i)),
                          out + g * group_bytes + (kPacked ? i / 2 : i));
    }
  }
}

// The lane-wise maximum of a group's magnitude patterns: |w|'s bits for f32 inputs (i32
// lanes), the stored pattern & 0x7FFF for f16/bf16, unconverted, two per i32 lane (or one
// beside a zero, widened, for a group narrower than a vector): non-negative patterns order
// as their values, so the largest is the amax's pattern, and one above the format's
// infinity is a NaN. MaxOfPatterns reduces such vectors and PatternsToLanes takes each
// lane's larger half once the batch's groups are reduced.
template <DType kDtype>
HWY_INLINE fp_impl::VI GroupMagnitudeMax(const std::byte* HWY_RESTRICT group, std::size_t gs) {
  const fp_impl::DI di;
  if constexpr (kDtype == DType::f32) {
    const auto* p = reinterpret_cast<const std::int32_t*>(group);
    fp_impl::VI m = hn::Zero(di);
    for (std::size_t i = 0; i < gs; i += hn::Lanes(di)) {
      m = hn::Max(m, hn::And(hn::LoadU(di, p + i), hn::Set(di, 0x7FFFFFFF)));
    }
    return m;
  } else {
    const hn::Repartition<std::int16_t, fp_impl::DI> d16;
    const std::size_t n16 = hn::Lanes(d16);
    const auto* p = reinterpret_cast<const std::int16_t*>(group);
    if (gs < n16) {  // gs (16 or 32, a multiple of N) below 2N: gs == N, widened
      return hn::And(hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::int16_t, fp_impl::DI>(), p)), hn::Set(di, 0x7FFF));
    }
    const auto mask = hn::Set(d16, 0x7FFF);
    auto m = hn::And(hn::LoadU(d16, p), mask);
    if (gs == 2 * n16) return hn::BitCast(di, hn::Max(m, hn::And(hn::LoadU(d16, p + n16), mask)));
    for (std::size_t i = n16; i < gs; i += n16) m = hn::Max(m, hn::And(hn::LoadU(d16, p + i), mask));
    return hn::BitCast(di, m);
  }
}

// The lane-wise maximum of two GroupMagnitudeMax vectors: of i32 lanes, or of the 16-bit
// patterns they hold (the group reduction moves whole i32 lanes, so pairs stay together).
template <DType kDtype>
HWY_INLINE fp_impl::VI MaxOfPatterns(fp_impl::VI x, fp_impl::VI y) {
  if constexpr (kDtype == DType::f32) {
    return hn::Max(x, y);
  } else {
    const hn::Repartition<std::int16_t, fp_impl::DI> d16;
    return hn::BitCast(fp_impl::DI(), hn::Max(hn::BitCast(d16, x), hn::BitCast(d16, y)));
  }
}

template <DType kDtype>
HWY_INLINE fp_impl::VI PatternsToLanes(fp_impl::VI m) {
  if constexpr (kDtype == DType::f32) {
    return m;
  } else {
    return hn::Max(hn::And(m, hn::Set(fp_impl::DI(), 0xFFFF)), hn::ShiftRight<16>(m));
  }
}

template <DType kDtype>
constexpr std::int32_t kInfPattern = kDtype == DType::bf16 ? 0x7F80 : kDtype == DType::f16 ? 0x7C00 : 0x7F800000;

// A magnitude pattern of GroupMagnitudeMax → its f32 value, exactly.
template <DType kDtype>
HWY_INLINE fp_impl::VF MagnitudeToF32(fp_impl::VI bits) {
  const fp_impl::DF df;
  const hn::RebindToUnsigned<fp_impl::DF> du;
  if constexpr (kDtype == DType::bf16) return hn::BitCast(df, hn::ShiftLeft<16>(bits));
  else if constexpr (kDtype == DType::f16) return F16BitsToF32(df, hn::BitCast(du, bits));
  else return hn::BitCast(df, bits);
}

#endif

template <class Codes>
constexpr bool kQuarters = std::is_same_v<Codes, E2M1CpuCodes> && HWY_TARGET != HWY_SCALAR;  // one lane: no pairs

// bf16 mx groups (E2M1 with the CPU rounding, E4M3) are encoded on their stored 16-bit
// patterns (E2M1CpuOfBF16, E4M3OfBF16) on every vector target: that halved the mx rows'
// time on AVX2 and made mxfp8 a fifth faster on AVX3_DL, mxfp4 unchanged there.
// nvfp4 groups of bf16 without a global scale are encoded a pair at a time by one FMA and
// a byte lookup on AVX3_DL and AVX2 (EncodeBF16NarrowPairs), elsewhere by the f32 path
// (docs/benchmarks.md §Measurements behind kernel choices).

template <DType kDtype, bool kDivide, class Codes>
constexpr bool kBF16Patterns = (kQuarters<Codes> || std::is_same_v<Codes, E4M3Codes>) && kDtype == DType::bf16 &&
                               !kDivide && HWY_TARGET != HWY_SCALAR;

// E2M1 CPU rounding in quarters, q = 4y: mx q = w·quarter with quarter = 4/scale, nvfp4
// q = (w·enc)/quarter with quarter = s/4 (exact: s >= 2^-9). Every |q| of a group is at
// most the same arithmetic on its amax (monotone roundings): the groups whose bound is
// <= 48 (|y| <= 12, the table's range). nvfp4 compares |amax·enc| <= 12·s instead, with
// no division: 12·s is exact (s, an E4M3 value, has at most 4 significant bits), and
// a <= 48·(s/4) implies RN(a/(s/4)) <= 48, so no group outside the range passes.
template <bool kDivide>
HWY_INLINE hn::Mask<fp_impl::DF> QuartersInRange(fp_impl::VF factor, fp_impl::VF amax, fp_impl::VF enc,
                                                 fp_impl::VF& quarter) {
  const fp_impl::DF df;
  if constexpr (kDivide) {
    quarter = hn::Mul(factor, hn::Set(df, 0.25f));
    return hn::Le(hn::Abs(hn::Mul(amax, enc)), hn::Mul(factor, hn::Set(df, 12.0f)));
  } else {
    quarter = hn::Mul(factor, hn::Set(df, 4.0f));
    return hn::Le(hn::Abs(hn::Mul(amax, quarter)), hn::Set(df, 48.0f));
  }
}

// The oracle's amax of a group that holds a NaN: the largest |w| of the others.
inline float AmaxIgnoringNaN(const float* w, std::size_t n) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(w[i]));
  return amax;
}

// The per-group constants of a batch's encoding (QuantizeBatchFast): mx E2M1 CPU rounding
// k1 = 4/scale; nvfp4 E2M1 CPU rounding E2M1CpuQuotient's k1 = 2^(5−e), neg_m = −m,
// inv_m = RN(1/m), neg_half_inv_m = −inv_m/2; other encoders: k1 = the factor.
struct alignas(64) BatchPlan {
  static constexpr std::size_t kMaxN = hn::MaxLanes(fp_impl::DF());
  float k1[kMaxN], neg_m[kMaxN], inv_m[kMaxN], neg_half_inv_m[kMaxN];
  float k1_inv_m[kMaxN], neg_quarter_s[kMaxN];  // E2M1CpuQuotientNarrow's K and −s/4
  std::int16_t shift[kMaxN];  // E2M1CpuOfBF16's k << 7 (mx scale 2^k)
};

#if HWY_TARGET != HWY_SCALAR
// The magnitude patterns of the amax of a batch's nb <= N groups (lane g: group g; lanes
// past nb: 0), from one ReduceGroups of their lane-wise maxima, with no per-group
// reduction or branch.
template <DType kDtype>
HWY_INLINE fp_impl::VI BatchAmaxPatterns(const std::byte* HWY_RESTRICT batch, std::size_t nb, std::size_t gs) {
  namespace fi = fp_impl;
  const fi::DI di;
  constexpr std::size_t kMaxN = BatchPlan::kMaxN;  // x86 vectors: == Lanes
  constexpr std::size_t kStoredBytes = kDtype == DType::f32 ? 4 : 2;
  fi::VI partial[kMaxN];
  const hn::Repartition<std::int16_t, fi::DI> d16;
  const auto max_of = [](fi::VI x, fi::VI y) { return MaxOfPatterns<kDtype>(x, y); };
  const auto* p = reinterpret_cast<const std::int16_t*>(batch);
  const auto mask = hn::Set(d16, 0x7FFF);
  if (kDtype != DType::f32 && nb == kMaxN && gs == 2 * hn::Lanes(d16)) {  // full batches of two-vector groups
#pragma GCC unroll 16
    for (std::size_t g = 0; g < kMaxN; ++g) {
      partial[g] = hn::BitCast(di, hn::Max(hn::And(hn::LoadU(d16, p + g * gs), mask),
                                           hn::And(hn::LoadU(d16, p + g * gs + hn::Lanes(d16)), mask)));
    }
    ReduceGroups<kMaxN>(di, partial, max_of);
  } else if (kDtype != DType::f32 && nb == kMaxN && gs == hn::Lanes(d16)) {  // full batches of one-vector groups
#pragma GCC unroll 16
    for (std::size_t g = 0; g < kMaxN; ++g) partial[g] = hn::BitCast(di, hn::And(hn::LoadU(d16, p + g * gs), mask));
    ReduceGroups<kMaxN>(di, partial, max_of);
  } else if (kDtype != DType::f32 && nb == kMaxN && 2 * gs == hn::Lanes(d16)) {
    // Full batches of half-vector groups (AVX-512 nvfp4): two groups a vector, their
    // 16-bit patterns in i32 lanes as the first level's output, which is skipped.
#pragma GCC unroll 16
    for (std::size_t j = 0; j < kMaxN / 2; ++j) {
      partial[j] = hn::BitCast(di, hn::And(hn::LoadU(d16, p + 2 * j * gs), mask));
    }
    ReduceGroups<kMaxN, 2>(di, partial, max_of);
  } else {
    for (std::size_t g = 0; g < kMaxN; ++g)
      partial[g] = g < nb ? GroupMagnitudeMax<kDtype>(batch + g * gs * kStoredBytes, gs) : hn::Zero(di);
    ReduceGroups<kMaxN>(di, partial, max_of);
  }
  return PatternsToLanes<kDtype>(partial[0]);
}
#endif

// The common batch of N groups, given their BatchAmaxPatterns and the ScaleCodes of
// those (whose factors are in plan.k1): no NaN, no zero nvfp4 scale, and (E2M1 CPU
// rounding) every |y| <= 12. Writes its scale codes and plan (the per-group constants),
// with no per-group branch. Returns false for any other batch (then QuantizeBatch writes
// the scale codes again, identically).
template <DType kDtype, bool kDivide, class Codes>
HWY_INLINE bool PlanBatchFast(const fd::RowJob& job, fp_impl::VI amax_bits, fp_impl::VI codes, std::size_t nb,
                              std::uint8_t* HWY_RESTRICT scale_codes, BatchPlan& plan) {
#if HWY_TARGET == HWY_SCALAR
  (void)job, (void)amax_bits, (void)codes, (void)nb, (void)scale_codes, (void)plan;
  return false;
#else
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  constexpr std::size_t kMaxN = BatchPlan::kMaxN;
  const fi::VF vamax = MagnitudeToF32<kDtype>(amax_bits);
  if (nb == hn::Lanes(di)) {
    const hn::Rebind<std::uint8_t, fi::DI> d8;
    hn::StoreU(affine_pack::LowBytes(d8, hn::BitCast(hn::RebindToUnsigned<fi::DI>(), codes)), d8, scale_codes);
  } else {
    alignas(64) std::int32_t codes32[kMaxN];
    hn::Store(codes, di, codes32);
    for (std::size_t g = 0; g < nb; ++g) scale_codes[g] = static_cast<std::uint8_t>(codes32[g]);
  }
  const auto live = hn::FirstN(df, nb);
  const fi::VF vfactor = hn::Load(df, plan.k1), venc = hn::Set(df, job.enc);
  // Refused, one test for all: a NaN; nvfp4, a live group's zero scale; E2M1 CPU rounding,
  // a live group outside the table's range (QuartersInRange).
  auto refused = hn::RebindMask(df, hn::Gt(amax_bits, hn::Set(di, kInfPattern<kDtype>)));
  if constexpr (kDivide) refused = hn::Or(refused, hn::And(live, hn::Eq(vfactor, hn::Zero(df))));
  fi::VF quarter;
  if constexpr (kQuarters<Codes>) {
    refused = hn::Or(refused, hn::AndNot(QuartersInRange<kDivide>(vfactor, vamax, venc, quarter), live));
  }
  if (!hn::AllFalse(df, refused)) return false;
  if constexpr (kQuarters<Codes>) {
    // nvfp4: E2M1CpuQuotient's p = (w·enc)·2^(5−e) and m = s·2^(3−e) (e = ⌊log2 s⌋; s >=
    // 2^-9 is a normal f32).
    if constexpr (kDivide) {
      const fi::VI e = hn::Sub(hn::ShiftRight<23>(hn::BitCast(di, vfactor)), hn::Set(di, 127));
      const auto pow2 = [&](fi::VI k) { return hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(k, hn::Set(di, 127)))); };
      const fi::VF vm = hn::Mul(vfactor, pow2(hn::Sub(hn::Set(di, 3), e)));
      fi::VF vinv;
      if constexpr (hn::MaxLanes(df) >= 8) {
        // RN(1/m) from a table: m − 8 is s's top three mantissa bits (m, an integer in
        // [8, 16), has s's significand). Replaces a division on the batch's critical path.
        alignas(64) static constexpr float kInvM[16] = {1.0f / 8,  1.0f / 9,  1.0f / 10, 1.0f / 11,
                                                        1.0f / 12, 1.0f / 13, 1.0f / 14, 1.0f / 15};
        const fi::VI idx = hn::And(hn::ShiftRight<20>(hn::BitCast(di, vfactor)), hn::Set(di, 7));
        vinv = hn::TableLookupLanes(hn::Load(df, kInvM), hn::IndicesFromVec(df, idx));
      } else {
        vinv = hn::Div(hn::Set(df, 1.0f), hn::IfThenElse(live, vm, hn::Set(df, 8.0f)));
      }
      const fi::VF vk1 = pow2(hn::Sub(hn::Set(di, 5), e));
      hn::Store(hn::Mul(vk1, vinv), df, plan.k1_inv_m);
      hn::Store(hn::Neg(quarter), df, plan.neg_quarter_s);
      // 16-bit inputs without a global scale are encoded by E2M1CpuQuotientNarrow, which
      // reads these two alone.
      if (kDtype != DType::f32 && !job.has_global) return true;
      hn::Store(vk1, df, plan.k1);
      hn::Store(hn::Neg(vm), df, plan.neg_m);
      hn::Store(vinv, df, plan.inv_m);
      hn::Store(hn::Mul(vinv, hn::Set(df, -0.5f)), df, plan.neg_half_inv_m);
    } else {
      hn::Store(quarter, df, plan.k1);
    }
  }
  if constexpr (kBF16Patterns<kDtype, kDivide, Codes>) {
    // k = code − 127 >= −123 for E2M1CpuOfBF16, >= −110 for E4M3OfBF16; below 255 (a
    // finite scale). Live groups only.
    constexpr std::int32_t kLowest = std::is_same_v<Codes, E4M3Codes> ? 17 : 4;
    const auto usable = hn::And(hn::Gt(codes, hn::Set(di, kLowest - 1)), hn::Lt(codes, hn::Set(di, 255)));
    if (!hn::AllTrue(di, hn::Or(hn::Not(hn::RebindMask(di, live)), usable))) return false;
    alignas(64) std::int32_t shift[kMaxN];
    hn::Store(hn::ShiftLeft<7>(hn::Sub(codes, hn::Set(di, 127))), di, shift);
    for (std::size_t g = 0; g < kMaxN; ++g) plan.shift[g] = static_cast<std::int16_t>(shift[g]);
  }
  return true;
#endif
}

#if HWY_TARGET != HWY_SCALAR
// The codes of the 16-bit vector of bf16 patterns at `w` (element i of group g, whose
// shift is given) to `out` (the group's codes from element i). E2M1: lanes 2k and 2k+1
// share a u32 lane, whose byte 0 becomes code(2k) | code(2k+1) << 4 by one shift and or.
// E4M3: a byte a lane; a vector holding an E4M3 subnormal is encoded again by the f32 path.
template <class Codes>
HWY_INLINE void EncodePatternVector(const std::int16_t* HWY_RESTRICT w, hn::Vec<hn::ScalableTag<std::int16_t>> shift,
                                    float factor, std::uint8_t* HWY_RESTRICT out) {
  namespace fi = fp_impl;
  const hn::ScalableTag<std::int16_t> d16;
  const auto v = hn::LoadU(d16, w);
  if constexpr (std::is_same_v<Codes, E4M3Codes>) {
    const hn::Rebind<std::uint8_t, decltype(d16)> d8;
    bool subnormal = false;
    hn::StoreU(hn::DemoteTo(d8, fi::E4M3OfBF16(d16, v, shift, subnormal)), d8, out);
    if (HWY_UNLIKELY(subnormal)) {
      const fi::DF df;
      for (std::size_t j = 0; j < hn::Lanes(d16); j += hn::Lanes(df)) {
        const auto* at = reinterpret_cast<const std::byte*>(w);
        StoreCodes<false>(fi::E4M3(hn::Mul(LoadStored<DType::bf16>(at, j), hn::Set(df, factor))), out + j);
      }
    }
  } else {
    const hn::Repartition<std::uint32_t, decltype(d16)> d32;
    const hn::Rebind<std::uint8_t, decltype(d32)> d8;
    const auto pairs = hn::BitCast(d32, fi::E2M1CpuOfBF16(d16, v, shift));
    hn::StoreU(affine_pack::LowBytes(d8, hn::Or(pairs, hn::ShiftRight<12>(pairs))), d8, out);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// The E2M1 codes of two vectors of 16-bit lanes (< 16 each) as 16 packed bytes, code(2k) |
// code(2k+1) << 4: one vpmaddwd a vector (pairs weighted 1 and 16), both packed to bytes
// together, the dwords put back in order (each 128-bit half packs 4 of a and 4 of b).
HWY_INLINE void StoreNibblePairs(hn::Vec256<std::int16_t> a, hn::Vec256<std::int16_t> b, std::uint8_t* out) {
  const __m256i weights = _mm256_set1_epi32(0x00100001);
  const __m256i words = _mm256_packus_epi32(_mm256_madd_epi16(a.raw, weights), _mm256_madd_epi16(b.raw, weights));
  const __m256i bytes = _mm256_packus_epi16(words, words);
  const __m256i order = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(order));
}
#endif
#endif

// The codes of nb bf16 mx groups (kBF16Patterns) from their stored patterns, 16-bit lanes
// at a time (EncodePatternVector); groups of one or two vectors without an inner loop
// (its per-group set-up cost mxfp8 a sixth on AVX-512:
// docs/benchmarks.md §Measurements behind kernel choices). A group size that is
// not a multiple of the vector takes the f32 path.
template <class Codes>
HWY_INLINE void EncodeBF16Patterns(const std::byte* HWY_RESTRICT batch, std::size_t nb, std::size_t gs,
                                   const BatchPlan& plan, std::size_t ahead, std::uint8_t* HWY_RESTRICT out) {
#if HWY_TARGET != HWY_SCALAR
  namespace fi = fp_impl;
  constexpr bool kE4M3 = std::is_same_v<Codes, E4M3Codes>;
  const hn::ScalableTag<std::int16_t> d16;
  const std::size_t n16 = hn::Lanes(d16), code_bytes = kE4M3 ? 1 : 2;  // elements a byte holds
  if (gs % n16 != 0) {
    const fi::DF df;
    EncodeGroups<DType::bf16, Codes::kPacked>(batch, nb, gs, ahead, out, [&](std::size_t g, fi::VF w) {
      const fi::VF y = hn::Mul(w, hn::Set(df, plan.k1[g]));
      if constexpr (kE4M3) return fi::E4M3(y);
      else return fi::E2M1CpuQuarters(y);
    });
    return;
  }
  const auto* w = reinterpret_cast<const std::int16_t*>(batch);
  if (gs == 2 * n16) {
    constexpr std::size_t kStride = 4 * hn::MaxLanes(d16);  // == 2 · gs bytes here (x86: Lanes == MaxLanes)
    for (std::size_t g = 0; g < nb; ++g) {
      PrefetchPast(batch, g, kStride, ahead);
      const auto shift = hn::Set(d16, plan.shift[g]);
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
      if constexpr (!kE4M3) {
        StoreNibblePairs(fi::E2M1CpuOfBF16(d16, hn::LoadU(d16, w + g * gs), shift),
                         fi::E2M1CpuOfBF16(d16, hn::LoadU(d16, w + g * gs + n16), shift), out + g * gs / 2);
        continue;
      }
#endif
      EncodePatternVector<Codes>(w + g * gs, shift, plan.k1[g], out + g * gs / code_bytes);
      EncodePatternVector<Codes>(w + g * gs + n16, shift, plan.k1[g], out + (g * gs + n16) / code_bytes);
    }
    return;
  }
  if (gs == n16) {  // one vector a group (AVX-512's groups of 32): one line, one prefetch
    constexpr std::size_t kStride = 2 * hn::MaxLanes(d16);
    for (std::size_t g = 0; g < nb; ++g) {
      PrefetchPast(batch, g, kStride, ahead);
      EncodePatternVector<Codes>(w + g * gs, hn::Set(d16, plan.shift[g]), plan.k1[g], out + g * gs / code_bytes);
    }
    return;
  }
  for (std::size_t g = 0; g < nb; ++g) {
    PrefetchPast(batch, g, 2 * gs, ahead);
    const auto shift = hn::Set(d16, plan.shift[g]);
    for (std::size_t i = 0; i < gs; i += n16) {
      EncodePatternVector<Codes>(w + g * gs + i, shift, plan.k1[g], out + (g * gs + i) / code_bytes);
    }
  }
#else
  (void)batch, (void)nb, (void)gs, (void)plan, (void)ahead, (void)out;
#endif
}

#if HWY_TARGET == HWY_AVX3_DL && HWY_ARCH_X86
// E2M1CpuQuotientNarrow of the bf16 groups of 16 of a fast nvfp4 batch without a global
// scale, two groups (one 64-byte line) a load: u32 lane k holds elements 2k and 2k+1, so
// lanes 0-7 are group g and 8-15 group g+1, and each lane's K comes from one permute of
// the plan. Elements 2k and 2k+1 become f32 |x| by a mask and a shift, each takes one FMA
// and an upward conversion, and its code is one byte lookup indexed by c = ⌈·⌉ and the
// element's sign bit at bit 6 (c <= 48 < 64 in a fast batch, so no clamp), the odd
// elements' table shifted to the high nibble: an or packs the pair. Eight groups are
// looked up and stored together (a vpmovdb per line cost more than gathering the index
// bytes). Returns the number of groups encoded (the even part of nb).
HWY_INLINE std::size_t EncodeBF16NarrowPairs(const std::byte* HWY_RESTRICT batch, std::size_t nb, const BatchPlan& plan,
                                             std::size_t ahead, std::uint8_t* HWY_RESTRICT out) {
  static_assert(BatchPlan::kMaxN == 16);
  alignas(64) static constexpr std::array<std::uint8_t, 128> kEven = fp_impl::E2M1CodeBySignAndCeil<128, 0>();
  alignas(64) static constexpr std::array<std::uint8_t, 128> kOdd = fp_impl::E2M1CodeBySignAndCeil<128, 4>();
  // Byte 4·(j mod 32) of two vectors' 128 bytes, at byte j: the index bytes of lanes 0-15
  // of the first and then of the second, twice (a blend keeps one copy).
  alignas(64) static constexpr std::array<std::uint8_t, 64> kLaneBytes = [] {
    std::array<std::uint8_t, 64> t{};
    for (std::size_t j = 0; j < 64; ++j) t[j] = static_cast<std::uint8_t>(4 * (j % 32));
    return t;
  }();
  const __m512i even_lo = _mm512_load_si512(kEven.data()), even_hi = _mm512_load_si512(kEven.data() + 64);
  const __m512i odd_lo = _mm512_load_si512(kOdd.data()), odd_hi = _mm512_load_si512(kOdd.data() + 64);
  const __m512 k = _mm512_load_ps(plan.k1_inv_m), bias = _mm512_set1_ps(-0x1p-16f);
  const __m512i group_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i sign_bit = _mm512_set1_epi32(0x40), magnitudes = _mm512_set1_epi32(0x7FFF7FFF);
  const __m512i odd_magnitude = _mm512_set1_epi32(0x7FFF0000);
  constexpr int kRoundUp = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
  // The table indices of groups g and g+1 (one 64-byte line), even and odd elements, in
  // the low byte of each u32 lane: c | (sign & 0x40), bit 15 (element 2k's sign) or bit 31
  // (2k+1's) moved to bit 6.
  const auto indices = [&](std::size_t g, __m512i& i_even, __m512i& i_odd) {
    PrefetchPast(batch, g / 2, 64, ahead);
    const __m512i raw = _mm512_loadu_si512(batch + g * 32);
    const __m512i pair = _mm512_add_epi32(group_of_lane, _mm512_set1_epi32(static_cast<int>(g)));
    const __m512 lane_k = _mm512_permutexvar_ps(pair, k);
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_and_si512(raw, magnitudes), 16));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(raw, odd_magnitude));
    const __m512i c_even = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(even, lane_k, bias), kRoundUp);
    const __m512i c_odd = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(odd, lane_k, bias), kRoundUp);
    i_even = _mm512_ternarylogic_epi32(c_even, _mm512_srli_epi32(raw, 9), sign_bit, 0xF8);
    i_odd = _mm512_ternarylogic_epi32(c_odd, _mm512_srli_epi32(raw, 25), sign_bit, 0xF8);
  };
  std::size_t g = 0;
  // Eight groups (four lines) a step: their index bytes gathered into one vector each for
  // the even and odd elements (two two-table byte permutations and a blend), so one
  // lookup each and one 64-byte store serve the eight groups.
  const __m512i lane_bytes = _mm512_load_si512(kLaneBytes.data());
  const auto gather = [&](const __m512i* i) {
    return _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_permutex2var_epi8(i[0], lane_bytes, i[1]),
                                  _mm512_permutex2var_epi8(i[2], lane_bytes, i[3]));
  };
  for (; g + 8 <= nb; g += 8) {
    __m512i i_even[4], i_odd[4];
#pragma GCC unroll 4
    for (std::size_t l = 0; l < 4; ++l) indices(g + 2 * l, i_even[l], i_odd[l]);
    const __m512i bytes = _mm512_or_si512(_mm512_permutex2var_epi8(even_lo, gather(i_even), even_hi),
                                          _mm512_permutex2var_epi8(odd_lo, gather(i_odd), odd_hi));
    _mm512_storeu_si512(out + g * 8, bytes);
  }
  const hn::Full512<std::uint32_t> du;
  const hn::Rebind<std::uint8_t, decltype(du)> d8;
  for (; g + 2 <= nb; g += 2) {
    __m512i i_even, i_odd;
    indices(g, i_even, i_odd);
    const __m512i bytes = _mm512_or_si512(_mm512_permutex2var_epi8(even_lo, i_even, even_hi),
                                          _mm512_permutex2var_epi8(odd_lo, i_odd, odd_hi));
    hn::StoreU(affine_pack::LowBytes(d8, hn::Vec512<std::uint32_t>{bytes}), d8, out + g * 8);
  }
  return g;
}
#endif

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
// E2M1CpuQuotientNarrow of the bf16 groups of 16 of a fast nvfp4 batch without a global
// scale on AVX2, two groups (64 bytes) a step. u32 lane k of a group's load holds elements
// 2k and 2k+1; each becomes f32 |x| by a mask (and a shift), and c = ⌈|x|·K − 2^-16⌉ is
// rint(|x|·K + (1/2 − 2^-16)): one FMA and one vcvtps2dq (RNE). By E2M1CpuQuotientNarrow's
// argument RN(|x|·K + 1/2 − 2^-16) lies within 2^-17.5 of y + 1/2 − 2^-16, with y = |p|/m an
// integer n (then it lies in (n, n + 1/2)) or at least 2^-14 from every integer (then in
// (⌈y⌉ − 1/2, ⌈y⌉ + 1/2)); for |p| < 1 it rounds to 0 or 1, magnitude 0 and no sign either
// way. c takes its element's sign (vpsignd), and the four vectors of c (<= 48 in a fast
// batch) are packed to signed bytes, even elements beside odd ones in each 128-bit block.
// Magnitude: a 16-entry byte table of min(|c|, 15), plus one above 20; the sign bit where
// c < −1 (|q| > 1 and negative). The odd codes shifted in beside the even ones make the
// bytes, and one dword permutation orders the two groups. Returns the groups encoded (the
// even part of nb).
HWY_INLINE std::size_t EncodeBF16NarrowPairs(const std::byte* HWY_RESTRICT batch, std::size_t nb, const BatchPlan& plan,
                                             std::size_t ahead, std::uint8_t* HWY_RESTRICT out) {
  const __m256 half_less = _mm256_set1_ps(0.5f - 0x1p-16f);
  const __m256i magnitude_bits = _mm256_set1_epi32(0x7FFFFFFF), high_magnitude = _mm256_set1_epi32(0x7FFF0000);
  // E2M1 magnitude of c = 0 .. 15 (kE2M1QuarterMidpoints passed), in both blocks.
  const __m256i table = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 6,  //
                                         0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 6);
  const __m256i fifteen = _mm256_set1_epi8(15), twenty = _mm256_set1_epi8(20), minus_one = _mm256_set1_epi8(-1);
  const __m256i sign_bit = _mm256_set1_epi8(8), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 3, 6, 7);
  const auto ceil_of = [&](__m256i magnitude, __m256 k, __m256i sign_source) {
    const __m256i c = _mm256_cvtps_epi32(_mm256_fmadd_ps(_mm256_castsi256_ps(magnitude), k, half_less));
    return _mm256_sign_epi32(c, sign_source);
  };
  std::size_t g = 0;
  for (; g + 2 <= nb; g += 2) {
    hwy::Prefetch(batch + ahead + g * 32);
    const __m256i raw_a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(batch + g * 32));
    const __m256i raw_b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(batch + g * 32 + 32));
    const __m256 k_a = _mm256_broadcast_ss(plan.k1_inv_m + g), k_b = _mm256_broadcast_ss(plan.k1_inv_m + g + 1);
    const __m256i even_a = _mm256_slli_epi32(raw_a, 16), even_b = _mm256_slli_epi32(raw_b, 16);
    const __m256i c_even_a = ceil_of(_mm256_and_si256(even_a, magnitude_bits), k_a, even_a);
    const __m256i c_even_b = ceil_of(_mm256_and_si256(even_b, magnitude_bits), k_b, even_b);
    const __m256i c_odd_a = ceil_of(_mm256_and_si256(raw_a, high_magnitude), k_a, raw_a);
    const __m256i c_odd_b = ceil_of(_mm256_and_si256(raw_b, high_magnitude), k_b, raw_b);
    // Per block: a's even, b's even, a's odd, b's odd, four each (elements 8·block + 2j (+1)).
    const __m256i c = _mm256_packs_epi16(_mm256_packs_epi32(c_even_a, c_even_b), _mm256_packs_epi32(c_odd_a, c_odd_b));
    const __m256i size = _mm256_abs_epi8(c);
    const __m256i magnitude = _mm256_sub_epi8(_mm256_shuffle_epi8(table, _mm256_min_epu8(size, fifteen)),
                                              _mm256_cmpgt_epi8(size, twenty));
    const __m256i codes = _mm256_or_si256(magnitude, _mm256_and_si256(_mm256_cmpgt_epi8(minus_one, c), sign_bit));
    const __m256i bytes = _mm256_or_si256(codes, _mm256_slli_epi16(_mm256_srli_si256(codes, 8), 4));
    const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, order);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + g * 8), _mm256_castsi256_si128(ordered));
  }
  return g;
}
#endif

// The element codes of a batch that PlanBatchFast accepted, group by group: converted
// again from the input (now cached) and encoded with no branch or (nvfp4) division.
template <DType kDtype, bool kDivide, class Codes>
HWY_INLINE void EncodeBatchFast(const fd::RowJob& job, const std::byte* HWY_RESTRICT batch, std::size_t nb,
                                const BatchPlan& plan, std::size_t ahead, std::uint8_t* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  (void)job, (void)batch, (void)nb, (void)plan, (void)ahead, (void)out;
#else
  namespace fi = fp_impl;
  const fi::DF df;
  const auto gs = static_cast<std::size_t>(job.group_size);
  const fi::VF venc = hn::Set(df, job.enc);
  if constexpr (kQuarters<Codes> && kDivide) {
    const auto quotient = [&](std::size_t g, fi::VF x) {
      return fi::E2M1CpuQuotient(hn::Mul(x, hn::Set(df, plan.k1[g])), hn::Set(df, plan.neg_m[g]),
                                 hn::Set(df, plan.inv_m[g]), hn::Set(df, plan.neg_half_inv_m[g]));
    };
    if (job.has_global) {
      EncodeGroups<kDtype, true>(batch, nb, gs, ahead, out,
                                 [&](std::size_t g, fi::VF w) { return quotient(g, hn::Mul(w, venc)); });
    } else if constexpr (kDtype != DType::f32) {  // enc = 1: x = w·enc = w, of at most 11 significant bits
      std::size_t done = 0;  // groups encoded in pairs
#if (HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2) && HWY_ARCH_X86
      if (kDtype == DType::bf16 && gs == 16) done = EncodeBF16NarrowPairs(batch, nb, plan, ahead, out);
#endif
      EncodeGroups<kDtype, true>(batch + done * gs * 2, nb - done, gs, ahead, out + done * gs / 2,
                                 [&](std::size_t g, fi::VF w) {
                                   return fi::E2M1CpuQuotientNarrow(w, hn::Set(df, plan.k1_inv_m[done + g]),
                                                                    hn::Set(df, plan.neg_quarter_s[done + g]));
                                 });
    } else {
      EncodeGroups<kDtype, true>(batch, nb, gs, ahead, out, quotient);  // enc = 1: w·enc = w
    }
  } else if constexpr (kBF16Patterns<kDtype, kDivide, Codes>) {
    EncodeBF16Patterns<Codes>(batch, nb, gs, plan, ahead, out);
  } else if constexpr (kQuarters<Codes>) {
    EncodeGroups<kDtype, true>(batch, nb, gs, ahead, out, [&](std::size_t g, fi::VF w) {
      return fi::E2M1CpuQuarters(hn::Mul(w, hn::Set(df, plan.k1[g])));
    });
  } else {
    EncodeGroups<kDtype, Codes::kPacked>(batch, nb, gs, ahead, out, [&](std::size_t g, fi::VF w) {
      const fi::VF factor = hn::Set(df, plan.k1[g]);
      return Codes::Encode(kDivide ? hn::Div(hn::Mul(w, venc), factor) : hn::Mul(w, factor));
    });
  }
#endif
}

// Any batch of nb <= N groups, group by group: convert to f32 and take each amax (NaN
// groups as the oracle), the N scale codes as one vector, then encode. kDivide: nvfp4's
// y = (w·enc)/s; else the mx formats' y = w·(1/scale), exact (ScaleCodes).
template <DType kDtype, bool kDivide, class Codes>
void QuantizeBatch(const fd::RowJob& job, const std::byte* HWY_RESTRICT batch, std::size_t nb,
                   std::uint8_t* HWY_RESTRICT scale_codes, std::uint8_t* HWY_RESTRICT out) {
  namespace fi = fp_impl;
  const fi::DF df;
  const fi::DI di;
  constexpr std::size_t kMaxN = hn::MaxLanes(fi::DF());
  constexpr std::size_t kMaxGroup = 32;
  const std::size_t N = hn::Lanes(df);
  const auto gs = static_cast<std::size_t>(job.group_size);
  const std::size_t group_bytes = Codes::kPacked ? gs / 2 : gs;
  const auto venc = hn::Set(df, job.enc);
  alignas(64) float values[kMaxN * kMaxGroup];
  alignas(64) float amax[kMaxN], factor[kMaxN], quarter_factor[kMaxN];
  alignas(64) std::int32_t codes32[kMaxN], small[kMaxN];
  bool has_nan[kMaxN];
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
  for (std::size_t g = 0; g < nb; ++g) scale_codes[g] = static_cast<std::uint8_t>(codes32[g]);
  if constexpr (kQuarters<Codes>) {
    // A group takes E2M1CpuQuarters when QuartersInRange holds and it has no NaN.
    fi::VF quarter;
    const auto in_range = QuartersInRange<kDivide>(hn::Load(df, factor), vamax, venc, quarter);
    hn::Store(quarter, df, quarter_factor);
    hn::Store(hn::VecFromMask(di, hn::RebindMask(di, in_range)), di, small);
  }
  for (std::size_t g = 0; g < nb; ++g) {
    std::uint8_t* const dst = out + g * group_bytes;
    const fi::VF vfactor = hn::Set(df, factor[g]);
    if constexpr (kDivide) {
      if (factor[g] == 0.0f) {  // the oracle's zero-scale rule
        std::memset(dst, 0, group_bytes);
        continue;
      }
    }
    if constexpr (kQuarters<Codes>) {
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

// `groups` consecutive groups of stored values (rows are contiguous, so a block of rows is
// a run of groups) → scale codes and element codes (E4M3: a byte each; E2M1: packed two
// to a byte), N groups (a batch) at a time, kChunk batches planned before any is
// encoded: the plans are independent of each other, so their reductions and scale
// arithmetic overlap instead of each batch's encoding waiting on its own; and within the
// plan every batch's amax comes first, then every batch's scale codes, then the per-group
// constants, so that the batches' dependency chains interleave. A batch the fast plan
// refuses goes to QuantizeBatch. Encoding a chunk prefetches the chunk after next
// (PrefetchPast): the next chunk's plan reads its input as soon as this encoding ends.
template <DType kDtype, bool kDivide, class Codes>
void QuantizeBlock(const fd::RowJob& job, const std::byte* HWY_RESTRICT src, std::size_t groups,
                   std::uint8_t* HWY_RESTRICT scale_codes, std::uint8_t* HWY_RESTRICT out) {
  constexpr std::size_t kStoredBytes = kDtype == DType::f32 ? 4 : 2;
  constexpr std::size_t kChunk = 8;
  const std::size_t N = hn::Lanes(fp_impl::DF());
  const auto gs = static_cast<std::size_t>(job.group_size);
  const std::size_t group_bytes = Codes::kPacked ? gs / 2 : gs, ahead = 2 * kChunk * N * gs * kStoredBytes;
  BatchPlan plans[kChunk];
  bool fast[kChunk];
  alignas(64) std::uint8_t staged[BatchPlan::kMaxN * 32];  // a batch's element codes, to be streamed
  // Read back 16 bytes at a time below AVX-512, as the encoders store them there: a load
  // that spans two stores still in the store buffer cannot take their bytes from it.
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  const hn::ScalableTag<std::uint8_t> d8;
#else
  const hn::CappedTag<std::uint8_t, 16> d8;
#endif
  for (std::size_t c0 = 0; c0 < groups; c0 += kChunk * N) {
    const std::size_t batches = std::min(kChunk, (groups - c0 + N - 1) / N);
#if HWY_TARGET != HWY_SCALAR
    fp_impl::VI amax_bits[kChunk], codes[kChunk];
    for (std::size_t b = 0; b < batches; ++b) {
      const std::size_t g0 = c0 + b * N;
      amax_bits[b] = BatchAmaxPatterns<kDtype>(src + g0 * gs * kStoredBytes, std::min(N, groups - g0), gs);
    }
    for (std::size_t b = 0; b < batches; ++b) {  // a NaN's code is computed too, and dropped with its batch
      codes[b] = ScaleCodes(job, MagnitudeToF32<kDtype>(amax_bits[b]), plans[b].k1);
    }
    for (std::size_t b = 0; b < batches; ++b) {
      const std::size_t g0 = c0 + b * N;
      fast[b] = PlanBatchFast<kDtype, kDivide, Codes>(job, amax_bits[b], codes[b], std::min(N, groups - g0),
                                                      scale_codes + g0, plans[b]);
    }
#else
    for (std::size_t b = 0; b < batches; ++b) fast[b] = false;
#endif
    for (std::size_t b = 0; b < batches; ++b) {
      const std::size_t g0 = c0 + b * N, nb = std::min(N, groups - g0);
      const std::byte* const batch = src + g0 * gs * kStoredBytes;
      std::uint8_t* const dst = out + g0 * group_bytes;
      const std::size_t bytes = nb * group_bytes;
      if (!fast[b]) {
        QuantizeBatch<kDtype, kDivide, Codes>(job, batch, nb, scale_codes + g0, dst);
      } else if (job.stream && bytes % 64 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0) {
        EncodeBatchFast<kDtype, kDivide, Codes>(job, batch, nb, plans[b], ahead, staged);
        for (std::size_t i = 0; i < bytes; i += hn::Lanes(d8)) hn::Stream(hn::Load(d8, staged + i), d8, dst + i);
      } else {
        EncodeBatchFast<kDtype, kDivide, Codes>(job, batch, nb, plans[b], ahead, dst);
      }
    }
  }
  if (job.stream) hwy::FlushStream();  // the streamed lines visible before the task ends
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

#if HWY_TARGET != HWY_SCALAR
// `values` element codes (whole groups of gs, a multiple of Lanes) → bf16 where every
// group's products are StoreAs::kBF16High values (no global factor): 2N at a time, the
// high halves of two f32 vectors as one full vector (ConcatOdd: one vpermt2w on AVX-512)
// and one store, a whole line there. Group by group (DequantizeGroup) each vector took a
// half-line store, a shift and two packs, and nvfp4's 16-value groups a dispatch each
// (docs/benchmarks.md §Measurements behind kernel choices).
template <bool kE4M3>
HWY_INLINE void DequantizeBf16High(const std::uint8_t* HWY_RESTRICT codes, std::size_t values, std::size_t gs,
                                   const float* HWY_RESTRICT scales, std::uint16_t* HWY_RESTRICT out, bool stream) {
  namespace fi = fp_impl;
  const fi::DF df;
  const hn::Repartition<std::uint16_t, fi::DF> d16;
  const std::size_t N = hn::Lanes(df);
  // The scale of vector k is scales[k / (gs / N)], found by counting: a 64-bit division
  // per vector (scales[i / gs]) took two of the AVX2 loop's 42 instructions and most of
  // its time on Zen 3 (docs/benchmarks.md §Measurements behind kernel choices).
  const std::size_t per_group = gs / N;
  std::size_t group = 0, left = per_group;
  const auto decode = [&](std::size_t i) {
    const auto c = LoadCodes<!kE4M3>(codes, i);  // E2M1 codes come packed
    const fi::VF scale = hn::Set(df, scales[group]);
    if (--left == 0) ++group, left = per_group;
    return hn::Mul(kE4M3 ? fi::E4M3Decode(c) : fi::E2M1DecodeLut(c), scale);
  };
  for (std::size_t i = 0; i < values; i += 2 * N) {
    const fi::VF lo = decode(i), hi = decode(i + N);
    Put(d16, hn::ConcatOdd(d16, hn::BitCast(d16, hi), hn::BitCast(d16, lo)), out + i, stream);
  }
}
#endif

// Batches of N scale codes decoded at once before one DequantizeBf16High call, where a
// batch holds fewer than kWideBelow values.
constexpr std::size_t kWideBatches = 4;
#if HWY_TARGET != HWY_SCALAR
constexpr std::size_t kWideBelow = 256;
#endif

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
#if HWY_TARGET != HWY_SCALAR
  // Whole lines (DequantizeBf16High) for bf16 outputs of groups of whole vectors.
  const bool line_stores = store == StoreAs::bf16 && !job.has_global && gs % N == 0;
#endif
  alignas(64) std::int32_t lane_codes[kMaxN];
  alignas(64) float scales[kWideBatches * kMaxN];
  const auto decode_scales = [&](fi::VI sc, float* to) {
    hn::Store(job.e8m0_scales ? fi::E8M0Decode(sc) : fi::E4M3Decode(sc), df, to);
  };
#if HWY_TARGET != HWY_SCALAR
  // Every lane's products normal (a partial batch's zero lanes fail an E8M0 batch).
  const auto normal_products = [&](fi::VI sc) {
    return !job.e8m0_scales ||
           hn::AllFalse(di, hn::Or(hn::Lt(sc, hn::Set(di, lowest)), hn::Gt(sc, hn::Set(di, highest))));
  };
  // `values` values from group `first` on as whole bf16 lines, with the scales decoded.
  const auto put_lines = [&](std::size_t first, std::size_t values) {
    auto* const dst = reinterpret_cast<std::uint16_t*>(out + first * out_group_bytes);
    if (packed) DequantizeBf16High<false>(in + first * gs / 2, values, gs, scales, dst, stream);
    else DequantizeBf16High<true>(in + first * gs, values, gs, scales, dst, stream);
  };
#endif
  for (std::size_t g0 = 0; g0 < groups; g0 += N) {
#if HWY_TARGET != HWY_SCALAR
    // Batches of fewer than kWideBelow values (nvfp4 below AVX-512): kWideBatches·N groups
    // at once where every one takes DequantizeBf16High, one call and one loop instead of
    // kWideBatches (the per-batch work was a sixth of nvfp4's instructions; the mx
    // formats' batches of 256 values ran slower this way,
    // docs/benchmarks.md §Measurements behind kernel choices).
    if (line_stores && N * gs < kWideBelow && groups - g0 >= kWideBatches * N) {
      bool normal = true;
      for (std::size_t v = 0; v < kWideBatches; ++v) {
        const fi::VI wide = hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::uint8_t, fi::DI>(), scale_codes + g0 + v * N));
        normal = normal && normal_products(wide);
        decode_scales(wide, scales + v * N);
      }
      if (normal) {
        put_lines(g0, kWideBatches * N * gs);
        g0 += (kWideBatches - 1) * N;  // and N more by the loop
        continue;
      }
    }
#endif
    const std::size_t nb = std::min(N, groups - g0);
    fi::VI sc;
    if (nb == N) {
      sc = hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::uint8_t, fi::DI>(), scale_codes + g0));
      hn::Store(sc, di, lane_codes);
    } else {  // the block's last groups; the lanes past them 0
      for (std::size_t g = 0; g < N; ++g) lane_codes[g] = g < nb ? scale_codes[g0 + g] : 0;
      sc = hn::Load(di, lane_codes);
    }
    decode_scales(sc, scales);
#if HWY_TARGET != HWY_SCALAR
    if (line_stores && nb * gs % (2 * N) == 0 && normal_products(sc)) {
      put_lines(g0, nb * gs);
      continue;
    }
#endif
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

// Rows per parallel task: whole rows of streaming_elements_per_task elements (at least one),
// a split fixed by the problem (the ops are exact: no split can change bits).
std::int64_t rows_per_task(std::int64_t rows, std::int64_t d) {
  return std::max<std::int64_t>(1, streaming_elements_per_task(rows * d) / std::max<std::int64_t>(d, 1));
}
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
  fd::RowJob job = fd::make_job(spec, rounding, global_scale, d);
  const std::int64_t rows = x.numel() / d;
  job.stream = static_cast<std::size_t>(wq.numel()) * dtype_size(wq.dtype) >= fd::kStreamBytes;
  const auto n = static_cast<std::size_t>(d), groups_per_row = static_cast<std::size_t>(job.groups);
  const std::size_t row_bytes = n * dtype_size(x.dtype), wq_row_bytes = n * static_cast<std::size_t>(spec.bits) / 8;
  auto* const quantize_block = &HWY_DYNAMIC_DISPATCH(FpQuantizeBlock);
  auto* const wq_bytes = reinterpret_cast<std::uint8_t*>(wq.data);  // LSB-first words = byte order
  auto* const scale_bytes = reinterpret_cast<std::uint8_t*>(scales.data);
  const std::int64_t per_task = fd::rows_per_task(rows, d);
  parallel_for((rows + per_task - 1) / per_task, [&](std::int64_t task) {
    const std::int64_t r0 = task * per_task, r1 = std::min(rows, r0 + per_task);
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
  const std::int64_t per_task = fd::rows_per_task(rows, d);
  parallel_for((rows + per_task - 1) / per_task, [&](std::int64_t task) {
    const std::int64_t r0 = task * per_task, r1 = std::min(rows, r0 + per_task);
    const auto u0 = static_cast<std::size_t>(r0), block_rows = static_cast<std::size_t>(r1 - r0);
    dequantize_block(job, wq_bytes + u0 * wq_row_bytes, scale_bytes + u0 * groups_per_row,
                     block_rows * groups_per_row, out.dtype, out.data + u0 * out_row_bytes, stream);
  });
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
