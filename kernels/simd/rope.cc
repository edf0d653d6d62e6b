// SIMD RoPE (contract: reference/rope.h), within rope's tolerance of the oracle, with the
// same bits on every Highway target and for any thread count.
//
// Two passes per window of positions (a window's cos/sin table is at most kTableBytes):
// 1. Table: c = cos θ, s = sin θ rounded to f32 for every (batch row b, position t,
//    pair i) of the window, computed once and shared by every head. Positions run in
//    blocks of kBlock; at a block's first position θ = p·inv_i is computed exactly as the
//    oracle does (p = scale·(t + offset_b) and θ in double) and std::cos/std::sin give the
//    oracle's own c and s; the block's other positions follow by the angle-addition
//    recurrence in double, vectorized across pairs:
//      c' = c·cos δ − s·sin δ,  s' = s·cos δ + c·sin δ,  δ_i = scale·inv_i.
// 2. Data, in memory order (b, h, t) split into tasks of about kTaskBytes: each f16/bf16/
//    f32 vector is loaded and converted to f32 in registers (half_convert-inl.h: exact, but
//    for F16C's quieting of a signalling NaN, whose results are NaN and made canonical),
//    rotated in f32 — out1 = x1·c − x2·s, out2 = x1·s + x2·c, each product and sum
//    rounded separately (-ffp-contract=off: no FMA on any target) — and converted back
//    with kvlab's RNE. Traditional f16/bf16 pairs (x[2i], x[2i+1]) are one u32 lane
//    (low/high half), so no shuffles are needed; non-traditional bf16 takes two
//    neighbouring pairs per u32 lane the same way, with the table's blocks reordered to
//    match (RotateRowBF16Lanes). Features [dims, D) are copied as bytes.
//    Outputs of kStreamBytes or more are written with streaming (non-temporal) stores,
//    in whole 64-byte lines.
// Every lane does the same IEEE ops in the same order on every target, and remainders
// (pairs past the last whole vector) repeat them in scalar code, so the bits do not
// depend on the target or the lane count. NaN results are the one exception to "same
// ops, same bits": when two NaNs meet in a commutative Add/Mul, x86 returns the first
// operand's and the compiler orders them differently per target (measured: SSE4 vs
// AVX3 with NaN positions), so every NaN result is replaced by the positive quiet NaN
// (the oracle promises NaN, not a payload). Task sizes depend on the problem only.
//
// Error bound (the unit test checks |got − want| ≤ ulp_dtype(want) + 8·2^-24·(|x1| + |x2|)):
// * Angles (u = 2^-53): a block takes the recurrence only when every |θ| in it is
//   ≤ kMaxRecurrenceAngle = 2^21; otherwise every entry is std::cos/std::sin of the
//   oracle's own θ, i.e. exactly the oracle's values. The oracle's θ_t =
//   fl(fl(scale·(t+off))·inv) is within 2u·|θ_t| (+u²) of the exact scale·(t+off)·inv.
//   The block's first entry uses the oracle's θ; k steps later the recurrence has turned
//   it by k·δ with δ = fl(scale·inv) within u·|δ| of the exact step, so its angle differs
//   from the oracle's θ_t by at most 2u·|θ_first| + k·u·|δ| + 2u·|θ_t| ≤ u·(2^22 + 2^22 +
//   2^22) = 1.5·2^-30 (k·|δ| is the exact angle difference, ≤ 2·2^21). Each step rounds
//   4 products and 2 sums of magnitude ≤ 1 (≤ 3u per component) and uses cos δ, sin δ
//   within 1 ulp (≤ 2u more), and a rotation does not grow earlier errors, so the
//   k ≤ kBlock − 1 = 255 steps add < 255·5u·√2 < 2^-42 (norm drift included). So the
//   double c, s are within 2^-29.4 of cos/sin of the oracle's θ, and rounding them to f32
//   adds ≤ 2^-25: |Δc|, |Δs| ≤ 2^-25 + 2^-29.4 < 2^-24.
// * Rotation in f32: |x1|·|Δc| + |x2|·|Δs| ≤ 2^-24·(|x1| + |x2|); the two products
//   2^-24·(|x1·c| + |x2·s|) ≤ 2^-24·(|x1| + |x2|); the sum 2^-24·|result| ≤ 2^-24·(|x1| +
//   |x2|)·(1 + ...): in all ≤ 3·2^-24·(|x1| + |x2|) up to second-order terms.
// * Storage: f16/bf16 outputs are rounded from the f32 result, so up to 1 ulp of the
//   dtype where the oracle (double, rounded once) is within 0.5 ulp; f32 outputs ±0.5 ulp
//   of the f32 result.
#ifndef KVLAB_SIMD_ROPE_COMMON
#define KVLAB_SIMD_ROPE_COMMON
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/rope.h"

namespace kvlab::simd::rope_detail {

// Positions per recurrence block: the first is exact, the next kBlock − 1 are stepped.
constexpr std::int64_t kBlock = 256;
// Beyond this |θ| the oracle's own rounding of θ (2^-53·|θ|) would no longer be
// negligible against the f32 rounding of c and s; such blocks use std::cos/std::sin.
constexpr double kMaxRecurrenceAngle = 0x1p21;
// cos/sin table per window of positions (all batch rows): bounds its memory and keeps
// it in cache while every head of the window streams past it (measured on the perf
// shape: windows of 128 KiB to 2 MiB run alike).
constexpr std::size_t kTableBytes = std::size_t{1} << 20;
// Input bytes per data task.
constexpr std::size_t kTaskBytes = std::size_t{64} << 10;
// Outputs at least this large are written with streaming stores: far larger than the
// per-core L2, so the consumer would not find them in cache anyway, and skipping the
// read-for-ownership of each output line saves a third of the traffic (measured on the
// perf shape: docs/benchmarks.md §Measurements behind kernel choices).
constexpr std::size_t kStreamBytes = std::size_t{16} << 20;
// Software prefetch of the input this many bytes ahead of the row being rotated, within
// a task's rows: the hardware prefetcher alone left the read's latency exposed on the
// Intel Xeon of model 207, where the bf16 perf row rose from 79-81 % to 97-106 % of
// memcpy with it (docs/benchmarks.md §Measurements behind kernel choices).
constexpr std::size_t kPrefetchBytes = std::size_t{8} << 10;

}  // namespace kvlab::simd::rope_detail
#endif  // KVLAB_SIMD_ROPE_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/rope.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;

// `count` table rows (c[0, half) then s[0, half), 2·half floats each) starting from
// c/s (the exact values at the first position, overwritten: the state of the
// recurrence) and turning by (cd, sd) per position. Positions outside, pairs inside:
// the pairs' chains are independent, so their latencies overlap.
void FillTable(double* HWY_RESTRICT c, double* HWY_RESTRICT s, const double* HWY_RESTRICT cd,
               const double* HWY_RESTRICT sd, std::size_t half, std::size_t count, float* HWY_RESTRICT table) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const std::size_t N = hn::Lanes(dd);
  for (std::size_t k = 0; k < count; ++k, table += 2 * half) {
    std::size_t i = 0;
    for (; i + N <= half; i += N) {
      const auto vc = hn::LoadU(dd, c + i), vs = hn::LoadU(dd, s + i);
      const auto vcd = hn::LoadU(dd, cd + i), vsd = hn::LoadU(dd, sd + i);
      hn::StoreU(hn::DemoteTo(df, vc), df, table + i);
      hn::StoreU(hn::DemoteTo(df, vs), df, table + half + i);
      hn::StoreU(hn::Sub(hn::Mul(vc, vcd), hn::Mul(vs, vsd)), dd, c + i);
      hn::StoreU(hn::Add(hn::Mul(vs, vcd), hn::Mul(vc, vsd)), dd, s + i);
    }
    for (; i < half; ++i) {  // the same double ops, one pair at a time
      table[i] = static_cast<float>(c[i]);
      table[half + i] = static_cast<float>(s[i]);
      const double next_c = c[i] * cd[i] - s[i] * sd[i];
      s[i] = s[i] * cd[i] + c[i] * sd[i];
      c[i] = next_c;
    }
  }
}

// Element access per storage dtype: vector load/store through f32, scalar conversions.
struct F32Io {
  using T = float;
  static VF Load(DF df, const T* p) { return hn::LoadU(df, p); }
  static float ToF32(T v) { return v; }
  static T FromF32(float v) { return v; }
};
// 16-bit types, for results whose NaNs are already canonical (see CanonicalNaN):
//   Demote: N results -> N u16 lanes; Pack2: 2N results (a then b) -> one full u16
//   vector; PackPair: results lo, hi -> u32 lanes (lo | hi << 16), i.e. the pairs
//   (x[2i], x[2i+1]) in memory order; Low/High: the 16-bit halves of u32 lanes -> f32.
// bf16 keeps RoundToBF16High's upper halves (ConcatOdd / a mask) instead of shifting
// each result down and narrowing it: fewer ops where the kernel is port-bound.
struct BF16Io {
  using T = std::uint16_t;
  static VF Load(DF df, const T* p) { return LoadBF16(df, p); }
  static hn::Vec<hn::Rebind<T, DF>> Demote(DF df, VF v) { return DemoteToBF16(df, v); }
#if HWY_TARGET != HWY_SCALAR
  static hn::Vec<hn::Repartition<T, DF>> Pack2(DF df, VF a, VF b) {
    const hn::Repartition<T, DF> dw;
    return hn::ConcatOdd(dw, hn::BitCast(dw, RoundToBF16High(df, b)), hn::BitCast(dw, RoundToBF16High(df, a)));
  }
#endif
  static VU PackPair(DF df, VF lo, VF hi) {
    const DU du;
#if HWY_TARGET != HWY_SCALAR
    const hn::Repartition<T, DF> dw;  // one blend of the 16-bit halves (vpblendw)
    return hn::BitCast(du, hn::OddEven(hn::BitCast(dw, RoundToBF16High(df, hi)),
                                       hn::BitCast(dw, hn::ShiftRight<16>(RoundToBF16High(df, lo)))));
#else
    return hn::Or(hn::ShiftRight<16>(RoundToBF16High(df, lo)), hn::And(RoundToBF16High(df, hi), hn::Set(du, 0xFFFF0000u)));
#endif
  }
  static VF Low(DF df, VU w) { return BF16BitsToF32(df, w); }
  static VF High(DF df, VU w) { return hn::BitCast(df, hn::And(w, hn::Set(DU(), 0xFFFF0000u))); }
  static float ToF32(T v) { return bf16_bits_to_f32(v); }
  static T FromF32(float v) { return f32_to_bf16_bits(v); }
};
struct F16Io {
  using T = std::uint16_t;
  // F16C's one-instruction load where it exists: it quiets a signalling NaN, but every
  // NaN input makes both results of its pair NaN, and those become canonical.
  static VF Load(DF df, const T* p) { return LoadF16QuietingNaN(df, p); }
  static hn::Vec<hn::Rebind<T, DF>> Demote(DF df, VF v) { return DemoteToF16(df, v); }
#if HWY_TARGET != HWY_SCALAR
  static hn::Vec<hn::Repartition<T, DF>> Pack2(DF df, VF a, VF b) {
    return hn::Combine(hn::Repartition<T, DF>(), DemoteToF16(df, b), DemoteToF16(df, a));
  }
#endif
  static VU PackPair(DF df, VF lo, VF hi) {
    return hn::Or(F32ToF16Bits(df, lo), hn::ShiftLeft<16>(F32ToF16Bits(df, hi)));
  }
  static VF Low(DF df, VU w) { return F16BitsToF32(df, w); }
  static VF High(DF df, VU w) { return F16BitsToF32(df, hn::ShiftRight<16>(w)); }
  static float ToF32(T v) { return f16_bits_to_f32(v); }
  static T FromF32(float v) { return f32_to_f16_bits(v); }
};

// NaN results as one pattern, whatever NaN the operands carried (see the top comment).
HWY_INLINE VF CanonicalNaN(VF v) {
  const DF df;
  return hn::IfThenElse(hn::IsNaN(v), hn::BitCast(df, hn::Set(DU(), 0x7FC00000u)), v);
}
HWY_INLINE float CanonicalNaN(float v) { return std::isnan(v) ? std::bit_cast<float>(0x7FC00000u) : v; }

// (x1, x2) -> (x1·c − x2·s, x1·s + x2·c): each product and sum rounded separately.
// Turn1/Turn2 leave NaN payloads as the target's ops make them; Rotated1/Rotated2 make
// them canonical.
HWY_INLINE VF Turn1(VF x1, VF x2, VF c, VF s) { return hn::Sub(hn::Mul(x1, c), hn::Mul(x2, s)); }
HWY_INLINE VF Turn2(VF x1, VF x2, VF c, VF s) { return hn::Add(hn::Mul(x1, s), hn::Mul(x2, c)); }
HWY_INLINE VF Rotated1(VF x1, VF x2, VF c, VF s) { return CanonicalNaN(Turn1(x1, x2, c, s)); }
HWY_INLINE VF Rotated2(VF x1, VF x2, VF c, VF s) { return CanonicalNaN(Turn2(x1, x2, c, s)); }

// One full vector to memory. Streaming (non-temporal) stores write whole cache lines
// without first reading them (no read-for-ownership), for outputs too large to be
// re-read from cache. Only vectors of a whole 64-byte line at a line-aligned address
// are streamed (AVX3): streaming half lines one at a time measured slower than plain
// stores (AVX2, perf shape), so AVX2 streams through PutLine, two halves of a line back to
// back (docs/benchmarks.md §Measurements behind kernel choices).
template <class D, typename T>
HWY_INLINE void Put(D d, hn::Vec<D> v, T* HWY_RESTRICT p, bool stream) {
  constexpr std::size_t kLine = 64;
  if (stream && hn::Lanes(d) * sizeof(T) >= kLine && reinterpret_cast<std::uintptr_t>(p) % kLine == 0) {
    hn::Stream(v, d, p);
  } else {
    hn::StoreU(v, d, p);
  }
}

// Pair i of one row in scalar code: the same f32 ops as the vector lanes.
template <class Io>
HWY_INLINE void RotatePairScalar(const typename Io::T* x, std::size_t i1, std::size_t i2, float c, float s,
                                 typename Io::T* out) {
  const float x1 = Io::ToF32(x[i1]), x2 = Io::ToF32(x[i2]);
  out[i1] = Io::FromF32(CanonicalNaN(x1 * c - x2 * s));
  out[i2] = Io::FromF32(CanonicalNaN(x1 * s + x2 * c));
}

// Two vectors to the 2·Lanes elements at p. Where two vectors make one 64-byte line (AVX2)
// and p starts a line, both halves are streamed back to back, so the write-combining
// buffer fills the whole line and the line is written without a read-for-ownership;
// otherwise each vector goes through Put.
template <class D, typename T>
HWY_INLINE void PutLine(D d, hn::Vec<D> lo, hn::Vec<D> hi, T* HWY_RESTRICT p, bool stream) {
  constexpr std::size_t kLine = 64;
  if (stream && 2 * hn::Lanes(d) * sizeof(T) == kLine && reinterpret_cast<std::uintptr_t>(p) % kLine == 0) {
    hn::Stream(lo, d, p);
    hn::Stream(hi, d, p + hn::Lanes(d));
  } else {
    Put(d, lo, p, stream);
    Put(d, hi, p + hn::Lanes(d), stream);
  }
}

// The rotations of f32 pairs [j, j + N): x1's results in `first`, x2's in `second`. A
// function, not a lambda: GCC left such lambdas here out of line, and the 16-bit rows ran
// 35-40 % slower through them.
struct HalvesF32 {
  VF first, second;
};
template <class Io>
HWY_INLINE HalvesF32 RotateHalvesF32(DF df, const typename Io::T* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                     const float* HWY_RESTRICT s, std::size_t half, std::size_t j) {
  const VF x1 = Io::Load(df, x + j), x2 = Io::Load(df, x + half + j);
  const VF vc = hn::LoadU(df, c + j), vs = hn::LoadU(df, s + j);
  return {Rotated1(x1, x2, vc, vs), Rotated2(x1, x2, vc, vs)};
}

#if HWY_TARGET != HWY_SCALAR
// Lanes where a or b is NaN: one unordered compare for both on x86 (AVX-512: into a mask
// register, where IsNaN twice took two vfpclassps and a korw).
HWY_INLINE hn::Mask<DF> EitherNaN(VF a, VF b) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::Mask<DF>{_mm512_cmp_ps_mask(a.raw, b.raw, _CMP_UNORD_Q)};
#elif HWY_TARGET == HWY_AVX2
  return hn::Mask<DF>{_mm256_cmp_ps(a.raw, b.raw, _CMP_UNORD_Q)};
#else
  return hn::Or(hn::IsNaN(a), hn::IsNaN(b));
#endif
}

// Non-traditional bf16, pairs [0, 2N·⌊half/2N⌋) (i: where it stopped). A step's 2N bf16 of
// x1 (and of x2) are N u32 lanes, pair i + 2k in lane k's low half and i + 2k + 1 in its
// high half: one load and one shift or mask give each f32 vector, and PackPair puts the
// rounded results back into the same halves, so nothing is widened or packed across
// lanes. The table's blocks of 2N pairs are split to match (SplitTableBlocks). NaN
// results are made canonical only in rows that have one: without kCanonical the steps
// only note whether a result was NaN (one compare per two vectors) and the function
// returns false, and the caller rotates the row again with kCanonical. Where two vectors
// make a 64-byte line (AVX2), two steps at a time so that streamed lines are whole.
struct PackedBF16 {
  VU first, second;  // the outputs at out + i and at out + half + i
};
template <bool kCanonical>
HWY_INLINE PackedBF16 TurnBF16Lanes(DF df, const std::uint16_t* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                    const float* HWY_RESTRICT s, std::size_t half, std::size_t i, hn::Mask<DF>& nan) {
  const DU du;
  const std::size_t N = hn::Lanes(df);
  const VU high = hn::Set(du, 0xFFFF0000u);
  const VU w1 = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(x + i));
  const VU w2 = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(x + half + i));
  const VF x1e = hn::BitCast(df, hn::ShiftLeft<16>(w1)), x1o = hn::BitCast(df, hn::And(w1, high));
  const VF x2e = hn::BitCast(df, hn::ShiftLeft<16>(w2)), x2o = hn::BitCast(df, hn::And(w2, high));
  const VF ce = hn::LoadU(df, c + i), co = hn::LoadU(df, c + i + N);
  const VF se = hn::LoadU(df, s + i), so = hn::LoadU(df, s + i + N);
  VF r1e = Turn1(x1e, x2e, ce, se), r1o = Turn1(x1o, x2o, co, so);
  VF r2e = Turn2(x1e, x2e, ce, se), r2o = Turn2(x1o, x2o, co, so);
  if constexpr (kCanonical) {
    r1e = CanonicalNaN(r1e), r1o = CanonicalNaN(r1o), r2e = CanonicalNaN(r2e), r2o = CanonicalNaN(r2o);
  } else {
    nan = hn::Or(nan, hn::Or(EitherNaN(r1e, r1o), EitherNaN(r2e, r2o)));  // kept a mask: no vpmovm2d
  }
  return {BF16Io::PackPair(df, r1e, r1o), BF16Io::PackPair(df, r2e, r2o)};
}
template <bool kCanonical>
HWY_INLINE bool RotateRowBF16Lanes(const std::uint16_t* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                   const float* HWY_RESTRICT s, std::size_t half, std::uint16_t* HWY_RESTRICT out,
                                   bool stream, std::size_t& i) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  auto* out1 = reinterpret_cast<std::uint32_t*>(out);
  auto* out2 = reinterpret_cast<std::uint32_t*>(out + half);
  auto nan = hn::FirstN(df, 0);  // lanes where a result was NaN
  i = 0;
  if (stream && 2 * N * sizeof(std::uint32_t) == 64) {
    for (; i + 4 * N <= half; i += 4 * N) {
      const PackedBF16 a = TurnBF16Lanes<kCanonical>(df, x, c, s, half, i, nan);
      const PackedBF16 b = TurnBF16Lanes<kCanonical>(df, x, c, s, half, i + 2 * N, nan);
      PutLine(du, a.first, b.first, out1 + i / 2, stream);
      PutLine(du, a.second, b.second, out2 + i / 2, stream);
    }
  }
  for (; i + 2 * N <= half; i += 2 * N) {
    const PackedBF16 a = TurnBF16Lanes<kCanonical>(df, x, c, s, half, i, nan);
    Put(du, a.first, out1 + i / 2, stream);
    Put(du, a.second, out2 + i / 2, stream);
  }
  return kCanonical || hn::AllFalse(df, nan);
}

#endif

// The table layout RotateRowBF16Lanes reads: in each row's c and s, every whole block of
// 2N pairs as its even pairs' values, then its odd pairs'. The rest stays in order.
void SplitTableBlocks(float* HWY_RESTRICT table, std::size_t rows, std::size_t half) {
#if HWY_TARGET != HWY_SCALAR
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t k = 0; k < 2 * rows; ++k, table += half) {  // c, then s, of each row
    for (std::size_t i = 0; i + 2 * N <= half; i += 2 * N) {
      VF even, odd;
      hn::LoadInterleaved2(df, table + i, even, odd);
      hn::StoreU(even, df, table + i);
      hn::StoreU(odd, df, table + i + N);
    }
  }
#else
  (void)table, (void)rows, (void)half;
#endif
}

// Non-traditional: x1 = x[i], x2 = x[i + half].
template <class Io>
HWY_INLINE void RotateRowHalves(const typename Io::T* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                const float* HWY_RESTRICT s, std::size_t half, typename Io::T* HWY_RESTRICT out,
                                bool stream) {
  using T = typename Io::T;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  if constexpr (sizeof(T) == 4) {
    if (stream && 2 * N * sizeof(T) == 64) {  // a vector is half a line: a whole line a step
      for (; i + 2 * N <= half; i += 2 * N) {
        const HalvesF32 a = RotateHalvesF32<Io>(df, x, c, s, half, i);
        const HalvesF32 b = RotateHalvesF32<Io>(df, x, c, s, half, i + N);
        PutLine(df, a.first, b.first, out + i, stream);
        PutLine(df, a.second, b.second, out + half + i, stream);
      }
    }
    for (; i + N <= half; i += N) {
      const HalvesF32 r = RotateHalvesF32<Io>(df, x, c, s, half, i);
      Put(df, r.first, out + i, stream);
      Put(df, r.second, out + half + i, stream);
    }
  } else {
    const hn::Rebind<T, DF> dh;  // N 16-bit lanes: half a vector
#if HWY_TARGET != HWY_SCALAR
    if constexpr (std::is_same_v<Io, BF16Io>) {
      if (!RotateRowBF16Lanes<false>(x, c, s, half, out, stream, i)) {
        RotateRowBF16Lanes<true>(x, c, s, half, out, stream, i);
      }
    }
    // f16: 2N pairs per step, so each store is one full vector (whole lines when streaming
    // on AVX3; streaming AVX2's half lines two at a time showed no clear change, f16 being
    // bound by its conversions: docs/benchmarks.md §Measurements behind kernel choices).
    const hn::Repartition<T, DF> dw;
    for (; i + 2 * N <= half; i += 2 * N) {
      const VF x1a = Io::Load(df, x + i), x2a = Io::Load(df, x + half + i);
      const VF x1b = Io::Load(df, x + i + N), x2b = Io::Load(df, x + half + i + N);
      const VF ca = hn::LoadU(df, c + i), sa = hn::LoadU(df, s + i);
      const VF cb = hn::LoadU(df, c + i + N), sb = hn::LoadU(df, s + i + N);
      Put(dw, Io::Pack2(df, Rotated1(x1a, x2a, ca, sa), Rotated1(x1b, x2b, cb, sb)), out + i, stream);
      Put(dw, Io::Pack2(df, Rotated2(x1a, x2a, ca, sa), Rotated2(x1b, x2b, cb, sb)), out + half + i, stream);
    }
#endif
    for (; i + N <= half; i += N) {
      const VF x1 = Io::Load(df, x + i), x2 = Io::Load(df, x + half + i);
      const VF vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
      hn::StoreU(Io::Demote(df, Rotated1(x1, x2, vc, vs)), dh, out + i);
      hn::StoreU(Io::Demote(df, Rotated2(x1, x2, vc, vs)), dh, out + half + i);
    }
  }
  for (; i < half; ++i) RotatePairScalar<Io>(x, i, half + i, c[i], s[i], out);
}

// Traditional f32: x1 = x[2i], x2 = x[2i + 1], deinterleaved by LoadInterleaved2
// (StoreInterleaved2 has no streaming form).
HWY_INLINE void RotateRowPairsF32(const float* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                  const float* HWY_RESTRICT s, std::size_t half, float* HWY_RESTRICT out) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + N <= half; i += N) {
    VF x1, x2;
    hn::LoadInterleaved2(df, x + 2 * i, x1, x2);
    const VF vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
    hn::StoreInterleaved2(Rotated1(x1, x2, vc, vs), Rotated2(x1, x2, vc, vs), df, out + 2 * i);
  }
  for (; i < half; ++i) RotatePairScalar<F32Io>(x, 2 * i, 2 * i + 1, c[i], s[i], out);
}

// Traditional f16/bf16: the pair (x[2i], x[2i+1]) is one little-endian u32 lane, x1 in
// its low half and x2 in its high half, so the pair never needs a shuffle.
template <class Io>
HWY_INLINE VU TurnPairs16(DF df, const std::uint16_t* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                          const float* HWY_RESTRICT s, std::size_t i) {
  const VU w = hn::LoadU(DU(), reinterpret_cast<const std::uint32_t*>(x + 2 * i));
  const VF x1 = Io::Low(df, w), x2 = Io::High(df, w);
  const VF vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
  return Io::PackPair(df, Rotated1(x1, x2, vc, vs), Rotated2(x1, x2, vc, vs));
}
template <class Io>
HWY_INLINE void RotateRowPairs16(const std::uint16_t* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                 const float* HWY_RESTRICT s, std::size_t half, std::uint16_t* HWY_RESTRICT out,
                                 bool stream) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  auto* out32 = reinterpret_cast<std::uint32_t*>(out);
  std::size_t i = 0;
  if (stream && N * sizeof(std::uint32_t) * 2 == 64) {  // a vector is half a line: a whole line a step
    for (; i + 2 * N <= half; i += 2 * N) {
      PutLine(du, TurnPairs16<Io>(df, x, c, s, i), TurnPairs16<Io>(df, x, c, s, i + N), out32 + i, stream);
    }
  }
  for (; i + N <= half; i += N) Put(du, TurnPairs16<Io>(df, x, c, s, i), out32 + i, stream);
  for (; i < half; ++i) RotatePairScalar<Io>(x, 2 * i, 2 * i + 1, c[i], s[i], out);
}

template <class Io>
void RotateRowsAs(const std::byte* x, std::byte* out, const float* table, std::size_t rows, std::size_t d,
                  std::size_t half, bool traditional, bool stream) {
  using T = typename Io::T;
  const std::size_t tail = (d - 2 * half) * sizeof(T);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(x);
  const std::size_t row_bytes = d * sizeof(T), total = rows * row_bytes;
  for (std::size_t r = 0; r < rows; ++r, table += 2 * half) {
    // The lines kPrefetchBytes past this row's, as many as it has, none past the task.
    const std::size_t ahead_end = std::min(total, (r + 1) * row_bytes + rope_detail::kPrefetchBytes);
    for (std::size_t pos = r * row_bytes + rope_detail::kPrefetchBytes; pos < ahead_end; pos += 64) {
      hwy::Prefetch(bytes + pos);
    }
    const auto* xr = reinterpret_cast<const T*>(x) + r * d;
    T* orow = reinterpret_cast<T*>(out) + r * d;
    if (!traditional) {
      RotateRowHalves<Io>(xr, table, table + half, half, orow, stream);
    } else if constexpr (sizeof(T) == 4) {
      RotateRowPairsF32(xr, table, table + half, half, orow);
    } else {
      RotateRowPairs16<Io>(xr, table, table + half, half, orow, stream);
    }
    if (tail != 0) std::memcpy(orow + 2 * half, xr + 2 * half, tail);  // bit-exact, NaN payloads too
  }
}

// `rows` consecutive rows (positions t, t+1, ...) of D elements; table row r is theirs.
// With `stream`, aligned full vectors are written with streaming stores, made visible
// (sfence) before returning.
void RotateRows(const std::byte* x, std::byte* out, const float* table, std::size_t rows, std::size_t d,
                std::size_t half, DType dtype, bool traditional, bool stream) {
  switch (dtype) {
    case DType::f32: RotateRowsAs<F32Io>(x, out, table, rows, d, half, traditional, stream); break;
    case DType::bf16: RotateRowsAs<BF16Io>(x, out, table, rows, d, half, traditional, stream); break;
    default: RotateRowsAs<F16Io>(x, out, table, rows, d, half, traditional, stream); break;  // f16
  }
  if (stream) hwy::FlushStream();
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(FillTable);
HWY_EXPORT(SplitTableBlocks);
HWY_EXPORT(RotateRows);

namespace {

using namespace rope_detail;

struct Geometry {
  std::int64_t batch = 0, heads = 0, seq = 0, d = 0;
  std::size_t half = 0;
  double scale = 1;
  std::vector<std::int64_t> offset;  // per batch row
  std::vector<double> inv_freq;      // per pair, as the oracle
  double max_inv = 0;
  std::vector<double> step_cos, step_sin;  // cos δ_i, sin δ_i, δ_i = scale·inv_i

  double position(std::int64_t b, std::int64_t t) const {
    return scale * static_cast<double>(t + offset[static_cast<std::size_t>(b)]);
  }
};

// Table rows for positions [t_begin, t_begin + count) of batch row b (count <= kBlock).
void fill_block(const Geometry& g, std::int64_t b, std::int64_t t_begin, std::int64_t count, float* table) {
  const std::size_t half = g.half, n = static_cast<std::size_t>(count);
  const double p_first = g.position(b, t_begin), p_last = g.position(b, t_begin + count - 1);
  const bool recurrence = std::max(std::abs(p_first), std::abs(p_last)) * g.max_inv <= kMaxRecurrenceAngle;
  if (!recurrence) {  // huge or non-finite angles: the oracle's θ and libm for every entry
    for (std::size_t k = 0; k < n; ++k) {
      const double p = g.position(b, t_begin + static_cast<std::int64_t>(k));
      float* row = table + k * 2 * half;
      for (std::size_t i = 0; i < half; ++i) {
        const double theta = p * g.inv_freq[i];
        row[i] = static_cast<float>(std::cos(theta));
        row[half + i] = static_cast<float>(std::sin(theta));
      }
    }
    return;
  }
  std::vector<double> c(half), s(half);  // exact at t_begin, then the recurrence's state
  for (std::size_t i = 0; i < half; ++i) {
    const double theta = p_first * g.inv_freq[i];
    c[i] = std::cos(theta);
    s[i] = std::sin(theta);
  }
  HWY_DYNAMIC_DISPATCH(FillTable)(c.data(), s.data(), g.step_cos.data(), g.step_sin.data(), half, n, table);
}

}  // namespace

void rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
          const std::optional<ConstTensorView>& per_row_offsets, const TensorView& out) {
  ref::validate_rope(x, params, offset, per_row_offsets, out);
  KVLAB_REQUIRE(!params.mlx_arithmetic, unsupported,
                "SimdBackend: rope in MLX's arithmetic (flavour=mlx) is computed by the oracle only");
  Geometry g;
  g.batch = x.dim(0);
  g.seq = x.dim(-2);
  g.d = x.dim(-1);
  const std::int64_t rows = x.numel() / g.d;
  if (rows == 0) return;
  g.heads = rows / g.batch / g.seq;  // the * axes between B and T
  g.scale = static_cast<double>(params.scale);
  // Offsets are read up front, as the oracle does.
  g.offset.assign(static_cast<std::size_t>(g.batch), offset);
  if (per_row_offsets) {
    for (std::int64_t b = 0; b < g.batch; ++b) g.offset[static_cast<std::size_t>(b)] = per_row_offsets->load_int(b);
  }
  g.half = static_cast<std::size_t>(params.dims / 2);
  g.inv_freq.resize(g.half);
  g.step_cos.resize(g.half);
  g.step_sin.resize(g.half);
  for (std::size_t i = 0; i < g.half; ++i) {
    g.inv_freq[i] = params.freqs.empty()
                        ? std::pow(static_cast<double>(params.base), -2.0 * static_cast<double>(i) / params.dims)
                        : 1.0 / static_cast<double>(params.freqs[i]);
    g.max_inv = std::max(g.max_inv, g.inv_freq[i]);
    const double delta = g.scale * g.inv_freq[i];
    g.step_cos[i] = std::cos(delta);
    g.step_sin[i] = std::sin(delta);
  }

  const std::size_t elem = dtype_size(x.dtype), d = static_cast<std::size_t>(g.d);
  const std::size_t row_bytes = d * elem, table_row = 2 * g.half;
  // Window of positions: its table for all batch rows fits kTableBytes (at least one
  // position), in whole recurrence blocks when it spans more than one.
  const std::size_t per_position = static_cast<std::size_t>(g.batch) * table_row * sizeof(float);
  auto window = static_cast<std::int64_t>(std::max<std::size_t>(1, kTableBytes / per_position));
  if (window > kBlock) window -= window % kBlock;
  window = std::min(window, g.seq);
  // Data tasks: chunks of one (b, head)'s window rows, or several whole (b, head)
  // windows when one is smaller than kTaskBytes.
  const auto task_rows = static_cast<std::int64_t>(std::max<std::size_t>(1, kTaskBytes / row_bytes));
  const std::int64_t seqs = g.batch * g.heads;
  const bool stream = static_cast<std::size_t>(rows) * row_bytes >= kStreamBytes;
  // The bf16 halves path reads its table in split blocks (RotateRowBF16Lanes).
  const bool split_table = x.dtype == DType::bf16 && !params.traditional;

  // Every entry is written before it is read: no zero fill.
  const auto table_buffer =
      std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(g.batch * window) * table_row);
  float* const table = table_buffer.get();
  for (std::int64_t t0 = 0; t0 < g.seq; t0 += window) {
    const std::int64_t span = std::min(window, g.seq - t0);
    // 1. cos/sin of [t0, t0 + span) for every batch row; blocks restart at kBlock steps.
    const std::int64_t blocks = (span + kBlock - 1) / kBlock;
    parallel_for(g.batch * blocks, [&](std::int64_t task) {
      const std::int64_t b = task / blocks, first = (task % blocks) * kBlock;
      float* dst = table + static_cast<std::size_t>(b * span + first) * table_row;
      const std::int64_t count = std::min(kBlock, span - first);
      fill_block(g, b, t0 + first, count, dst);
      if (split_table) HWY_DYNAMIC_DISPATCH(SplitTableBlocks)(dst, static_cast<std::size_t>(count), g.half);
    });
    // 2. The rows of every (b, head) in the window, in memory order.
    const std::int64_t chunk = std::min(task_rows, span);
    const std::int64_t chunks = (span + chunk - 1) / chunk;
    const std::int64_t seqs_per_task = chunk == span ? std::max<std::int64_t>(1, task_rows / span) : 1;
    const std::int64_t seq_groups = (seqs + seqs_per_task - 1) / seqs_per_task;
    parallel_for(seq_groups * chunks, [&](std::int64_t task) {
      const std::int64_t group = task / chunks, first = (task % chunks) * chunk;
      const std::int64_t count = std::min(chunk, span - first);
      const std::int64_t seq_end = std::min(seqs, (group + 1) * seqs_per_task);
      for (std::int64_t bh = group * seqs_per_task; bh < seq_end; ++bh) {
        const std::int64_t b = bh / g.heads;
        const auto row = static_cast<std::size_t>(bh * g.seq + t0 + first);
        HWY_DYNAMIC_DISPATCH(RotateRows)(x.data + row * row_bytes, out.data + row * row_bytes,
                                         table + static_cast<std::size_t>(b * span + first) * table_row,
                                         static_cast<std::size_t>(count), d, g.half, x.dtype, params.traditional,
                                         stream);
      }
    });
  }
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
