// Per-target f16/bf16 <-> f32 conversions with exactly the bits of kvlab's scalar
// conversions (include/kvlab/dtype.h, core/dtype.cc) on every Highway target:
//   load  (f16/bf16 -> f32): exact, inf/NaN kept (NaN payload and signalling bit too);
//   store (f32 -> f16/bf16): round to nearest even, subnormals, overflow to ±inf,
//         NaN kept NaN: quiet, sign and top payload bits preserved.
// Highway 1.0.3 cannot be used as is: its PromoteTo(f16) emulation (SSSE3/SSE4/SCALAR)
// maps f16 inf/NaN to finite values, its DemoteTo(f16) emulation truncates the mantissa
// (and turns NaNs with only low payload bits into inf), and its DemoteTo(bf16)
// truncates on every target (x86_128-inl.h, scalar-inl.h of 1.0.3). So the bits are
// built by integer/float ops that are exact on every target. Only F16C's vcvtps2ph
// (f32 -> f16 stores on AVX2/AVX3) is used directly: it rounds to nearest even with
// subnormals, overflow and NaN exactly like kvlab; its vcvtph2ps (load) is not, because
// it quiets signalling NaNs. Both facts are checked by tests/simd/test_simd_half_convert.cc.
//
// Two layers:
//   F16BitsToF32 / BF16BitsToF32 / F32ToF16Bits / F32ToBF16Bits work on 16-bit patterns
//     held in the low half of u32 lanes (how rope handles interleaved pairs in place);
//   LoadF16/LoadBF16/StoreF16/StoreBF16 move Lanes(df) elements to/from memory
//     (DemoteToF16/DemoteToBF16 give the stored u16 vector), and HalfRowToF32/
//     F32RowToHalf convert whole rows (scalar tails by kvlab's functions).
//
// Include inside a Highway foreach_target TU, after <hwy/highway.h>. Functions live in
// kvlab::simd::HWY_NAMESPACE.

// Highway's per-target include guard: toggled each time foreach_target re-includes.
#if defined(KVLAB_SIMD_HALF_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVLAB_SIMD_HALF_CONVERT_INL_H_
#undef KVLAB_SIMD_HALF_CONVERT_INL_H_
#else
#define KVLAB_SIMD_HALF_CONVERT_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "kvlab/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether this target stores f16 with F16C's vcvtps2ph (RNE in hardware).
#undef KVLAB_HALF_CONVERT_F16C
#if HWY_TARGET <= HWY_AVX2 && HWY_TARGET != HWY_SCALAR && !defined(HWY_DISABLE_F16C) && HWY_ARCH_X86
#define KVLAB_HALF_CONVERT_F16C 1
#else
#define KVLAB_HALF_CONVERT_F16C 0
#endif

// ---- 16-bit patterns in the low half of u32 lanes --------------------------------

// f16 bits (low 16 bits of each lane; the upper 16 are ignored) -> f32, exactly.
// Exponent+mantissa moved into f32 position and multiplied by 2^112 rebias 15 -> 127
// exactly, f16 subnormals included (they are f32 subnormals before the multiply, and
// kvlab never sets FTZ/DAZ); exponent 31 (inf/NaN) gets f32's all-ones exponent with the
// mantissa (payload, signalling bit) shifted up unchanged, as f16_bits_to_f32 does.
template <class DF>
HWY_INLINE hn::Vec<DF> F16BitsToF32(DF df, hn::Vec<hn::RebindToUnsigned<DF>> h) {
  const hn::RebindToUnsigned<DF> du;
  const auto exp_mask = hn::Set(du, 0x7C00u);
  const auto shifted = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu)));
  const auto finite = hn::BitCast(du, hn::Mul(hn::BitCast(df, shifted), hn::Set(df, 0x1p112f)));
  const auto special = hn::Or(shifted, hn::Set(du, 0x7F800000u));
  const auto mag = hn::IfThenElse(hn::Eq(hn::And(h, exp_mask), exp_mask), special, finite);
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  return hn::BitCast(df, hn::Or(mag, sign));
}

// bf16 bits (low 16 bits of each lane; the upper 16 are ignored) -> f32: bf16 is the
// high half of an f32, so this is exact for every pattern.
template <class DF>
HWY_INLINE hn::Vec<DF> BF16BitsToF32(DF df, hn::Vec<hn::RebindToUnsigned<DF>> h) {
  return hn::BitCast(df, hn::ShiftLeft<16>(h));
}

// f32 -> f16 bits in the low 16 bits of each lane (upper 16 zero), as f32_to_f16_bits.
// With F16C: vcvtps2ph, widened back to u32 lanes. Without: case by case as the scalar
// code. All values compared are |x| patterns < 2^31, so signed compares (the only
// integer Gt Highway 1.0.3 has on every target) are exact.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToF16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
#if KVLAB_HALF_CONVERT_F16C
  (void)df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<std::uint16_t, DF> d16;
  return hn::PromoteTo(du, hn::BitCast(d16, hn::DemoteTo(dh, v)));
#else
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(di, v);
  const auto a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(di, 0x8000));
  // Subnormal or zero (|x| < 2^-14): |x| + 0.5 lands in [0.5, 0.5 + 2^-14], where the
  // f32 spacing is 2^-24 = the f16 subnormal unit, so the one RNE addition rounds |x| to
  // whole units with ties to even (0.5's mantissa is 0); the units are its mantissa.
  // This is nearbyint(|x|·2^24) of the scalar code. 2^-14 − tiny may round to 1024
  // units = 0x0400, the smallest normal, as the scalar code gives too.
  const auto plus_half = hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f));
  auto bits = hn::Sub(hn::BitCast(di, plus_half), hn::Set(di, 0x3F000000));
  // Normal in f16 (|x| >= 2^-14): round the 13 dropped bits to even, rebias 127 -> 15.
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(di, 1));
  const auto rounded = hn::Add(hn::Add(a, hn::Set(di, 0xFFF)), odd);
  const auto normal = hn::ShiftRight<13>(hn::Sub(rounded, hn::Set(di, 0x38000000)));
  bits = hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x387FFFFF)), normal, bits);
  // |x| >= 65520 (the midpoint between 65504 and 2^16) rounds to inf.
  bits = hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x477FEFFF)), hn::Set(di, 0x7C00), bits);
  // NaN: quiet, with the top 10 payload bits.
  const auto nan = hn::Or(hn::Set(di, 0x7E00), hn::And(hn::ShiftRight<13>(a), hn::Set(di, 0x3FF)));
  bits = hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x7F800000)), nan, bits);
  return hn::BitCast(du, hn::Or(bits, sign));
#endif
}

// u32 lanes whose upper 16 bits are the bf16 RNE rounding of v (the lower 16 bits are
// junk), as f32_to_bf16_bits for every v that is not NaN: a carry out of the mantissa
// bumps the exponent, up to inf. A NaN can come out as any pattern, even a number, so
// callers handle NaN first (F32ToBF16Bits below; rope makes every NaN 0x7FC00000, whose
// rounding is the quiet 0x7FC0 that f32_to_bf16_bits gives it). For callers that keep
// the high halves (ConcatOdd of two vectors, or a mask) and skip the shift.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundToBF16High(DF /*df*/, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, v);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), odd);
}

// f32 -> bf16 bits in the low 16 bits of each lane (upper 16 zero), as f32_to_bf16_bits:
// RNE on the high half; NaN keeps its top bits and is made quiet (bit 6 of the pattern).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToBF16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto quiet = hn::Or(hn::ShiftRight<16>(hn::BitCast(du, v)), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, hn::ShiftRight<16>(RoundToBF16High(df, v)));
}

// ---- Lanes(df) elements in memory -------------------------------------------------

template <class DF>
HWY_INLINE hn::Vec<DF> LoadBF16(DF df, const std::uint16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<std::uint16_t, DF> d16;
  return BF16BitsToF32(df, hn::PromoteTo(du, hn::LoadU(d16, p)));
}

// Not F16C's vcvtph2ps even where it exists: it quiets signalling NaNs (measured by the
// exhaustive test), while f16_bits_to_f32 keeps the pattern.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16(DF df, const std::uint16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<std::uint16_t, DF> d16;
  return F16BitsToF32(df, hn::PromoteTo(du, hn::LoadU(d16, p)));
}

// LoadF16 in one instruction where F16C exists (vcvtph2ps): the same value for every
// pattern except that a signalling NaN comes back quiet. Only for callers to whom every
// NaN is alike (affine quantize: a NaN gives code 0 whatever its payload). Highway 1.0.3
// emulates PromoteTo(f16) on SSSE3/SSE4/SCALAR wrongly for inf/NaN, so LoadF16 there.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16QuietingNaN(DF df, const std::uint16_t* HWY_RESTRICT p) {
#if KVLAB_HALF_CONVERT_F16C
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), reinterpret_cast<const hwy::float16_t*>(p)));
#else
  return LoadF16(df, p);
#endif
}

// Lanes(df) f32 values -> their bf16 / f16 patterns in u16 lanes (a half-width vector),
// for callers that combine two of them into one full vector before storing.
// Patterns < 2^16 in i32 lanes survive DemoteTo (it saturates to [0, 65535]); Highway
// 1.0.3 has no u32 -> u16 DemoteTo on every target.
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<std::uint16_t, DF>> DemoteToBF16(DF df, hn::Vec<DF> v) {
  return hn::DemoteTo(hn::Rebind<std::uint16_t, DF>(), hn::BitCast(hn::RebindToSigned<DF>(), F32ToBF16Bits(df, v)));
}

template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<std::uint16_t, DF>> DemoteToF16(DF df, hn::Vec<DF> v) {
  const hn::Rebind<std::uint16_t, DF> d16;
#if KVLAB_HALF_CONVERT_F16C
  (void)df;
  return hn::BitCast(d16, hn::DemoteTo(hn::Rebind<hwy::float16_t, DF>(), v));
#else
  return hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<DF>(), F32ToF16Bits(df, v)));
#endif
}

template <class DF>
HWY_INLINE void StoreBF16(hn::Vec<DF> v, DF df, std::uint16_t* HWY_RESTRICT p) {
  hn::StoreU(DemoteToBF16(df, v), hn::Rebind<std::uint16_t, DF>(), p);
}

template <class DF>
HWY_INLINE void StoreF16(hn::Vec<DF> v, DF df, std::uint16_t* HWY_RESTRICT p) {
  hn::StoreU(DemoteToF16(df, v), hn::Rebind<std::uint16_t, DF>(), p);
}

// ---- Rows ---------------------------------------------------------------------------

// n f16 (bf16 == false) or bf16 elements -> f32, any n (tail by kvlab's scalar code).
inline void HalfRowToF32(const std::uint16_t* HWY_RESTRICT src, bool bf16, std::size_t n,
                         float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  if (bf16) {
    for (; i + N <= n; i += N) hn::StoreU(LoadBF16(df, src + i), df, dst + i);
    for (; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i]);
  } else {
    for (; i + N <= n; i += N) hn::StoreU(LoadF16(df, src + i), df, dst + i);
    for (; i < n; ++i) dst[i] = f16_bits_to_f32(src[i]);
  }
}

// n f32 values -> f16 (bf16 == false) or bf16, RNE, any n (tail by kvlab's scalar code).
inline void F32RowToHalf(const float* HWY_RESTRICT src, bool bf16, std::size_t n, std::uint16_t* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  if (bf16) {
    for (; i + N <= n; i += N) StoreBF16(hn::LoadU(df, src + i), df, dst + i);
    for (; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i]);
  } else {
    for (; i + N <= n; i += N) StoreF16(hn::LoadU(df, src + i), df, dst + i);
    for (; i < n; ++i) dst[i] = f32_to_f16_bits(src[i]);
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVLAB_SIMD_HALF_CONVERT_INL_H_ toggle
