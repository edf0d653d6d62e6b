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
// Quantize, in blocks of kBlock = 16 groups, software-pipelined (the encoding of one
// block interleaved with the scan of the next):
//   scan    each group → f32 (F16C where it exists, else exact bit manipulation),
//           running Max/Min and a sum that flags NaN/±inf;
//   finish  the 16 groups' extremes reduced to one lane per group (ReduceBlock), the
//           spec §1.2 parameters for all 16 at once, one group per lane (BlockParams),
//           1/scale, the scalar redo of flagged groups, scales/biases stored with
//           kvlab's RNE conversion (half_convert-inl.h);
//   encode  per vector (g − bias)·(1/scale), rounding, clamp, float→int, and the packing
//           straight into wq (affine_pack-inl.h: 2/4/8 bits in registers; other widths
//           and the SCALAR target through a u8 group buffer and pack_codes); a group
//           with a lane in doubt (below) is encoded again with the true division.
// Dequantize, per group: the stored scale/bias → f32 (a block at a time), codes
// unpacked (same split), code·scale + bias, the RNE conversion to f16/bf16 in vectors.
//
// Exactness argument:
// * Every float op on data is a correctly rounded IEEE op (Div, Sub, Mul, Add; Round =
//   ties-to-even, Trunc, Min/Max, compares), the oracle's ops in the oracle's order,
//   except the reciprocal below; the build sets -ffp-contract=off, so Mul+Add never
//   fuses on the FMA targets. BlockParams is group_params lane-wise.
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
// * Min/Max reductions, in any order, give the group's max/min; only which signed zero
//   wins may differ from the oracle's `>` scan, which never matters (a zero edge gives
//   q0 = ±0 and bias 0.0f either way).
// * mlx_cpu codes: rint(clamp(q, 0, n)) = clamp(rint(q), 0, n) (rint is monotone, 0 and
//   n are integers) and c + 2^23 rounds c ∈ [0, 255] to an integer with RNE, whose bits
//   are 0x4B000000 + code (CodeOf). mlx_gpu: round() from trunc and the exact fraction.
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
// ~16K elements per parallel task: large enough to amortize the pool's per-task cost,
// small enough that 2–16 threads stay balanced on a cache-sized problem.
constexpr std::int64_t kElementsPerTask = 16384;

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
// scalar divisions into a few vector ops and lets the extremes of 16 groups overlap.
constexpr std::size_t kBlock = 16;
static_assert(kBlock % HWY_LANES(float) == 0, "a block is whole vectors");

// The encoding's fast path trusts q' = (g − bias)·(1/scale) where it lies farther than
// this from every half-integer (header: the bound on |q' − q| is 3·2^-15 < 2^-13).
constexpr float kDoubtfulDistance = 0.5f - 0x1p-13f;

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
template <std::size_t P, std::size_t kCount, class Op>
HWY_INLINE void ReduceLevel(VF* v, Op op) {
  const DF df;
  const hn::Repartition<std::uint64_t, DF> du64;
  for (std::size_t k = 0; k < kCount / 2; ++k) {
    const VF lo = v[2 * k], hi = v[2 * k + 1];
    if constexpr (P == hn::MaxLanes(DF())) {
      v[k] = op(hn::ConcatLowerLower(df, hi, lo), hn::ConcatUpperUpper(df, hi, lo));
    } else if constexpr (P >= 4) {
      const auto lo64 = hn::BitCast(du64, lo), hi64 = hn::BitCast(du64, hi);
      v[k] = op(hn::BitCast(df, hn::ConcatEven(du64, hi64, lo64)), hn::BitCast(df, hn::ConcatOdd(du64, hi64, lo64)));
    } else {
      v[k] = op(hn::ConcatEven(df, hi, lo), hn::ConcatOdd(df, hi, lo));
    }
  }
}
#endif

template <class Op>
HWY_INLINE void ReduceBlock(VF* v, Op op, float* out) {
  const DF df;
  constexpr std::size_t N = hn::MaxLanes(DF());  // full vectors: == Lanes(df)
  static_assert(N <= kBlock && kBlock % N == 0);
#if HWY_TARGET != HWY_SCALAR
  if constexpr (N >= 2) ReduceLevel<N, kBlock>(v, op);
  if constexpr (N >= 4) ReduceLevel<N / 2, kBlock / 2>(v, op);
  if constexpr (N >= 8) ReduceLevel<N / 4, kBlock / 4>(v, op);
  if constexpr (N >= 16) ReduceLevel<N / 8, kBlock / 8>(v, op);
  static_assert(N <= 16, "more levels needed");
#endif
  (void)op;
  for (std::size_t k = 0; k < kBlock / N; ++k) hn::StoreU(v[k], df, out + k * N);
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

// One block of up to kBlock consecutive groups, from its scan to its encoding.
struct Block {
  std::size_t first = 0, count = 0;               // flattened index of its first group; groups
  alignas(64) float buf[kBlock * ad::kMaxGroup];  // f16/bf16 groups converted to f32
  alignas(64) float alpha[kBlock], beta[kBlock], scale[kBlock], bias[kBlock], recip[kBlock];
  VF maxes[kBlock], mins[kBlock], probes[kBlock];  // per group, lane-wise
  const float* group[kBlock];                      // each group's f32 values
  bool finite[kBlock];
};

// The three steps of quantizing a block: Scan each group (to f32, running Max/Min and
// the NaN/Inf probe), Finish the block (its parameters, vectorized; the scalar redo of
// NaN/Inf groups; the stored scales/biases), Encode each group (the codes, packed
// straight into wq). kBits: 2/4/8 packed in registers, 0 = any width via a u8 buffer.
template <int kBits, bool kGpu>
class GroupQuantizer {
 public:
  explicit GroupQuantizer(const ad::GroupJob& job)
      : job_(job),
        len_(static_cast<std::size_t>(job.gs)),
        group_bytes_(len_ * static_cast<std::size_t>(job.bits) / 8),
        elem_size_(dtype_size(job.data_dtype)) {}

  HWY_INLINE void Scan(Block& b, std::size_t j) const {
    const DF df;
    const std::size_t N = hn::Lanes(df);
    const std::byte* src = job_.in + (b.first + j) * len_ * elem_size_;
    // GPU kernels start the running max at 0 (oracle header, spec §1.2 (a)).
    const VF max_init = hn::Set(df, kGpu ? 0.0f : -std::numeric_limits<float>::infinity());
    const VF min_init = hn::Set(df, std::numeric_limits<float>::infinity());
    // Two accumulator sets (even/odd vectors; len/N is even) halve the dependency
    // chains. probe: the group's sum, finite unless some value is NaN/±inf (or the sum
    // overflows, which only sends a finite group to the exact scalar path too).
    VF max0 = max_init, max1 = max_init, min0 = min_init, min1 = min_init, sum0 = hn::Zero(df), sum1 = sum0;
    const auto visit = [&](VF v0, VF v1) {
      max0 = hn::Max(max0, v0);
      max1 = hn::Max(max1, v1);
      min0 = hn::Min(min0, v0);
      min1 = hn::Min(min1, v1);
      sum0 = hn::Add(sum0, v0);
      sum1 = hn::Add(sum1, v1);
    };
    if (job_.data_dtype == DType::f32) {
      const float* g = reinterpret_cast<const float*>(src);
      b.group[j] = g;
      for (std::size_t i = 0; i < len_; i += 2 * N) visit(hn::LoadU(df, g + i), hn::LoadU(df, g + i + N));
    } else {
      const auto* src16 = reinterpret_cast<const std::uint16_t*>(src);
      float* dst = b.buf + j * len_;
      b.group[j] = dst;
      const auto convert = [&](auto to_f32) {
        for (std::size_t i = 0; i < len_; i += 2 * N) {
          const VF v0 = to_f32(src16 + i), v1 = to_f32(src16 + i + N);
          hn::StoreU(v0, df, dst + i);
          hn::StoreU(v1, df, dst + i + N);
          visit(v0, v1);
        }
      };
      // Lambdas, not function pointers: HWY_INLINE (always_inline) callees must stay
      // direct calls at -O1 (the asan preset).
      if (job_.data_dtype == DType::bf16) convert([](const std::uint16_t* p) { return LoadBF16(DF(), p); });
      else convert([](const std::uint16_t* p) { return LoadF16QuietingNaN(DF(), p); });
    }
    b.maxes[j] = hn::Max(max0, max1);
    b.mins[j] = hn::Min(min0, min1);
    b.probes[j] = hn::Add(sum0, sum1);
  }

  void Finish(Block& b) {
    const DF df;
    for (std::size_t j = b.count; j < kBlock; ++j) b.maxes[j] = b.mins[j] = b.probes[j] = hn::Zero(df);  // unused
    ReduceBlock(b.maxes, [](VF x, VF y) { return hn::Max(x, y); }, b.alpha);
    ReduceBlock(b.mins, [](VF x, VF y) { return hn::Min(x, y); }, b.beta);
    // One test per block (a tree of adds: short chains); a non-finite block sum (NaN/inf
    // somewhere, or an overflow) is resolved group by group.
    for (std::size_t w = 1; w < kBlock; w *= 2)
      for (std::size_t j = 0; j + w < kBlock; j += 2 * w) b.probes[j] = hn::Add(b.probes[j], b.probes[j + w]);
    const bool block_finite = hn::AllTrue(df, hn::IsFinite(b.probes[0]));
    BlockParams<kGpu>(b.alpha, b.beta, job_.bits, b.scale, b.bias);
    for (std::size_t j = 0; j < kBlock; j += hn::Lanes(df))
      hn::StoreU(hn::Div(hn::Set(df, 1.0f), hn::LoadU(df, b.scale + j)), df, b.recip + j);
    for (std::size_t j = 0; j < b.count; ++j) {
      b.finite[j] = block_finite || GroupIsFinite(b.group[j], len_);
      if (b.finite[j]) continue;
      const ad::GroupParams p = ad::scalar_group(b.group[j], job_.gs, job_.bits, kGpu, codes_);
      b.scale[j] = p.scale;
      b.bias[j] = p.bias;
      ad::pack_codes(codes_, len_, job_.bits, Out(b, j));
    }
    // Codes come from the f32 parameters; the stored copies are rounded (RNE) to x.dtype.
    StoreParams(job_.param_dtype, b.scale, b.count, job_.scales_out, b.first);
    StoreParams(job_.param_dtype, b.bias, b.count, job_.biases_out, b.first);
  }

  // The codes of group j, packed into wq: first through the reciprocal (kExact false),
  // redone with the true division when any lane of the group is in doubt (header).
  HWY_INLINE void Encode(const Block& b, std::size_t j) {
    if (!b.finite[j]) return;
    if (!std::isfinite(b.recip[j]) || !EncodeWith<false>(b, j)) EncodeWith<true>(b, j);
  }

 private:
  // kExact: q = (g − bias)/scale, the oracle's division. Otherwise q' = (g − bias)·r,
  // r = 1/scale, and the result says whether every lane's code is certainly the
  // oracle's (a false return means the group must be redone exactly; what was written
  // is overwritten then).
  template <bool kExact>
  HWY_INLINE bool EncodeWith(const Block& b, std::size_t j) {
    const DF df;
    const DI di;
    const std::size_t N = hn::Lanes(df);
    const VF vn = hn::Set(df, ad::largest_code(job_.bits));
    const VI vmask = hn::Set(di, (1 << job_.bits) - 1);
    const VF vb = hn::Set(df, b.bias[j]);
    const VF vs = hn::Set(df, kExact ? b.scale[j] : b.recip[j]);
    const float* g = b.group[j];
    std::uint8_t* const out = Out(b, j);
    VF doubt = hn::Zero(df);  // the largest distance to the nearest integer (fast path)
    for (std::size_t i = 0; i < len_; i += N) {
      const VF d = hn::Sub(hn::LoadU(df, g + i), vb);
      VI ci;
      if constexpr (kExact) {
        ci = CodeOf<kGpu>(hn::Div(d, vs), vn, vmask);
      } else {
        const VF q = hn::Mul(d, vs);
        const VF k = hn::Round(q);
        VF dist = hn::Abs(hn::Sub(q, k));
        // mlx_gpu wraps negative codes, so a negative q' is in doubt as a whole.
        if constexpr (kGpu) dist = hn::IfThenElse(hn::Lt(q, hn::Zero(df)), hn::Set(df, 1.0f), dist);
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
};

// Groups [g0, g1) of the flattened x, block after block, software-pipelined: the
// encoding of a block (bound by the divider's throughput) is interleaved group by
// group with the scan of the next block (loads, conversions, Min/Max), which one
// block's encoding alone would keep out of the reorder window.
template <int kBits, bool kGpu>
void QuantizeGroupsT(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  if (g0 >= g1) return;
  GroupQuantizer<kBits, kGpu> q(job);
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

template <bool kGpu>
void QuantizeGroupsFor(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  switch (job.bits) {
    case 2: return QuantizeGroupsT<2, kGpu>(job, g0, g1);
    case 4: return QuantizeGroupsT<4, kGpu>(job, g0, g1);
    case 8: return QuantizeGroupsT<8, kGpu>(job, g0, g1);
    default: return QuantizeGroupsT<0, kGpu>(job, g0, g1);
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

}  // namespace

void affine_quantize(const ConstTensorView& x, const QuantSpec& spec, Rounding rounding, const TensorView& wq,
                     const TensorView& scales, const TensorView& biases) {
  ref::validate_affine_quantize(x, spec, wq, scales, biases);  // the oracle's checks and messages
  KVLAB_REQUIRE(rounding == Rounding::mlx_cpu || rounding == Rounding::mlx_gpu, invalid_argument,
                "unknown rounding ", static_cast<int>(rounding));
  affine_detail::GroupJob job;
  job.gs = spec.group_size;
  job.bits = spec.bits;
  job.gpu = rounding == Rounding::mlx_gpu;
  job.data_dtype = x.dtype;
  job.param_dtype = scales.dtype;
  job.in = x.data;
  job.out = wq.data;
  job.scales_out = scales.data;
  job.biases_out = biases.data;
  run_in_tasks(&HWY_DYNAMIC_DISPATCH(QuantizeGroups), job, scales.numel());
}

void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                       const QuantSpec& spec, const TensorView& out) {
  ref::validate_affine_dequantize(wq, scales, biases, spec, out);  // the oracle's checks and messages
  affine_detail::GroupJob job;
  job.gs = spec.group_size;
  job.bits = spec.bits;
  job.data_dtype = out.dtype;
  job.param_dtype = scales.dtype;
  job.in = wq.data;
  job.out = out.data;
  job.scales_in = scales.data;
  job.biases_in = biases.data;
  run_in_tasks(&HWY_DYNAMIC_DISPATCH(DequantizeGroups), job, scales.numel());
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
