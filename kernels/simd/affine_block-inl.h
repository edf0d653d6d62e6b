// Per-target pieces of the SIMD affine kernels that work on a block of kBlock groups
// (kernels/simd/affine_quantize.cc, whose header gives the exactness argument, and
// affine_dequantize.cc): rounding to codes, the parameters of a block
// (docs/quantization.md §Affine parameters), the block's extreme reductions, parameter loads and
// stores, the 16-bit scan's ordered keys, and the Block scratch of the quantizer's pipeline.
#if defined(KVLAB_SIMD_AFFINE_BLOCK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVLAB_SIMD_AFFINE_BLOCK_INL_H_
#undef KVLAB_SIMD_AFFINE_BLOCK_INL_H_
#else
#define KVLAB_SIMD_AFFINE_BLOCK_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/affine_common.h"
#include "kernels/simd/affine_pack-inl.h"
#include "kernels/simd/group_reduce-inl.h"
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

// R of docs/quantization.md §Affine parameters on every lane: rint (ties to even) for mlx_cpu,
// round (ties away from zero) for mlx_gpu. round() exactly: q − trunc(q) is exact (Sterbenz
// for |q| >= 1, trivially below), so |frac| >= 0.5 is the true test; adding 0.5 then
// truncating would round 0.49999997 up (its sum rounds to 1.0f).
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
// same for 16 or 32 groups, and twice the groups per Finish measured faster. Its latency
// is not what costs: issuing it half a block early measured slower
// (docs/benchmarks.md §Measurements behind kernel choices).
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
// to one value per group: out[j] = op over the lanes of v[j] (ReduceGroups: ~3 ops per
// vector for the whole block instead of a full lane reduction per group). Max/Min are
// exact; only which signed zero wins can depend on the order, which never matters (file
// header). v is clobbered (not on AVX-512).
// D: f32 lanes (the f32 scan's extremes) or i32 lanes (the 16-bit scan's ordered keys).
template <class D, class Op>
HWY_INLINE void ReduceBlock(D d, hn::Vec<D>* v, Op op, hn::TFromD<D>* out) {
  constexpr std::size_t N = hn::MaxLanes(D());  // full vectors: == Lanes(d)
#if HWY_TARGET <= HWY_AVX3
  // With 32 vector registers a local copy, unrolled, keeps the levels in registers:
  // reduced in place in the block, each level reloaded the previous level's stores.
  // (AVX2's 16 would spill the 16-vector level.)
  hn::Vec<D> local[kBlock];
#pragma GCC unroll 32
  for (std::size_t k = 0; k < kBlock; ++k) local[k] = v[k];
  v = local;
#endif
  ReduceGroups<kBlock>(d, v, op);
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
// the previous block keeps the core busy the hardware streamers alone left much of a cold
// call's time waiting on DRAM (measured faster cold with it, no change hot:
// docs/benchmarks.md §Measurements behind kernel choices).
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
  alignas(64) float scaled_recip[kBlock], scaled_offset[kBlock];  // the scaled path's R and C (AVX3_DL, AVX2)
  alignas(64) std::int32_t key_pair[kBlock];  // 16-bit scan: max key | ~min key << 16
  VF maxes[kBlock], mins[kBlock], probes[kBlock];  // f32 scan: per group, lane-wise
  VI key_pairs[kBlock];                            // 16-bit scan: the same, lane-wise
  const float* group[kBlock];                      // f32 scan: each group's f32 values
  const std::uint16_t* group16[kBlock];            // 16-bit scan: each group's patterns
  // Bit j: group j holds no NaN/±inf; group j's fast-path codes need no clamp; group j
  // takes the fused fast path; group j takes the scaled path (all set in Finish).
  std::uint32_t finite = 0, in_range = 0, fused = 0, scaled = 0;
  bool Finite(std::size_t j) const { return ((finite >> j) & 1u) != 0; }
  bool InRange(std::size_t j) const { return ((in_range >> j) & 1u) != 0; }
  bool Fused(std::size_t j) const { return ((fused >> j) & 1u) != 0; }
  bool Scaled(std::size_t j) const { return ((scaled >> j) & 1u) != 0; }
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

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVLAB_SIMD_AFFINE_BLOCK_INL_H_
