// Per-target code of the fused quantized decode kernel (plan and split:
// quantized_decode.h). One task = one chunk of keys of one (b, kv head), all R·Lq query
// rows of its GQA group at once, so every K/V code is unpacked once for all of them.
//
// Arithmetic, k = c·s + b and v = c·s + b (c the code, s/b its group's scale and bias):
//  * K side: each key's codes are dequantized once for all rows, k = c·s + b by one
//    MulAdd per 16 codes; then q·k by FMAs (queries carry params.scale), and scores
//    reduced N keys at a time (a transposing tree of shuffle pairs, PairRound: N
//    vectors in, one vector of N dot products out). Not factored as s·Σq·c + b·Σq
//    (issue 4's suggestion): that form rounds relative to |b|·Σ|q| instead of Σ|q·k|
//    (the two terms cancel), and its rigorous bound is 7-9× the whole f32 attention
//    tolerance. The fused c·s + b differs from the oracle's (c·s rounded, then + b) by
//    at most u·|c·s| + 2u·|k|, a term of 3/(Dk+2) of the tolerance plus u·S_b.
//  * softcap, mask, running max and e^(s−m) run on whole vectors of keys; a hidden key's
//    score is selected to −inf (never added), its weight is then exactly 0.
//  * V side, factored: o += Σ_t (p_t·s_t)·c_t per group, plus Σ_t p_t·b_t added once per
//    group at the end, so the inner loop is code × weight FMAs only. p_t·s_t and p_t·b_t
//    are selected to 0 where p_t = 0, so NaN-poisoned scales of hidden keys cannot reach
//    the output (0·NaN would). Its rounding term (2γ·max|b_V|) is derived in the
//    quantized_sdpa budget (harness/ops/sdpa_info.cc).
// Everything accumulates in f32 (Highway MulAdd: FMA on AVX2/AVX3). Plain bf16 K and V
// with a bf16 output on an AVX512_BF16 CPU take vdpbf16ps on both sides (K: the stored
// bf16 queries, exact products; V: P rounded to bf16, declared as such, with the
// argument at ValueBlockBf16).
//
// Codes are read straight from the packed rows for 4 and 8 bits: 8-bit N bytes → N f32
// in element order; 4-bit N bytes → two vectors (low nibbles = even elements, high =
// odd), which is the "lane order" of the header. Other widths are first unpacked to one
// byte per code for the chunk and then take the 8-bit path.
//
// Cost per key at R = 4, D = 128 on AVX3 (16 lanes, 2 FMA ports): 2·R·D/16 = 64 FMAs,
// 16 code unpacks (4-bit: widen + shift + 2 lookups per 32 codes; 8-bit: widen +
// convert per 16, plus 8 dequantize FMAs), ~11 uops of score reduction and ~8 of
// softmax, about 120 vector uops: ~60 cycles at two per cycle, f32 FMAs the floor.
// Measured on the 2-core Xeon VM (one thread, chunk in L2) it takes well over that floor at
// either width (docs/benchmarks.md §Measurements behind kernel choices).
// No AVX-512 VNNI (vpdpbusd, u8 codes × s8 queries): rounding q to s8 per (row, group)
// moves each q_d by up to max_g|q|/254, so the logit moves by up to
// |scale|·Σ_g (max_g|q|/254)·Σ_{d∈g}|s·c_d|. The tolerance allows eps_T·S with
// S = max over keys of |scale|·Σ|q_d·k_d| (eps_T = 2^-10 f16, 2^-7 bf16, 2^-23 f32),
// and max_g|q|·Σ|k| is not bounded by any multiple of Σ|q_d·k_d| (q and k large on
// different elements), so no fixed-point q passes the worst case: not with s8 (> 2^-8
// relative to max_g|q|), not with a two-part s8 split (2^-16), and never for f32 q.
// A K side in fixed point needs a run-time certificate instead (its error bound against
// eps_T times a lower bound of S, the f32 path again where it fails): that is
// quantized_decode_vnni-inl.h, for 4-bit K with f16/bf16 outputs on AVX3_DL.
// The V side in fixed point has no a-priori bound either: weights p·s_v rounded per block
// of keys move the output relative to the block's largest p·|s|, and a key's scale times
// its largest code need not be a value V holds (its codes may all be small), so the move
// is not bounded by max|v|. quantized_decode_int_values-inl.h takes byte-coded and 4-bit
// V with f16/bf16 outputs by vpdpwssd under a run-time certificate (its bound against a
// sampled lower bound of max|v|).
#ifndef KVLAB_SIMD_QDECODE_COMMON
#define KVLAB_SIMD_QDECODE_COMMON
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"

namespace kvlab::simd::qdecode::detail {

// Per-thread scratch of a task, grown on demand and reused across tasks and calls.
struct Scratch {
  std::vector<float> k_scales, k_biases;  // [key][g], as stored
  std::vector<float> v_scales, v_biases, convert;  // [g][ncp]
  std::vector<float> scores;   // [ρ][ncp]: raw, then capped and masked scores
  std::vector<float> weights;  // [ρ][Gv][ncp]: p·s_v
  std::vector<float> weights_bf16;  // [ρ][ncp] p in bf16, two per float (DecodePlan::value_bf16)
  std::vector<float> tile;     // [RB][N/KB][N] partly reduced dot products of one key tile (RB <= 8)
  std::vector<float> out_bias; // [ρ][Gv]: Σ p·b_v
  std::vector<std::uint8_t> k_codes, v_codes;  // one byte per code (2/3/5/6-bit)
  std::vector<float> k_rows, v_rows;  // [key][D]: a decoded side's f32 or bf16 values (PackedSide::decoded)
  std::vector<float> factors;  // [key][g]: a side's scales made from its scale codes (CodedScales)
};

// Rows [0, n) of `bits`-bit codes (row_words u32 each, d codes) → one byte per code.
inline void unpack_rows(const std::uint32_t* words, std::int64_t n, std::int64_t row_words, std::int64_t d, int bits,
                        std::uint8_t* out) {
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  const auto nbytes = static_cast<std::size_t>(bits);
  for (std::int64_t j = 0; j < n; ++j) {
    const auto* in = reinterpret_cast<const unsigned char*>(words + j * row_words);
    std::uint8_t* o = out + j * d;
    // 8 codes fill exactly `bits` bytes of the LSB-first stream (d % 32 == 0).
    for (std::int64_t i = 0; i < d; i += 8, in += nbytes) {
      std::uint64_t acc = 0;
      std::memcpy(&acc, in, nbytes);
      for (int t = 0; t < 8; ++t) o[i + t] = static_cast<std::uint8_t>((acc >> (t * bits)) & mask);
    }
  }
}

}  // namespace kvlab::simd::qdecode::detail
#endif  // KVLAB_SIMD_QDECODE_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/quantized_decode.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "kernels/simd/quantized_decode_blocks-inl.h"
#include "kernels/simd/softcap-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::qdecode::HWY_NAMESPACE {

#include "kernels/simd/quantized_decode_vnni-inl.h"  // the integer K side (AVX3_DL only)
#include "kernels/simd/quantized_decode_int_values-inl.h"  // the integer V side (AVX3_DL, AVX2)

// ---------------------------------------------------------------- softmax of a chunk

// e^x for x <= 0 (x = −inf gives 0), bit for bit Highway's Exp there: the same
// reduction, polynomial and single rounding. Cheaper on AVX3: for x <= 0 the rounding
// offset is −0.5 (Exp builds ±0.5 from x's sign), the truncation needs no fix-up for
// positive overflow, and 2^q is applied by one vscalefps instead of two multiplies by
// built powers of two (either rounds once, only where the result is subnormal). 18 ops
// instead of 29. Other targets call Exp.
HWY_INLINE VF ExpNonPositive(DF df, VF x) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const VF q_real = hn::MulAdd(x, hn::Set(df, 1.442695040888963407359924681f), hn::Set(df, -0.5f));
  const VF q = VF{_mm512_cvtepi32_ps(_mm512_cvttps_epi32(q_real.raw))};  // trunc(x/ln2 − 0.5)
  VF r = hn::MulAdd(q, hn::Set(df, -0.693145751953125f), x);  // x − q·ln2, ln2 in two parts
  r = hn::MulAdd(q, hn::Set(df, -1.428606765330187045e-6f), r);
  // Highway's ExpPoly: r + r²·P(r), P of degree 5 by Estrin's scheme.
  const VF r2 = hn::Mul(r, r), r4 = hn::Mul(r2, r2);
  const VF p01 = hn::MulAdd(hn::Set(df, +0.166666671633720397949219f), r, hn::Set(df, +0.5f));
  const VF p23 = hn::MulAdd(hn::Set(df, +0.00833336077630519866943359f), r, hn::Set(df, +0.0416664853692054748535156f));
  const VF p45 = hn::MulAdd(hn::Set(df, +0.000198527617612853646278381f), r, hn::Set(df, +0.00139304355252534151077271f));
  const VF poly = hn::MulAdd(r4, p45, hn::MulAdd(r2, p23, p01));
  const VF y = hn::Add(hn::MulAdd(poly, hn::Mul(r, r), r), hn::Set(df, 1.0f));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(df, -104.0f)), VF{_mm512_scalef_ps(y.raw, q.raw)});
#else
  return hn::Exp(df, x);
#endif
}

// The E2M1 kernel's V codes (2v) and K values (scale 1/2, bias 0: v itself) of n packed
// bytes, n a multiple of N, in lane order.
void E2M1CodesForTest(const std::uint8_t* HWY_RESTRICT src, std::size_t n, float* HWY_RESTRICT codes,
                      float* HWY_RESTRICT values) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const VF table = NibbleCodes<kE2M1>(df), half = hn::Set(df, 0.5f), bias = hn::Zero(df);
  const VF key_table = hn::MulAdd(table, half, bias);
  for (std::size_t i = 0; i + N <= n; i += N) {
    const VI bytes = LoadBytes<kE2M1>(df, src + i);
    for (std::size_t t = 0; t < 2; ++t) {
      hn::StoreU(ValueCodes<kE2M1>(df, bytes, t, table), df, codes + 2 * i + t * N);
      hn::StoreU(KeyValues<kE2M1>(df, bytes, t, key_table, half, bias), df, values + 2 * i + t * N);
    }
  }
}

bool E2M1NibblesInPlace() { return kNibbleLookup; }

// Plain bf16 rows as pairs (kPlainBF16Pairs) below AVX-512, where no vdpbf16ps reads them
// and a unit of 2N values divides every head dim the decode takes (Dk a multiple of 16).
bool Bf16PairsInPlace() { return HWY_TARGET != HWY_SCALAR && kMaxLanes <= 8; }

// The largest of op(x) over n elements x at p: vec_op on whole vectors, op on the tail.
template <typename T, class VecOp, class Op>
T Largest(const T* HWY_RESTRICT p, std::size_t n, const VecOp& vec_op, const Op& op) {
  const hn::ScalableTag<T> d;
  const std::size_t N = hn::Lanes(d);
  auto largest = hn::Zero(d);
  std::size_t i = 0;
  for (; i + N <= n; i += N) largest = hn::Max(largest, vec_op(d, hn::LoadU(d, p + i)));
  HWY_ALIGN T lanes[hn::MaxLanes(hn::ScalableTag<T>())];
  hn::Store(largest, d, lanes);
  T out = 0;
  for (std::size_t l = 0; l < N; ++l) out = std::max(out, lanes[l]);
  for (; i < n; ++i) out = std::max(out, op(p[i]));
  return out;
}

std::uint8_t MaxByte(const std::uint8_t* HWY_RESTRICT p, std::size_t n, std::uint8_t add) {
  return Largest(
      p, n, [add](auto d, auto v) { return hn::Add(v, hn::Set(d, add)); },
      [add](std::uint8_t x) { return static_cast<std::uint8_t>(x + add); });
}

std::uint16_t MaxF16Magnitude(const std::uint16_t* HWY_RESTRICT p, std::size_t n) {
  return Largest(
      p, n, [](auto d, auto v) { return hn::And(v, hn::Set(d, std::uint16_t{0x7FFF})); },
      [](std::uint16_t x) { return static_cast<std::uint16_t>(x & 0x7FFFu); });
}

// E8M0 code c → the f32 2^(c−7) by its bits (exponent field c + 120), 255 → +inf.
void E8M0Factors(const std::uint8_t* HWY_RESTRICT codes, std::size_t n, float* HWY_RESTRICT out) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<std::uint8_t, DF> d8;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto c = hn::PromoteTo(du, hn::LoadU(d8, codes + i));
    const auto bits = hn::IfThenElse(hn::Eq(c, hn::Set(du, 255u)), hn::Set(du, 0x7F800000u),
                                     hn::ShiftLeft<23>(hn::Add(c, hn::Set(du, 120u))));
    hn::StoreU(hn::BitCast(df, bits), df, out + i);
  }
  for (; i < n; ++i) {
    const std::uint32_t c = codes[i];
    out[i] = std::bit_cast<float>(c == 255 ? 0x7F800000u : (c + 120u) << 23);
  }
}

// Test hook (exp_nonpositive in the header): ExpNonPositive or Highway's Exp over n values.
void ExpNonPositiveForTest(const float* HWY_RESTRICT x, std::size_t n, float* HWY_RESTRICT out, bool highway) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  HWY_ALIGN float lanes[hn::MaxLanes(DF())];
  for (std::size_t i = 0; i < n; i += N) {
    const std::size_t m = std::min(N, n - i);
    for (std::size_t j = 0; j < N; ++j) lanes[j] = j < m ? x[i + j] : 0.0f;
    const VF v = hn::Load(df, lanes);
    hn::Store(highway ? hn::Exp(df, v) : ExpNonPositive(df, v), df, lanes);
    for (std::size_t j = 0; j < m; ++j) out[i + j] = lanes[j];
  }
}

// Array-mask element `at` as a value added to the score: boolean 0 (keep) or −inf (hide).
float ArrayMaskValue(const DecodePlan& plan, std::int64_t at) {
  if (plan.mask_kind == MaskKind::boolean) {
    return reinterpret_cast<const std::uint8_t*>(plan.mask)[at] != 0 ? 0.0f : -INFINITY;
  }
  switch (plan.mask_dtype) {
    case DType::f16: return f16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(plan.mask)[at]);
    case DType::bf16: return bf16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(plan.mask)[at]);
    default: return reinterpret_cast<const float*>(plan.mask)[at];
  }
}

struct RowSoftmax {
  float max = -INFINITY;  // NaN when a visible score is NaN
  float sum = 0;
};

// The V side of one row: where a key's weight p is 0 (hidden, or e^(s−m) underflowed)
// p·s_v and p·b_v are selected to 0, so a NaN-poisoned scale of a hidden key stays out.
struct ValueSide {
  const float* scales;  // [g][ncp] f32 V scales of the chunk; null for plain rows (weights p)
  const float* biases;  // null where every bias is 0 (BiasesAreZero)
  std::size_t groups;
  float* weights;    // out: [g][ncp] p·s_v
  float* bias_sums;  // out: [g] Σ p·b_v
};

// Softcap, mask, max and NaN of row ρ's raw scores `s` over the chunk's keys j0 + [0, nc),
// in place: visible keys [lo, hi) keep their (capped, masked) score, every other key of
// the whole vectors [t_lo, t_hi) covering them gets −inf.
RowSoftmax MaskRow(const DecodePlan& plan, std::int64_t b, std::int64_t kvh, std::int64_t rho, std::int64_t j0,
                   std::size_t lo, std::size_t hi, std::size_t t_lo, std::size_t t_hi, float* HWY_RESTRICT s) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const std::size_t N = hn::Lanes(df);
  const auto vlo = hn::Set(di, static_cast<std::int32_t>(lo)), vhi = hn::Set(di, static_cast<std::int32_t>(hi));
  const VF neg_inf = hn::Set(df, -INFINITY);
  const bool capped = plan.softcap > 0;
  const VF cap = hn::Set(df, plan.softcap);
  VF vmax = neg_inf;
  auto any_nan = hn::FirstN(df, 0);  // all false
  for (std::size_t t = t_lo; t < t_hi; t += N) {
    VF x = hn::LoadU(df, s + t);
    if (capped) x = kvlab::simd::HWY_NAMESPACE::Softcap(df, x, cap);  // capped before the mask is added
    if (t < lo || t + N > hi) {  // only the first and last vector can hold hidden keys
      const auto idx = hn::Iota(di, static_cast<std::int32_t>(t));
      x = hn::IfThenElse(hn::RebindMask(df, hn::AndNot(hn::Lt(idx, vlo), hn::Lt(idx, vhi))), x, neg_inf);
      hn::StoreU(x, df, s + t);
    } else if (capped) {
      hn::StoreU(x, df, s + t);
    }
    vmax = hn::Max(vmax, x);
    any_nan = hn::Or(any_nan, hn::IsNaN(x));
  }
  RowSoftmax out;
  out.max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  bool nan = !hn::AllFalse(df, any_nan);
  if (plan.mask != nullptr) {  // array masks: add (or hide) per key, then a new max
    const std::int64_t h = kvh * (plan.hq / plan.hkv) + rho / plan.lq, i = rho % plan.lq;
    const std::int64_t row =
        (((plan.mask_b == 1 ? 0 : b) * plan.mask_h + (plan.mask_h == 1 ? 0 : h)) * plan.lq + i) * plan.lk;
    out.max = -INFINITY;
    nan = false;  // the vector pass saw keys the array may hide
    for (std::size_t t = lo; t < hi; ++t) {
      const float add = ArrayMaskValue(plan, row + j0 + static_cast<std::int64_t>(t));
      s[t] = add == -INFINITY ? -INFINITY : s[t] + add;
      if (std::isnan(s[t])) nan = true;
      else out.max = std::max(out.max, s[t]);
    }
  }
  if (nan) out.max = std::numeric_limits<float>::quiet_NaN();
  return out;
}

// p = e^(s − m) over the vectors [t_lo, t_hi): Σ p, and per V group p·s_v (stored) and
// Σ p·b_v. kGroups: the V group count when known at compile time (accumulators in
// registers, loops unrolled), 0 for any (vside.groups). kBiases false: every bias 0, so
// Σ p·b_v is 0 and not formed (half the loop's loads and multiplies).
template <std::size_t kGroups, bool kBiases = true>
float ExpRow(const float* HWY_RESTRICT s, float m, std::size_t t_lo, std::size_t t_hi, std::size_t ncp,
             const ValueSide& vside) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t kAcc = kGroups == 0 ? 1 : kGroups;
  const std::size_t groups = kGroups == 0 ? vside.groups : kGroups;
  const float* HWY_RESTRICT scales = vside.scales;
  const float* HWY_RESTRICT biases = vside.biases;
  float* HWY_RESTRICT weights = vside.weights;
  const VF vm = hn::Set(df, m), zero = hn::Zero(df);
  VF sum = zero, bias_acc[kAcc];
  for (std::size_t g = 0; g < kAcc; ++g) bias_acc[g] = zero;
  if constexpr (kGroups == 0) {
    for (std::size_t g = 0; g < groups; ++g) vside.bias_sums[g] = 0;
  }
  const VF neg_inf = hn::Set(df, -INFINITY);
  for (std::size_t t = t_lo; t < t_hi; t += N) {
    const VF x = hn::LoadU(df, s + t);
    const VF p = ExpNonPositive(df, hn::Sub(x, vm));  // hidden: e^−inf = 0
    sum = hn::Add(sum, p);
    // Hidden keys (score −inf: MaskRow) get weight 0 whatever their scale, poison included.
    // A key whose p merely underflows in f32 keeps p·s: a NaN or infinite scale there makes
    // the output NaN, as the oracle's p·v does (p in double), never a silent 0.
    const auto used = hn::Ne(x, neg_inf);
#pragma GCC unroll 8
    for (std::size_t g = 0; g < groups; ++g) {
      const std::size_t at = g * ncp + t;
      hn::StoreU(hn::IfThenElseZero(used, hn::Mul(p, hn::LoadU(df, scales + at))), df, weights + at);
      if constexpr (!kBiases) continue;
      const VF pb = hn::IfThenElseZero(used, hn::Mul(p, hn::LoadU(df, biases + at)));
      if constexpr (kGroups == 0) {
        vside.bias_sums[g] += hn::GetLane(hn::SumOfLanes(df, pb));
      } else {
        bias_acc[g] = hn::Add(bias_acc[g], pb);
      }
    }
  }
  if constexpr (kGroups != 0 && kBiases) {
    for (std::size_t g = 0; g < kGroups; ++g) vside.bias_sums[g] = hn::GetLane(hn::SumOfLanes(df, bias_acc[g]));
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// Plain V rows: the weights are p itself (one group), Σ p returned, no bias sums.
float ExpRowPlain(const float* HWY_RESTRICT s, float m, std::size_t t_lo, std::size_t t_hi, const ValueSide& vside) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const VF vm = hn::Set(df, m);
  VF sum = hn::Zero(df);
  for (std::size_t t = t_lo; t < t_hi; t += N) {
    const VF p = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + t), vm));  // hidden: e^−inf = 0
    sum = hn::Add(sum, p);
    hn::StoreU(p, df, vside.weights + t);
  }
  vside.bias_sums[0] = 0;
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// Row ρ over the chunk's keys j0 + [0, nc): the raw scores `s` (in place) get softcap and
// mask; then the max, Σ e^(s − max), and the V weights of `vside`.
RowSoftmax SoftmaxRow(const DecodePlan& plan, std::int64_t b, std::int64_t kvh, std::int64_t rho, std::int64_t j0,
                      std::size_t nc, std::size_t ncp, float* HWY_RESTRICT s, const ValueSide& vside) {
  const std::size_t N = hn::Lanes(DF());
  const auto cell = static_cast<std::size_t>(b * plan.rows + rho);
  const auto lo = static_cast<std::size_t>(std::clamp<std::int64_t>(plan.row_lo[cell] - j0, 0, static_cast<std::int64_t>(nc)));
  const auto hi = static_cast<std::size_t>(
      std::clamp<std::int64_t>(plan.row_hi[cell] - j0, static_cast<std::int64_t>(lo), static_cast<std::int64_t>(nc)));
  // Whole vectors covering [lo, hi); everything outside stays at weight 0.
  const std::size_t t_lo = lo / N * N, t_hi = (hi + N - 1) / N * N;
  RowSoftmax out;
  if (lo < hi) out = MaskRow(plan, b, kvh, rho, j0, lo, hi, t_lo, t_hi, s);
  for (std::size_t g = 0; g < vside.groups; ++g) {
    std::fill(vside.weights + g * ncp, vside.weights + g * ncp + t_lo, 0.0f);
    std::fill(vside.weights + g * ncp + t_hi, vside.weights + (g + 1) * ncp, 0.0f);
    vside.bias_sums[g] = 0;
  }
  if (std::isnan(out.max) || out.max == -INFINITY) {  // a NaN row is NaN whatever the weights; zeros keep V finite
    for (std::size_t g = 0; g < vside.groups; ++g) {
      std::fill(vside.weights + g * ncp + t_lo, vside.weights + g * ncp + t_hi, 0.0f);
    }
    return out;
  }
  if (vside.scales == nullptr) {
    out.sum = ExpRowPlain(s, out.max, t_lo, t_hi, vside);
    return out;
  }
  if (vside.biases == nullptr) {  // bias_sums stay 0
    switch (vside.groups) {
      case 4: out.sum = ExpRow<4, false>(s, out.max, t_lo, t_hi, ncp, vside); break;
      case 8: out.sum = ExpRow<8, false>(s, out.max, t_lo, t_hi, ncp, vside); break;
      default: out.sum = ExpRow<0, false>(s, out.max, t_lo, t_hi, ncp, vside);
    }
    return out;
  }
  switch (vside.groups) {
    case 1: out.sum = ExpRow<1>(s, out.max, t_lo, t_hi, ncp, vside); break;
    case 2: out.sum = ExpRow<2>(s, out.max, t_lo, t_hi, ncp, vside); break;
    case 4: out.sum = ExpRow<4>(s, out.max, t_lo, t_hi, ncp, vside); break;
    case 8: out.sum = ExpRow<8>(s, out.max, t_lo, t_hi, ncp, vside); break;
    default: out.sum = ExpRow<0>(s, out.max, t_lo, t_hi, ncp, vside);
  }
  return out;
}

// ---------------------------------------------------------------- one task

// The code rows of chunk keys [j0, j0 + nc) of one side: packed 4/8-bit rows, q8_0's
// signed bytes, mxfp4's E2M1 nibbles (where PackedSide::e2m1_nibbles) and mxfp8's E4M3
// bytes as they are, other widths unpacked to bytes (then read as 8-bit), plain rows
// as they are, other decoded formats dequantized into scratch.
struct CodeRows {
  const std::uint8_t* data;
  std::size_t row_bytes;
  int bits;  // 4, 8, kE2M1, kE4M3, kS8 or a kPlain* constant: the kernel that reads them
};

int PlainKernel(DType dtype) {
  return dtype == DType::f16 ? kPlainF16 : dtype == DType::bf16 ? kPlainBF16 : kPlainF32;
}

// to[i] = factor·from[i] for n floats (q4_0's biases −8d from its scales d; the integer K
// side's −12·s/2 for E2M1 and −128d for q8_0).
// In vectors: the ci build's -O2 leaves a plain loop scalar.
void ScaledCopy(const float* HWY_RESTRICT from, std::size_t n, float factor, float* HWY_RESTRICT to) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const VF f = hn::Set(df, factor);
  std::size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(f, hn::LoadU(df, from + i)), df, to + i);
  for (; i < n; ++i) to[i] = factor * from[i];
}

// The byte scale codes (T: uint8_t, or int8_t sign-extended) of rows [row0, row0 + n),
// [row][group], each as the float vec_op (widened to int32 lanes) and op (one) make of it.
template <typename T, class VecOp, class Op>
void ScaleBytesAsFloats(const PackedSide& side, std::int64_t row0, std::size_t n, float* HWY_RESTRICT out,
                        const VecOp& vec_op, const Op& op) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<T, DF> d8;
  const std::size_t N = hn::Lanes(df);
  const auto groups = static_cast<std::size_t>(side.groups());
  const T* codes = reinterpret_cast<const T*>(side.scales) + static_cast<std::size_t>(row0) * groups;
  const std::size_t count = n * groups;
  std::size_t i = 0;
  for (; i + N <= count; i += N) hn::StoreU(vec_op(di, hn::PromoteTo(di, hn::LoadU(d8, codes + i))), df, out + i);
  for (; i < count; ++i) out[i] = op(codes[i]);
}

// mxfp4's scales of rows [row0, row0 + n), [row][group]: for each E8M0 code c (at most 250,
// quantized_sdpa.cc's mxfp4_as_affine) the E2M1 kernel's scale s/2 = 2^(c−128), exact, by
// its bits: the exponent field c − 1 for c >= 2, the subnormals 2^-128 and 2^-127 below
// (a table lookup per group measured as costly as the V side's sums of a chunk).
void E2M1HalfScales(const PackedSide& side, std::int64_t row0, std::size_t n, float* HWY_RESTRICT out) {
  const auto vec_op = [](auto di, VI c) {
    const VI normal = hn::ShiftLeft<23>(hn::Sub(c, hn::Set(di, 1)));
    const VI tiny = hn::IfThenElse(hn::Eq(c, hn::Zero(di)), hn::Set(di, 0x00200000), hn::Set(di, 0x00400000));
    return hn::BitCast(DF(), hn::IfThenElse(hn::Lt(c, hn::Set(di, 2)), tiny, normal));
  };
  const auto op = [](std::uint8_t c) { return std::bit_cast<float>(c >= 2 ? (c - 1u) << 23 : 0x00200000u << c); };
  ScaleBytesAsFloats<std::uint8_t>(side, row0, n, out, vec_op, op);
}

// nvfp4's scales of rows [row0, row0 + n), [row][group]: each E4M3 code c as E4M3(c)/2,
// exact (E4M3Values gives E4M3(c)·2^-120, a power of two makes it ·2^-1; the smallest,
// 2^-10, is a normal f32), 0x7F as 480/2 as the oracle's decode reads it.
void E4M3HalfScales(const PackedSide& side, std::int64_t row0, std::size_t n, float* HWY_RESTRICT out) {
  const auto vec_op = [](auto, VI c) { return hn::Mul(E4M3Values(DF(), c), hn::Set(DF(), 0x1p119f)); };
  const auto op = [](std::int8_t c) {
    return std::bit_cast<float>((static_cast<std::uint32_t>(std::int32_t{c}) << 20) & 0x87F00000u) * 0x1p119f;
  };
  ScaleBytesAsFloats<std::int8_t>(side, row0, n, out, vec_op, op);
}

// The chunk's scales as f32 [key][group] where the side stores codes of them (mxfp8's
// E8M0 factors for E4M3 chunks, e4m3_factors; mxfp4's E8M0 scales s as s/2,
// E2M1HalfScales; nvfp4's E4M3 scales likewise, E4M3HalfScales), into `store`; null where
// they are stored as f32/f16/bf16 (converted where used).
const float* CodedScales(const PackedSide& side, const CodeRows& rows, std::int64_t row0, std::size_t nc,
                         std::size_t groups, std::vector<float>& store) {
  if (rows.bits != kE4M3 && !side.e2m1) return nullptr;
  float* out = aligned_floats(store, nc * groups);
  if (rows.bits == kE4M3) e4m3_factors(side, row0, nc, out);
  else if (side.e4m3_scales) E4M3HalfScales(side, row0, nc, out);
  else E2M1HalfScales(side, row0, nc, out);
  return out;
}

// Whether a side's chunk has no biases, every one 0: q8_0's, mxfp4's and nvfp4's signed
// codes, E4M3 chunks.
bool BiasesAreZero(const PackedSide& side, const CodeRows& rows) {
  return side.s8 || side.e2m1 || rows.bits == kE4M3;
}
// The biases of n scales where the side stores none: 0 (BiasesAreZero) or bias_factor
// times the scale (q4_0: −8d), exact either way; false where they are stored.
bool BiasesFromScales(const PackedSide& side, const CodeRows& rows, const float* scales, std::size_t n,
                      float* biases) {
  if (BiasesAreZero(side, rows)) {
    std::fill(biases, biases + n, 0.0f);
  } else if (side.bias_factor != 0) {
    ScaledCopy(scales, n, side.bias_factor, biases);
  } else {
    return false;
  }
  return true;
}

// Group size of a side's chunk as its kernel reads it: mxfp8's for E4M3 codes, one group
// of D for plain rows (a decoded chunk's among them).
std::size_t KernelGroup(const PackedSide& side, const CodeRows& rows) {
  return static_cast<std::size_t>(rows.bits == kE4M3 ? side.decoded->spec.group_size : side.group);
}

// Key j0's row of (b, kv head) bk as stored: plain values or packed code words (not for
// a decoded side, whose rows exist only in a task's scratch).
const std::uint8_t* StoredRow(const PackedSide& side, std::int64_t bk, std::int64_t lk, std::int64_t j0) {
  const auto* base = side.plain != nullptr ? reinterpret_cast<const std::uint8_t*>(side.plain)
                                           : reinterpret_cast<const std::uint8_t*>(side.codes);
  return base + static_cast<std::size_t>(bk * lk + j0) * static_cast<std::size_t>(side.row_bytes());
}

CodeRows ChunkCodes(const PackedSide& side, std::int64_t bk, std::int64_t lk, std::int64_t j0, std::size_t nc,
                    std::vector<std::uint8_t>& unpacked, std::vector<float>& decoded) {
  const auto row_bytes = static_cast<std::size_t>(side.row_bytes());
  if (side.decoded != nullptr) {
    const auto d = static_cast<std::size_t>(side.d);
    if (e4m3_codes_readable(side, bk * lk + j0, nc)) {  // mxfp8 codes as they lie
      const auto* codes = reinterpret_cast<const std::uint8_t*>(side.decoded->wq.data);
      return {codes + static_cast<std::size_t>(bk * lk + j0) * d, d, kE4M3};
    }
    float* rows = aligned_floats(decoded, nc * d);
    const DType dtype = decoded_dtype(side, bk * lk + j0, nc);
    decoded_rows(side, bk * lk + j0, nc, dtype, rows);
    return {reinterpret_cast<const std::uint8_t*>(rows), d * dtype_size(dtype), PlainKernel(dtype)};
  }
  const std::uint8_t* first = StoredRow(side, bk, lk, j0);
  if (side.plain != nullptr) {
    return {first, row_bytes, side.bf16_pairs ? kPlainBF16Pairs : PlainKernel(side.plain_dtype)};
  }
  if (side.s8) return {first, row_bytes, kS8};
  if (side.e2m1 && side.e2m1_nibbles) return {first, row_bytes, side.e4m3_scales ? kE2M1Halves : kE2M1};
  if (!side.e2m1 && (side.bits == 4 || side.bits == 8)) return {first, row_bytes, side.bits};
  const auto d = static_cast<std::size_t>(side.d);
  if (unpacked.size() < nc * d) unpacked.resize(nc * d);
  if (side.e2m1) {  // signed bytes 2v
    e2m1_to_bytes(first, nc * row_bytes, unpacked.data());
    return {unpacked.data(), d, kS8};
  }
  qd::unpack_rows(reinterpret_cast<const std::uint32_t*>(first), static_cast<std::int64_t>(nc),
                  side.d * side.bits / 32, side.d, side.bits, unpacked.data());
  return {unpacked.data(), d, 8};
}

// A task's (b, kv head) and key range [j0, j1) (empty: no key of its chunk is visible).
struct ChunkKeys {
  std::int64_t bk, b, j0, j1;
};
ChunkKeys KeysOf(const DecodePlan& plan, std::int64_t task) {
  const std::int64_t bk = task / plan.chunks, c = task % plan.chunks, b = bk / plan.hkv;
  return {bk, b, std::max(c * plan.chunk, plan.span_lo[static_cast<std::size_t>(b)]),
          std::min((c + 1) * plan.chunk, plan.span_hi[static_cast<std::size_t>(b)])};
}

// The first K rows (as stored: plain, packed or mxfp8's E4M3 bytes) of the chunk this
// thread runs next, for the V side to prefetch as it ends; claims that task
// (claim_next_task). None where no task is promised or the next chunk has no visible key,
// and for another decoded K side (its dequantizer reads the stored rows in one stream).
NextChunk NextChunkRows(const DecodePlan& plan) {
  const bool e4m3 = plan.k.decoded != nullptr && plan.k.decoded->spec.mode == QuantMode::mxfp8;
  if (plan.k.decoded != nullptr && !e4m3) return {};
  const std::int64_t task = claim_next_task();
  if (task < 0) return {};
  const ChunkKeys next = KeysOf(plan, task);
  if (next.j0 >= next.j1) return {};
  if (e4m3) {
    const auto d = static_cast<std::size_t>(plan.k.d);
    const auto* codes = reinterpret_cast<const std::uint8_t*>(plan.k.decoded->wq.data);
    return {codes + static_cast<std::size_t>(next.bk * plan.lk + next.j0) * d, d};
  }
  return {StoredRow(plan.k, next.bk, plan.lk, next.j0), static_cast<std::size_t>(plan.k.row_bytes())};
}

// f(std::integral_constant<int, bits>) for a CodeRows::bits value.
template <class F>
void DispatchKernel(int bits, const F& f) {
  switch (bits) {
    case 4: return f(std::integral_constant<int, 4>{});
    case kPlainF16: return f(std::integral_constant<int, kPlainF16>{});
    case kPlainBF16: return f(std::integral_constant<int, kPlainBF16>{});
    case kPlainBF16Pairs: return f(std::integral_constant<int, kPlainBF16Pairs>{});
    case kPlainF32: return f(std::integral_constant<int, kPlainF32>{});
    case kE2M1: return f(std::integral_constant<int, kE2M1>{});
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    case kE2M1Halves: return f(std::integral_constant<int, kE2M1Halves>{});  // (e2m1_nibbles only)
#endif
    case kE4M3: return f(std::integral_constant<int, kE4M3>{});
    case kS8: return f(std::integral_constant<int, kS8>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// K and V bytes of a call from which the decode reads its chunks in quarters: above the
// L2 of a few cores, where the quarters' gain from DRAM outweighs their cost in cache.
constexpr std::int64_t kQuarterMinBytes = std::int64_t{8} << 20;

// The chunk's key order (KeyOrder): quarters where the plan allows them
// (quarter_order_available()), the f32 kernels read plain K and V
// rows of at least kQuarterMinBytes, every row sees every key of the chunk (no array
// mask, no row's bound inside it), the chunk holds a multiple of 64 keys and every row
// block's K side takes 4 keys a block; in order otherwise (the vdpbf16ps sides read in
// order).
KeyOrder ChunkOrder(const DecodePlan& plan, std::int64_t b, std::int64_t j0, std::int64_t j1) {
  const auto nc = static_cast<std::size_t>(j1 - j0);
  const bool f32_sides = plan.k.plain != nullptr && plan.v.plain != nullptr && plan.query_bf16 == nullptr &&
                         !plan.value_bf16;
  const std::int64_t bytes = plan.batch * plan.hkv * plan.lk * (plan.k.row_bytes() + plan.v.row_bytes());
  if (!plan.quarters || bytes < kQuarterMinBytes) return {};
  constexpr bool kBlocksOfFour = kQuarterOrder<1> && kQuarterOrder<2> && kQuarterOrder<3> && kQuarterOrder<4>;
  if (!kBlocksOfFour || !f32_sides || plan.mask != nullptr || plan.rows > 4 || nc % 64 != 0) return {};
  for (std::int64_t rho = 0; rho < plan.rows; ++rho) {
    const auto cell = static_cast<std::size_t>(b * plan.rows + rho);
    if (plan.row_lo[cell] > j0 || plan.row_hi[cell] < j1) return {};
  }
  return {nc / 4};
}

void DecodeChunk(const DecodePlan& plan, std::int64_t task) {
  static thread_local qd::Scratch scratch;
  qd::Scratch& sc = scratch;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const ChunkKeys keys = KeysOf(plan, task);
  const std::int64_t bk = keys.bk, b = keys.b, kvh = bk % plan.hkv, j0 = keys.j0, j1 = keys.j1;
  const std::int64_t rows = plan.rows;
  const auto urows = static_cast<std::size_t>(rows);
  float* part_max = plan.part_max + task * rows;
  float* part_sum = plan.part_sum + task * rows;
  if (j0 >= j1) {  // no key of this chunk is visible to any row
    std::fill(part_max, part_max + rows, -INFINITY);
    std::fill(part_sum, part_sum + rows, 0.0f);
    return;
  }
  const auto nc = static_cast<std::size_t>(j1 - j0);
  const std::size_t ncp = (nc + N - 1) / N * N;
  const PackedSide &ks = plan.k, &vs = plan.v;
  const auto dk = static_cast<std::size_t>(ks.d), dv = static_cast<std::size_t>(vs.d);
  const std::int64_t row0 = bk * plan.lk + j0;  // the chunk's first (b, kv head, key) row

  // K side: the scores of every row, in integers where the certificate holds
  // (quantized_decode_vnni-inl.h), else from the chunk's f32 scales/biases.
  const std::size_t kbytes = dtype_size(ks.meta_dtype);
  const CodeRows kc = ChunkCodes(ks, bk, plan.lk, j0, nc, sc.k_codes, sc.k_rows);
  const CodeRows vc = ChunkCodes(vs, bk, plan.lk, j0, nc, sc.v_codes, sc.v_rows);
  const std::size_t kgs = KernelGroup(ks, kc), vgs = KernelGroup(vs, vc), kg = dk / kgs, vg = dv / vgs;
  const std::size_t kmeta_row = static_cast<std::size_t>(row0) * kg, vmeta_row = static_cast<std::size_t>(row0) * vg;
  if (ks.decoded != nullptr && kc.bits != kE4M3) plan.mix->decoded += static_cast<std::int64_t>(nc * dk);
  if (vs.decoded != nullptr && vc.bits != kE4M3) plan.mix->decoded += static_cast<std::int64_t>(nc * dv);
  const ChunkStream stream{kc.data, nc * kc.row_bytes, vc.data, nc * vc.row_bytes};
  float* scores = aligned_floats(sc.scores, urows * ncp);
  const float* query = plan.query + static_cast<std::size_t>(bk * rows) * dk;
  const float* k_coded = CodedScales(ks, kc, row0, nc, kg, sc.factors);  // (V's come after K is scored)
  bool scored = false;
#if HWY_TARGET == HWY_AVX3_DL
  const bool amx = amx_available();
  if (vnni::Eligible(plan.score_slack, plan.lk, kc.bits, dk, kgs, amx)) {
    float* s_cols = aligned_floats(sc.k_scales, kg * ncp);
    float* b_cols = aligned_floats(sc.k_biases, kg * ncp);
    if (k_coded != nullptr) {
      meta_columns(reinterpret_cast<const std::byte*>(k_coded), DType::f32, nc, kg, ncp, sc.convert, s_cols);
    } else {
      meta_columns(ks.scales + kmeta_row * kbytes, ks.meta_dtype, nc, kg, ncp, sc.convert, s_cols);
    }
    if (const float offset = vnni::CodeOffset(kc.bits); offset != 0) {  // codes read as c + offset
      ScaledCopy(s_cols, kg * ncp, -offset, b_cols);
    } else if (!BiasesFromScales(ks, kc, s_cols, kg * ncp, b_cols)) {
      meta_columns(ks.biases + kmeta_row * kbytes, ks.meta_dtype, nc, kg, ncp, sc.convert, b_cols);
    }
    scored = vnni::ScoreChunk(plan.call, bk, query, urows, dk, kgs, vnni::ReadCodeBits(kc.bits, ks.code_bits()),
                              kc.bits, plan.score_slack, kc.data, kc.row_bytes, nc, ncp, s_cols, b_cols, scores,
                              amx, *plan.mix);
  }
#endif
  const float* k_scales = k_coded;
  float* k_biases = aligned_floats(sc.k_biases, nc * kg);
  if (!scored && k_coded == nullptr && !ks.plain_rows()) {
    float* stored = aligned_floats(sc.k_scales, nc * kg);
    to_f32(ks.scales + kmeta_row * kbytes, ks.meta_dtype, nc * kg, stored);
    k_scales = stored;
  }
  if (!scored && k_scales != nullptr && !BiasesFromScales(ks, kc, k_scales, nc * kg, k_biases)) {
    to_f32(ks.biases + kmeta_row * kbytes, ks.meta_dtype, nc * kg, k_biases);
  }
  float* tile = aligned_floats(sc.tile, 8 * N * N);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (plan.query_bf16 != nullptr) {  // bf16 K and q on an AVX512_BF16 CPU: vdpbf16ps
    const std::uint16_t* qb = plan.query_bf16 + static_cast<std::size_t>(bk * rows) * dk;
    for (std::size_t r0 = 0, rb = 0; r0 < urows; r0 += rb) {
      rb = RowBlock(urows - r0);
      ScoreBlockBf16(rb, qb + r0 * dk, dk, kc.data, kc.row_bytes, nc, ncp, tile, scores + r0 * ncp);
    }
    plan.mix->bf16_dot += static_cast<std::int64_t>(urows * nc * dk / 2);  // Dk/2 lanes per key and row
    const VF scale = hn::Set(df, plan.query_scale);
    for (std::size_t i = 0; i < urows * ncp; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, scores + i), scale), df, scores + i);
    scored = true;
  }
#endif
  const KeyOrder order = scored ? KeyOrder{} : ChunkOrder(plan, b, j0, j1);
  // Dk FMA lanes per key and row (the integer side counted its own, certificate held or not).
  if (!scored) plan.mix->fma += static_cast<std::int64_t>(urows * nc * dk);
  for (std::size_t r0 = 0, rb = 0; r0 < urows && !scored; r0 += rb) {
    rb = RowBlock(urows - r0);
    const auto score = [&](auto bits) {
      ScoreBlock<decltype(bits)::value>(rb, query + r0 * dk, dk, kc.data, kc.row_bytes, k_scales, k_biases, kg, kgs,
                                        nc, ncp, tile, scores + r0 * ncp, r0 == 0 ? &stream : nullptr, order);
    };
    DispatchKernel(kc.bits, score);
  }

  // Softmax pieces per row, then the V weights.
  float* v_scales = nullptr;
  float* v_biases = nullptr;
  const float* v_coded = CodedScales(vs, vc, row0, nc, vg, sc.factors);
  if (v_coded != nullptr || !vs.plain_rows()) {  // as columns [g][ncp]
    v_scales = aligned_floats(sc.v_scales, vg * ncp);
    v_biases = aligned_floats(sc.v_biases, vg * ncp);
    const std::size_t vbytes = dtype_size(vs.meta_dtype);
    if (v_coded != nullptr) {
      meta_columns(reinterpret_cast<const std::byte*>(v_coded), DType::f32, nc, vg, ncp, sc.convert, v_scales);
    } else {
      meta_columns(vs.scales + vmeta_row * vbytes, vs.meta_dtype, nc, vg, ncp, sc.convert, v_scales);
    }
    if (!BiasesFromScales(vs, vc, v_scales, vg * ncp, v_biases)) {
      meta_columns(vs.biases + vmeta_row * vbytes, vs.meta_dtype, nc, vg, ncp, sc.convert, v_biases);
    }
  }
  float* weights = aligned_floats(sc.weights, urows * vg * ncp);
  float* out_bias = aligned_floats(sc.out_bias, urows * vg);
  for (std::size_t rho = 0; rho < urows; ++rho) {
    const ValueSide vside{v_scales, BiasesAreZero(vs, vc) ? nullptr : v_biases, vg, weights + rho * vg * ncp,
                          out_bias + rho * vg};
    const RowSoftmax sm = SoftmaxRow(plan, b, kvh, static_cast<std::int64_t>(rho), j0, nc, ncp, scores + rho * ncp,
                                     vside);
    part_max[rho] = sm.max;
    part_sum[rho] = sm.sum;
  }

  // V side: Σ (p·s)·c into the partial output (lane order), then + Σ p·b per group.
  const NextChunk next = NextChunkRows(plan);
  float* out = plan.part_out + static_cast<std::size_t>(task * rows) * dv;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (plan.value_bf16 && vc.bits == kPlainBF16) {  // p in bf16 and vdpbf16ps, unless V is too small
    auto* wb = reinterpret_cast<std::uint16_t*>(aligned_floats(sc.weights_bf16, urows * ncp / 2));
    WeightsToBf16(weights, urows * ncp, wb);
    bool taken = true;
    for (std::size_t r0 = 0, rb = 0; r0 < urows && taken; r0 += rb) {
      rb = RowBlock(urows - r0);
      taken = ValueBlockBf16(rb, reinterpret_cast<const std::uint32_t*>(wb + r0 * ncp), ncp / 2, vc.data,
                             vc.row_bytes, dv, nc, r0 == 0 ? next : NextChunk{}, out + r0 * dv);
      plan.mix->bf16_dot += static_cast<std::int64_t>(rb * ((nc + 1) / 2) * dv);  // Dv lanes per key pair
    }
    if (taken) {
      plan.rounded_probabilities->store(true, std::memory_order_relaxed);
      return;  // plain rows: no biases
    }
  }
#endif
  bool summed = false;
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
  if (!vs.plain_rows() && int_values::Eligible(plan.score_slack, vc.bits, dv, vgs) &&
      (vc.bits == 8 || vc.bits == kS8 || plan.packed_int_values)) {
    static thread_local int_values::Weights rounded;
    const auto sum = [&](auto bits) {
      return int_values::AccumulateChunk<decltype(bits)::value>(weights, urows, vg, ncp, vc.data, vc.row_bytes, dv,
                                                                vgs, nc, vs.code_bits(), v_scales, v_biases, part_sum,
                                                                plan.score_slack, next, rounded, out);
    };
    summed = vc.bits == 4       ? sum(std::integral_constant<int, 4>{})
             : vc.bits == kE2M1 ? sum(std::integral_constant<int, kE2M1>{})
             : vc.bits == kS8   ? sum(std::integral_constant<int, kS8>{})
                                : sum(std::integral_constant<int, 8>{});
    if (summed) {
      // Dv lanes a key pair: vpdpwssd (AVX3_DL), vpmaddwd + vpaddd (AVX2).
      (HWY_TARGET == HWY_AVX2 ? plan.mix->s16_madd : plan.mix->s16_dot) +=
          static_cast<std::int64_t>(urows * ((nc + 1) / 2) * dv);
      plan.rounded_probabilities->store(true, std::memory_order_relaxed);
    }
  }
#endif
  if (!summed) {
    plan.mix->fma += static_cast<std::int64_t>(urows * nc * dv);
    for (std::size_t r0 = 0, rb = 0; r0 < urows; r0 += rb) {
      rb = RowBlock(urows - r0);
      const auto accumulate = [&](auto bits) {
        ValueBlock<decltype(bits)::value>(rb, weights + r0 * vg * ncp, vg, ncp, vc.data, vc.row_bytes, dv, vgs, nc,
                                          r0 == 0 ? &next : nullptr, order, out + r0 * dv);
      };
      DispatchKernel(vc.bits, accumulate);
    }
  }
  if (vs.plain_rows()) return;  // no biases (an E4M3 chunk's are 0)
  for (std::size_t rho = 0; rho < urows; ++rho) {
    float* o = out + rho * dv;
    for (std::size_t pos = 0; pos < dv; pos += N) {
      hn::StoreU(hn::Add(hn::LoadU(df, o + pos), hn::Set(df, out_bias[rho * vg + pos / vgs])), df, o + pos);
    }
  }
}

}  // namespace kvlab::simd::qdecode::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd::qdecode {

HWY_EXPORT(DecodeChunk);
HWY_EXPORT(ExpNonPositiveForTest);
HWY_EXPORT(E2M1CodesForTest);
HWY_EXPORT(E2M1NibblesInPlace);
HWY_EXPORT(Bf16PairsInPlace);
HWY_EXPORT(MaxByte);
HWY_EXPORT(MaxF16Magnitude);
HWY_EXPORT(E8M0Factors);

std::uint8_t max_byte(const std::uint8_t* p, std::size_t n, std::uint8_t add) {
  return HWY_DYNAMIC_DISPATCH(MaxByte)(p, n, add);
}
void e8m0_factors(const std::uint8_t* codes, std::size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(E8M0Factors)(codes, n, out);
}
std::uint16_t max_f16_magnitude(const std::uint16_t* bits, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(MaxF16Magnitude)(bits, n);
}

bool e2m1_nibbles_available() { return HWY_DYNAMIC_DISPATCH(E2M1NibblesInPlace)(); }
bool bf16_pairs_available() { return HWY_DYNAMIC_DISPATCH(Bf16PairsInPlace)(); }

void decode_chunk(const DecodePlan& plan, std::int64_t task) { HWY_DYNAMIC_DISPATCH(DecodeChunk)(plan, task); }

void exp_nonpositive(const float* x, std::size_t n, float* out, bool highway) {
  HWY_DYNAMIC_DISPATCH(ExpNonPositiveForTest)(x, n, out, highway);
}

void e2m1_codes_for_test(const std::uint8_t* src, std::size_t n, float* codes, float* values) {
  HWY_DYNAMIC_DISPATCH(E2M1CodesForTest)(src, n, codes, values);
}

}  // namespace kvlab::simd::qdecode
#endif  // HWY_ONCE
