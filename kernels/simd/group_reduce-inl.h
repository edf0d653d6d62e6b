// Per-target reduction of many groups' lane-wise partial vectors to one value per group
// (the affine and fp quantizers' group extremes): one lane per group instead of a full
// lane reduction per group.
#if defined(KVLAB_SIMD_GROUP_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVLAB_SIMD_GROUP_REDUCE_INL_H_
#undef KVLAB_SIMD_GROUP_REDUCE_INL_H_
#else
#define KVLAB_SIMD_GROUP_REDUCE_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR  // one lane per vector: nothing to reduce
// One level: kCount vectors of G groups × P lanes → kCount/2 vectors of 2G groups × P/2
// lanes, in group order, with a shuffle pair that never mixes two groups (vector halves,
// then u64 lane pairs, then 32-bit lane pairs): ~3 ops per vector.
template <std::size_t P, std::size_t kCount, class D, class Op>
HWY_INLINE void ReduceLevel(D d, hn::Vec<D>* v, Op op) {
  const hn::Repartition<std::uint64_t, D> du64;
#pragma GCC unroll 16
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

// kCount (a multiple of N = Lanes(d), full vectors) groups' lane-wise partials, kPer
// groups to a vector (v[j] holds groups j·kPer .. j·kPer + kPer − 1, N/kPer lanes each, in
// order), down to kCount/N vectors v[0..kCount/N) whose lane i of v[k] is group k·N + i
// reduced by op. v is clobbered. An exact op (Max, Min) gives the same value as any other
// order. Partials that already share vectors skip the first levels.
template <std::size_t kCount, std::size_t kPer = 1, class D, class Op>
HWY_INLINE void ReduceGroups(D d, hn::Vec<D>* v, Op op) {
  constexpr std::size_t N = hn::MaxLanes(D());
  static_assert(N <= kCount && kCount % N == 0 && N % kPer == 0);
#if HWY_TARGET != HWY_SCALAR
  if constexpr (N >= 2 && kPer <= 1) ReduceLevel<N, kCount>(d, v, op);
  if constexpr (N >= 4 && kPer <= 2) ReduceLevel<N / 2, kCount / 2>(d, v, op);
  if constexpr (N >= 8 && kPer <= 4) ReduceLevel<N / 4, kCount / 4>(d, v, op);
  if constexpr (N >= 16 && kPer <= 8) ReduceLevel<N / 8, kCount / 8>(d, v, op);
  static_assert(N <= 16, "more levels needed");
#endif
  (void)d;
  (void)v;
  (void)op;
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVLAB_SIMD_GROUP_REDUCE_INL_H_
