// Per-target code of the fused quantized decode kernel (plan and split:
// quantized_decode.h). One task = one chunk of keys of one (b, kv head), all R·Lq query
// rows of its GQA group at once, so every K/V code is unpacked once for all of them.
//
// Arithmetic, k = c·s + b and v = c·s + b (c the code, s/b its group's scale and bias):
//  * K side: each key's codes are dequantized once for all rows, k = c·s + b by one
//    MulAdd per 16 codes; then q·k by FMAs (queries carry params.scale), and scores
//    reduced N keys at a time (a transposing tree of ConcatEven/ConcatOdd pairs: N
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
// Everything accumulates in f32 (Highway MulAdd: FMA on AVX2/AVX3).
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
// Measured on the 2-core Xeon VM (one thread, chunk in L2): ~95-110 cycles per key at
// either width, the K and V loops each near 1.3-1.6 vector uops per cycle.
// No AVX-512 VNNI (vpdpbusd, u8 codes × s8 queries): rounding q to s8 per (row, group)
// moves each q_d by up to max_g|q|/254, so the logit moves by up to
// |scale|·Σ_g (max_g|q|/254)·Σ_{d∈g}|s·c_d|. The tolerance allows eps_T·S with
// S = max over keys of |scale|·Σ|q_d·k_d| (eps_T = 2^-10 f16, 2^-7 bf16, 2^-23 f32),
// and max_g|q|·Σ|k| is not bounded by any multiple of Σ|q_d·k_d| (q and k large on
// different elements), so no fixed-point q passes the worst case: not with s8 (> 2^-8
// relative to max_g|q|), not with a two-part s8 split (2^-16), and never for f32 q.
#ifndef KVLAB_SIMD_QDECODE_COMMON
#define KVLAB_SIMD_QDECODE_COMMON
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/simd/quantized_decode.h"

namespace kvlab::simd::qdecode::detail {

// Per-thread scratch of a task, grown on demand and reused across tasks and calls.
struct Scratch {
  std::vector<float> k_scales, k_biases;  // [key][g], as stored
  std::vector<float> v_scales, v_biases, convert;  // [g][ncp]
  std::vector<float> scores;   // [ρ][ncp]: raw, then capped and masked scores
  std::vector<float> weights;  // [ρ][Gv][ncp]: p·s_v
  std::vector<float> tile;     // [RB][N/KB][N] partly reduced dot products of one key tile (RB <= 8)
  std::vector<float> out_bias; // [ρ][Gv]: Σ p·b_v
  std::vector<std::uint8_t> k_codes, v_codes;  // one byte per code (2/3/5/6-bit)
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

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::qdecode::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace qd = kvlab::simd::qdecode::detail;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if HWY_TARGET <= HWY_AVX3
constexpr bool kManyRegisters = true;  // 32 vector registers
#else
constexpr bool kManyRegisters = false;  // 16 (or scalar)
#endif

// ---------------------------------------------------------------- code unpacking

// One unit = the codes of N bytes: 8-bit → 1 vector (element order); 4-bit → 2 vectors,
// low nibbles (even elements) then high nibbles (odd elements).
template <int kBits>
constexpr std::size_t kVecsPerUnit = kBits == 4 ? 2 : 1;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 4-bit codes become floats by a 16-entry table lookup (vpermps), see LookupNibbles.
constexpr bool kNibbleLookup = true;
#else
constexpr bool kNibbleLookup = false;
#endif

// The lookup table mapping each 4-bit code to itself, 0.0f..15.0f.
HWY_INLINE VF NibbleCodes(DF df) {
  alignas(64) static constexpr float kNibbles[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return hn::Load(df, kNibbles);
}

using VI = hn::Vec<hn::RebindToSigned<DF>>;

// The N bytes at p, one per lane (int32).
HWY_INLINE VI LoadBytes(DF, const std::uint8_t* HWY_RESTRICT p) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint8_t, DF> d8;
  return hn::PromoteTo(di, hn::LoadU(d8, p));
}

// Codes of part t of a unit as floats, `bytes` from LoadBytes: 8-bit the bytes themselves;
// 4-bit the low (t = 0) or high (t = 1) nibbles.
template <int kBits>
HWY_INLINE VF CodesAsFloats(DF df, VI bytes, std::size_t t) {
  const hn::RebindToSigned<DF> di;
  if constexpr (kBits == 4) {
    return hn::ConvertTo(df, t == 0 ? hn::And(bytes, hn::Set(di, 15)) : hn::ShiftRight<4>(bytes));
  } else {
    return hn::ConvertTo(df, bytes);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// table[n] for the nibble n of each lane: vpermps reads only the low 4 bits of each index
// lane, so the low nibble needs no mask and the high one only a shift. Raw intrinsics:
// Highway's IndicesFromVec asserts indices < 16 in debug builds. (The masked form with an
// all-ones mask: GCC 12 warns about the unmasked one's _mm512_undefined_ps pass-through,
// a false maybe-uninitialized.)
HWY_INLINE VF LookupNibbles(VI bytes, std::size_t t, VF table) {
  const VI index = t == 0 ? bytes : hn::ShiftRight<4>(bytes);
  return VF{_mm512_mask_permutexvar_ps(table.raw, 0xFFFF, index.raw, table.raw)};
}
#endif

// V codes of part t of a unit as floats; 4-bit on AVX3 by lookups in NibbleCodes() (a
// shift and convert for the high nibble measured no faster).
template <int kBits>
HWY_INLINE VF ValueCodes(DF df, VI bytes, std::size_t t, [[maybe_unused]] VF nibble_codes) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kBits == 4) return LookupNibbles(bytes, t, nibble_codes);
#endif
  return CodesAsFloats<kBits>(df, bytes, t);
}

// K codes of part t of a unit dequantized, k = c·s + b by one MulAdd. 4-bit on AVX3:
// `table` holds the key's 16 values c·s + b of this group (the same MulAdd, so the same
// bits), and one lookup both unpacks and dequantizes.
template <int kBits>
HWY_INLINE VF KeyValues(DF df, VI bytes, std::size_t t, [[maybe_unused]] VF table, VF scale, VF bias) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kBits == 4) return LookupNibbles(bytes, t, table);
#endif
  return hn::MulAdd(CodesAsFloats<kBits>(df, bytes, t), scale, bias);
}

// Software prefetch of whole code rows [from, to) (every 64-byte line), kPrefetchKeys
// keys ahead of the rows being read: each side of a chunk is one sequential stream, but
// the hardware prefetcher alone leaves DRAM latency exposed at 2 cores. The rows are
// contiguous: one loop over the lines of the byte range.
constexpr std::size_t kPrefetchKeys = 32;
HWY_INLINE void PrefetchRows(const std::uint8_t* codes, std::size_t row_bytes, std::size_t from, std::size_t to) {
  const std::uint8_t* end = codes + to * row_bytes;
  for (const std::uint8_t* line = codes + from * row_bytes; line < end; line += 64) hwy::Prefetch(line);
}

// ---------------------------------------------------------------- K side: scores

#if HWY_TARGET != HWY_SCALAR
// One round of the transposing reduction: lanes (2k, 2k+1) of v[2i] are summed into the
// low half of v[i], those of v[2i+1] into its high half; after log2(n) rounds lane i of
// v[0] holds the full sum of the original v[i] (n = N), or, for n < N, of lanes
// [i·N/n, (i+1)·N/n) of what a full N-vector tree would sum there. The rounds only ever
// combine neighbours, so log2(KB) rounds over each block of KB consecutive vectors and
// then log2(N/KB) rounds over the N/KB results are exactly the full tree.
template <std::size_t n>
HWY_INLINE void PairRounds(DF df, VF* v) {
  if constexpr (n > 1) {
#pragma GCC unroll 16
    for (std::size_t i = 0; i < n / 2; ++i) {
      v[i] = hn::Add(hn::ConcatEven(df, v[2 * i + 1], v[2 * i]), hn::ConcatOdd(df, v[2 * i + 1], v[2 * i]));
    }
    PairRounds<n / 2>(df, v);
  }
}
#else
template <std::size_t n>
HWY_INLINE void PairRounds(DF, VF*) {
  static_assert(n == 1, "one lane: nothing to reduce");
}
#endif

constexpr std::size_t kMaxLanes = hn::MaxLanes(DF());

// q·k of KB consecutive keys for RB rows. Each key's codes are dequantized once for all
// RB rows, k = c·s + b in one MulAdd (4-bit on AVX3: in the table lookup itself); then
// one accumulator per (key, row) over the whole head dim, and the first log2(KB) rounds
// of the score reduction in registers: out[r] holds the KB keys' partial sums.
// kUnits/kUnitsPerGroup: the head dim and group in units when fixed at compile time (0:
// from dk and gs). Fixed, the block is straight-line code: with the common 2 or 4 units
// per group, loop control, table setup and the reduction otherwise cost as much as the
// FMAs (measured: half of the K side's time outside its inner loop).
template <int kBits, std::size_t RB, std::size_t KB, std::size_t kUnits = 0, std::size_t kUnitsPerGroup = 0>
HWY_INLINE void KeyBlock(DF df, const float* HWY_RESTRICT q, std::size_t dk, const std::uint8_t* HWY_RESTRICT codes,
                         std::size_t row_bytes, const float* HWY_RESTRICT scales, const float* HWY_RESTRICT biases,
                         std::size_t groups, std::size_t gs, VF* HWY_RESTRICT out) {
  constexpr std::size_t kV = kVecsPerUnit<kBits>;
  const std::size_t N = hn::Lanes(df);
  const std::size_t units = kUnits != 0 ? kUnits : dk / (kV * N);
  const std::size_t units_per_group = kUnitsPerGroup != 0 ? kUnitsPerGroup : gs / (kV * N);
  if constexpr (kUnits != 0) {  // the strides too, so addresses are base + constant
    dk = kUnits * kV * kMaxLanes;
    row_bytes = dk * kBits / 8;
    groups = kUnits / kUnitsPerGroup;
  }
  VF acc[KB][RB];
#pragma GCC unroll 16
  for (std::size_t k = 0; k < KB; ++k) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) acc[k][r] = hn::Zero(df);
  }
  // 4-bit with lookups: the table of a (key, group) holds its 16 values c·s + b (see
  // KeyValues); otherwise scale and bias are applied to each unpacked vector.
  constexpr bool kTable = kBits == 4 && kNibbleLookup;
  const VF codes_table = NibbleCodes(df);
#pragma GCC unroll 8
  for (std::size_t u0 = 0, g = 0; u0 < units; u0 += units_per_group, ++g) {
    VF table[KB], scale[KB], bias[KB];
#pragma GCC unroll 16
    for (std::size_t k = 0; k < KB; ++k) {
      scale[k] = hn::Set(df, scales[k * groups + g]);
      bias[k] = hn::Set(df, biases[k * groups + g]);
      table[k] = kTable ? hn::MulAdd(codes_table, scale[k], bias[k]) : codes_table;
    }
#pragma GCC unroll 8
    for (std::size_t u = u0; u < u0 + units_per_group; ++u) {
      VF c[KB][kV];
#pragma GCC unroll 16
      for (std::size_t k = 0; k < KB; ++k) {
        const VI bytes = LoadBytes(df, codes + k * row_bytes + u * N);
#pragma GCC unroll 2
        for (std::size_t t = 0; t < kV; ++t) c[k][t] = KeyValues<kBits>(df, bytes, t, table[k], scale[k], bias[k]);
      }
#pragma GCC unroll 2
      for (std::size_t t = 0; t < kV; ++t) {
#pragma GCC unroll 16
        for (std::size_t r = 0; r < RB; ++r) {
          const VF qv = hn::LoadU(df, q + r * dk + (u * kV + t) * N);
#pragma GCC unroll 16
          for (std::size_t k = 0; k < KB; ++k) acc[k][r] = hn::MulAdd(qv, c[k][t], acc[k][r]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (std::size_t r = 0; r < RB; ++r) {
    VF v[KB];
#pragma GCC unroll 16
    for (std::size_t k = 0; k < KB; ++k) v[k] = acc[k][r];
    PairRounds<KB>(df, v);
    out[r] = v[0];
  }
}

// Keys per block: as many as the accumulators (KB·RB) and the codes leave registers for,
// and never more than a vector has lanes (blocks tile the N keys of a score vector).
template <std::size_t RB>
constexpr std::size_t kKeysPerBlock =
    std::min(kMaxLanes, kManyRegisters ? (RB <= 4 ? std::size_t{4} : std::size_t{2}) : (RB <= 2 ? std::size_t{2} : std::size_t{1}));

// Raw scores q·k of keys [0, nc) for RB rows → scores[r][0, ncp) (keys past nc get 0;
// they are masked later). scales/biases: the chunk's K scales and biases in f32, as
// stored: [key][group].
// Per N keys: N/KB blocks, each reduced by log2(KB) rounds in registers and parked in
// `tile` ([r][block][N]), then the remaining log2(N/KB) rounds give a vector of N scores.
template <int kBits, std::size_t RB, std::size_t kUnits = 0, std::size_t kUnitsPerGroup = 0>
void ScoreRows(const float* HWY_RESTRICT q, std::size_t dk, const std::uint8_t* HWY_RESTRICT codes,
               std::size_t row_bytes, const float* HWY_RESTRICT scales, const float* HWY_RESTRICT biases,
               std::size_t groups, std::size_t gs, std::size_t nc, std::size_t ncp, float* HWY_RESTRICT tile,
               float* HWY_RESTRICT scores) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t KB = kKeysPerBlock<RB>, kBlocks = kMaxLanes / KB;
  for (std::size_t t0 = 0; t0 < nc; t0 += N) {
    const std::size_t in_tile = std::min(N, nc - t0);
    std::size_t blk = 0;
    for (; (blk + 1) * KB <= in_tile; ++blk) {
      const std::size_t key = t0 + blk * KB;
      // A few rows per block, not N rows per tile: a burst of prefetches fills the line
      // fill buffers and stalls the loads that follow.
      PrefetchRows(codes, row_bytes, std::min(nc, key + kPrefetchKeys), std::min(nc, key + kPrefetchKeys + KB));
      VF red[RB];
      KeyBlock<kBits, RB, KB, kUnits, kUnitsPerGroup>(df, q, dk, codes + key * row_bytes, row_bytes,
                                                      scales + key * groups, biases + key * groups, groups, gs, red);
#pragma GCC unroll 16
      for (std::size_t r = 0; r < RB; ++r) hn::StoreU(red[r], df, tile + (r * kBlocks + blk) * N);
    }
    if (blk < kBlocks) {  // the chunk's last keys: a partial block, then empty ones
      const std::size_t key = t0 + blk * KB, left = in_tile - blk * KB;
      VF part[RB][KB];
      for (std::size_t r = 0; r < RB; ++r) {
        for (std::size_t k = 0; k < KB; ++k) part[r][k] = hn::Zero(df);
      }
      for (std::size_t k = 0; k < left; ++k) {
        VF one[RB];
        KeyBlock<kBits, RB, 1>(df, q, dk, codes + (key + k) * row_bytes, row_bytes, scales + (key + k) * groups,
                               biases + (key + k) * groups, groups, gs, one);
        for (std::size_t r = 0; r < RB; ++r) part[r][k] = one[r];
      }
      for (std::size_t r = 0; r < RB; ++r) {
        PairRounds<KB>(df, part[r]);
        hn::StoreU(part[r][0], df, tile + (r * kBlocks + blk) * N);
        for (std::size_t b = blk + 1; b < kBlocks; ++b) hn::StoreU(hn::Zero(df), df, tile + (r * kBlocks + b) * N);
      }
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) {
      VF v[kBlocks];
#pragma GCC unroll 16
      for (std::size_t b = 0; b < kBlocks; ++b) v[b] = hn::LoadU(df, tile + (r * kBlocks + b) * N);
      PairRounds<kBlocks>(df, v);
      hn::StoreU(v[0], df, scores + r * ncp + t0);
    }
  }
}

// ---------------------------------------------------------------- V side

// out[r][pos] = Σ_{j<nc} w[r][g(pos)][j]·c_j[pos] for RB rows (pos in lane order), DS
// vectors of positions at a time. A DS·N-position slice lies in one group, or (DS·N =
// 64, group 32) in two, split at its middle.
template <int kBits, std::size_t RB, std::size_t DS>
void AccumulateValues(const float* HWY_RESTRICT w, std::size_t groups, std::size_t ncp,
                      const std::uint8_t* HWY_RESTRICT codes, std::size_t row_bytes, std::size_t dv, std::size_t gs,
                      std::size_t nc, float* HWY_RESTRICT out) {
  const DF df;
  constexpr std::size_t kV = kVecsPerUnit<kBits>;
  static_assert(DS % kV == 0, "a slice holds whole units");
  const std::size_t N = hn::Lanes(df);
  const std::size_t nvec = dv / N;
  const VF codes_table = NibbleCodes(df);
  for (std::size_t vs = 0; vs < nvec; vs += DS) {
    const std::size_t ga = vs * N / gs, gb = (vs + DS - 1) * N / gs;
    const std::size_t second = (gb - ga) * ncp;
    const float* wr[RB];
    for (std::size_t r = 0; r < RB; ++r) wr[r] = w + (r * groups + ga) * ncp;
    VF o[RB][DS];
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 16
      for (std::size_t s = 0; s < DS; ++s) o[r][s] = hn::Zero(df);
    }
    const std::uint8_t* row = codes + (vs / kV) * N;
    for (std::size_t j = 0; j < nc; ++j, row += row_bytes) {
      if (vs == 0 && j + kPrefetchKeys < nc) PrefetchRows(codes, row_bytes, j + kPrefetchKeys, j + kPrefetchKeys + 1);
      VF c[DS];
#pragma GCC unroll 16
      for (std::size_t uu = 0; uu < DS / kV; ++uu) {
        const VI bytes = LoadBytes(df, row + uu * N);
#pragma GCC unroll 2
        for (std::size_t t = 0; t < kV; ++t) c[uu * kV + t] = ValueCodes<kBits>(df, bytes, t, codes_table);
      }
#pragma GCC unroll 16
      for (std::size_t r = 0; r < RB; ++r) {
        const VF wa = hn::Set(df, wr[r][j]), wb = hn::Set(df, wr[r][j + second]);
#pragma GCC unroll 16
        for (std::size_t s = 0; s < DS; ++s) o[r][s] = hn::MulAdd(s < DS / 2 ? wa : wb, c[s], o[r][s]);
      }
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 16
      for (std::size_t s = 0; s < DS; ++s) hn::StoreU(o[r][s], df, out + r * dv + (vs + s) * N);
    }
  }
}

// ---------------------------------------------------------------- dispatch on rows

// RB rows with the head dim and group fixed at compile time where they are the common
// ones (AVX3, Dk = 128, group 64 or 128); any other shape takes the loops.
template <int kBits, std::size_t RB>
void ScoreRowsAnyShape(const float* q, std::size_t dk, const std::uint8_t* codes, std::size_t row_bytes,
                       const float* scales, const float* biases, std::size_t groups, std::size_t gs, std::size_t nc,
                       std::size_t ncp, float* tile, float* scores) {
  if constexpr (kManyRegisters && (RB == 4 || RB == 8)) {
    constexpr std::size_t kUnitDims = kVecsPerUnit<kBits> * kMaxLanes, kUnits = 128 / kUnitDims;
    if (dk == 128 && gs == 64) {
      return ScoreRows<kBits, RB, kUnits, 64 / kUnitDims>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc,
                                                         ncp, tile, scores);
    }
    if (dk == 128 && gs == 128) {
      return ScoreRows<kBits, RB, kUnits, kUnits>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile,
                                                  scores);
    }
  }
  ScoreRows<kBits, RB>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores);
}

template <int kBits>
void ScoreBlock(std::size_t rb, const float* q, std::size_t dk, const std::uint8_t* codes, std::size_t row_bytes,
                const float* scales, const float* biases, std::size_t groups, std::size_t gs, std::size_t nc,
                std::size_t ncp, float* tile, float* scores) {
  switch (rb) {
    case 1: return ScoreRows<kBits, 1>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores);
    case 2: return ScoreRows<kBits, 2>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores);
    case 3: return ScoreRows<kBits, 3>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores);
    case 4:
      return ScoreRowsAnyShape<kBits, 4>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores);
  }
  if constexpr (kManyRegisters) {
    ScoreRowsAnyShape<kBits, 8>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores);
  }
}

template <int kBits, std::size_t RB>
void ValueRowsAnyWidth(const float* w, std::size_t groups, std::size_t ncp, const std::uint8_t* codes,
                       std::size_t row_bytes, std::size_t dv, std::size_t gs, std::size_t nc, float* out) {
  const std::size_t nvec = dv / hn::Lanes(DF());
  // Four vectors per slice where the accumulators (RB·4) still fit the registers.
  const bool wide = nvec % 4 == 0 && (kManyRegisters ? RB <= 4 : RB <= 2);
  if (wide) return AccumulateValues<kBits, RB, 4>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
  return AccumulateValues<kBits, RB, 2>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
}

template <int kBits>
void ValueBlock(std::size_t rb, const float* w, std::size_t groups, std::size_t ncp, const std::uint8_t* codes,
                std::size_t row_bytes, std::size_t dv, std::size_t gs, std::size_t nc, float* out) {
  switch (rb) {
    case 1: return ValueRowsAnyWidth<kBits, 1>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
    case 2: return ValueRowsAnyWidth<kBits, 2>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
    case 3: return ValueRowsAnyWidth<kBits, 3>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
    case 4: return ValueRowsAnyWidth<kBits, 4>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
  }
  if constexpr (kManyRegisters) ValueRowsAnyWidth<kBits, 8>(w, groups, ncp, codes, row_bytes, dv, gs, nc, out);
}

// Rows per block: 8 where 32 registers hold 8 rows' accumulators, else 4; a remainder
// below 4 runs as is (1, 2 or 3 rows).
std::size_t RowBlock(std::size_t remaining) {
  if (kManyRegisters && remaining >= 8) return 8;
  return std::min<std::size_t>(4, remaining);
}

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
  const float* scales;  // [g][ncp] f32 V scales of the chunk
  const float* biases;
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
    if (capped) x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));  // capped before the mask is added
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
// registers, loops unrolled), 0 for any (vside.groups).
template <std::size_t kGroups>
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
  for (std::size_t t = t_lo; t < t_hi; t += N) {
    const VF p = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + t), vm));  // hidden: e^−inf = 0
    sum = hn::Add(sum, p);
    const auto used = hn::Ne(p, zero);
#pragma GCC unroll 8
    for (std::size_t g = 0; g < groups; ++g) {
      const std::size_t at = g * ncp + t;
      hn::StoreU(hn::IfThenElseZero(used, hn::Mul(p, hn::LoadU(df, scales + at))), df, weights + at);
      const VF pb = hn::IfThenElseZero(used, hn::Mul(p, hn::LoadU(df, biases + at)));
      if constexpr (kGroups == 0) {
        vside.bias_sums[g] += hn::GetLane(hn::SumOfLanes(df, pb));
      } else {
        bias_acc[g] = hn::Add(bias_acc[g], pb);
      }
    }
  }
  if constexpr (kGroups != 0) {
    for (std::size_t g = 0; g < kGroups; ++g) vside.bias_sums[g] = hn::GetLane(hn::SumOfLanes(df, bias_acc[g]));
  }
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
  switch (vside.groups) {
    case 1: out.sum = ExpRow<1>(s, out.max, t_lo, t_hi, ncp, vside); break;
    case 2: out.sum = ExpRow<2>(s, out.max, t_lo, t_hi, ncp, vside); break;
    case 4: out.sum = ExpRow<4>(s, out.max, t_lo, t_hi, ncp, vside); break;
    default: out.sum = ExpRow<0>(s, out.max, t_lo, t_hi, ncp, vside);
  }
  return out;
}

// ---------------------------------------------------------------- one task

// The code rows of chunk keys [j0, j0 + nc) of one side: packed 4/8-bit rows as they
// are, other widths unpacked to bytes (then read as 8-bit).
struct CodeRows {
  const std::uint8_t* data;
  std::size_t row_bytes;
  int bits;  // 4 or 8: the kernel that reads them
};

CodeRows ChunkCodes(const PackedSide& side, std::int64_t bk, std::int64_t lk, std::int64_t j0, std::size_t nc,
                    std::vector<std::uint8_t>& unpacked) {
  const std::int64_t words = side.d * side.bits / 32;
  const std::uint32_t* first = side.codes + (bk * lk + j0) * words;
  if (side.bits == 4 || side.bits == 8) {
    return {reinterpret_cast<const std::uint8_t*>(first), static_cast<std::size_t>(side.row_bytes()), side.bits};
  }
  const auto d = static_cast<std::size_t>(side.d);
  if (unpacked.size() < nc * d) unpacked.resize(nc * d);
  qd::unpack_rows(first, static_cast<std::int64_t>(nc), words, side.d, side.bits, unpacked.data());
  return {unpacked.data(), d, 8};
}

void DecodeChunk(const DecodePlan& plan, std::int64_t task) {
  static thread_local qd::Scratch scratch;
  qd::Scratch& sc = scratch;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const std::int64_t bk = task / plan.chunks, c = task % plan.chunks, b = bk / plan.hkv, kvh = bk % plan.hkv;
  const std::int64_t rows = plan.rows;
  const auto urows = static_cast<std::size_t>(rows);
  float* part_max = plan.part_max + task * rows;
  float* part_sum = plan.part_sum + task * rows;
  const std::int64_t j0 = std::max(c * plan.chunk, plan.span_lo[static_cast<std::size_t>(b)]);
  const std::int64_t j1 = std::min((c + 1) * plan.chunk, plan.span_hi[static_cast<std::size_t>(b)]);
  if (j0 >= j1) {  // no key of this chunk is visible to any row
    std::fill(part_max, part_max + rows, -INFINITY);
    std::fill(part_sum, part_sum + rows, 0.0f);
    return;
  }
  const auto nc = static_cast<std::size_t>(j1 - j0);
  const std::size_t ncp = (nc + N - 1) / N * N;
  const PackedSide &ks = plan.k, &vs = plan.v;
  const auto kg = static_cast<std::size_t>(ks.groups()), vg = static_cast<std::size_t>(vs.groups());
  const auto dk = static_cast<std::size_t>(ks.d), dv = static_cast<std::size_t>(vs.d);
  const std::size_t kmeta_row = static_cast<std::size_t>((bk * plan.lk + j0)) * kg;
  const std::size_t vmeta_row = static_cast<std::size_t>((bk * plan.lk + j0)) * vg;

  // K side: f32 scales/biases of the chunk, then the scores of every row.
  float* k_scales = aligned_floats(sc.k_scales, nc * kg);
  float* k_biases = aligned_floats(sc.k_biases, nc * kg);
  const std::size_t kbytes = dtype_size(ks.meta_dtype);
  to_f32(ks.scales + kmeta_row * kbytes, ks.meta_dtype, nc * kg, k_scales);
  to_f32(ks.biases + kmeta_row * kbytes, ks.meta_dtype, nc * kg, k_biases);
  const CodeRows kc = ChunkCodes(ks, bk, plan.lk, j0, nc, sc.k_codes);
  float* scores = aligned_floats(sc.scores, urows * ncp);
  float* tile = aligned_floats(sc.tile, 8 * N * N);
  const float* query = plan.query + static_cast<std::size_t>(bk * rows) * dk;
  const auto kgs = static_cast<std::size_t>(ks.group);
  for (std::size_t r0 = 0, rb = 0; r0 < urows; r0 += rb) {
    rb = RowBlock(urows - r0);
    if (kc.bits == 4) {
      ScoreBlock<4>(rb, query + r0 * dk, dk, kc.data, kc.row_bytes, k_scales, k_biases, kg, kgs, nc, ncp, tile,
                    scores + r0 * ncp);
    } else {
      ScoreBlock<8>(rb, query + r0 * dk, dk, kc.data, kc.row_bytes, k_scales, k_biases, kg, kgs, nc, ncp, tile,
                    scores + r0 * ncp);
    }
  }

  // Softmax pieces per row, then the V weights.
  float* v_scales = aligned_floats(sc.v_scales, vg * ncp);
  float* v_biases = aligned_floats(sc.v_biases, vg * ncp);
  const std::size_t vbytes = dtype_size(vs.meta_dtype);
  meta_columns(vs.scales + vmeta_row * vbytes, vs.meta_dtype, nc, vg, ncp, sc.convert, v_scales);
  meta_columns(vs.biases + vmeta_row * vbytes, vs.meta_dtype, nc, vg, ncp, sc.convert, v_biases);
  float* weights = aligned_floats(sc.weights, urows * vg * ncp);
  float* out_bias = aligned_floats(sc.out_bias, urows * vg);
  for (std::size_t rho = 0; rho < urows; ++rho) {
    const ValueSide vside{v_scales, v_biases, vg, weights + rho * vg * ncp, out_bias + rho * vg};
    const RowSoftmax sm = SoftmaxRow(plan, b, kvh, static_cast<std::int64_t>(rho), j0, nc, ncp, scores + rho * ncp,
                                     vside);
    part_max[rho] = sm.max;
    part_sum[rho] = sm.sum;
  }

  // V side: Σ (p·s)·c into the partial output (lane order), then + Σ p·b per group.
  const CodeRows vc = ChunkCodes(vs, bk, plan.lk, j0, nc, sc.v_codes);
  float* out = plan.part_out + static_cast<std::size_t>(task * rows) * dv;
  for (std::size_t r0 = 0, rb = 0; r0 < urows; r0 += rb) {
    rb = RowBlock(urows - r0);
    if (vc.bits == 4) {
      ValueBlock<4>(rb, weights + r0 * vg * ncp, vg, ncp, vc.data, vc.row_bytes, dv,
                    static_cast<std::size_t>(vs.group), nc, out + r0 * dv);
    } else {
      ValueBlock<8>(rb, weights + r0 * vg * ncp, vg, ncp, vc.data, vc.row_bytes, dv,
                    static_cast<std::size_t>(vs.group), nc, out + r0 * dv);
    }
  }
  const std::size_t vgs = static_cast<std::size_t>(vs.group);
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

void decode_chunk(const DecodePlan& plan, std::int64_t task) { HWY_DYNAMIC_DISPATCH(DecodeChunk)(plan, task); }

void exp_nonpositive(const float* x, std::size_t n, float* out, bool highway) {
  HWY_DYNAMIC_DISPATCH(ExpNonPositiveForTest)(x, n, out, highway);
}

}  // namespace kvlab::simd::qdecode
#endif  // HWY_ONCE
