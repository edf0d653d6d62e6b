// SIMD affine quantize/dequantize (contract: reference/affine_quantize.h), bit-exact
// with the oracle on every Highway target.
//
// Layout of the work: rows are contiguous and groups are consecutive elements of a row,
// so group k of the flattened tensor owns elements [k·gs, (k+1)·gs), scale/bias k and
// stream bytes [k·gs·bits/8, (k+1)·gs·bits/8) (gs·bits is a multiple of 32: whole words,
// docs/quantization.md §Bit packing). Groups are independent: parallel_for runs tasks of
// streaming_elements_per_task/gs groups (a split fixed by the problem, never by the thread count). Scratch
// lives on the stack (two Blocks of kBlock groups), so nothing is allocated per call or row.
//
// Quantize, in blocks of kBlock = 32 groups, software-pipelined (the encoding of one
// block interleaved with the scan of the next):
//   scan    f16/bf16 (vector targets): the raw 16-bit patterns as ordered integer keys,
//           running Max/Min of the keys, no conversion (2N elements per vector; a key
//           beyond ±inf's flags NaN/±inf); f32 (and 16-bit input on SCALAR): running
//           Max/Min and a sum that flags NaN/±inf;
//   finish  the 32 groups' extremes reduced to one lane per group (ReduceBlock), the
//           the parameters (docs/quantization.md §Affine parameters) for all 32 at once, one group
//           per lane (BlockParams), 1/scale, whether each group's codes can skip the clamp (not
//           where the packs clamp, below), the scalar redo of flagged groups, scales/biases
//           stored with kvlab's RNE conversion (half_convert-inl.h); flags move as
//           mask bits (AVX3: straight from k-registers; a byte store reloaded as a u32
//           stalls every block), and only the non-finite groups are visited;
//   encode  per vector g → f32 (F16C where it exists, else exact bit manipulation),
//           (g − bias)·(1/scale), rounding (mlx_cpu: one add of 1.5·2^23, whose bits
//           are the code), the clamp where needed, and the packing
//           straight into wq (affine_pack-inl.h: 2/4/8 bits in registers; other widths
//           and the SCALAR target through a u8 group buffer and pack_codes); a group
//           with a lane in doubt (below) is encoded again with the true division.
//           AVX3 and AVX2, mlx_cpu, 2/4/8 bits: four vectors at a time, rint by
//           vcvtps2dq, and the clamp done by the saturating packs of StoreCodesFour.
//           AVX3_DL and AVX2, 2/4/8 bits, nearly every group: the scaled form (below),
//           whose doubt test reads the integer code (AVX3_DL: StoreHighHalfCodes packs
//           and clamps; AVX2: the high halves shifted down, then StoreCodesFour).
// Dequantize: affine_dequantize.cc. Shared with it: affine_common.h (scalar steps, the
// task split) and affine_block-inl.h (per-target block helpers).
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
//   fused; the others keep Sub then Mul. One op fewer per vector.
// * The scaled form (AVX3_DL and AVX2, mlx_cpu, 2/4/8 bits, gs a multiple of four vectors;
//   Finish picks the fused groups with |c| <= 256 whose extremes' |q'| are at most 2^14): t =
//   rint(fl(g·R − C)) by vcvtps2dq, R = 2^16·r (exact), C = fl(2^16·c − 32776), so t ≈
//   2^16·(q + 0.5) + 8, and K = t >> 16 (t's high half) is clamped to [0, n] by the packs
//   (StoreHighHalfCodes). Let D = t − 2^16·q − 32776. With x = g·r − c exact, r =
//   (1 + e1)/s, c = (bias/s)(1 + e1)(1 + e2): x − Q = e1·Q − (1 + e1)(bias/s)e2, where
//   |bias/s| <= 256(1 + 2u); so |x − q| <= |Q|(3u + u²) + |bias/s|·u(1 + u). Every lane
//   has |q| < 2^14 + 1 (its q' lies between the extremes'), so |D| < 240 (0.5 for the
//   conversion, 32 for the FMA's rounding below 2^30, 1 for C's below 2^25, 194 for
//   2^16·|x − q|): no overflow, K fits 16 bits. A lane with |Q| < 257 has |D| <= 0.5 +
//   0.5 (FMA, below 2^24) + 1 + 2^16·1024u (= 4) = 6. A lane is certain when m = t mod
//   2^16 is >= 16; any other (also the 0x80000000 of a NaN) sends its group to Redo.
//   A certain lane with K in [0, n] has |Q| < 257 (|D| < 240 keeps q in (−0.51, n + 0.51)),
//   so 2^16·(q + 0.5 − K) = m − 8 − D lies in (2, 65533): q is strictly inside
//   (K − 0.5, K + 0.5), rint(q) = K, no tie. A certain lane with K > n has q >= n + 0.5:
//   below it |D| <= 6, and t >= 2^16·(n + 1) would leave m = t − 2^16·(n + 1) < 8 + 6;
//   so the oracle's code is n too. With K < 0 likewise q <= −0.5 and code 0. Per vector
//   one op fewer than the four-vector path (the test reads t; no fraction), and the
//   packing takes one µop fewer at 4 bits. The window flags 16 of the 2^16 values of m:
//   a lane is in doubt as often as under the 2^-13 distance test.
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
#include "kernels/simd/affine_common.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/affine_quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/affine_block-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
// The steps of EncodeWith's four-vector path, per target. RintToInt: rint(q) as an
// integer by vcvtps2dq, which rounds by MXCSR (RNE, never changed here), exact for the
// |q| < 2^22 it gets. DistanceToInteger and Larger only feed the doubt test, which reads
// magnitudes: DistanceToInteger(q) has magnitude |q − rint(q)| (exact: Sterbenz), and
// Larger(x, y), for x and y from either, has magnitude max(|x|, |y|), sign cleared.
#if HWY_TARGET == HWY_AVX2
using RawCodes = __m256i;
HWY_INLINE RawCodes RintToInt(VF q) { return _mm256_cvtps_epi32(q.raw); }
HWY_INLINE VF DistanceToInteger(VF q) {
  return hn::Abs(hn::Sub(q, VF{_mm256_round_ps(q.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}));
}
HWY_INLINE VF Larger(VF x, VF y) { return hn::Max(x, y); }  // both already non-negative
#else
using RawCodes = __m512i;
HWY_INLINE RawCodes RintToInt(VF q) { return _mm512_cvtps_epi32(q.raw); }
// vreduceps 0x08: q − rint(q) (RNE, exact; no precision exception) in one µop.
HWY_INLINE VF DistanceToInteger(VF q) { return VF{_mm512_reduce_ps(q.raw, 0x08)}; }
// vrangeps 0x0B: the larger magnitude, sign cleared, in one µop (Abs + Max take two).
HWY_INLINE VF Larger(VF x, VF y) { return VF{_mm512_range_ps(x.raw, y.raw, 0x0B)}; }
#endif
#endif

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
#if HWY_TARGET == HWY_AVX3_DL
  static constexpr bool kScaled = kFuse && ap::kPacksHighHalves<kBits>;  // the scaled path (header)
#elif HWY_TARGET == HWY_AVX2
  static constexpr bool kScaled = kFuse && ap::kPacksFour<kBits>;
#else
  static constexpr bool kScaled = false;
#endif
  // The scaled path's constants (header): R = kScaledUnit·r, C = fl(kScaledUnit·c −
  // kScaledOffset), groups with |c| <= kScaledOffsetLimit whose extremes' |q'| are at most
  // kScaledQuotientLimit; a code is certain where t & kScaledWindow != 0.
  static constexpr float kScaledUnit = 65536.0f, kScaledOffset = 32776.0f, kScaledOffsetLimit = 256.0f;
  static constexpr float kScaledQuotientLimit = 16384.0f;
  static constexpr int kScaledWindow = 0xFFF0;

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
    b.scaled = 0;
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
      if constexpr (kScaled) {
        // The scaled path's groups (header): fused, |c| <= 256, the extremes' |q'| at most
        // 2^14, whole steps of four vectors.
        const VF qa = FastQuotient<true>(hn::LoadU(df, b.alpha + j), bias, recip, bias_recip);
        const VF qb = FastQuotient<true>(hn::LoadU(df, b.beta + j), bias, recip, bias_recip);
        const auto bounded = hn::Le(hn::Max(hn::Abs(qa), hn::Abs(qb)), hn::Set(df, kScaledQuotientLimit));
        const auto small = hn::Le(hn::Abs(bias_recip), hn::Set(df, kScaledOffsetLimit));
        if (len_ % (4 * N) == 0) b.scaled |= MaskBits(df, hn::And(hn::And(fused, small), bounded), j);
        hn::StoreU(hn::Mul(recip, hn::Set(df, kScaledUnit)), df, b.scaled_recip + j);
        hn::StoreU(hn::Sub(hn::Mul(bias_recip, hn::Set(df, kScaledUnit)), hn::Set(df, kScaledOffset)), df,
                   b.scaled_offset + j);
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

  // The codes of group j, packed into wq through the reciprocal; false where a lane's
  // code is in doubt (header) and the group must be encoded again by Redo, which the
  // caller defers to the end of the block (a branch on each group's doubt mispredicts
  // on the ~3 % of groups in doubt, costing more than their redo).
  HWY_INLINE bool Encode(const Block& b, std::size_t j) {
    if (!b.Finite(j)) return true;
    if (!std::isfinite(b.recip[j])) return EncodeWith<true, true>(b, j);
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
    if constexpr (kScaled) {
      if (b.Scaled(j)) return EncodeScaled(b, j);
    }
#endif
    bool certain;
    if constexpr (kGpu) {
      certain = EncodeWith<false, true>(b, j);
    } else if (kFuse && b.Fused(j)) {
      certain = kPacksClamp || b.InRange(j) ? EncodeWith<false, false, true>(b, j) : EncodeWith<false, true, true>(b, j);
    } else {
      certain = kPacksClamp || b.InRange(j) ? EncodeWith<false, false>(b, j) : EncodeWith<false, true>(b, j);
    }
    return certain;
  }

  // Group j (finite, finite 1/scale) with the oracle's division.
  void Redo(const Block& b, std::size_t j) { EncodeWith<true, kPacksClamp>(b, j); }

 private:
  int Bits() const { return kBits != 0 ? kBits : job_.bits; }

  // The f32 scan: each group → f32 (16-bit inputs on the SCALAR target: exact scalar
  // conversion into b.buf), running Max/Min and a sum that flags NaN/±inf.
  HWY_INLINE void ScanF32(Block& b, std::size_t j) const {
    const DF df;
    const std::size_t N = hn::Lanes(df);
    const std::byte* src = job_.in + (b.first + j) * len_ * elem_size_;
    PrefetchAhead(src, len_ * elem_size_);
    // GPU kernels start the running max at 0 (oracle header,
    // docs/quantization.md §Affine parameters).
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
#if HWY_TARGET <= HWY_AVX3
      // Rotated halves (vprold): both halves hold the max (min) key, and one ternary
      // logic op takes the max's low half and the complemented min's high half.
      const auto swapped = [&](auto keys) { return hn::BitCast(d16, hn::RotateRight<16>(hn::BitCast(du32, keys))); };
      const VI top = hn::BitCast(di, hn::Max(kmax, swapped(kmax)));
      const VI bottom = hn::BitCast(di, hn::Min(kmin, swapped(kmin)));
      const VI high = hn::Set(di, static_cast<std::int32_t>(0xFFFF0000u));
      b.key_pairs[j] = hn::Or(hn::AndNot(high, top), hn::AndNot(bottom, high));
#else
      const auto upper_of = [&](auto keys) { return hn::BitCast(d16, hn::ShiftRight<16>(hn::BitCast(du32, keys))); };
      const VI top = hn::BitCast(di, hn::Max(kmax, upper_of(kmax)));        // low half: the max key
      const VI bottom = hn::BitCast(di, hn::Min(kmin, upper_of(kmin)));     // low half: the min key
      b.key_pairs[j] = hn::Or(hn::And(top, hn::Set(di, 0xFFFF)), hn::ShiftLeft<16>(hn::Not(bottom)));
#endif
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
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
    if constexpr ((!kExact || !kClamp) && !kGpu && ap::kPacksFour<kBits>) {
      // Four vectors per step (two for a group of 32 on AVX3): rint(q') as an integer
      // (vcvtps2dq, RNE; |q'| < 2^22 on this path), clamped and packed by StoreCodesFour.
      // The four fractions meet in a tree, so the doubt chain grows by one op per step.
      // kExact without kClamp (Redo: a finite group with a finite 1/scale, whose q is as
      // bounded as q'): the oracle's division instead, and no doubt.
      const auto quotient = [&](std::size_t i, VF& fraction) {
        const VF g = Values(b, j, i);
        const VF q = kExact ? hn::Div(hn::Sub(g, vb), vs) : FastQuotient<kFused>(g, vb, vs, vbr);
        fraction = kExact ? hn::Zero(df) : DistanceToInteger(q);
        return RintToInt(q);
      };
      VF f0, f1, f2, f3;
      if (len_ < 4 * N) {
        const RawCodes k[4] = {quotient(0, f0), quotient(N, f1), hn::Zero(di).raw, hn::Zero(di).raw};
        doubt = Larger(f0, f1);
        ap::StoreCodesFour<kBits>(k, true, out);
      } else {
        for (std::size_t i = 0; i < len_; i += 4 * N) {
          const RawCodes k[4] = {quotient(i, f0), quotient(i + N, f1), quotient(i + 2 * N, f2),
                                 quotient(i + 3 * N, f3)};
          doubt = Larger(doubt, Larger(Larger(f0, f1), Larger(f2, f3)));
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
        hn::StoreU(affine_pack::LowBytes(du8, hn::BitCast(hn::RebindToUnsigned<DI>(), ci)), du8, codes_ + i);
      }
    }
    if constexpr (!ap::kInRegisters<kBits>) ad::pack_codes(codes_, len_, job_.bits, out);
    return kExact || hn::AllFalse(df, hn::Gt(doubt, hn::Set(df, kDoubtfulDistance)));
  }

#if HWY_TARGET == HWY_AVX3_DL
  // Group j by the scaled form (header): t = rint(fl(g·R − C)), the code t's high half,
  // certain unless some lane's t has bits 4..15 all zero.
  HWY_INLINE bool EncodeScaled(const Block& b, std::size_t j) {
    const DF df;
    const std::size_t N = hn::Lanes(df);
    const VF vr = hn::Set(df, b.scaled_recip[j]), vc = hn::Set(df, b.scaled_offset[j]);
    const __m512i window = _mm512_set1_epi32(kScaledWindow);
    __mmask16 certain = 0xFFFF;  // lanes whose codes so far are all certain
    std::uint8_t* const out = Out(b, j);
    for (std::size_t i = 0; i < len_; i += 4 * N) {
      __m512i t[4];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < 4; ++v) {
        t[v] = RintToInt(hn::MulSub(Values(b, j, i + v * N), vr, vc));
        certain = _mm512_mask_test_epi32_mask(certain, t[v], window);
      }
      ap::StoreHighHalfCodes<kBits>(t, out + i * kBits / 8);
    }
    return certain == 0xFFFF;
  }
#elif HWY_TARGET == HWY_AVX2
  // The same on AVX2: the window test as the lanes' unsigned minimum of t & window (zero
  // where a lane is in doubt), the codes t's high halves by an arithmetic shift, clamped
  // and packed by StoreCodesFour.
  HWY_INLINE bool EncodeScaled(const Block& b, std::size_t j) {
    const DF df;
    const DI di;
    const hn::RebindToUnsigned<DI> du;
    const std::size_t N = hn::Lanes(df);
    const VF vr = hn::Set(df, b.scaled_recip[j]), vc = hn::Set(df, b.scaled_offset[j]);
    const auto window = hn::Set(du, kScaledWindow);
    auto least = window;  // the smallest t & window so far
    std::uint8_t* const out = Out(b, j);
    for (std::size_t i = 0; i < len_; i += 4 * N) {
      RawCodes k[4];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < 4; ++v) {
        const VI t{RintToInt(hn::MulSub(Values(b, j, i + v * N), vr, vc))};
        least = hn::Min(least, hn::And(hn::BitCast(du, t), window));
        k[v] = hn::ShiftRight<16>(t).raw;
      }
      ap::StoreCodesFour<kBits>(k, false, out + i * kBits / 8);
    }
    return hn::AllFalse(du, hn::Eq(least, hn::Zero(du)));
  }
#endif

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
    std::uint8_t doubtful[kBlock];
    std::size_t redos = 0;
    for (std::size_t j = 0; j < kBlock; ++j) {
      if (j < cur->count) {
        doubtful[redos] = static_cast<std::uint8_t>(j);
        redos += q.Encode(*cur, j) ? 0u : 1u;
      }
      if (j < next->count) q.Scan(*next, j);
    }
    for (std::size_t i = 0; i < redos; ++i) q.Redo(*cur, doubtful[i]);
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

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(QuantizeGroups);

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding, const TensorView& wq,
                     const TensorView& scales, const TensorView& biases) {
  ref::validate_affine_quantize(x, spec, wq, scales, biases);  // the oracle's checks and messages
  KVLAB_REQUIRE(rounding == Rounding::mlx_cpu || rounding == Rounding::mlx_gpu, invalid_argument,
                "unknown rounding ", static_cast<int>(rounding));
  affine_detail::GroupJob job = affine_detail::job_of(spec, x.dtype, scales.dtype, x.data, wq.data);
  job.gpu = rounding == Rounding::mlx_gpu;
  job.scales_out = scales.data;
  job.biases_out = biases.data;
  affine_detail::run_in_tasks(&HWY_DYNAMIC_DISPATCH(QuantizeGroups), job, scales.numel());
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
