// Per-target inner blocks of the fused quantized decode kernel, included by
// quantized_decode.cc only (whose header gives the plan, the arithmetic and its bounds):
// the code unpacking of 4- and 8-bit rows (or the loads of plain f16/bf16/f32 rows), the K side (RB query rows × KB keys of
// dequantized K, scores reduced N keys at a time), the V side (weighted code sums per
// group) and the dispatch of a row count onto those blocks.
#if defined(KVLAB_SIMD_QUANTIZED_DECODE_BLOCKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVLAB_SIMD_QUANTIZED_DECODE_BLOCKS_INL_H_
#undef KVLAB_SIMD_QUANTIZED_DECODE_BLOCKS_INL_H_
#else
#define KVLAB_SIMD_QUANTIZED_DECODE_BLOCKS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"
#include "kernels/simd/quantized_decode.h"

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

// Plain rows (PackedSide::plain) take the kernels with one of these in place of kBits:
// no scale or bias, each unit one vector of values in element order.
constexpr int kPlainF16 = 1016, kPlainBF16 = 2016, kPlainF32 = 1032;
// Plain bf16 rows below AVX-512 (PackedSide::bf16_pairs) take this one: a unit is N u32
// lanes of two neighbouring values, the even elements (low halves, shifted up) in its
// first vector and the odd ones (high halves, masked) in its second, the 4-bit lane
// order. One shift or one AND a vector, where element order widens each vector by a
// zero-extending shuffle and a shift: 4 % less time in L2 on a Zen 3, bf16 then as cheap
// as f16 (docs/benchmarks.md §Measurements behind kernel choices).
constexpr int kPlainBF16Pairs = 2017;
template <int kBits>
constexpr bool kPlain = kBits > 1000;
template <int kBits>
constexpr bool kPairs = kBits == kPlainBF16Pairs;
// mxfp8 rows take them with this: one E4M3 code a byte, laid out as 8-bit codes, read as
// the value·2^-120 (E4M3Values) beside the f32 scale 2^(c−7) of each E8M0 code c and a
// zero bias (quantized_decode.cc, E4M3Factors): the affine arithmetic then gives the
// values themselves.
constexpr int kE4M3 = 508;
// ggml's q8_0 rows take them with this: signed bytes read as they lie, with their scale d
// and a zero bias (PackedSide::s8), where the 8-bit kernels would need each byte's top bit
// flipped and a bias of −128d.
constexpr int kS8 = 608;
// mxfp4 rows take them with this: E2M1 codes two a byte, laid out as 4-bit codes, each read
// as the signed integer 2v of its value v (E2M1Codes) beside the scale s/2 of the group's
// E8M0 scale s and a zero bias (quantized_sdpa.cc, mxfp4_as_affine): the affine
// arithmetic then gives v·s exactly, and a group's sum over keys holds no bias to cancel.
constexpr int kE2M1 = 404;
// nvfp4 rows take them with this (PackedSide::e4m3_scales, AVX3 only): E2M1 codes as kE2M1,
// but in groups of 16, half of kE2M1's unit of 2N = 32 codes. So vector t of a unit holds
// bytes [t·N/2, (t + 1)·N/2)'s low nibbles, then their high ones: one whole group per
// vector (the "halves" lane order, lane_to_element), whose table and V weight are the
// group's own.
constexpr int kE2M1Halves = 416;
template <int kBits>
constexpr bool kHalves = kBits == kE2M1Halves;
// Bits a code of the kernel's rows takes in memory (not plain).
template <int kBits>
constexpr int kCodeWidth = kBits == kE4M3 || kBits == kS8 ? 8 : kBits == kE2M1 || kHalves<kBits> ? 4 : kBits;
// Rows of two codes a byte, the nibbles split into two vectors (affine 4-bit and E2M1).
template <int kBits>
constexpr bool kNibbles = kCodeWidth<kBits> == 4;

// One unit = the codes of N·kLaneBytes bytes: 8-bit → 1 vector (element order); 4-bit →
// 2 vectors, low nibbles (even elements) then high nibbles (odd elements); plain → 1
// vector of N values; bf16 pairs → 2 vectors of N values, even then odd elements.
template <int kBits>
constexpr std::size_t kVecsPerUnit = kNibbles<kBits> || kPairs<kBits> ? 2 : 1;
template <int kBits>
constexpr std::size_t kLaneBytes = kBits == kPlainF32 || kPairs<kBits> ? 4 : kPlain<kBits> ? 2 : 1;
// Bytes of a row of d elements.
template <int kBits>
constexpr std::size_t RowBytes(std::size_t d) {
  return kPairs<kBits> ? d * 2 : kPlain<kBits> ? d * kLaneBytes<kBits> : d * kCodeWidth<kBits> / 8;
}

// N plain values at p as f32: exact (f16 by vcvtph2ps where F16C exists, which only
// quiets a signalling NaN; attention makes any NaN input a NaN output anyway).
template <int kBits>
HWY_INLINE VF PlainValues(DF df, const std::uint8_t* HWY_RESTRICT p) {
  namespace hc = kvlab::simd::HWY_NAMESPACE;
  if constexpr (kBits == kPlainF32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(p));
  } else if constexpr (kBits == kPlainBF16) {
    return hc::LoadBF16(df, reinterpret_cast<const std::uint16_t*>(p));
  } else {
    return hc::LoadF16QuietingNaN(df, reinterpret_cast<const std::uint16_t*>(p));
  }
}

// The kVecsPerUnit<kBits> vectors of the plain unit at p into c[0..]: PlainValues, or for
// bf16 pairs the even elements then the odd ones, exactly (a bf16 pattern shifted into
// the top half of a u32 is its f32).
template <int kBits>
HWY_INLINE void PlainUnit(DF df, const std::uint8_t* HWY_RESTRICT p, VF* HWY_RESTRICT c) {
  if constexpr (kPairs<kBits>) {
    const hn::RebindToUnsigned<DF> du;
    const auto pairs = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
    c[0] = hn::BitCast(df, hn::ShiftLeft<16>(pairs));
    c[1] = hn::BitCast(df, hn::And(pairs, hn::Set(du, 0xFFFF0000u)));
  } else {
    c[0] = PlainValues<kBits>(df, p);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 4-bit codes become floats by a 16-entry table lookup (vpermps), see LookupNibbles.
constexpr bool kNibbleLookup = true;
#else
constexpr bool kNibbleLookup = false;
#endif

// The lookup table of a nibble's code as a float: a 4-bit code is itself, 0..15; an E2M1
// code of value v is 2v (bit 3 the sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6).
// Only the first N entries are loaded where a vector holds fewer than 16 lanes (no lookup
// reads it there).
template <int kBits>
HWY_INLINE VF NibbleCodes(DF df) {
  alignas(64) static constexpr float kFours[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  alignas(64) static constexpr float kE2M1s[16] = {0, 1, 2, 3, 4, 6, 8, 12, -0.0f, -1, -2, -3, -4, -6, -8, -12};
  return hn::Load(df, kBits == kE2M1 || kHalves<kBits> ? kE2M1s : kFours);
}

using VI = hn::Vec<hn::RebindToSigned<DF>>;

// The N bytes at p, one per lane (int32): zero-extended, or sign-extended for kS8 codes and
// for E4M3 codes (whose sign bit E4M3Values then finds in every high bit).
template <int kBits>
HWY_INLINE VI LoadBytes(DF, const std::uint8_t* HWY_RESTRICT p) {
  const hn::RebindToSigned<DF> di;
  if constexpr (kBits == kE4M3 || kBits == kS8) {
    return hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::int8_t, DF>(), reinterpret_cast<const std::int8_t*>(p)));
  } else {
    return hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::uint8_t, DF>(), p));
  }
}

// E4M3 codes (sign-extended bytes) as their values·2^-120, exactly: the sign to bit 31 and
// the 7 magnitude bits to bits 20–26 make the f32 whose exponent field is E4M3's and whose
// top 3 mantissa bits are its mantissa, so 2^(e−127)·(1 + m/8) = 2^-120·2^(e−7)·(1 + m/8);
// for e = 0 the f32 subnormal m·2^-129 = 2^-120·m·2^-9 is E4M3's subnormal. The magnitude
// 0x7F reads as 480, as the oracle's decode (reference/fp_quantize.h). Two operations per
// N codes, where a decode to the values themselves (fp_quantize.cc's E4M3Decode) takes a
// multiply more; the 2^120 goes into the scales.
HWY_INLINE VF E4M3Values(DF df, VI bytes) {
  const hn::RebindToSigned<DF> di;
  return hn::BitCast(df, hn::And(hn::ShiftLeft<20>(bytes), hn::Set(di, static_cast<std::int32_t>(0x87F00000u))));
}

// E2M1 codes n (0..15, one a lane) as the signed integers 2v of their values v, by
// arithmetic where no 16-entry lookup exists: the magnitude code m = n & 7 has 2|v| = m
// for m <= 4 and 6, 8, 12 for m = 5, 6, 7, which is m + max(m − 4, 0) + 2·max(m − 6, 0);
// bit 3 negates it. Plans on those targets unpack mxfp4 to bytes instead (faster:
// e2m1_nibbles_available); this keeps the E2M1 kernel right on every target
// (E2M1CodesForTest).
HWY_INLINE VI E2M1Codes(VI n) {
  const hn::RebindToSigned<DF> di;
  const VI zero = hn::Zero(di), m = hn::And(n, hn::Set(di, 7));
  const VI above4 = hn::Max(hn::Sub(m, hn::Set(di, 4)), zero), above6 = hn::Max(hn::Sub(m, hn::Set(di, 6)), zero);
  const VI twice = hn::Add(hn::Add(m, above4), hn::Add(above6, above6));
  const auto negative = hn::Ne(hn::And(n, hn::Set(di, 8)), zero);
  return hn::IfThenElse(negative, hn::Neg(twice), twice);
}

// Vector t of a kE2M1Halves unit from LoadBytes's N bytes: lanes [t·N/2, (t + 1)·N/2)
// twice, the second copy shifted down to its high nibbles (bits above 3 left as they are).
// AVX-512 only: DispatchKernel instantiates kE2M1Halves on the AVX3 targets alone, and a
// use on any other target fails to compile rather than run an untested branch.
template <int kBits>
HWY_INLINE VI HalvesNibbles(VI bytes, std::size_t t) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const __m512i pick = t == 0 ? _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7)
                              : _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
  return VI{_mm512_srlv_epi32(_mm512_permutexvar_epi32(pick, bytes.raw), shift)};
#else
  static_assert(kBits != kBits, "kE2M1Halves is read on AVX-512 targets only (DispatchKernel)");
  (void)t;
  return bytes;
#endif
}

// Codes of part t of a unit as floats, `bytes` from LoadBytes: 8-bit the bytes themselves;
// 4-bit the low (t = 0) or high (t = 1) nibbles; E2M1 those nibbles as 2v (kE2M1Halves:
// HalvesNibbles's); E4M3 the values·2^-120; kS8 the signed bytes.
template <int kBits>
HWY_INLINE VF CodesAsFloats(DF df, VI bytes, std::size_t t) {
  const hn::RebindToSigned<DF> di;
  if constexpr (kHalves<kBits>) {
    return hn::ConvertTo(df, E2M1Codes(hn::And(HalvesNibbles<kBits>(bytes, t), hn::Set(di, 15))));
  } else if constexpr (kNibbles<kBits>) {
    const VI nibbles = t == 0 ? hn::And(bytes, hn::Set(di, 15)) : hn::ShiftRight<4>(bytes);
    return hn::ConvertTo(df, kBits == kE2M1 ? E2M1Codes(nibbles) : nibbles);
  } else if constexpr (kBits == kE4M3) {
    return E4M3Values(df, bytes);
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

// V codes of part t of a unit as floats; 4-bit and E2M1 on AVX3 by lookups in
// NibbleCodes<kBits>() (a shift and convert for the high nibble measured no faster).
template <int kBits>
HWY_INLINE VF ValueCodes(DF df, VI bytes, std::size_t t, [[maybe_unused]] VF nibble_codes) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kHalves<kBits>) return LookupNibbles(HalvesNibbles<kBits>(bytes, t), 0, nibble_codes);
  if constexpr (kNibbles<kBits>) return LookupNibbles(bytes, t, nibble_codes);
#endif
  return CodesAsFloats<kBits>(df, bytes, t);
}

// K codes of part t of a unit dequantized, k = c·s + b by one MulAdd. 4-bit and E2M1 on
// AVX3: `table` holds the key's 16 values c·s + b of this group (the same MulAdd, so the
// same bits), and one lookup both unpacks and dequantizes.
template <int kBits>
HWY_INLINE VF KeyValues(DF df, VI bytes, std::size_t t, [[maybe_unused]] VF table, VF scale, VF bias) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kHalves<kBits>) return LookupNibbles(HalvesNibbles<kBits>(bytes, t), 0, table);
  if constexpr (kNibbles<kBits>) return LookupNibbles(bytes, t, table);
#endif
  return hn::MulAdd(CodesAsFloats<kBits>(df, bytes, t), scale, bias);
}

// Software prefetch, kPrefetchKeys keys ahead: each side of a chunk is one sequential
// stream, but the hardware prefetcher alone leaves DRAM latency exposed at 2 cores. One
// line is asked for per line the kernel reads, among the arithmetic on that line: issued
// in bursts (a block's 16 lines at once), the prefetches fill the line fill buffers, and
// the time of the read and of the compute add up instead of overlapping. 64 keys ahead
// (8 KiB of 8-bit rows at Dk 128, 16 KiB of f16) beat 32 on every decode row of the Intel
// Xeon, as a streaming loop with arithmetic gains when its prefetches run further ahead
// (docs/benchmarks.md §Measurements behind kernel choices).
constexpr std::size_t kPrefetchKeys = 64;
// Into L2 (prefetcht2, locality 1): on the Intel Xeon the f16/bf16 decode read 70-72 % of
// the DRAM read this way and 65-67 % with prefetcht0, into L1 (docs/benchmarks.md).
HWY_INLINE void PrefetchLine(const std::uint8_t* p) { __builtin_prefetch(p, 0, 1); }

// Key order of a chunk. Its keys are read in order, or, where every row sees every key of
// the chunk and the call's K and V are too large to stay in cache (KeyOrder::quarter >
// 0), as four interleaved streams: position j (the order of the scores, the softmax
// weights and the V side's sum) is key j/4 + (j%4)·quarter, so a block of 4 consecutive
// positions is one key of each quarter. From DRAM four streams keep more lines in flight
// while the arithmetic runs on the Intel Xeon of model 167; in L2 they cost time, and
// from DRAM too on the Xeon of model 207 and on AMD (Zen 4), so only model 167 takes them
// (quarter_order_available; docs/benchmarks.md §Measurements behind kernel choices).
// Softmax and the sums do not depend on the order beyond rounding, and the order depends
// only on the shape and the CPU, never on the thread count.
struct KeyOrder {
  std::size_t quarter = 0;  // 0: in order
  HWY_INLINE std::size_t Key(std::size_t j) const { return quarter == 0 ? j : j / 4 + (j % 4) * quarter; }
};

// A chunk's code bytes in the order the K side looks ahead: its K rows, then its V rows,
// so the K side's last keys fetch the first rows the V side reads after the softmax.
struct ChunkStream {
  const std::uint8_t* k = nullptr;
  std::size_t k_bytes = 0;
  const std::uint8_t* v = nullptr;
  std::size_t v_bytes = 0;

  // The line holding stream byte pos; nothing past the stream's end (the V side's last
  // slice looks ahead into the next task's chunk).
  HWY_INLINE void Prefetch(std::size_t pos) const {
    if (pos < k_bytes) return PrefetchLine(k + pos);
    if (pos - k_bytes < v_bytes) PrefetchLine(v + (pos - k_bytes));
  }
};

// The first K rows of the task this thread runs after the current one
// (claim_next_task): where the V side's last slice looks ahead past the chunk's end.
struct NextChunk {
  const std::uint8_t* rows = nullptr;  // null: no such task
  std::size_t row_bytes = 0;
};

// The V side reads a chunk slice by slice: bytes [s0, s0 + sb) of every row, then the
// next slice's. Key j prefetches its slice's lines of key j + kPrefetchKeys; past the
// chunk's end, the next slice's lines of the first keys (the K side fetched the first
// slice's), or after the last slice the next chunk's K rows, whole.
struct SliceStream {
  const std::uint8_t* codes;
  std::size_t row_bytes, nc, s0, sb;
  bool last;
  NextChunk next;

  HWY_INLINE void Prefetch(std::size_t j) const { PrefetchKey(j + kPrefetchKeys); }
  // The slice's lines of key `key` (past the chunk's end: as Prefetch says).
  HWY_INLINE void PrefetchKey(std::size_t key) const {
    if (key < nc) return Lines(codes + key * row_bytes + s0, sb);
    key -= nc;
    if (!last) return Lines(codes + key * row_bytes + s0 + sb, sb);
    if (next.rows != nullptr) Lines(next.rows + key * next.row_bytes, next.row_bytes);
  }
  static HWY_INLINE void Lines(const std::uint8_t* p, std::size_t bytes) {
    for (std::size_t off = 0; off < bytes; off += 64) PrefetchLine(p + off);
  }
};

// ---------------------------------------------------------------- K side: scores

#if HWY_TARGET != HWY_SCALAR
// Round kRound (0-based) of the transposing reduction, on neighbours lo = v[2i] and hi =
// v[2i+1]: each output lane sums two lanes of one input. Generic: lanes (2k, 2k+1) of lo
// go to the low half, of hi to the high half (ConcatEven/ConcatOdd, any round). AVX-512:
// rounds 0-1 pair floats inside each 128-bit block (vshufps), rounds 2-3 pair the blocks
// (vshuff32x4); after the four rounds of 16 vectors lane i again holds the sum of v[i].
// Both shuffles keep their inputs, where vpermt2ps overwrites one (so a copy precedes
// it), and each is a cheaper shuffle than vpermt2ps: the bf16 K side spent most of
// its time in this reduction on a Zen 4
// (docs/benchmarks.md §Measurements behind kernel choices).
template <std::size_t kRound>
HWY_INLINE VF PairRound(DF df, VF lo, VF hi) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)df;
  if constexpr (kRound < 2) {
    return VF{_mm512_add_ps(_mm512_shuffle_ps(lo.raw, hi.raw, 0x88), _mm512_shuffle_ps(lo.raw, hi.raw, 0xDD))};
  } else {
    return VF{_mm512_add_ps(_mm512_shuffle_f32x4(lo.raw, hi.raw, 0x88), _mm512_shuffle_f32x4(lo.raw, hi.raw, 0xDD))};
  }
#else
  return hn::Add(hn::ConcatEven(df, hi, lo), hn::ConcatOdd(df, hi, lo));
#endif
}

// Rounds kFirst.. of the reduction over n consecutive vectors: afterwards lane i of v[0]
// holds the full sum of the original v[i] (n = N, kFirst = 0), or, for n < N, the part
// of the full N-vector tree's sums that these vectors contribute. Rounds only ever
// combine neighbours, so log2(KB) rounds over each block of KB consecutive vectors and
// then rounds log2(KB).. over the N/KB results are exactly the full tree.
template <std::size_t n, std::size_t kFirst = 0>
HWY_INLINE void PairRounds(DF df, VF* v) {
  if constexpr (n > 1) {
#pragma GCC unroll 16
    for (std::size_t i = 0; i < n / 2; ++i) v[i] = PairRound<kFirst>(df, v[2 * i], v[2 * i + 1]);
    PairRounds<n / 2, kFirst + 1>(df, v);
  }
}
#else
template <std::size_t n, std::size_t kFirst = 0>
HWY_INLINE void PairRounds(DF, VF*) {
  static_assert(n == 1, "one lane: nothing to reduce");
}
#endif

// Rounds of a tree over n vectors (n a power of two).
constexpr std::size_t RoundsOf(std::size_t n) { return n <= 1 ? 0 : 1 + RoundsOf(n / 2); }

constexpr std::size_t kMaxLanes = hn::MaxLanes(DF());

// The last log2(kBlocks) rounds of a tile's reduction: the kBlocks partly reduced vectors
// of each of RB rows (tile [r][block][N]) → one vector of N scores at scores[r·ncp].
template <std::size_t RB, std::size_t kBlocks>
HWY_INLINE void FinishTile(DF df, const float* HWY_RESTRICT tile, std::size_t ncp, float* HWY_RESTRICT scores) {
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 16
  for (std::size_t r = 0; r < RB; ++r) {
    VF v[kBlocks];
#pragma GCC unroll 16
    for (std::size_t b = 0; b < kBlocks; ++b) v[b] = hn::LoadU(df, tile + (r * kBlocks + b) * N);
    PairRounds<kBlocks, RoundsOf(kMaxLanes / kBlocks)>(df, v);
    hn::StoreU(v[0], df, scores + r * ncp);
  }
}

// q·k of KB consecutive keys for RB rows. Each key's codes are dequantized once for all
// RB rows, k = c·s + b in one MulAdd (4-bit on AVX3: in the table lookup itself); then
// one accumulator per (key, row) over the whole head dim, and the first log2(KB) rounds
// of the score reduction in registers: out[r] holds the KB keys' partial sums.
// kUnits/kUnitsPerGroup: the head dim and group in units when fixed at compile time (0:
// from dk and gs). Fixed, the block is straight-line code: with the common 2 or 4 units
// per group, loop control, table setup and the reduction otherwise cost as much as the
// FMAs (measured: half of the K side's time outside its inner loop).
// ahead (null: none): the block's prefetches, from stream byte ahead_pos on. key_stride:
// bytes from one key of the block to the next (0: row_bytes, consecutive keys).
template <int kBits, std::size_t RB, std::size_t KB, std::size_t kUnits = 0, std::size_t kUnitsPerGroup = 0>
HWY_INLINE void KeyBlock(DF df, const float* HWY_RESTRICT q, std::size_t dk, const std::uint8_t* HWY_RESTRICT codes,
                         std::size_t row_bytes, const float* HWY_RESTRICT scales, const float* HWY_RESTRICT biases,
                         std::size_t groups, std::size_t gs, VF* HWY_RESTRICT out,
                         const ChunkStream* ahead = nullptr, std::size_t ahead_pos = 0, std::size_t key_stride = 0) {
  constexpr std::size_t kV = kVecsPerUnit<kBits>;
  const std::size_t N = hn::Lanes(df);
  // kE2M1Halves: a unit is two groups, one per vector (units_per_group 1, groups_per_step 2).
  constexpr std::size_t kGroupsPerStep = kHalves<kBits> ? kV : 1;
  const std::size_t units = kUnits != 0 ? kUnits : dk / (kV * N);
  const std::size_t units_per_group =
      kHalves<kBits> ? 1 : kUnitsPerGroup != 0 ? kUnitsPerGroup : gs / (kV * N);
  if constexpr (kUnits != 0) {  // the strides too, so addresses are base + constant
    dk = kUnits * kV * kMaxLanes;
    row_bytes = RowBytes<kBits>(dk);
    groups = kUnits * kGroupsPerStep / kUnitsPerGroup;
  }
  if (key_stride == 0) key_stride = row_bytes;
  VF acc[KB][RB];
#pragma GCC unroll 16
  for (std::size_t k = 0; k < KB; ++k) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) acc[k][r] = hn::Zero(df);
  }
  // 4-bit with lookups: the table of a (key, group) holds its 16 values c·s + b (see
  // KeyValues); otherwise scale and bias are applied to each unpacked vector.
  constexpr bool kTable = kNibbles<kBits> && kNibbleLookup;
  const VF codes_table = NibbleCodes<kBits>(df);
#pragma GCC unroll 8
  for (std::size_t u0 = 0, g = 0; u0 < units; u0 += units_per_group, g += kGroupsPerStep) {
    VF table[KB][kGroupsPerStep], scale[KB][kGroupsPerStep], bias[KB][kGroupsPerStep];
    if constexpr (!kPlain<kBits>) {
#pragma GCC unroll 16
      for (std::size_t k = 0; k < KB; ++k) {
#pragma GCC unroll 2
        for (std::size_t h = 0; h < kGroupsPerStep; ++h) {
          scale[k][h] = hn::Set(df, scales[k * groups + g + h]);
          bias[k][h] = hn::Set(df, biases[k * groups + g + h]);
          table[k][h] = kTable ? hn::MulAdd(codes_table, scale[k][h], bias[k][h]) : codes_table;
        }
      }
    }
#pragma GCC unroll 8
    for (std::size_t u = u0; u < u0 + units_per_group; ++u) {
      const std::size_t unit_byte = u * N * kLaneBytes<kBits>;
      if (ahead != nullptr && unit_byte % 64 == 0) {  // a line of each key at its first unit
#pragma GCC unroll 16
        for (std::size_t k = 0; k < KB; ++k) ahead->Prefetch(ahead_pos + k * key_stride + unit_byte);
      }
      VF c[KB][kV];
#pragma GCC unroll 16
      for (std::size_t k = 0; k < KB; ++k) {
        if constexpr (kPlain<kBits>) {
          PlainUnit<kBits>(df, codes + k * key_stride + u * N * kLaneBytes<kBits>, c[k]);
        } else {
          const VI bytes = LoadBytes<kBits>(df, codes + k * key_stride + u * N);
#pragma GCC unroll 2
          for (std::size_t t = 0; t < kV; ++t) {
            const std::size_t h = kHalves<kBits> ? t : 0;
            c[k][t] = KeyValues<kBits>(df, bytes, t, table[k][h], scale[k][h], bias[k][h]);
          }
        }
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
// With 16 registers, 2 keys at 4 rows need one register more than there are (8
// accumulators, 4 code vectors, a q vector, two keys' scale and bias) and still beat 1
// key: each q load then serves two keys, and the K side is bound by loads and FMAs, not by
// the accumulators' latency (bench/records/2026-11-27-zen3-avx2.md, "Night").
template <std::size_t RB>
constexpr std::size_t kKeysPerBlock = std::min(kMaxLanes, kManyRegisters && RB <= 4 ? std::size_t{4} : std::size_t{2});
// Row blocks whose K side can read a chunk in quarters (KeyOrder): blocks of 4 keys.
template <std::size_t RB>
constexpr bool kQuarterOrder = kKeysPerBlock<RB> == 4;
// Keys per block of a chunk read in order. At 4 rows, 8-bit codes and plain f16 take 2:
// their unpacks (widen + convert per 16 codes or values, the codes' scale and bias per
// key) leave 4 keys' 16 accumulators short of registers, and the spills cost more than
// the q loads that 2 keys share less (docs/benchmarks.md §Measurements behind kernel choices).
// The quarters keep blocks of 4: one key of each quarter.
template <int kBits, std::size_t RB>
constexpr std::size_t kInOrderKeysPerBlock =
    RB == 4 && (kCodeWidth<kBits> == 8 || kBits == kPlainF16) ? std::min(kMaxLanes, std::size_t{2}) : kKeysPerBlock<RB>;

// meta + offset, or null for plain rows (which have no scales or biases).
template <int kBits>
HWY_INLINE const float* Meta(const float* meta, std::size_t offset) {
  return kPlain<kBits> ? nullptr : meta + offset;
}

// Raw scores q·k of keys [0, nc) for RB rows → scores[r][0, ncp) (keys past nc get 0;
// they are masked later). scales/biases: the chunk's K scales and biases in f32, as
// stored: [key][group].
// Per N keys: N/KB blocks, each reduced by log2(KB) rounds in registers and parked in
// `tile` ([r][block][N]), then the remaining log2(N/KB) rounds give a vector of N scores.
// order: the chunk's key order (quarters only where kQuarterOrder<RB>, for plain rows and
// nc a multiple of 64; the caller checks).
template <int kBits, std::size_t RB, std::size_t kUnits = 0, std::size_t kUnitsPerGroup = 0>
void ScoreRows(const float* HWY_RESTRICT q, std::size_t dk, const std::uint8_t* HWY_RESTRICT codes,
               std::size_t row_bytes, const float* HWY_RESTRICT scales, const float* HWY_RESTRICT biases,
               std::size_t groups, std::size_t gs, std::size_t nc, std::size_t ncp, float* HWY_RESTRICT tile,
               float* HWY_RESTRICT scores, const ChunkStream* ahead, KeyOrder order) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  if constexpr (kQuarterOrder<RB> && kPlain<kBits>) {
    constexpr std::size_t KB = kKeysPerBlock<RB>, kBlocks = kMaxLanes / KB;
    if (order.quarter != 0) {  // the block at position t: key t/4 of each quarter; prefetch 8 keys on in each
      for (std::size_t t0 = 0; t0 < nc; t0 += N) {
        for (std::size_t blk = 0; blk < kBlocks; ++blk) {
          const std::size_t key = (t0 + blk * KB) / 4;
          VF red[RB];
          KeyBlock<kBits, RB, KB, kUnits, kUnitsPerGroup>(df, q, dk, codes + key * row_bytes, row_bytes, nullptr,
                                                          nullptr, groups, gs, red, ahead,
                                                          (key + kPrefetchKeys / 4) * row_bytes,
                                                          order.quarter * row_bytes);
#pragma GCC unroll 16
          for (std::size_t r = 0; r < RB; ++r) hn::StoreU(red[r], df, tile + (r * kBlocks + blk) * N);
        }
        FinishTile<RB, kBlocks>(df, tile, ncp, scores + t0);
      }
      return;
    }
  }
  constexpr std::size_t KB = kInOrderKeysPerBlock<kBits, RB>, kBlocks = kMaxLanes / KB;
  for (std::size_t t0 = 0; t0 < nc; t0 += N) {
    const std::size_t in_tile = std::min(N, nc - t0);
    std::size_t blk = 0;
    for (; (blk + 1) * KB <= in_tile; ++blk) {
      const std::size_t key = t0 + blk * KB;
      VF red[RB];
      KeyBlock<kBits, RB, KB, kUnits, kUnitsPerGroup>(df, q, dk, codes + key * row_bytes, row_bytes,
                                                      Meta<kBits>(scales, key * groups), Meta<kBits>(biases, key * groups),
                                                      groups, gs, red, ahead, (key + kPrefetchKeys) * row_bytes);
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
        KeyBlock<kBits, RB, 1>(df, q, dk, codes + (key + k) * row_bytes, row_bytes,
                               Meta<kBits>(scales, (key + k) * groups), Meta<kBits>(biases, (key + k) * groups), groups,
                               gs, one);
        for (std::size_t r = 0; r < RB; ++r) part[r][k] = one[r];
      }
      for (std::size_t r = 0; r < RB; ++r) {
        PairRounds<KB>(df, part[r]);
        hn::StoreU(part[r][0], df, tile + (r * kBlocks + blk) * N);
        for (std::size_t b = blk + 1; b < kBlocks; ++b) hn::StoreU(hn::Zero(df), df, tile + (r * kBlocks + b) * N);
      }
    }
    FinishTile<RB, kBlocks>(df, tile, ncp, scores + t0);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// K side of plain bf16 K with the stored bf16 queries (DecodePlan::query_bf16), by
// AVX512_BF16's vdpbf16ps (the caller checked the CPU): each lane adds two bf16 products,
// exact in f32, to an f32 accumulator, so 32 elements take one instruction where the f32
// path widens K and spends two FMAs. Scores come out unscaled (the caller multiplies by
// the scale) and reduced like ScoreRows': KB keys per block in registers, then the tile.
// kb keys (KB at compile time) from `key` for RB rows; kUnits: Dk/32 when fixed (0: dk/32).
// The attribute names the target's own features too: clang lets a function's target
// attribute replace the one Highway's pragma gives, and would then refuse to inline
// Highway's ops into it (GCC adds the two).
#undef KVLAB_TARGET_BF16
#define KVLAB_TARGET_BF16 __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
// The queries of RB rows as bf16 vectors: in registers for the whole chunk when they fit
// (RB·Dk/32 <= 16 with Dk fixed), reloaded from L1 per block otherwise.
template <std::size_t RB, std::size_t kUnits>
constexpr bool kHeldQueries = kUnits != 0 && RB * kUnits <= 16;

template <std::size_t RB, std::size_t KB, std::size_t kUnits>
KVLAB_TARGET_BF16 HWY_INLINE void KeyBlockBf16(const std::uint16_t* HWY_RESTRICT q, std::size_t dk,
                                              const __m512bh (&held)[RB][kUnits == 0 ? 1 : kUnits],
                                              const std::uint8_t* HWY_RESTRICT codes, std::size_t row_bytes,
                                              VF* out) {
  const DF df;
  const std::size_t units = kUnits != 0 ? kUnits : dk / 32;
  if constexpr (kUnits != 0) {
    dk = kUnits * 32;
    row_bytes = dk * 2;
  }
  __m512 acc[KB][RB];
#pragma GCC unroll 16
  for (std::size_t k = 0; k < KB; ++k) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) acc[k][r] = _mm512_setzero_ps();
  }
#pragma GCC unroll 8
  for (std::size_t u = 0; u < units; ++u) {
    __m512bh kv[KB];
#pragma GCC unroll 16
    for (std::size_t k = 0; k < KB; ++k) {
      kv[k] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(codes + k * row_bytes + u * 64));
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) {
      __m512bh qv;
      if constexpr (kHeldQueries<RB, kUnits>) {
        qv = held[r][u];
      } else {
        qv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + r * dk + u * 32));
      }
#pragma GCC unroll 16
      for (std::size_t k = 0; k < KB; ++k) acc[k][r] = _mm512_dpbf16_ps(acc[k][r], qv, kv[k]);
    }
  }
#pragma GCC unroll 16
  for (std::size_t r = 0; r < RB; ++r) {
    VF v[KB];
#pragma GCC unroll 16
    for (std::size_t k = 0; k < KB; ++k) v[k] = VF{acc[k][r]};
    PairRounds<KB>(df, v);
    out[r] = v[0];
  }
}

// No software prefetch here, unlike ScoreRows and the V side: the hardware prefetchers
// follow this one forward stream, and the prefetches only held line fill buffers (from
// DRAM the row was slower with them). With the queries held (kHeldQueries) a block is 2
// keys, so that the KB·RB accumulators, the queries and the key vectors fit the 32
// registers: reloading the queries every block cost in cache and more from DRAM, where
// those loads queue behind the misses
// (docs/benchmarks.md §Measurements behind kernel choices).
template <std::size_t RB, std::size_t kUnits>
KVLAB_TARGET_BF16 void ScoreRowsBf16(const std::uint16_t* HWY_RESTRICT q, std::size_t dk,
                                     const std::uint8_t* HWY_RESTRICT codes, std::size_t row_bytes, std::size_t nc,
                                     std::size_t ncp, float* HWY_RESTRICT tile, float* HWY_RESTRICT scores) {
  const DF df;
  constexpr std::size_t N = 16, KB = kHeldQueries<RB, kUnits> ? 2 : kKeysPerBlock<RB>, kBlocks = N / KB;
  __m512bh held[RB][kUnits == 0 ? 1 : kUnits];
  if constexpr (kHeldQueries<RB, kUnits>) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 8
      for (std::size_t u = 0; u < kUnits; ++u) {
        held[r][u] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + r * kUnits * 32 + u * 32));
      }
    }
  }
  for (std::size_t t0 = 0; t0 < nc; t0 += N) {
    const std::size_t in_tile = std::min(N, nc - t0);
    for (std::size_t blk = 0; blk < kBlocks; ++blk) {
      const std::size_t key = t0 + blk * KB;
      VF red[RB];
      if ((blk + 1) * KB <= in_tile) {
        KeyBlockBf16<RB, KB, kUnits>(q, dk, held, codes + key * row_bytes, row_bytes, red);
      } else {  // the chunk's last keys one at a time, zeros past them
        VF part[RB][KB];
        for (std::size_t r = 0; r < RB; ++r) {
          for (std::size_t k = 0; k < KB; ++k) part[r][k] = hn::Zero(df);
        }
        for (std::size_t k = 0; blk * KB + k < in_tile; ++k) {
          VF one[RB];
          KeyBlockBf16<RB, 1, kUnits>(q, dk, held, codes + (key + k) * row_bytes, row_bytes, one);
          for (std::size_t r = 0; r < RB; ++r) part[r][k] = one[r];
        }
        for (std::size_t r = 0; r < RB; ++r) {
          PairRounds<KB>(df, part[r]);
          red[r] = part[r][0];
        }
      }
#pragma GCC unroll 16
      for (std::size_t r = 0; r < RB; ++r) hn::StoreU(red[r], df, tile + (r * kBlocks + blk) * N);
    }
    FinishTile<RB, kBlocks>(df, tile, ncp, scores + t0);
  }
}

template <std::size_t RB>
void ScoreRowsBf16AnyShape(const std::uint16_t* q, std::size_t dk, const std::uint8_t* codes, std::size_t row_bytes,
                           std::size_t nc, std::size_t ncp, float* tile, float* scores) {
  if (dk == 128) return ScoreRowsBf16<RB, 4>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
  if (dk == 64) return ScoreRowsBf16<RB, 2>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
  ScoreRowsBf16<RB, 0>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
}

void ScoreBlockBf16(std::size_t rb, const std::uint16_t* q, std::size_t dk, const std::uint8_t* codes,
                    std::size_t row_bytes, std::size_t nc, std::size_t ncp, float* tile, float* scores) {
  switch (rb) {
    case 1: return ScoreRowsBf16<1, 0>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
    case 2: return ScoreRowsBf16<2, 0>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
    case 3: return ScoreRowsBf16<3, 0>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
    case 4: return ScoreRowsBf16AnyShape<4>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
  }
  ScoreRowsBf16AnyShape<8>(q, dk, codes, row_bytes, nc, ncp, tile, scores);
}

// V side of plain bf16 V for a bf16 output (DecodePlan::value_bf16), by vdpbf16ps. The
// weights p come rounded to bf16 (RNE), two keys share an f32 lane: vpunpck{l,h}wd pairs
// v_j[d] with v_{j+1}[d], the pair's weights are one broadcast u32, and 32 products take
// one instruction where the f32 path widens V and spends two FMAs. The unpacks permute
// the elements within each 128-bit block (lo: d = 8k + 0..3 of block k, hi: 8k + 4..7);
// the store puts them back in element order.
//
// Precision, against the f32 path (both add each product to an f32 sum, one rounding
// each; only the order of the sums differs, which the tolerance's γ term covers):
//  * p rounded to bf16: a relative 2^-9, the tolerance's "P rounded to T before P·V"
//    with T = bf16 (harness/ops/sdpa_info.cc: 2·eps_T·max|v| and the ceiling's
//    probabilities term). The chunk's largest p is 1 and stays 1, so l_c >= 1.
//  * vdpbf16ps treats subnormal inputs as 0 and flushes subnormal results (DAZ/FTZ,
//    whatever MXCSR says), as does the bf16 conversion of p: a dropped p (< 2^-126, and
//    p <= 1) loses < 2^-126·max|v|, a dropped v < 2^-126, a flushed product or partial
//    sum < 2^-126. Per key at most one of the first three and one flushed sum, so a
//    chunk of n <= 2^16 keys (kMaxBf16ValueChunk) moves o_c = Σ p·v / l_c by at most
//    n·2^-125·(max|v| + 1) <= 2^-108 when max|v| <= 1, and 2^-108·max|v| above that;
//    the combine's convex mixture of the chunks keeps the bound.
//  * The budget is at least 2·eps_T·max|v| = 2^-6·max|v|: with max|v| >= 2^-90 the flush
//    term is below 2^-12 of it (2^-108 against 2^-96). The kernel checks that lower
//    bound on the way: the largest first vector of each key's row as i16 (a positive
//    bf16 pattern orders like its value; negative ones are negative i16) must reach the
//    pattern of 2^-90, else
//    ValueBlockBf16 returns false and the chunk takes the f32 path (V all tiny, or all
//    negative in those elements).
constexpr std::int16_t kBf16ValueFloor = (127 - 90) << 7;  // bf16 pattern of 2^-90

// p → bf16 (RNE, vcvtneps2bf16) for n weights (n a multiple of 16).
KVLAB_TARGET_BF16 void WeightsToBf16(const float* HWY_RESTRICT w, std::size_t n, std::uint16_t* HWY_RESTRICT out) {
  for (std::size_t i = 0; i < n; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(w + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<__m256i>(b));
  }
}

// Elements [0, 32·kUnits) of each V row over keys [0, nc) for RB rows: w holds each
// row's bf16 weights as u32 pairs (row r at w + r·w_stride), out[r·dv + ...] gets the
// sums in element order; sample tracks the largest first vector of each row.
template <std::size_t RB, std::size_t kUnits>
KVLAB_TARGET_BF16 HWY_INLINE void AccumulateSliceBf16(const std::uint32_t* HWY_RESTRICT w, std::size_t w_stride,
                                                      const SliceStream& ahead, std::size_t dv,
                                                      float* HWY_RESTRICT out, __m512i& sample) {
  const std::uint8_t* row = ahead.codes + ahead.s0;
  const std::size_t row_bytes = ahead.row_bytes, nc = ahead.nc;
  __m512 o[RB][2 * kUnits];
#pragma GCC unroll 16
  for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 16
    for (std::size_t s = 0; s < 2 * kUnits; ++s) o[r][s] = _mm512_setzero_ps();
  }
  // Keys j and j + 1 (b_row null: j is the chunk's last key, paired with zeros and the
  // zero weight that SoftmaxRow leaves past it).
  const auto pair = [&](const std::uint8_t* a_row, const std::uint8_t* b_row, std::size_t jp) KVLAB_TARGET_BF16 {
#pragma GCC unroll 4
    for (std::size_t u = 0; u < kUnits; ++u) {
      const __m512i a = _mm512_loadu_si512(a_row + u * 64);
      const __m512i b = b_row != nullptr ? _mm512_loadu_si512(b_row + u * 64) : _mm512_setzero_si512();
      if (u == 0) sample = _mm512_max_epi16(sample, a);
      const auto lo = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(a, b));
      const auto hi = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(a, b));
#pragma GCC unroll 16
      for (std::size_t r = 0; r < RB; ++r) {
        const auto wv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(w[r * w_stride + jp])));
        o[r][2 * u] = _mm512_dpbf16_ps(o[r][2 * u], wv, lo);
        o[r][2 * u + 1] = _mm512_dpbf16_ps(o[r][2 * u + 1], wv, hi);
      }
    }
  };
  std::size_t j = 0;
  for (; j + 2 <= nc; j += 2, row += 2 * row_bytes) {
    ahead.Prefetch(j);
    ahead.Prefetch(j + 1);
    pair(row, row + row_bytes, j / 2);
  }
  if (j < nc) pair(row, nullptr, j / 2);
  // Element order: block k of lo holds d = 8k + 0..3, of hi d = 8k + 4..7.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 16
  for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (std::size_t u = 0; u < kUnits; ++u) {
      _mm512_storeu_ps(out + r * dv + u * 32, _mm512_permutex2var_ps(o[r][2 * u], first, o[r][2 * u + 1]));
      _mm512_storeu_ps(out + r * dv + u * 32 + 16, _mm512_permutex2var_ps(o[r][2 * u], second, o[r][2 * u + 1]));
    }
  }
}

// RB rows of the V side (dv a multiple of 32); false where the sampled values do not show
// max|v| >= 2^-90 (out is then partly written, and the caller takes the f32 path).
template <std::size_t RB>
KVLAB_TARGET_BF16 bool ValueRowsBf16(const std::uint32_t* w, std::size_t w_stride, const std::uint8_t* codes,
                                     std::size_t row_bytes, std::size_t dv, std::size_t nc, const NextChunk& next,
                                     float* out) {
  constexpr std::size_t kUnits = RB <= 4 ? 2 : 1;  // accumulators: 4·RB or 2·RB of 32 registers
  __m512i sample = _mm512_set1_epi16(std::numeric_limits<std::int16_t>::min());
  const std::size_t units = dv / 32;
  std::size_t u0 = 0;
  for (; u0 + kUnits <= units; u0 += kUnits) {
    const SliceStream ahead{codes, row_bytes, nc, u0 * 64, kUnits * 64, u0 + kUnits == units, next};
    AccumulateSliceBf16<RB, kUnits>(w, w_stride, ahead, dv, out + u0 * 32, sample);
  }
  for (; u0 < units; ++u0) {
    const SliceStream ahead{codes, row_bytes, nc, u0 * 64, 64, u0 + 1 == units, next};
    AccumulateSliceBf16<RB, 1>(w, w_stride, ahead, dv, out + u0 * 32, sample);
  }
  return _mm512_cmpge_epi16_mask(sample, _mm512_set1_epi16(kBf16ValueFloor)) != 0;
}

bool ValueBlockBf16(std::size_t rb, const std::uint32_t* w, std::size_t w_stride, const std::uint8_t* codes,
                    std::size_t row_bytes, std::size_t dv, std::size_t nc, const NextChunk& next, float* out) {
  switch (rb) {
    case 1: return ValueRowsBf16<1>(w, w_stride, codes, row_bytes, dv, nc, next, out);
    case 2: return ValueRowsBf16<2>(w, w_stride, codes, row_bytes, dv, nc, next, out);
    case 3: return ValueRowsBf16<3>(w, w_stride, codes, row_bytes, dv, nc, next, out);
    case 4: return ValueRowsBf16<4>(w, w_stride, codes, row_bytes, dv, nc, next, out);
  }
  return ValueRowsBf16<8>(w, w_stride, codes, row_bytes, dv, nc, next, out);
}
#endif

// ---------------------------------------------------------------- V side

// The key loop of one slice of AccumulateValues: o[r][s] += w·c_j over keys [0, nc).
// kTwoGroups: the slice's second half lies in the next group (its weights `second`
// floats on); otherwise one broadcast weight per (row, key) serves the whole slice, which
// halves the broadcast loads (the V side is bound by loads as much as by FMAs on AVX2).
// kQuarters: the keys in KeyOrder's quarters (order.quarter > 0), else in order.
template <int kBits, std::size_t RB, std::size_t DS, bool kTwoGroups, bool kQuarters = false>
HWY_INLINE void AccumulateSlice(DF df, const float* const* HWY_RESTRICT wr, std::size_t second,
                                const std::uint8_t* HWY_RESTRICT row, std::size_t row_bytes, std::size_t nc,
                                const SliceStream* ahead, VF codes_table, VF (&o)[RB][DS], KeyOrder order = {}) {
  constexpr std::size_t kV = kVecsPerUnit<kBits>;
  const std::size_t N = hn::Lanes(df);
  const std::uint8_t* HWY_RESTRICT const first = row;
  for (std::size_t j = 0; j < nc; ++j, row += row_bytes) {
    if constexpr (kQuarters) {  // 16 keys ahead in each quarter, 64 in all
      const std::size_t key = order.Key(j);
      row = first + key * row_bytes;
      if (ahead != nullptr) ahead->PrefetchKey(key + kPrefetchKeys / 4);
    } else if (ahead != nullptr) {
      ahead->Prefetch(j);
    }
    VF c[DS];
#pragma GCC unroll 16
    for (std::size_t uu = 0; uu < DS / kV; ++uu) {
      if constexpr (kPlain<kBits>) {
        PlainUnit<kBits>(df, row + uu * N * kLaneBytes<kBits>, c + uu * kV);
      } else {
        const VI bytes = LoadBytes<kBits>(df, row + uu * N);
#pragma GCC unroll 2
        for (std::size_t t = 0; t < kV; ++t) c[uu * kV + t] = ValueCodes<kBits>(df, bytes, t, codes_table);
      }
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < RB; ++r) {
      const VF wa = hn::Set(df, wr[r][j]);
      const VF wb = kTwoGroups ? hn::Set(df, wr[r][j + second]) : wa;
#pragma GCC unroll 16
      for (std::size_t s = 0; s < DS; ++s) o[r][s] = hn::MulAdd(s < DS / 2 ? wa : wb, c[s], o[r][s]);
    }
  }
}

// Whether AccumulateValues may walk the chunk in blocks of kValueBlockKeys keys, every
// slice of a block before the next block, instead of slice by slice over the whole chunk.
// With 16 registers a slice of RB >= 3 rows is 2 vectors wide, so a V row of Dv = 128 f16
// values is read in 8 passes of 32 bytes; from DRAM each pass touches every line of the
// rows at a quarter of a sequential stream's density. In blocks the rows stream in order
// once and the passes over a block find it in L1, for one load and store of the slice's
// accumulators per block. Rows of 128 bytes or more only (8-bit, plain f16/bf16/f32):
// 4-bit rows of Dv = 128 are one line, which a slice pass already reads whole. The sums
// run in the same key order either way, so the outputs are the same bits
// (docs/benchmarks.md §Measurements behind kernel choices).
template <std::size_t RB>
constexpr bool kKeyBlocks = !kManyRegisters && RB >= 3 && HWY_TARGET != HWY_SCALAR;
constexpr std::size_t kValueBlockKeys = 32, kValueBlockMinRow = 128;

template <int kBits, std::size_t RB, std::size_t DS>
void AccumulateKeyBlocks(const float* HWY_RESTRICT w, std::size_t groups, std::size_t ncp,
                         const std::uint8_t* HWY_RESTRICT codes, std::size_t row_bytes, std::size_t dv,
                         std::size_t gs, std::size_t nc, const NextChunk* ahead, float* HWY_RESTRICT out) {
  const DF df;
  constexpr std::size_t kV = kVecsPerUnit<kBits>;
  const std::size_t N = hn::Lanes(df);
  const std::size_t nvec = dv / N;
  const VF codes_table = NibbleCodes<kBits>(df);
  for (std::size_t r = 0; r < RB; ++r) {
    for (std::size_t i = 0; i < dv; i += N) hn::StoreU(hn::Zero(df), df, out + r * dv + i);
  }
  // Whole rows kPrefetchKeys keys ahead; past the chunk's end the next chunk's K rows.
  const SliceStream rows{codes, row_bytes, nc, 0, row_bytes, true, ahead != nullptr ? *ahead : NextChunk{}};
  for (std::size_t j0 = 0; j0 < nc; j0 += kValueBlockKeys) {
    const std::size_t jn = std::min(kValueBlockKeys, nc - j0);
    for (std::size_t vs = 0; vs < nvec; vs += DS) {
      if (ahead != nullptr) {  // the block's prefetches spread over its slices
        for (std::size_t j = j0 + vs * jn / nvec; j < j0 + (vs + DS) * jn / nvec; ++j) rows.Prefetch(j);
      }
      const std::size_t ga = vs * N / gs, gb = (vs + DS - 1) * N / gs;
      const std::size_t second = (gb - ga) * ncp;
      const float* wr[RB];
      for (std::size_t r = 0; r < RB; ++r) wr[r] = w + (r * groups + ga) * ncp + j0;
      VF o[RB][DS];
#pragma GCC unroll 16
      for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 16
        for (std::size_t s = 0; s < DS; ++s) o[r][s] = hn::LoadU(df, out + r * dv + (vs + s) * N);
      }
      const std::uint8_t* block = codes + j0 * row_bytes + (vs / kV) * N * kLaneBytes<kBits>;
      if (!kPlain<kBits> && second != 0) {
        AccumulateSlice<kBits, RB, DS, true>(df, wr, second, block, row_bytes, jn, nullptr, codes_table, o);
      } else {
        AccumulateSlice<kBits, RB, DS, false>(df, wr, second, block, row_bytes, jn, nullptr, codes_table, o);
      }
#pragma GCC unroll 16
      for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 16
        for (std::size_t s = 0; s < DS; ++s) hn::StoreU(o[r][s], df, out + r * dv + (vs + s) * N);
      }
    }
  }
}

// out[r][pos] = Σ_{j<nc} w[r][g(pos)][j]·c_j[pos] for RB rows (pos in lane order), DS
// vectors of positions at a time. A DS·N-position slice lies in one group, or in two
// split at its middle (DS·N twice the group: 64 in groups of 32, 32 in nvfp4's 16). ahead (null: no prefetch, as for a second
// block of rows): the slices prefetch their rows, the last one the next chunk's.
template <int kBits, std::size_t RB, std::size_t DS>
void AccumulateValues(const float* HWY_RESTRICT w, std::size_t groups, std::size_t ncp,
                      const std::uint8_t* HWY_RESTRICT codes, std::size_t row_bytes, std::size_t dv, std::size_t gs,
                      std::size_t nc, const NextChunk* ahead, KeyOrder order, float* HWY_RESTRICT out) {
  const DF df;
  constexpr std::size_t kV = kVecsPerUnit<kBits>;
  static_assert(DS % kV == 0, "a slice holds whole units");
  const std::size_t N = hn::Lanes(df);
  const std::size_t nvec = dv / N;
  const VF codes_table = NibbleCodes<kBits>(df);
  if constexpr (kKeyBlocks<RB>) {
    if (order.quarter == 0 && row_bytes >= kValueBlockMinRow) {
      return AccumulateKeyBlocks<kBits, RB, DS>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, out);
    }
  }
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
    const std::size_t s0 = (vs / kV) * N * kLaneBytes<kBits>, sb = DS / kV * N * kLaneBytes<kBits>;
    const SliceStream stream{codes, row_bytes, nc, s0, sb, vs + DS >= nvec, ahead != nullptr ? *ahead : NextChunk{}};
    const SliceStream* slice_ahead = ahead != nullptr ? &stream : nullptr;
    if constexpr (kPlain<kBits>) {  // one group: no second half
      if (order.quarter != 0) {
        AccumulateSlice<kBits, RB, DS, false, true>(df, wr, second, codes + s0, row_bytes, nc, slice_ahead, codes_table,
                                                    o, order);
      } else {
        AccumulateSlice<kBits, RB, DS, false>(df, wr, second, codes + s0, row_bytes, nc, slice_ahead, codes_table, o);
      }
    } else if (second != 0) {
      AccumulateSlice<kBits, RB, DS, true>(df, wr, second, codes + s0, row_bytes, nc, slice_ahead, codes_table, o);
    } else {
      AccumulateSlice<kBits, RB, DS, false>(df, wr, second, codes + s0, row_bytes, nc, slice_ahead, codes_table, o);
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
                       std::size_t ncp, float* tile, float* scores, const ChunkStream* ahead, KeyOrder order) {
  if constexpr (kManyRegisters && (RB == 4 || RB == 8)) {
    constexpr std::size_t kUnitDims = kVecsPerUnit<kBits> * kMaxLanes, kUnits = 128 / kUnitDims;
    if constexpr (kHalves<kBits>) {  // groups of kMaxLanes, one per vector
      if (dk == 128 && gs == kMaxLanes) {
        return ScoreRows<kBits, RB, kUnits, 1>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile,
                                               scores, ahead, order);
      }
    } else {
      if (dk == 128 && gs == 64) {
        return ScoreRows<kBits, RB, kUnits, 64 / kUnitDims>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc,
                                                           ncp, tile, scores, ahead, order);
      }
      if (dk == 128 && gs == 128) {
        return ScoreRows<kBits, RB, kUnits, kUnits>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp,
                                                    tile, scores, ahead, order);
      }
    }
  }
  ScoreRows<kBits, RB>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores, ahead, order);
}

template <int kBits>
void ScoreBlock(std::size_t rb, const float* q, std::size_t dk, const std::uint8_t* codes, std::size_t row_bytes,
                const float* scales, const float* biases, std::size_t groups, std::size_t gs, std::size_t nc,
                std::size_t ncp, float* tile, float* scores, const ChunkStream* ahead, KeyOrder order) {
  switch (rb) {
    case 1:
      return ScoreRows<kBits, 1>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores, ahead,
                                 order);
    case 2:
      return ScoreRows<kBits, 2>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores, ahead,
                                 order);
    case 3:
      return ScoreRows<kBits, 3>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores, ahead,
                                 order);
    case 4:
      return ScoreRowsAnyShape<kBits, 4>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores,
                                         ahead, order);
  }
  if constexpr (kManyRegisters) {
    ScoreRowsAnyShape<kBits, 8>(q, dk, codes, row_bytes, scales, biases, groups, gs, nc, ncp, tile, scores, ahead,
                                order);
  }
}

template <int kBits, std::size_t RB>
void ValueRowsAnyWidth(const float* w, std::size_t groups, std::size_t ncp, const std::uint8_t* codes,
                       std::size_t row_bytes, std::size_t dv, std::size_t gs, std::size_t nc, const NextChunk* ahead,
                       KeyOrder order, float* out) {
  const std::size_t N = hn::Lanes(DF()), nvec = dv / N;
  // Four vectors per slice where the accumulators (RB·4) still fit the registers and the
  // slice spans at most two groups (nvfp4's 16 at 16 lanes: two vectors).
  const bool wide = nvec % 4 == 0 && (kManyRegisters ? RB <= 4 : RB <= 2) && 2 * N <= gs;
  if (wide) return AccumulateValues<kBits, RB, 4>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
  return AccumulateValues<kBits, RB, 2>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
}

template <int kBits>
void ValueBlock(std::size_t rb, const float* w, std::size_t groups, std::size_t ncp, const std::uint8_t* codes,
                std::size_t row_bytes, std::size_t dv, std::size_t gs, std::size_t nc, const NextChunk* ahead,
                KeyOrder order, float* out) {
  switch (rb) {
    case 1: return ValueRowsAnyWidth<kBits, 1>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
    case 2: return ValueRowsAnyWidth<kBits, 2>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
    case 3: return ValueRowsAnyWidth<kBits, 3>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
    case 4: return ValueRowsAnyWidth<kBits, 4>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
  }
  if constexpr (kManyRegisters) {
    ValueRowsAnyWidth<kBits, 8>(w, groups, ncp, codes, row_bytes, dv, gs, nc, ahead, order, out);
  }
}

// Rows per block: 8 where 32 registers hold 8 rows' accumulators, else 4; a remainder
// below 4 runs as is (1, 2 or 3 rows).
std::size_t RowBlock(std::size_t remaining) {
  if (kManyRegisters && remaining >= 8) return 8;
  return std::min<std::size_t>(4, remaining);
}
}  // namespace kvlab::simd::qdecode::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVLAB_SIMD_QUANTIZED_DECODE_BLOCKS_INL_H_
