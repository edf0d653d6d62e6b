// SIMD affine quantize/dequantize (contract: reference/affine_quantize.h), bit-exact
// with the oracle on every Highway target.
//
// Layout of the work: rows are contiguous and groups are consecutive elements of a row,
// so group k of the flattened tensor owns elements [k·gs, (k+1)·gs), scale/bias k and
// stream bytes [k·gs·bits/8, (k+1)·gs·bits/8) (gs·bits is a multiple of 32: whole words,
// spec §1.4). Groups are independent: parallel_for runs tasks of kElementsPerTask/gs
// groups (a split fixed by the problem, never by the thread count). Scratch lives on
// the stack (two Blocks of kBlock groups), so nothing is allocated per call or row.
//
// Quantize, in blocks of kBlock = 32 groups, software-pipelined (the encoding of one
// block interleaved with the scan of the next):
//   scan    f16/bf16 (vector targets): the raw 16-bit patterns as ordered integer keys,
//           running Max/Min of the keys, no conversion (2N elements per vector; a key
//           beyond ±inf's flags NaN/±inf); f32 (and 16-bit input on SCALAR): running
//           Max/Min and a sum that flags NaN/±inf;
//   finish  the 32 groups' extremes reduced to one lane per group (ReduceBlock), the
//           spec §1.2 parameters for all 32 at once, one group per lane (BlockParams),
//           1/scale, whether each group's codes can skip the clamp (not where the
//           packs clamp, below), the scalar redo of flagged groups, scales/biases
//           stored with kvlab's RNE conversion (half_convert-inl.h); flags move as
//           mask bits (AVX3: straight from k-registers; a byte store reloaded as a u32
//           stalled every block), and only the non-finite groups are visited: 4-bit
//           60 → 53 µs per 256K elements, one thread (same-process A/B, median ratio
//           0.86; 0.88 cold on two threads);
//   encode  per vector g → f32 (F16C where it exists, else exact bit manipulation),
//           (g − bias)·(1/scale), rounding (mlx_cpu: one add of 1.5·2^23, whose bits
//           are the code), the clamp where needed, and the packing
//           straight into wq (affine_pack-inl.h: 2/4/8 bits in registers; other widths
//           and the SCALAR target through a u8 group buffer and pack_codes); a group
//           with a lane in doubt (below) is encoded again with the true division.
//           AVX3, mlx_cpu, 2/4/8 bits: four vectors at a time, rint by vcvtps2dq, and
//           the clamp done by the saturating packs of StoreCodesFour (4-bit 69 → 60 µs,
//           8-bit 65 → 60 µs per 256K elements, one thread, alternated processes).
// Dequantize, per group: the stored scale/bias → f32 (a block at a time), codes
// unpacked (same split), code·scale + bias, the RNE conversion to f16/bf16 in vectors.
//
// Exactness argument:
// * Every float op on data is a correctly rounded IEEE op (Div, Sub, Mul, Add; Round =
//   ties-to-even, Trunc, Min/Max, compares), the oracle's ops in the oracle's order,
//   except the reciprocal and the fused form below; the build sets -ffp-contract=off,
//   so Mul+Add never fuses on the FMA targets. BlockParams is group_params lane-wise.
// * The reciprocal: the oracle's q = fl(d/s), d = fl(g − bias). The fast path computes
//   q' = fl(d·fl(1/s)); with u = 2^-24, |q' − d/s| <= |d/s|·(2u + u²) and
//   |q − d/s| <= |d/s|·u, so |q' − q| <= 3u·|q|·(1 + 2^-22). A code is round-to-nearest
//   of q clamped to [0, n], so q and q' give the same code unless a half-integer lies
//   between them (or q is one). For |q| < 512 the gap is < 3·2^-15 < 2^-13: a lane whose
//   q' is within 2^-13 of a half-integer (|q' − rint(q')| > 0.5 − 2^-13; both ops exact)
//   is in doubt and its group is redone with Div (~1.5% of groups of 64 on random data).
//   Beyond 512 both sides clamp to the same end (n <= 255), except mlx_gpu's wrap of
//   negative codes, so under mlx_gpu every negative q' is in doubt (q' and q have d's
//   sign). ±inf/NaN: q' = ±inf where q overflows the same way or is beyond 512; a
//   non-finite 1/s (scale 0 or tiny) sends the group to Div directly.
// * The fused form (mlx_cpu on AVX2/AVX3, whose MulSub is one FMA): q' = fl(g·r − c),
//   r = fl(1/s), c = fl(bias·r), for a group with |c| <= 512. With Q = (g − bias)/s
//   exact: g·r − c = Q(1 + e1) − (bias/s)(1 + e1)e2, so |q' − Q| <= |Q|(2u + u²) +
//   |bias/s|·u(1 + u)², and the oracle's |q − Q| <= |Q|(2u + u²) (the rounding of
//   g − bias, then of the division). Only |q'| < n + 1 <= 256 matters (beyond, q lies
//   past n + 0.5 or below −0.5 too and both clamp to the same end), where |Q| < 257 and
//   |bias/s| <= 513: |q' − q| <= 1028u + 513u + O(u²) < 1542u < 2^-13 = 2048u, the
//   same doubt test. On data spanning zero |bias/s| = |q0| <= n, so every such group is
//   fused; the others keep Sub then Mul. One op fewer per vector (8-bit measured
//   73 → 66 µs per 256K elements, one thread; 4-bit unchanged).
// * Min/Max reductions, in any order, give the group's max/min; only which signed zero
//   wins may differ from the oracle's `>` scan, which never matters (a zero edge gives
//   q0 = ±0 and bias 0.0f either way). The same holds for the ordered 16-bit keys (f16
//   and bf16 → f32 are exact and monotone).
// * mlx_cpu codes: rint(clamp(q, 0, n)) = clamp(rint(q), 0, n) (rint is monotone, 0 and
//   n are integers). Fast path: q' + 1.5·2^23 is rint(q') in the low bits (EncodeWith),
//   clamped as integers, or not at all for a group whose extremes' q' lie in
//   [−0.5, n + 0.5) (q' is monotone in g, so every lane's does). Division path (CodeOf):
//   c + 2^23 rounds c ∈ [0, 255] to an integer with RNE, whose bits are 0x4B000000 +
//   code. mlx_gpu: round() from trunc and the exact fraction.
// * Groups holding NaN/±inf (unspecified upstream) take a scalar path that mirrors the
//   oracle element for element, because vector Min/Max do not skip NaN like `>` does.
//   A finite group whose sum overflows takes it too (slower, equally exact).
// * Conversions (half_convert-inl.h) equal dtype.cc for every input incl. subnormals,
//   overflow and NaN; the one difference, F16C quieting a signaling-NaN f16 input on
//   load, never reaches an output (that group's codes are 0 and its parameters come
//   from its other elements).
// * Packing only moves bits. The task split and the thread count change which thread
//   computes a group, never how.
#ifndef KVLAB_SIMD_AFFINE_COMMON
#define KVLAB_SIMD_AFFINE_COMMON
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "reference/affine_quantize.h"

namespace kvlab::simd::affine_detail {

constexpr float kScaleFloor = 1e-7f;  // MLX's eps on the group step (as the oracle)
constexpr int kMaxGroup = 128;        // QuantSpec::validate allows 32, 64, 128
// 64K elements (128 KiB of f16) per parallel task: each task pays the pipeline's ramp
// (a block scanned alone, a block encoded alone), the pool's claim and a new input
// stream, which at 16K cost 2 threads ~5 % (4M f16 elements, same-process A/B: median
// 0.95 hot, 0.94–0.98 cold); an 8 MiB problem still has 64 tasks for 2–16 threads.
constexpr std::int64_t kElementsPerTask = 65536;

struct GroupParams {
  float scale = 0, bias = 0;
};

// What a block of groups needs (both directions); sizes in elements/bytes per group.
struct GroupJob {
  int gs = 0, bits = 0;
  bool gpu = false;               // Rounding::mlx_gpu
  DType data_dtype = DType::f32;  // quantize: x; dequantize: out
  DType param_dtype = DType::f32; // scales/biases
  const std::byte* in = nullptr;  // quantize: x; dequantize: wq
  std::byte* out = nullptr;       // quantize: wq; dequantize: out
  std::byte* scales_out = nullptr;  // quantize
  std::byte* biases_out = nullptr;
  const std::byte* scales_in = nullptr;  // dequantize
  const std::byte* biases_in = nullptr;
};

inline float largest_code(int bits) { return static_cast<float>((1 << bits) - 1); }

inline float round_to_code(float v, bool gpu) { return gpu ? std::round(v) : std::rint(v); }

// Spec §1.2 from the group's extremes, operation for operation as the oracle.
inline GroupParams group_params(float alpha, float beta, int bits, bool gpu) {
  const float s0 = std::max((alpha - beta) / largest_code(bits), kScaleFloor);
  const bool anchor_on_min = std::abs(beta) > std::abs(alpha);
  const float s1 = anchor_on_min ? s0 : -s0;
  const float edge = anchor_on_min ? beta : alpha;
  const float q0 = round_to_code(edge / s1, gpu);
  if (q0 != 0.0f) return {edge / q0, edge};
  return {s1, 0.0f};
}

// The oracle's affine_code, for the non-finite fallback (NaN → 0; GPU: wrap mod 256).
inline std::uint8_t scalar_code(float value, const GroupParams& p, int bits, bool gpu) {
  const float n = largest_code(bits);
  const float r = round_to_code((value - p.bias) / p.scale, gpu);
  if (std::isnan(r)) return 0;
  if (!gpu) return static_cast<std::uint8_t>(std::min(std::max(r, 0.0f), n));
  const float capped = std::min(r, n);
  if (capped >= 0.0f) return static_cast<std::uint8_t>(capped);
  if (!(capped >= -0x1p31f)) return 0;
  return static_cast<std::uint8_t>(static_cast<std::int64_t>(capped) & 0xFF & ((std::int64_t{1} << bits) - 1));
}

// One group with the oracle's scalar loop (NaN-skipping `>`/`<` scan).
inline GroupParams scalar_group(const float* g, int gs, int bits, bool gpu, std::uint8_t* codes) {
  float alpha = gpu ? 0.0f : -std::numeric_limits<float>::infinity();
  float beta = std::numeric_limits<float>::infinity();
  for (int j = 0; j < gs; ++j) {
    if (g[j] > alpha) alpha = g[j];
    if (g[j] < beta) beta = g[j];
  }
  const GroupParams p = group_params(alpha, beta, bits, gpu);
  for (int j = 0; j < gs; ++j) codes[j] = scalar_code(g[j], p, bits, gpu);
  return p;
}

// Element k of a scales/biases buffer, with kvlab's own conversions (as TensorView).
inline void store_param(DType t, std::byte* base, std::size_t k, float v) {
  if (t == DType::f32) {
    std::memcpy(base + 4 * k, &v, 4);
    return;
  }
  const std::uint16_t bits = t == DType::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
  std::memcpy(base + 2 * k, &bits, 2);
}

inline float load_param(DType t, const std::byte* base, std::size_t k) {
  if (t == DType::f32) {
    float v;
    std::memcpy(&v, base + 4 * k, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, base + 2 * k, 2);
  return t == DType::f16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

}  // namespace kvlab::simd::affine_detail
#endif  // KVLAB_SIMD_AFFINE_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/affine_quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/affine_pack-inl.h"
#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace ad = kvlab::simd::affine_detail;
namespace ap = affine_pack;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// R of spec §1.2 on every lane: rint (ties to even) for mlx_cpu, round (ties away from
// zero) for mlx_gpu. round() exactly: q − trunc(q) is exact (Sterbenz for |q| >= 1,
// trivially below), so |frac| >= 0.5 is the true test; adding 0.5 then truncating would
// round 0.49999997 up (its sum rounds to 1.0f).
template <bool kGpu>
HWY_INLINE VF RoundToCode(VF q) {
  if constexpr (kGpu) {
    const DF df;
    const auto t = hn::Trunc(q);
    const auto frac = hn::Sub(q, t);
    return hn::IfThenElse(hn::Ge(hn::Abs(frac), hn::Set(df, 0.5f)), hn::Add(t, hn::CopySign(hn::Set(df, 1.0f), q)), t);
  } else {
    return hn::Round(q);
  }
}

// The code of each lane of q = (g − bias)/scale in the low 8 bits of the lane (the bits
// above are not zero; every consumer truncates): rint + clamp [0, n] (mlx_cpu), or
// round + min(·, n) + the oracle's wrap of negatives (mlx_gpu).
template <bool kGpu>
HWY_INLINE VI CodeOf(VF q, VF vn, VI vmask) {
  const DF df;
  const DI di;
  if constexpr (kGpu) {
    // min(r, n), no lower clamp; negative r (unreachable on finite groups) wraps like
    // the oracle: two's complement & (2^bits − 1); below −2^31 ConvertTo saturates to
    // INT32_MIN, whose low bits are 0, the oracle's answer there.
    return hn::And(hn::ConvertTo(di, hn::Min(RoundToCode<true>(q), vn)), vmask);
  } else {
    (void)vmask;
    // clamp(rint(q), 0, n) = rint(clamp(q, 0, n)): rint is monotone and 0, n are
    // integers (a −0 from either side becomes +0 below). c + 2^23 for c in [0, 255] lies
    // in [2^23, 2^24), where the f32 spacing is 1, so the addition itself is the RNE
    // rint and the sum's bits are 0x4B000000 + code.
    const auto c = hn::Min(hn::Max(q, hn::Zero(df)), vn);
    return hn::BitCast(di, hn::Add(c, hn::Set(df, 0x1p23f)));
  }
}

// Groups whose parameters are computed together, one group per lane (a multiple of
// every target's f32 lane count). Batching turns the per-group chain of dependent
// scalar divisions into a few vector ops and lets the extremes of 32 groups overlap.
// 32 rather than 16: a Finish (reduction tree, four vector divisions) costs about the
// same for 16 or 32 groups, and twice the groups per Finish measured 3 % faster (4-bit,
// one thread, 70 -> 68 us per 256K elements, alternated processes). Its latency is not
// what costs: issuing it half a block early measured 5 % slower.
constexpr std::size_t kBlock = 32;
static_assert(kBlock % HWY_LANES(float) == 0, "a block is whole vectors");

// The encoding's fast path trusts q' = (g − bias)·(1/scale) where it lies farther than
// this from every half-integer (header: the bound on |q' − q| is 3·2^-15 < 2^-13).
constexpr float kDoubtfulDistance = 0.5f - 0x1p-13f;

// The fused fast path (mlx_cpu, targets with FMA): q' = fl(g·r − c), c = fl(bias·r), one
// FMA instead of Sub then Mul, for groups with |c| <= kFusedOffsetLimit (header).
#if HWY_TARGET <= HWY_AVX2
constexpr bool kFusedQ = true;
#else
constexpr bool kFusedQ = false;  // MulSub is two roundings there
#endif
constexpr float kFusedOffsetLimit = 512.0f;

// q' of the fast path, by the form a group is encoded with: (g − bias)·r, or fused
// g·r − c with c = fl(bias·r). Finish (the in-range test on the extremes) and the
// encoding both call it, so the two cannot drift apart.
template <bool kFused>
HWY_INLINE VF FastQuotient(VF g, VF bias, VF recip, VF bias_recip) {
  if constexpr (kFused) return hn::MulSub(g, recip, bias_recip);
  return hn::Mul(hn::Sub(g, bias), recip);
}

// ad::group_params on kBlock groups at once (alpha/beta in, scale/bias out): the same
// IEEE ops in the same order, lane by lane; the lanes that q0 = 0 discards may hold
// inf/NaN from edge/0, which no exception flag or trap observes.
template <bool kGpu>
HWY_INLINE void BlockParams(const float* alpha, const float* beta, int bits, float* scale, float* bias) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const auto vn = hn::Set(df, ad::largest_code(bits)), floor = hn::Set(df, ad::kScaleFloor);
  const auto zero = hn::Zero(df);
  for (std::size_t j = 0; j < kBlock; j += N) {
    const auto a = hn::LoadU(df, alpha + j), b = hn::LoadU(df, beta + j);
    const auto s0 = hn::Max(hn::Div(hn::Sub(a, b), vn), floor);
    const auto anchor_on_min = hn::Gt(hn::Abs(b), hn::Abs(a));
    const auto s1 = hn::IfThenElse(anchor_on_min, s0, hn::Neg(s0));
    const auto edge = hn::IfThenElse(anchor_on_min, b, a);
    const auto q0 = RoundToCode<kGpu>(hn::Div(edge, s1));
    const auto nonzero = hn::Ne(q0, zero);
    hn::StoreU(hn::IfThenElse(nonzero, hn::Div(edge, q0), s1), df, scale + j);
    hn::StoreU(hn::IfThenElseZero(nonzero, edge), df, bias + j);
  }
}

// count (<= kBlock) f32 parameters → scales/biases elements [first, first + count);
// a whole block in vectors, a partial one element by element (no write past the end).
HWY_INLINE void StoreParams(DType t, const float* v, std::size_t count, std::byte* base, std::size_t first) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  if (count < kBlock) {
    for (std::size_t j = 0; j < count; ++j) ad::store_param(t, base, first + j, v[j]);
  } else if (t == DType::f32) {
    for (std::size_t j = 0; j < kBlock; j += N) hn::StoreU(hn::LoadU(df, v + j), df, reinterpret_cast<float*>(base) + first + j);
  } else {
    const hn::Rebind<std::uint16_t, DF> du16;
    auto* const out = reinterpret_cast<std::uint16_t*>(base) + first;
    for (std::size_t j = 0; j < kBlock; j += N) {
      const VF x = hn::LoadU(df, v + j);
      hn::StoreU(t == DType::bf16 ? DemoteToBF16(df, x) : DemoteToF16(df, x), du16, out + j);
    }
  }
}

// The extremes of kBlock groups, one lane-wise partial vector per group in v[j], down
// to one value per group: out[j] = op over the lanes of v[j]. Each level merges two
// vectors of G groups × P lanes into one of 2G groups × P/2 lanes, in group order, with
// a shuffle pair that never mixes two groups (vector halves, then u64 lane pairs, then
// f32 lane pairs): ~3 ops per vector for the whole block instead of a full lane
// reduction per group. Max/Min are exact; only which signed zero wins can depend on the
// order, which never matters (file header). v is clobbered.
#if HWY_TARGET != HWY_SCALAR  // one lane per vector: nothing to reduce
// One level: kCount vectors of groups × P lanes → kCount/2 vectors of groups × P/2.
template <std::size_t P, std::size_t kCount, class D, class Op>
HWY_INLINE void ReduceLevel(D d, hn::Vec<D>* v, Op op) {
  const hn::Repartition<std::uint64_t, D> du64;
  for (std::size_t k = 0; k < kCount / 2; ++k) {
    const hn::Vec<D> lo = v[2 * k], hi = v[2 * k + 1];
    if constexpr (P == hn::MaxLanes(D())) {
      v[k] = op(hn::ConcatLowerLower(d, hi, lo), hn::ConcatUpperUpper(d, hi, lo));
    } else if constexpr (P >= 4) {
      const auto lo64 = hn::BitCast(du64, lo), hi64 = hn::BitCast(du64, hi);
      v[k] = op(hn::BitCast(d, hn::ConcatEven(du64, hi64, lo64)), hn::BitCast(d, hn::ConcatOdd(du64, hi64, lo64)));
    } else {
      v[k] = op(hn::ConcatEven(d, hi, lo), hn::ConcatOdd(d, hi, lo));
    }
  }
}
#endif

// D: f32 lanes (the f32 scan's extremes) or i32 lanes (the 16-bit scan's ordered keys).
template <class D, class Op>
HWY_INLINE void ReduceBlock(D d, hn::Vec<D>* v, Op op, hn::TFromD<D>* out) {
  constexpr std::size_t N = hn::MaxLanes(D());  // full vectors: == Lanes(d)
  static_assert(N <= kBlock && kBlock % N == 0);
#if HWY_TARGET != HWY_SCALAR
  if constexpr (N >= 2) ReduceLevel<N, kBlock>(d, v, op);
  if constexpr (N >= 4) ReduceLevel<N / 2, kBlock / 2>(d, v, op);
  if constexpr (N >= 8) ReduceLevel<N / 4, kBlock / 4>(d, v, op);
  if constexpr (N >= 16) ReduceLevel<N / 8, kBlock / 8>(d, v, op);
  static_assert(N <= 16, "more levels needed");
#endif
  (void)op;
  for (std::size_t k = 0; k < kBlock / N; ++k) hn::StoreU(v[k], d, out + k * N);
}

// Whether a group holds no NaN/±inf (only asked when its block's sum is not finite).
HWY_INLINE bool GroupIsFinite(const float* g, std::size_t len) {
  const DF df;
  VF probe = hn::Zero(df);
  for (std::size_t i = 0; i < len; i += hn::Lanes(df)) probe = hn::Add(probe, hn::Mul(hn::LoadU(df, g + i), hn::Zero(df)));
  return hn::AllTrue(df, hn::IsFinite(probe));  // v·0 is ±0 for every finite v, NaN otherwise
}

// scales/biases elements [first, first + count) → f32 (exact), vectorized for whole
// blocks; a partial block is read element by element (no read past the buffer).
HWY_INLINE void LoadParams(DType t, const std::byte* base, std::size_t first, std::size_t count, float* v) {
  if (t == DType::f32) {
    std::memcpy(v, base + 4 * first, 4 * count);
  } else if (count < kBlock) {
    for (std::size_t j = 0; j < count; ++j) v[j] = ad::load_param(t, base, first + j);
  } else {
    const auto* src = reinterpret_cast<const std::uint16_t*>(base) + first;
    for (std::size_t j = 0; j < kBlock; j += hn::Lanes(DF()))
      hn::StoreU(t == DType::bf16 ? LoadBF16(DF(), src + j) : LoadF16(DF(), src + j), DF(), v + j);
  }
}

// How a quantizer reads x: f32 as is (also 16-bit inputs on the SCALAR target, converted
// during the scan), or f16/bf16 scanned as 16-bit patterns and converted while encoding.
enum class Input { f32, f16, bf16 };

// The 16-bit scan finds a group's extremes without converting it: a sign-magnitude
// pattern p maps to the ordered key p ^ ((p >> 15) & 0x7FFF) (i16, arithmetic shift),
// so negatives count down from −1 (−0) and positives up from 0 (+0), and integer Max/Min
// of keys are the float max/min (f16 → f32 and bf16 → f32 are exact and monotone; only
// −0 < +0 differs from `>`, which never matters, file header). The key maps back with
// the same XOR. A NaN/±inf pattern has |p| >= the exponent mask, so a group is finite iff
// its max key is below kInfKey and its min key above −kInfKey − 1 (−inf's key).
template <Input kIn>
constexpr std::int32_t kInfKey = kIn == Input::bf16 ? 0x7F80 : 0x7C00;

#if HWY_TARGET != HWY_SCALAR
constexpr bool kScanBits = true;
#else
constexpr bool kScanBits = false;  // one lane per vector: no i16 pairs to fold
#endif

// The scan asks for the same group of the block after next's scan (kBlock groups ahead)
// to be fetched: the scan is where a cold group is first read, and while the encoding of
// the previous block keeps the core busy the hardware streamers alone left ~40 % of a
// cold call's time waiting on DRAM (measured 8–15 % faster cold with it, no change hot).
// An integer address: a prefetch never faults, past the input's end included.
HWY_INLINE void PrefetchAhead(const void* group, std::size_t group_bytes) {
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(group) + kBlock * group_bytes;
  for (std::size_t line = 0; line < group_bytes; line += 64)
    hwy::Prefetch(reinterpret_cast<const std::uint8_t*>(ahead + line));
}

// One block of up to kBlock consecutive groups, from its scan to its encoding.
struct Block {
  std::size_t first = 0, count = 0;               // flattened index of its first group; groups
  alignas(64) float buf[kBlock * ad::kMaxGroup];  // f32 scan of 16-bit groups (SCALAR target)
  alignas(64) float alpha[kBlock], beta[kBlock], scale[kBlock], bias[kBlock], recip[kBlock];
  alignas(64) float bias_recip[kBlock];  // fl(bias·(1/scale)), the fused fast path's offset
  alignas(64) std::int32_t key_pair[kBlock];  // 16-bit scan: max key | ~min key << 16
  VF maxes[kBlock], mins[kBlock], probes[kBlock];  // f32 scan: per group, lane-wise
  VI key_pairs[kBlock];                            // 16-bit scan: the same, lane-wise
  const float* group[kBlock];                      // f32 scan: each group's f32 values
  const std::uint16_t* group16[kBlock];            // 16-bit scan: each group's patterns
  // Bit j: group j holds no NaN/±inf; group j's fast-path codes need no clamp; group j
  // takes the fused fast path (all set in Finish).
  std::uint32_t finite = 0, in_range = 0, fused = 0;
  bool Finite(std::size_t j) const { return ((finite >> j) & 1u) != 0; }
  bool InRange(std::size_t j) const { return ((in_range >> j) & 1u) != 0; }
  bool Fused(std::size_t j) const { return ((fused >> j) & 1u) != 0; }
};
static_assert(kBlock <= 32, "a block's flags are bits of a u32");

// The lanes of `mask` as bits (lane k → bit k), for a vector of lanes [j, j + N).
template <class D>
HWY_INLINE std::uint32_t MaskBits(D d, hn::Mask<D> mask, std::size_t j) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (hn::MaxLanes(D()) == 16) return static_cast<std::uint32_t>(mask.raw) << j;  // a k-register
#endif
  std::uint8_t bytes[8] = {};
  hn::StoreMaskBits(d, mask, bytes);
  std::uint32_t bits = 0;
  std::memcpy(&bits, bytes, sizeof bits);
  return (hn::Lanes(d) >= 32 ? bits : bits & ((1u << hn::Lanes(d)) - 1)) << j;
}

// The three steps of quantizing a block: Scan each group (its extremes and whether it is
// finite), Finish the block (its parameters, vectorized; the scalar redo of NaN/Inf
// groups; the stored scales/biases), Encode each group (the codes, packed straight into
// wq). kBits: 2/4/8 packed in registers, 0 = any width via a u8 buffer.
template <int kBits, bool kGpu, Input kIn>
class GroupQuantizer {
  static constexpr bool kFuse = kFusedQ && !kGpu;  // the fused form is taken where allowed
  // The fast path's codes are clamped by StoreCodesFour's saturating packs at no cost, so
  // no group needs Finish's in-range test.
  static constexpr bool kPacksClamp = ap::kPacksFour<kBits> && !kGpu;

 public:
  explicit GroupQuantizer(const ad::GroupJob& job)
      : job_(job),
        len_(static_cast<std::size_t>(job.gs)),
        group_bytes_(len_ * static_cast<std::size_t>(job.bits) / 8),
        elem_size_(dtype_size(job.data_dtype)) {}

  HWY_INLINE void Scan(Block& b, std::size_t j) const {
    if constexpr (kIn == Input::f32) {
      ScanF32(b, j);
    } else {
      ScanBits(b, j);
    }
  }

  void Finish(Block& b) {
    const DF df;
    [[maybe_unused]] const DI di;  // the 16-bit branch (not on SCALAR)
    const std::size_t N = hn::Lanes(df);
    if constexpr (kIn == Input::f32) {
      for (std::size_t j = b.count; j < kBlock; ++j) b.maxes[j] = b.mins[j] = b.probes[j] = hn::Zero(df);  // unused
      ReduceBlock(df, b.maxes, [](VF x, VF y) { return hn::Max(x, y); }, b.alpha);
      ReduceBlock(df, b.mins, [](VF x, VF y) { return hn::Min(x, y); }, b.beta);
      // One test per block (a tree of adds: short chains); a non-finite block sum (NaN/inf
      // somewhere, or an overflow) is resolved group by group.
      for (std::size_t w = 1; w < kBlock; w *= 2)
        for (std::size_t j = 0; j + w < kBlock; j += 2 * w) b.probes[j] = hn::Add(b.probes[j], b.probes[j + w]);
      b.finite = 0;
      const bool block_finite = hn::AllTrue(df, hn::IsFinite(b.probes[0]));
      for (std::size_t j = 0; j < b.count; ++j)
        if (block_finite || GroupIsFinite(b.group[j], len_)) b.finite |= 1u << j;
    } else {
#if HWY_TARGET != HWY_SCALAR  // kScanBits (SCALAR quantizes 16-bit input as Input::f32)
      for (std::size_t j = b.count; j < kBlock; ++j) b.key_pairs[j] = hn::Zero(di);  // unused
      // One reduction for both extremes: i16 Max on the pairs is the max of the max keys
      // (low halves) and of the complemented min keys (high halves: ~ reverses order).
      const hn::Repartition<std::int16_t, DF> d16;
      const auto max16 = [d16](VI x, VI y) { return hn::BitCast(DI(), hn::Max(hn::BitCast(d16, x), hn::BitCast(d16, y))); };
      ReduceBlock(di, b.key_pairs, max16, b.key_pair);
      b.finite = 0;
      for (std::size_t j = 0; j < kBlock; j += N) {
        const VI pair = hn::LoadU(di, b.key_pair + j);
        const VI kmax = hn::ShiftRight<16>(hn::ShiftLeft<16>(pair)), kmin = hn::Not(hn::ShiftRight<16>(pair));
        hn::StoreU(KeyToF32(kmax), df, b.alpha + j);
        hn::StoreU(KeyToF32(kmin), df, b.beta + j);
        const VI inf_key = hn::Set(di, kInfKey<kIn>), minus_inf_key = hn::Set(di, -kInfKey<kIn> - 1);
        b.finite |= MaskBits(di, hn::And(hn::Lt(kmax, inf_key), hn::Gt(kmin, minus_inf_key)), j);
      }
#endif
    }
    BlockParams<kGpu>(b.alpha, b.beta, job_.bits, b.scale, b.bias);
    // A code rint(q') needs no clamp when q' is in [−0.5, n + 0.5): −0.5 rounds to −0
    // (code 0), and n + 0.5 would round to the even n + 1.
    const VF lowest = hn::Set(df, -0.5f), beyond = hn::Set(df, ad::largest_code(Bits()) + 0.5f);
    b.in_range = 0;
    b.fused = 0;
    for (std::size_t j = 0; j < kBlock; j += N) {
      const VF bias = hn::LoadU(df, b.bias + j);
      const VF recip = hn::Div(hn::Set(df, 1.0f), hn::LoadU(df, b.scale + j));
      hn::StoreU(recip, df, b.recip + j);
      // Either q' is monotone in g (IEEE Sub and Mul, and the single rounding of the FMA,
      // round monotonically), so the group's q' lie between those of its extremes: the
      // extremes' q' by the form the group is encoded with. Lanes of unused or
      // non-finite groups compare false (NaN) or are never encoded.
      [[maybe_unused]] VF bias_recip = recip;  // (unused unless fused)
      [[maybe_unused]] auto fused = hn::FirstN(df, 0);
      if constexpr (kFuse) {
        // The fused form where |fl(bias·r)| <= kFusedOffsetLimit (false for NaN; always,
        // on data spanning zero, header).
        bias_recip = hn::Mul(bias, recip);
        hn::StoreU(bias_recip, df, b.bias_recip + j);
        fused = hn::Le(hn::Abs(bias_recip), hn::Set(df, kFusedOffsetLimit));
        b.fused |= MaskBits(df, fused, j);
      }
      if constexpr (!kPacksClamp) {
        const VF alpha = hn::LoadU(df, b.alpha + j), beta = hn::LoadU(df, b.beta + j);
        VF qa = FastQuotient<false>(alpha, bias, recip, recip), qb = FastQuotient<false>(beta, bias, recip, recip);
        if constexpr (kFuse) {
          qa = hn::IfThenElse(fused, FastQuotient<true>(alpha, bias, recip, bias_recip), qa);
          qb = hn::IfThenElse(fused, FastQuotient<true>(beta, bias, recip, bias_recip), qb);
        }
        b.in_range |= MaskBits(df, hn::And(hn::Ge(hn::Min(qa, qb), lowest), hn::Lt(hn::Max(qa, qb), beyond)), j);
      }
    }
    // The groups holding NaN/±inf (rare), by their bits.
    const std::uint32_t used = b.count >= 32 ? ~0u : (1u << b.count) - 1;
    for (std::uint32_t odd = used & ~b.finite; odd != 0; odd &= odd - 1) {
      const auto j = static_cast<std::size_t>(std::countr_zero(odd));
      const ad::GroupParams p = ad::scalar_group(GroupF32(b, j), job_.gs, job_.bits, kGpu, codes_);
      b.scale[j] = p.scale;
      b.bias[j] = p.bias;
      ad::pack_codes(codes_, len_, job_.bits, Out(b, j));
    }
    // Codes come from the f32 parameters; the stored copies are rounded (RNE) to x.dtype.
    StoreParams(job_.param_dtype, b.scale, b.count, job_.scales_out, b.first);
    StoreParams(job_.param_dtype, b.bias, b.count, job_.biases_out, b.first);
  }

  // The codes of group j, packed into wq: first through the reciprocal, redone with the
  // true division when any lane of the group is in doubt (header).
  HWY_INLINE void Encode(const Block& b, std::size_t j) {
    if (!b.Finite(j)) return;
    if (!std::isfinite(b.recip[j])) return (void)EncodeWith<true, true>(b, j);
    bool certain;
    if constexpr (kGpu) {
      certain = EncodeWith<false, true>(b, j);
    } else if (kFuse && b.Fused(j)) {
      certain = kPacksClamp || b.InRange(j) ? EncodeWith<false, false, true>(b, j) : EncodeWith<false, true, true>(b, j);
    } else {
      certain = kPacksClamp || b.InRange(j) ? EncodeWith<false, false>(b, j) : EncodeWith<false, true>(b, j);
    }
    if (!certain) EncodeWith<true, true>(b, j);
  }

 private:
  int Bits() const { return kBits != 0 ? kBits : job_.bits; }

  // The f32 scan: each group → f32 (16-bit inputs on the SCALAR target: exact scalar
  // conversion into b.buf), running Max/Min and a sum that flags NaN/±inf.
  HWY_INLINE void ScanF32(Block& b, std::size_t j) const {
    const DF df;
    const std::size_t N = hn::Lanes(df);
    const std::byte* src = job_.in + (b.first + j) * len_ * elem_size_;
    PrefetchAhead(src, len_ * elem_size_);
    // GPU kernels start the running max at 0 (oracle header, spec §1.2 (a)).
    const VF max_init = hn::Set(df, kGpu ? 0.0f : -std::numeric_limits<float>::infinity());
    const VF min_init = hn::Set(df, std::numeric_limits<float>::infinity());
    // Two accumulator sets (even/odd vectors; len/N is even) halve the dependency
    // chains. probe: the group's sum, finite unless some value is NaN/±inf (or the sum
    // overflows, which only sends a finite group to the exact scalar path too).
    VF max0 = max_init, max1 = max_init, min0 = min_init, min1 = min_init, sum0 = hn::Zero(df), sum1 = sum0;
    const float* g = reinterpret_cast<const float*>(src);
    if (job_.data_dtype != DType::f32) {
      float* dst = b.buf + j * len_;
      const auto* src16 = reinterpret_cast<const std::uint16_t*>(src);
      const bool bf16 = job_.data_dtype == DType::bf16;
      for (std::size_t i = 0; i < len_; ++i) dst[i] = bf16 ? bf16_bits_to_f32(src16[i]) : f16_bits_to_f32(src16[i]);
      g = dst;
    }
    b.group[j] = g;
    for (std::size_t i = 0; i < len_; i += 2 * N) {
      const VF v0 = hn::LoadU(df, g + i), v1 = hn::LoadU(df, g + i + N);
      max0 = hn::Max(max0, v0);
      max1 = hn::Max(max1, v1);
      min0 = hn::Min(min0, v0);
      min1 = hn::Min(min1, v1);
      sum0 = hn::Add(sum0, v0);
      sum1 = hn::Add(sum1, v1);
    }
    b.maxes[j] = hn::Max(max0, max1);
    b.mins[j] = hn::Min(min0, min1);
    b.probes[j] = hn::Add(sum0, sum1);
  }

  // The 16-bit scan: ordered keys of 2N patterns per vector, running Max/Min, then the
  // two keys of each i32 lane folded into one, max in the low half and the complement of
  // min in the high half (so that one i16 Max reduces both), ready for ReduceBlock.
  HWY_INLINE void ScanBits(Block& b, std::size_t j) const {
#if HWY_TARGET != HWY_SCALAR  // kScanBits
    {
      const hn::Repartition<std::int16_t, DF> d16;
      const DI di;
      const std::size_t N16 = hn::Lanes(d16);
      const auto* src = reinterpret_cast<const std::uint16_t*>(job_.in) + (b.first + j) * len_;
      b.group16[j] = src;
      PrefetchAhead(src, 2 * len_);
      const auto* p = reinterpret_cast<const std::int16_t*>(src);
      auto kmax = hn::Set(d16, static_cast<std::int16_t>(kGpu ? 0 : -32768));  // GPU: max starts at +0
      auto kmin = hn::Set(d16, static_cast<std::int16_t>(32767));
      const auto magnitude = hn::Set(d16, static_cast<std::int16_t>(0x7FFF));
      for (std::size_t i = 0; i < len_; i += N16) {
        const auto x = hn::LoadU(d16, p + i);
        const auto key = hn::Xor(x, hn::And(hn::ShiftRight<15>(x), magnitude));
        kmax = hn::Max(kmax, key);
        kmin = hn::Min(kmin, key);
      }
      const hn::Repartition<std::uint32_t, DF> du32;
      const auto upper_of = [&](auto keys) { return hn::BitCast(d16, hn::ShiftRight<16>(hn::BitCast(du32, keys))); };
      const VI top = hn::BitCast(di, hn::Max(kmax, upper_of(kmax)));        // low half: the max key
      const VI bottom = hn::BitCast(di, hn::Min(kmin, upper_of(kmin)));     // low half: the min key
      b.key_pairs[j] = hn::Or(hn::And(top, hn::Set(di, 0xFFFF)), hn::ShiftLeft<16>(hn::Not(bottom)));
    }
#else
    (void)b;
    (void)j;
#endif
  }

  // Ordered keys (sign-extended in i32 lanes) → the f32 values of their patterns.
  HWY_INLINE VF KeyToF32(VI key) const {
    const DF df;
    const hn::RebindToUnsigned<DF> du;
    const VI bits = hn::Xor(key, hn::And(hn::ShiftRight<15>(key), hn::Set(DI(), 0x7FFF)));
    if constexpr (kIn == Input::bf16) {
      return BF16BitsToF32(df, hn::BitCast(du, hn::And(bits, hn::Set(DI(), 0xFFFF))));
    } else {
      return F16BitsToF32(df, hn::BitCast(du, bits));  // reads the low 16 bits only
    }
  }

  // Lanes i.. of group j as f32 (finite groups only: F16C's NaN quieting cannot show).
  HWY_INLINE VF Values(const Block& b, std::size_t j, std::size_t i) const {
    if constexpr (kIn == Input::f32) {
      return hn::LoadU(DF(), b.group[j] + i);
    } else if constexpr (kIn == Input::bf16) {
      return LoadBF16(DF(), b.group16[j] + i);
    } else {
      return LoadF16QuietingNaN(DF(), b.group16[j] + i);
    }
  }

  // Group j as f32 values, for the scalar path of a non-finite group (exact conversions).
  const float* GroupF32(const Block& b, std::size_t j) {
    if constexpr (kIn == Input::f32) {
      return b.group[j];
    } else {
      const std::uint16_t* src = b.group16[j];
      for (std::size_t i = 0; i < len_; ++i)
        values_[i] = kIn == Input::bf16 ? bf16_bits_to_f32(src[i]) : f16_bits_to_f32(src[i]);
      return values_;
    }
  }

  // kExact: q = (g − bias)/scale, the oracle's division. Otherwise q' = (g − bias)·r,
  // r = 1/scale, and the result says whether every lane's code is certainly the
  // oracle's (a false return means the group must be redone exactly; what was written
  // is overwritten then). mlx_cpu: y = q' + 1.5·2^23 rounds q' to an integer k with RNE
  // (|q'| <= 2n + 1 < 2^22 on a finite group, so y is in [2^23, 2^24), spacing 1;
  // 1.5·2^23 is even, so a tie goes to the even k like rint), y − 1.5·2^23 = k and
  // q' − k are exact (Sterbenz), and y's bits are 0x4B400000 + k, monotone in k: the
  // clamp to [0, n] is an integer Min/Max on them, left out (kClamp false) for a group
  // whose q' all lie in [−0.5, n + 0.5) (Finish). The low byte is the code.
  template <bool kExact, bool kClamp, bool kFused = false>
  HWY_INLINE bool EncodeWith(const Block& b, std::size_t j) {
    const DF df;
    const DI di;
    const std::size_t N = hn::Lanes(df);
    const VF vn = hn::Set(df, ad::largest_code(Bits()));
    const VI vmask = hn::Set(di, (1 << Bits()) - 1);
    const VF vb = hn::Set(df, b.bias[j]);
    const VF vs = hn::Set(df, kExact ? b.scale[j] : b.recip[j]);
    const VF vbr = kFused ? hn::Set(df, b.bias_recip[j]) : vs;  // (unused unless fused)
    const VF magic = hn::Set(df, 0x1.8p23f);
    const VI code_zero = hn::BitCast(di, magic), code_n = hn::Add(code_zero, hn::Set(di, (1 << Bits()) - 1));
    std::uint8_t* const out = Out(b, j);
    VF doubt = hn::Zero(df);  // the largest distance to the nearest integer (fast path)
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (!kExact && !kGpu && ap::kPacksFour<kBits>) {
      // Four vectors per step (two for a group of 32): rint(q') as an integer (vcvtps2dq,
      // RNE; |q'| < 2^22 on this path), clamped and packed by StoreCodesFour. The four
      // fractions meet in a tree, so the doubt chain grows by one vrangeps per step.
      const auto larger = [](__m512 x, __m512 y) { return _mm512_range_ps(x, y, 0x0B); };
      const auto quotient = [&](std::size_t i, __m512& fraction) {
        const VF q = FastQuotient<kFused>(Values(b, j, i), vb, vs, vbr);
        fraction = _mm512_reduce_ps(q.raw, 0x08);
        return _mm512_cvtps_epi32(q.raw);
      };
      __m512 f0, f1, f2, f3;
      if (len_ < 4 * N) {
        const __m512i k[4] = {quotient(0, f0), quotient(N, f1), _mm512_setzero_si512(), _mm512_setzero_si512()};
        doubt = VF{larger(f0, f1)};
        ap::StoreCodesFour<kBits>(k, true, out);
      } else {
        for (std::size_t i = 0; i < len_; i += 4 * N) {
          const __m512i k[4] = {quotient(i, f0), quotient(i + N, f1), quotient(i + 2 * N, f2),
                                quotient(i + 3 * N, f3)};
          doubt = VF{larger(doubt.raw, larger(larger(f0, f1), larger(f2, f3)))};
          ap::StoreCodesFour<kBits>(k, false, out + i * kBits / 8);
        }
      }
      return hn::AllFalse(df, hn::Gt(doubt, hn::Set(df, kDoubtfulDistance)));
    }
#endif
    for (std::size_t i = 0; i < len_; i += N) {
      const VF g = Values(b, j, i);
      VI ci;
      if constexpr (kExact) {
        ci = CodeOf<kGpu>(hn::Div(hn::Sub(g, vb), vs), vn, vmask);
      } else if constexpr (!kGpu) {
        const VF q = FastQuotient<kFused>(g, vb, vs, vbr);
        const VF y = hn::Add(q, magic);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        // vreduceps 0x08: q' − rint(q') (RNE, exact; no precision exception), the same
        // value as q' − (y − 1.5·2^23) in one µop instead of two; vrangeps 0x0B: the
        // larger magnitude, sign cleared = max(|doubt|, |fraction|) in one (Abs + Max
        // take two).
        const VF fraction{_mm512_reduce_ps(q.raw, 0x08)};
        doubt = VF{_mm512_range_ps(doubt.raw, fraction.raw, 0x0B)};
#else
        const VF fraction = hn::Sub(q, hn::Sub(y, magic));
        doubt = hn::Max(doubt, hn::Abs(fraction));
#endif
        ci = hn::BitCast(di, y);
        if constexpr (kClamp) ci = hn::Min(hn::Max(ci, code_zero), code_n);
      } else {
        const VF q = FastQuotient<false>(g, vb, vs, vbr);
        const VF k = hn::Round(q);
        VF dist = hn::Abs(hn::Sub(q, k));
        // mlx_gpu wraps negative codes, so a negative q' is in doubt as a whole.
        dist = hn::IfThenElse(hn::Lt(q, hn::Zero(df)), hn::Set(df, 1.0f), dist);
        doubt = hn::Max(doubt, dist);
        ci = CodeOf<kGpu>(k, vn, vmask);
      }
      if constexpr (ap::kInRegisters<kBits>) {
        ap::StoreCodes<kBits>(di, ci, out + i * kBits / 8);
      } else {
        const hn::Rebind<std::uint8_t, DI> du8;
        hn::StoreU(hn::TruncateTo(du8, hn::BitCast(hn::RebindToUnsigned<DI>(), ci)), du8, codes_ + i);
      }
    }
    if constexpr (!ap::kInRegisters<kBits>) ad::pack_codes(codes_, len_, job_.bits, out);
    return kExact || hn::AllFalse(df, hn::Gt(doubt, hn::Set(df, kDoubtfulDistance)));
  }

  std::uint8_t* Out(const Block& b, std::size_t j) const {
    return reinterpret_cast<std::uint8_t*>(job_.out) + (b.first + j) * group_bytes_;
  }

  const ad::GroupJob& job_;
  const std::size_t len_, group_bytes_, elem_size_;
  alignas(64) std::uint8_t codes_[ad::kMaxGroup];  // the u8 code path and the scalar redo
  alignas(64) float values_[ad::kMaxGroup];        // a non-finite 16-bit group as f32
};

// Groups [g0, g1) of the flattened x, block after block, software-pipelined: the
// encoding of a block is interleaved group by group with the scan of the next block
// (loads and Min/Max), which one block's encoding alone would keep out of the reorder
// window.
template <int kBits, bool kGpu, Input kIn>
void QuantizeGroupsT(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  if (g0 >= g1) return;
  GroupQuantizer<kBits, kGpu, kIn> q(job);
  Block blocks[2];
  Block* cur = &blocks[0];
  Block* next = &blocks[1];
  const auto start = [&](Block& b, std::int64_t first) {
    b.first = static_cast<std::size_t>(first);
    b.count = std::min(kBlock, static_cast<std::size_t>(g1 - first));
  };
  start(*cur, g0);
  for (std::size_t j = 0; j < cur->count; ++j) q.Scan(*cur, j);
  for (std::int64_t b0 = g0; b0 < g1; b0 += static_cast<std::int64_t>(kBlock)) {
    q.Finish(*cur);
    const std::int64_t n0 = b0 + static_cast<std::int64_t>(kBlock);
    next->count = 0;
    if (n0 < g1) start(*next, n0);
    for (std::size_t j = 0; j < kBlock; ++j) {
      if (j < cur->count) q.Encode(*cur, j);
      if (j < next->count) q.Scan(*next, j);
    }
    std::swap(cur, next);
  }
}

template <int kBits, bool kGpu>
void QuantizeGroupsIn(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  if constexpr (kScanBits) {
    if (job.data_dtype == DType::f16) return QuantizeGroupsT<kBits, kGpu, Input::f16>(job, g0, g1);
    if (job.data_dtype == DType::bf16) return QuantizeGroupsT<kBits, kGpu, Input::bf16>(job, g0, g1);
  }
  return QuantizeGroupsT<kBits, kGpu, Input::f32>(job, g0, g1);
}

template <bool kGpu>
void QuantizeGroupsFor(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  switch (job.bits) {
    case 2: return QuantizeGroupsIn<2, kGpu>(job, g0, g1);
    case 4: return QuantizeGroupsIn<4, kGpu>(job, g0, g1);
    case 8: return QuantizeGroupsIn<8, kGpu>(job, g0, g1);
    default: return QuantizeGroupsIn<0, kGpu>(job, g0, g1);
  }
}

void QuantizeGroups(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  if (job.gpu) QuantizeGroupsFor<true>(job, g0, g1);
  else QuantizeGroupsFor<false>(job, g0, g1);
}

// out = code·scale + bias in f32, multiply then add (never fused; see CMakeLists), then
// one RNE rounding to the output dtype; in blocks of kBlock groups (their parameters
// converted together).
template <int kBits>
void DequantizeGroupsT(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  const DF df;
  const DI di;
  const hn::Rebind<std::uint8_t, DI> du8;
  const hn::Rebind<std::uint16_t, DF> du16;
  const std::size_t N = hn::Lanes(df);
  const auto len = static_cast<std::size_t>(job.gs);
  const std::size_t group_bytes = len * static_cast<std::size_t>(job.bits) / 8;
  alignas(64) std::uint8_t codes[ad::kMaxGroup];
  alignas(64) float scale[kBlock], bias[kBlock];

  const auto run = [&](auto store) {
    for (std::int64_t b0 = g0; b0 < g1; b0 += static_cast<std::int64_t>(kBlock)) {
      const auto first = static_cast<std::size_t>(b0);
      const std::size_t count = std::min(kBlock, static_cast<std::size_t>(g1 - b0));
      LoadParams(job.param_dtype, job.scales_in, first, count, scale);
      LoadParams(job.param_dtype, job.biases_in, first, count, bias);
      for (std::size_t j = 0; j < count; ++j) {
        const auto* const in = reinterpret_cast<const std::uint8_t*>(job.in) + (first + j) * group_bytes;
        const auto vs = hn::Set(df, scale[j]), vb = hn::Set(df, bias[j]);
        if constexpr (!ap::kInRegisters<kBits>) ad::unpack_codes(in, len, job.bits, codes);
        for (std::size_t i = 0; i < len; i += N) {
          VI ci;
          if constexpr (ap::kInRegisters<kBits>) {
            ci = ap::LoadCodes<kBits>(di, in + i * kBits / 8);
          } else {
            ci = hn::PromoteTo(di, hn::LoadU(du8, codes + i));
          }
          store(hn::Add(hn::Mul(hn::ConvertTo(df, ci), vs), vb), (first + j) * len + i);
        }
      }
    }
  };
  auto* const out32 = reinterpret_cast<float*>(job.out);
  auto* const out16 = reinterpret_cast<std::uint16_t*>(job.out);
  switch (job.data_dtype) {
    case DType::f16: return run([&](VF v, std::size_t e) { hn::StoreU(DemoteToF16(df, v), du16, out16 + e); });
    case DType::bf16: return run([&](VF v, std::size_t e) { hn::StoreU(DemoteToBF16(df, v), du16, out16 + e); });
    default: return run([&](VF v, std::size_t e) { hn::StoreU(v, df, out32 + e); });
  }
}

void DequantizeGroups(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  switch (job.bits) {
    case 2: return DequantizeGroupsT<2>(job, g0, g1);
    case 4: return DequantizeGroupsT<4>(job, g0, g1);
    case 8: return DequantizeGroupsT<8>(job, g0, g1);
    default: return DequantizeGroupsT<0>(job, g0, g1);
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(QuantizeGroups);
HWY_EXPORT(DequantizeGroups);

namespace {

using GroupsFn = void (*)(const affine_detail::GroupJob&, std::int64_t, std::int64_t);

// Runs fn over `groups` groups in tasks of kElementsPerTask/gs groups: a split fixed by
// the problem, never by the pool size.
void run_in_tasks(GroupsFn fn, const affine_detail::GroupJob& job, std::int64_t groups) {
  KVLAB_REQUIRE(job.gs > 0 && job.gs <= affine_detail::kMaxGroup && job.gs % 32 == 0, internal, "group size ",
                job.gs, " is outside the SIMD kernel's 32..", affine_detail::kMaxGroup);
  const std::int64_t per_task = std::max<std::int64_t>(1, affine_detail::kElementsPerTask / job.gs);
  parallel_for((groups + per_task - 1) / per_task,
               [&](std::int64_t t) { fn(job, t * per_task, std::min(groups, (t + 1) * per_task)); });
}

// What both directions share: the group shape, the dtypes and the streams (quantize: x →
// wq; dequantize: wq → out).
affine_detail::GroupJob job_of(const QuantSpec& spec, DType data, DType params, const std::byte* in, std::byte* out) {
  affine_detail::GroupJob job;
  job.gs = spec.group_size;
  job.bits = spec.bits;
  job.data_dtype = data;
  job.param_dtype = params;
  job.in = in;
  job.out = out;
  return job;
}

}  // namespace

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding, const TensorView& wq,
                     const TensorView& scales, const TensorView& biases) {
  ref::validate_affine_quantize(x, spec, wq, scales, biases);  // the oracle's checks and messages
  KVLAB_REQUIRE(rounding == Rounding::mlx_cpu || rounding == Rounding::mlx_gpu, invalid_argument,
                "unknown rounding ", static_cast<int>(rounding));
  affine_detail::GroupJob job = job_of(spec, x.dtype, scales.dtype, x.data, wq.data);
  job.gpu = rounding == Rounding::mlx_gpu;
  job.scales_out = scales.data;
  job.biases_out = biases.data;
  run_in_tasks(&HWY_DYNAMIC_DISPATCH(QuantizeGroups), job, scales.numel());
}

void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                       const QuantSpec& spec, const TensorView& out) {
  ref::validate_affine_dequantize(wq, scales, biases, spec, out);  // the oracle's checks and messages
  affine_detail::GroupJob job = job_of(spec, out.dtype, scales.dtype, wq.data, out.data);
  job.scales_in = scales.data;
  job.biases_in = biases.data;
  run_in_tasks(&HWY_DYNAMIC_DISPATCH(DequantizeGroups), job, scales.numel());
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
