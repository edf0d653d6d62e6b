// The V side of the fused quantized decode kernel in integers (AVX3_DL: AVX-512 VNNI's
// vpdpwssd; AVX2: vpmaddwd + vpaddd, quantized_decode_int_values_avx2-inl.h), included by
// quantized_decode.cc only. It replaces the f32 V side for a
// chunk of byte codes (8-bit, and the widths unpacked to bytes; q8_0's signed bytes) or
// packed 4-bit codes (nibbles split into bytes in the f32 side's lane order) when the call's output is
// f16/bf16 and its run-time certificate (below) holds; otherwise the chunk takes the f32
// path, so what it may return is bounded either way.
//
// Arithmetic. The f32 side sums o[d] = Σ_j w_j·c_j[d] per row and group, w = p·s (the
// group's Σ p·b is added later by both). Here, per block of N = 32 keys, w is rounded to
// a multiple of σ = W/32767, W = max |w| over the block: Q_j = rint(w_j·(32767/W)), an
// s16. vpdpwssd multiplies the s16 pairs (Q_j, Q_j+1) by the codes of keys j and j + 1
// widened to s16 and adds both products to an i32 lane exactly (|lane| <= 16 pairs ·
// 2·32767·255 < 2^31; signed codes have |c| <= 128), so the block's Σ Q·c is exact; it
// is flushed into f32 as fl(Σ)·σ once per block. Codes of two keys are interleaved by
// byte unpacks against zero, or against their sign bytes where signed (dims
// 16L + 4k..4k+3 of 128-bit block L in vector k; nibble codes across two groups of 32
// come apart, SliceCodes), undone at the end.
// Cost per key at R = 4, Dv = 128: 16 vpdpwssd (half the f32 side's 32 FMAs, at one a
// cycle on Zen 4 either way) and 8 unpacks, which run beside them on the shuffle pipes;
// the weights' rounding and the flushes add about 3 per key
// (docs/benchmarks.md §Measurements behind kernel choices).
//
// Error bound (u = 2^-24, n = 2^bits − 1, at least the largest |code|): with inv = fl(32767/W) and
// σ' = fl(W/32767), σ'·Q = w·(1+e1)(1+e2)(1+e3) + σ'·e4, |e_i| <= u, |e4| <= 1/2, so each
// weight moves by at most W·(0.5/32767 + 3.1u) <= 1.55e-5·W, and a block's share of
// o[d] by at most 1.55e-5·W·N_β·n (N_β its keys). The exact integer sum rounds once in
// the conversion and once in the flush FMA: relative f32 roundings of partial sums,
// fewer than the f32 side's per-key ones (the tolerance's γ term). A block whose W is
// below 2^-100 (where 32767/W could overflow) is dropped: its share moves by at most
// W·N_β·n.
// Certificate. The tolerance (harness/ops/sdpa_info.cc, attention_budget) allows the
// output 2·eps_T·max|v| for P rounded to T before P·V and the output's own rounding;
// this path leaves P in f32 and spends half the first allowance on its own rounding
// instead, declaring P rounded (Backend::attention_rounding). Per row and group, E =
// Σ_β (bound above) must stay within eps_T/2·V·l, l = Σ p of the chunk's row (the partial
// output is o/l) and V a lower bound of max|v|: the largest |s·c + b| of the first key
// of each block (all its dims; read after the sums, from rows they left in cache: read
// before them, cold, it cost the path its gain from DRAM), less 2^-8 for the dequantized
// values' rounding to their dtype. Then o/l moves by at most eps_T/2·max|v|, and the combine's convex mixture of
// the chunks keeps that. A non-finite weight fails it (the f32 side's NaN/inf semantics
// hold there), as does a sample that shows no finite value (V stays 0).
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
namespace int_values {

constexpr std::size_t kBlockKeys = 32;
constexpr float kLevels = 32767.0f;
constexpr double kWeightError = 1.55e-5;  // per unit of W, the bound above
constexpr float kTinyBlock = 0x1p-100f;

// The dims a row is walked in: AVX3_DL's 64-dim slices, AVX2's 16-dim stretches.
constexpr std::size_t kWalkDims = HWY_TARGET == HWY_AVX2 ? 16 : 64;

// Whether a chunk may take this path (the certificate decides the rest): byte (unsigned
// or q8_0's signed), packed 4-bit or E2M1 codes (kernel_bits, CodeRows::bits), an f16/bf16 output (eps > 0), whole
// slices (stretches) that each lie in one group or (groups of 32, 64-dim slices) in two, split at their middle.
inline bool Eligible(float eps, int kernel_bits, std::size_t dv, std::size_t gs) {
  return eps > 0 && (kernel_bits == 8 || kernel_bits == kS8 || kernel_bits == 4 || kernel_bits == kE2M1) &&
         dv % kWalkDims == 0 && gs % 32 == 0;
}

// Codes that are signed bytes (widened to s16 against their signs).
template <int kBits>
constexpr bool kSignedCodes = kBits == kE2M1 || kBits == kS8;

// Per-thread scratch: the rounded weights [ρ][g][ncp] (s16, key pairs as u32) and the
// blocks' σ [ρ][g][block].
struct Weights {
  std::vector<std::int16_t> q;
  std::vector<float> sigma;
};

#if HWY_TARGET == HWY_AVX3_DL
// The 64 codes of a slice at p, one byte each, in the row's lane order: 8-bit and kS8 as stored;
// 4-bit (32 bytes) as the f32 side reads them, per 16 bytes their low nibbles (even
// elements) then their high ones (odd elements); E2M1 likewise, each nibble as its signed
// code 2v (one vpshufb). Byte p holds lane-order position p.
// kHalvesApart (nibble codes, a slice across two groups of 32): byte 16L + 4k + i holds
// position 32(k >> 1) + 8L + 4(k & 1) + i instead, so that Slice's pairs 0–1 hold the
// first group's positions and pairs 2–3 the second's (one dword permute in place of the
// block shuffle). Byte codes keep their order: there the permute would be one op more.
template <int kBits, bool kHalvesApart = false>
HWY_INLINE __m512i SliceCodes(const std::uint8_t* HWY_RESTRICT p) {
  if constexpr (kBits == 8 || kBits == kS8) {
    static_assert(!kHalvesApart);
    return _mm512_loadu_si512(p);
  } else {
    const __m512i x = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    // Nibbles: position 32u + t is byte 16u + t mod 16's low (t < 16) or high nibble. Apart,
    // dword 4L + k takes dword 4(k >> 1) + 2(L mod 2) + (k & 1) of the 32 bytes, whose high
    // nibbles serve blocks 2–3; else blocks 0, 0, 1, 1, the high nibbles in blocks 1 and 3.
    const __m512i nibble_dwords = _mm512_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7, 0, 1, 4, 5, 2, 3, 6, 7);
    const __m512i halves = kHalvesApart ? _mm512_permutexvar_epi32(nibble_dwords, x) : _mm512_shuffle_i64x2(x, x, 0x50);
    const __m512i nibbles = _mm512_mask_blend_epi64(kHalvesApart ? 0xF0 : 0xCC, halves, _mm512_srli_epi16(halves, 4));
    const __m512i codes = _mm512_and_si512(nibbles, _mm512_set1_epi8(0x0F));
    if constexpr (kBits != kE2M1) return codes;
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    return _mm512_shuffle_epi8(table, codes);
  }
}

// Largest |s·c + b| over keys 0, N, 2N, ... of the chunk, all dv dims (non-finite values
// left out; 0 when none is finite). s/b: [g][ncp] columns.
template <int kBits>
float SampledMax(const std::uint8_t* codes, std::size_t row_bytes, std::size_t nc, std::size_t dv, std::size_t gs,
                 std::size_t ncp, const float* s, const float* b) {
  __m512 largest = _mm512_setzero_ps();
  for (std::size_t j = 0; j < nc; j += kBlockKeys) {
    for (std::size_t s0 = 0; s0 < dv; s0 += 64) {
      const __m512i bytes = SliceCodes<kBits>(codes + j * row_bytes + s0 * kCodeWidth<kBits> / 8);
      const __m128i part[4] = {_mm512_extracti32x4_epi32(bytes, 0), _mm512_extracti32x4_epi32(bytes, 1),
                               _mm512_extracti32x4_epi32(bytes, 2), _mm512_extracti32x4_epi32(bytes, 3)};
      for (std::size_t i = 0; i < 4; ++i) {
        const std::size_t g = (s0 + 16 * i) / gs;  // parts 0-1 and 2-3 may lie in two groups of 32
        const __m512 scale = _mm512_set1_ps(s[g * ncp + j]), bias = _mm512_set1_ps(b[g * ncp + j]);
        const __m512i widened = kSignedCodes<kBits> ? _mm512_cvtepi8_epi32(part[i]) : _mm512_cvtepu8_epi32(part[i]);
        const __m512 c = _mm512_cvtepi32_ps(widened);
        const __m512 v = _mm512_abs_ps(_mm512_fmadd_ps(c, scale, bias));
        const __mmask16 finite = static_cast<__mmask16>(~_mm512_fpclass_ps_mask(v, 0x99));  // not NaN, not ±inf
        largest = _mm512_mask_max_ps(largest, finite, largest, v);
      }
    }
  }
  return _mm512_reduce_max_ps(largest);
}

// Lane i of the result: the largest lane of m[i] (a transposed reduction, 45 shuffles and
// maxima for 16 vectors, where one vector's own reduction takes 8). The inputs come in
// slot order (Slot): the rounds below leave lane 4j + i with the vector of slot 4i + j.
HWY_INLINE __m512 LaneMaxima(const __m512 m[16]) {
  __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {  // 256-bit halves: lanes 0-7 vector 2k, 8-15 vector 2k + 1
    a[k] = _mm512_max_ps(_mm512_shuffle_f32x4(m[2 * k], m[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(m[2 * k], m[2 * k + 1], 0xEE));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {  // 128-bit block j: vector 4k + j
    b[k] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xDD));
  }
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {  // block j, lanes 0-1: vector 8k + j, lanes 2-3: 8k + 4 + j
    c[k] = _mm512_max_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44), _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
  }
  return _mm512_max_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}
// The slot of block i of a batch, so that LaneMaxima's lane i is block i's.
constexpr int Slot(int i) { return i % 4 * 4 + i / 4; }

// Rounds one row and group's weights w[0, ncp) (zero past the chunk's keys) to Q and σ;
// returns the error bound E of the row's outputs in that group, or −1 for a non-finite
// weight. Blocks go 16 at a time: their W in one vector (LaneMaxima), 32767/W and W/32767
// by one division each (the same correctly rounded values as one block's scalar ones).
inline double RoundWeights(const float* w, std::size_t nc, std::size_t ncp, double levels_n, std::int16_t* q,
                           float* sigma) {
  const std::size_t blocks = (ncp + kBlockKeys - 1) / kBlockKeys;
  const __m512 levels = _mm512_set1_ps(kLevels), tiny = _mm512_set1_ps(kTinyBlock);
  static_assert(kBlockKeys == 32, "block_first: the first key of each block of a batch");
  const __m512i block_first = _mm512_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448, 480);
  double bound = 0;
  for (std::size_t b0 = 0; b0 < blocks; b0 += 16) {
    const std::size_t batch = std::min<std::size_t>(16, blocks - b0);
    __m512 largest[16];
    __mmask16 odd = 0;
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const std::size_t j0 = (b0 + static_cast<std::size_t>(i)) * kBlockKeys;
      const __m512 a = j0 < ncp ? _mm512_loadu_ps(w + j0) : _mm512_setzero_ps();
      const __m512 c = j0 + 16 < ncp ? _mm512_loadu_ps(w + j0 + 16) : _mm512_setzero_ps();
      odd |= static_cast<__mmask16>(_mm512_fpclass_ps_mask(a, 0x99) | _mm512_fpclass_ps_mask(c, 0x99));
      largest[Slot(i)] = _mm512_range_ps(a, c, 0x0B);  // max(|a|, |c|) per lane
    }
    if (odd != 0) return -1;
    const __m512 W = LaneMaxima(largest);
    const __mmask16 scaled = _mm512_cmp_ps_mask(W, tiny, _CMP_GE_OQ);  // blocks below kTinyBlock are dropped
    const __m512 inverse = _mm512_maskz_div_ps(scaled, levels, W);
    const __mmask16 in_batch = static_cast<__mmask16>((1u << batch) - 1);
    _mm512_mask_storeu_ps(sigma + b0, in_batch, _mm512_maskz_div_ps(scaled, W, levels));
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (static_cast<std::size_t>(i) >= batch) break;
      const std::size_t j0 = (b0 + static_cast<std::size_t>(i)) * kBlockKeys;
      const __m512 inv = _mm512_permutexvar_ps(_mm512_set1_epi32(i), inverse);
      const __m512 a = _mm512_loadu_ps(w + j0);
      const __m512 c = j0 + 16 < ncp ? _mm512_loadu_ps(w + j0 + 16) : _mm512_setzero_ps();
      const __m512i qa = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i qc = _mm512_cvt_roundps_epi32(_mm512_mul_ps(c, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j0), _mm512_cvtsepi32_epi16(qa));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j0 + 16), _mm512_cvtsepi32_epi16(qc));
    }
    // Σ W·N_β, a dropped block's W·N_β whole and a rounded one's by kWeightError, in double
    // (W·N_β exact); lanes past the batch have W 0.
    const __m512i first = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(b0 * kBlockKeys)), block_first);
    const __m512i left = _mm512_max_epi32(_mm512_sub_epi32(_mm512_set1_epi32(static_cast<int>(nc)), first),
                                          _mm512_setzero_si512());
    const __m512i keys = _mm512_min_epi32(left, _mm512_set1_epi32(kBlockKeys));
    auto half_share = [&](__m256 w_half, __m256i keys_half, __mmask8 scaled_half) {
      const __m512d factor = _mm512_mask_blend_pd(scaled_half, _mm512_set1_pd(1.0), _mm512_set1_pd(kWeightError));
      return _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtps_pd(w_half), _mm512_cvtepi32_pd(keys_half)), factor);
    };
    const __m512d lo = half_share(_mm512_castps512_ps256(W), _mm512_castsi512_si256(keys), static_cast<__mmask8>(scaled));
    const __m512d hi = half_share(_mm512_extractf32x8_ps(W, 1), _mm512_extracti32x8_epi32(keys, 1),
                                  static_cast<__mmask8>(scaled >> 8));
    bound += _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  }
  return bound * levels_n;
}

// acc += Σ of each i32 lane's two s16 products, the weights one broadcast dword (the
// target's attributes leave out AVX512_VNNI: as vnni::Dot, inline assembly).
HWY_INLINE __m512i DotPairs(__m512i acc, __m512i codes, const std::int32_t* weights) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*weights));
  return acc;
}
// The same with the weights a vector: a slice across two groups of 32 (Slice).
HWY_INLINE __m512i DotPairs(__m512i acc, __m512i codes, __m512i weights) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(codes), "v"(weights));
  return acc;
}

// One 64-dim slice (lane-order positions [s0, s0 + 64) of every row, bytes from
// ahead.s0) for RB <= 4 rows: out[r·dv + s0 ...] = Σ_blocks σ·Σ Q·c, lane order. q: row
// r's rounded weights at q + r·q_stride; sigma likewise. kTwoGroups: positions 32-63 lie
// in the next group, whose weights and σ are q_next and sigma_next further on. Nibble
// codes come apart (SliceCodes), pairs 0–1 in this group and 2–3 in the next, so each
// takes its group's weights as the broadcast operand itself, sparing a masked broadcast
// per row and key pair (docs/benchmarks.md §Measurements behind kernel choices); byte
// codes keep their order, where the pairs' lanes 8-15 (their 128-bit blocks 2 and 3, see
// below) take the next group's from one masked broadcast per (row, key pair) and per
// (row, block).
template <int kBits, std::size_t RB, bool kTwoGroups = false>
HWY_INLINE void Slice(const std::int16_t* HWY_RESTRICT q, std::size_t q_stride, const float* HWY_RESTRICT sigma,
                      std::size_t sigma_stride, const SliceStream& ahead, bool prefetch, std::size_t dv,
                      std::size_t s0, float* HWY_RESTRICT out, std::size_t q_next = 0, std::size_t sigma_next = 0) {
  constexpr __mmask16 kNextGroup = 0xFF00;
  constexpr bool kApart = kTwoGroups && kCodeWidth<kBits> == 4;  // SliceCodes's kHalvesApart
  const std::uint8_t* HWY_RESTRICT row = ahead.codes + ahead.s0;
  const std::size_t row_bytes = ahead.row_bytes, nc = ahead.nc;
  const __m512i zero = _mm512_setzero_si512();
  __m512 o[RB][4];
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (std::size_t k = 0; k < 4; ++k) o[r][k] = _mm512_setzero_ps();
  }
  for (std::size_t j0 = 0, blk = 0; j0 < nc; j0 += kBlockKeys, ++blk) {
    __m512i acc[RB][4];
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 4
      for (std::size_t k = 0; k < 4; ++k) acc[r][k] = zero;
    }
    const std::size_t j1 = std::min(nc, j0 + kBlockKeys);
    for (std::size_t j = j0; j < j1; j += 2) {
      const std::uint8_t* a_row = row + j * row_bytes;
      if (prefetch) {
        ahead.Prefetch(j);
        ahead.Prefetch(j + 1);
      }
      const __m512i a = SliceCodes<kBits, kApart>(a_row);
      const __m512i b = j + 1 < nc ? SliceCodes<kBits, kApart>(a_row + row_bytes) : zero;  // the last key's pair: weight 0
      // Widened to s16: unsigned codes against zero, signed ones against their signs.
      const __m512i a_high = kSignedCodes<kBits> ? _mm512_movm_epi8(_mm512_movepi8_mask(a)) : zero;
      const __m512i b_high = kSignedCodes<kBits> ? _mm512_movm_epi8(_mm512_movepi8_mask(b)) : zero;
      const __m512i al = _mm512_unpacklo_epi8(a, a_high), ah = _mm512_unpackhi_epi8(a, a_high);
      const __m512i bl = _mm512_unpacklo_epi8(b, b_high), bh = _mm512_unpackhi_epi8(b, b_high);
      const __m512i pair[4] = {_mm512_unpacklo_epi16(al, bl), _mm512_unpackhi_epi16(al, bl),
                               _mm512_unpacklo_epi16(ah, bh), _mm512_unpackhi_epi16(ah, bh)};
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RB; ++r) {
        const auto* both = reinterpret_cast<const std::int32_t*>(q + r * q_stride + j);  // (Q_j, Q_j+1)
        if constexpr (kApart) {  // pairs 0–1 in this group, 2–3 in the next (SliceCodes)
          const auto* next = reinterpret_cast<const std::int32_t*>(q + r * q_stride + q_next + j);
#pragma GCC unroll 4
          for (std::size_t k = 0; k < 4; ++k) acc[r][k] = DotPairs(acc[r][k], pair[k], k < 2 ? both : next);
        } else if constexpr (kTwoGroups) {
          const auto* next = reinterpret_cast<const std::int32_t*>(q + r * q_stride + q_next + j);
          const __m512i w = _mm512_mask_set1_epi32(_mm512_set1_epi32(*both), kNextGroup, *next);
#pragma GCC unroll 4
          for (std::size_t k = 0; k < 4; ++k) acc[r][k] = DotPairs(acc[r][k], pair[k], w);
        } else {
#pragma GCC unroll 4
          for (std::size_t k = 0; k < 4; ++k) acc[r][k] = DotPairs(acc[r][k], pair[k], both);
        }
      }
    }
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RB; ++r) {
      const float* sr = sigma + r * sigma_stride + blk;
      const __m512 s = kTwoGroups && !kApart
                           ? _mm512_mask_mov_ps(_mm512_set1_ps(*sr), kNextGroup, _mm512_set1_ps(sr[sigma_next]))
                           : _mm512_set1_ps(*sr);
      const __m512 s_next = kApart ? _mm512_set1_ps(sr[sigma_next]) : s;
#pragma GCC unroll 4
      for (std::size_t k = 0; k < 4; ++k) {
        o[r][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][k]), k < 2 ? s : s_next, o[r][k]);
      }
    }
  }
  if constexpr (kApart) {
    // Vector k's lane 4L + i holds position 32(k >> 1) + 8L + 4(k & 1) + i: positions
    // 32h + 16m .. + 15 are blocks 2m, 2m + 1 of vectors 2h and 2h + 1, interleaved.
    const __m512i low = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i high = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RB; ++r) {
      float* dst = out + r * dv + s0;
#pragma GCC unroll 2
      for (std::size_t h = 0; h < 2; ++h) {
        _mm512_storeu_ps(dst + 32 * h, _mm512_permutex2var_ps(o[r][2 * h], low, o[r][2 * h + 1]));
        _mm512_storeu_ps(dst + 32 * h + 16, _mm512_permutex2var_ps(o[r][2 * h], high, o[r][2 * h + 1]));
      }
    }
    return;
  }
  // Vector k's block L holds dims 16L + 4k..4k+3: transpose the 4×4 blocks.
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) {
    const __m512 t0 = _mm512_shuffle_f32x4(o[r][0], o[r][1], 0x44), t1 = _mm512_shuffle_f32x4(o[r][0], o[r][1], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(o[r][2], o[r][3], 0x44), t3 = _mm512_shuffle_f32x4(o[r][2], o[r][3], 0xEE);
    float* dst = out + r * dv + s0;
    _mm512_storeu_ps(dst, _mm512_shuffle_f32x4(t0, t2, 0x88));
    _mm512_storeu_ps(dst + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
    _mm512_storeu_ps(dst + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
    _mm512_storeu_ps(dst + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
  }
}

// Every slice of RB <= 4 rows; a group's weights start q_row values (blocks σ) after the
// previous group's.
template <int kBits, std::size_t RB>
void Rows(const std::int16_t* q, std::size_t q_row, const float* sigma, std::size_t blocks, std::size_t vg,
          const std::uint8_t* codes, std::size_t row_bytes, std::size_t nc, std::size_t dv, std::size_t gs,
          const NextChunk& next, bool prefetch, float* out) {
  for (std::size_t s0 = 0; s0 < dv; s0 += 64) {
    const std::size_t g = s0 / gs;
    const SliceStream ahead{codes, row_bytes, nc, s0 * kCodeWidth<kBits> / 8, 64 * kCodeWidth<kBits> / 8,
                            s0 + 64 == dv, next};
    if ((s0 + 63) / gs != g) {  // groups of a multiple of 32: the next begins at s0 + 32
      Slice<kBits, RB, true>(q + g * q_row, vg * q_row, sigma + g * blocks, vg * blocks, ahead, prefetch, dv, s0, out,
                             q_row, blocks);
    } else {
      Slice<kBits, RB>(q + g * q_row, vg * q_row, sigma + g * blocks, vg * blocks, ahead, prefetch, dv, s0, out);
    }
  }
}

#else  // HWY_AVX2
#include "kernels/simd/quantized_decode_int_values_avx2-inl.h"
#endif

// The chunk's V side for `rows` rows: true with out[ρ·dv + d] = Σ_j ŵ·c_j[d] (before
// the group's Σ p·b), or false (certificate failed; out partly written or not at all)
// for the f32 side, which writes all of it.
// w: [ρ][g][ncp] the f32 weights p·s; s/b: [g][ncp] V scales/biases; sums: l per row;
// code_bits: the stored width (n = 2^bits − 1); kBits: the rows' (CodeRows::bits).
template <int kBits>
bool AccumulateChunk(const float* w, std::size_t rows, std::size_t vg, std::size_t ncp, const std::uint8_t* codes,
                     std::size_t row_bytes, std::size_t dv, std::size_t gs, std::size_t nc, int code_bits,
                     const float* s, const float* b, const float* sums, float eps, const NextChunk& next,
                     Weights& scratch, float* out) {
  const double levels_n = std::ldexp(1.0, code_bits) - 1;
  const std::size_t blocks = (ncp + kBlockKeys - 1) / kBlockKeys;
  // Q rows padded to whole blocks: RoundWeights stores 32 values a block.
  const std::size_t q_row = blocks * kBlockKeys;
  if (scratch.q.size() < rows * vg * q_row) scratch.q.resize(rows * vg * q_row);
  if (scratch.sigma.size() < rows * vg * blocks) scratch.sigma.resize(rows * vg * blocks);
  double worst = 0;  // the largest E / l over rows and groups
  for (std::size_t rho = 0; rho < rows; ++rho) {
    for (std::size_t g = 0; g < vg; ++g) {
      const std::size_t rg = rho * vg + g;
      const double bound = RoundWeights(w + rg * ncp, nc, ncp, levels_n, scratch.q.data() + rg * q_row,
                                        scratch.sigma.data() + rg * blocks);
      if (bound < 0) return false;
      if (bound > 0) {
        const double per_sum = bound / static_cast<double>(sums[rho]);
        if (!(per_sum <= std::numeric_limits<double>::max())) return false;  // NaN, or l = 0 with weights
        worst = std::max(worst, per_sum);
      }
    }
  }
  const std::size_t q_stride = vg * q_row, sigma_stride = vg * blocks;
  for (std::size_t r0 = 0; r0 < rows; r0 += 4) {
    const std::int16_t* q = scratch.q.data() + r0 * q_stride;
    const float* sg = scratch.sigma.data() + r0 * sigma_stride;
    float* o = out + r0 * dv;
    const bool prefetch = r0 == 0;
    switch (std::min<std::size_t>(4, rows - r0)) {
      case 1: Rows<kBits, 1>(q, q_row, sg, blocks, vg, codes, row_bytes, nc, dv, gs, next, prefetch, o); break;
      case 2: Rows<kBits, 2>(q, q_row, sg, blocks, vg, codes, row_bytes, nc, dv, gs, next, prefetch, o); break;
      case 3: Rows<kBits, 3>(q, q_row, sg, blocks, vg, codes, row_bytes, nc, dv, gs, next, prefetch, o); break;
      default: Rows<kBits, 4>(q, q_row, sg, blocks, vg, codes, row_bytes, nc, dv, gs, next, prefetch, o);
    }
  }
  // Sampled after the sums, from rows they left in cache.
  const float sampled = SampledMax<kBits>(codes, row_bytes, nc, dv, gs, ncp, s, b);
  return worst <= 0.5 * static_cast<double>(eps) * static_cast<double>(sampled) * (1 - 0x1p-8);
}

}  // namespace int_values
#endif  // HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
