// The K side of the fused quantized decode kernel in integers (AVX3_DL: AVX-512 VNNI),
// included by quantized_decode.cc only. It replaces ScoreRows for a chunk when the call's
// output is f16/bf16 and its run-time certificate (below) holds; otherwise the chunk's
// scores are computed again by the f32 path, so what it may return is bounded either way.
//
// Arithmetic. Per query row r and K group g, q (already ·scale) is rounded to a multiple
// of σ = 2^(e−22), 2^(e−1) <= max_g|q| < 2^e, so |q/σ| < 2^22 and the integer q_int =
// rint(q/σ) is three balanced base-256 digits (hi·2^16 + mid·2^8 + lo, each in
// [−128, 127]). vpdpbusd multiplies u8 codes by s8 digits and sums four products per
// i32 lane exactly, so per key I = Σ_{d∈g} q_int·c is exact in three i32 pieces (|piece|
// <= 128·255·128 < 2^22). The group's share of the logit is σ·(s·I + b·Q), Q = Σ q_int,
// k = c·s + b taken exactly (the oracle's k rounds c·s and the add: the budget's 3u·S +
// u·S_b, quantized_sdpa in harness/ops/sdpa_info.cc, covers the difference as for the
// f32 path's fused dequantize).
// Layout. 16 keys per tile, one per i32 lane: a 16×16 dword transpose of 16 code rows
// (64 bytes at a time, a shorter row's tail zero) puts dword jj of every key in vector
// jj; the codes then split into the low and the high nibbles (dims 8jj + 2b and
// 8jj + 2b + 1 in byte b). The q digits are laid out to match, so one vpdpbusd with a
// broadcast digit dword adds four dims of 16 keys for one (row, piece).
// 24 vpdpbusd per key at R = 4, D = 128 (16 per key for 2 pieces would move q by 2^-15
// of max_g|q|: on the order of the precision ceiling's q·scale-in-T term; three pieces
// keep q to 2^-23, below f32's own rounding of the dot product).
//
// Error bound of a key's logit, per group (u = 2^-24, n = 2^bits − 1, G groups):
//  (1) q rounding: |Σ (q − σ·q_int)·k| <= σ/2·Σ|c·s + b| <= σ·gs/2·(n·|s| + |b|);
//  (2) I in f32: fl(fl(hi)·2^16 + fl(mid·2^8 + lo)): |fl(hi)| is exact (< 2^24), the
//      conversion of L = mid·2^8 + lo errs by u·|L| <= u·32896·n·gs, the FMA by u·|I|;
//  (3) fl(s·I): u·|s|·|I|, |I| <= n·Σ|q_int|; (4) fl(b·Q + s·I): u·(|b|·|Q| + |s|·|I|),
//      and Q itself rounded to f32: u·|b|·|Q|;
//  (5) the logit's sum over groups (exact products by σ, one rounding per group):
//      G·u·Σ_g σ·(|b|·|Q| + |s|·|I|).
// So E_g = |s|·A_g + |b|·B_g with, over the rows,
//   A_g = max_r σ·(gs·n/2 + u·n·(32896·gs + (3 + G)·Σ|q_int|)),
//   B_g = max_r σ·(gs/2 + u·(2 + G)·|Q|),
// each raised by 2^-10 for second-order terms; E = Σ_g E_g per key.
// Certificate. attention_budget allows the logits eps_T·S (q·scale rounded to T; this
// path keeps q in f32 and spends the allowance on its own rounding instead), S = max
// over (row, key) of |scale|·Σ_d|q_d·k_d| >= Σ_g |group share| of any key. With Ŝ the
// largest computed Σ_g |σ·(s·I + b·Q)| of the chunk and Ê the largest E, the chunk's
// scores stand when Ê <= eps_T/4·Ŝ: then S >= Ŝ − Ê·(1 + G·u) >= Ŝ/2 and every logit is
// within eps_T/2·S. A non-finite q, scale, bias or bound fails it too (the f32 path's
// NaN/inf semantics hold there: 0·inf of a zero code, hidden keys' poisoned scales).
// On Zen 4 (one zmm vpdpbusd or FMA per cycle) a standalone tile loop measured fewer
// cycles per key than the f32 path's 34 FMAs, and the 4/4-bit perf rows gained
// (docs/benchmarks.md §Measurements behind kernel choices).
#if HWY_TARGET == HWY_AVX3_DL
namespace vnni {

constexpr std::size_t kTileKeys = 16;
constexpr std::size_t kPieces = 3;
constexpr std::size_t kMaxDk = 256;
constexpr std::size_t kMaxVectors = kMaxDk / 4;  // tile vectors: four dims each

// Whether a chunk may take this path (the certificate decides the rest). 4-bit K; K
// stored as bytes (8-bit, signed bytes, and the widths unpacked to bytes) only with AMX: built the
// same way with vpdpbusd (dims 4jj + b, two transposes per key) it measured slower than
// the f32 path at S 32 768-65 536 on Zen 4.
// Below kMinKeys keys per (b, kv head), making the q digits (MakeDigits, once per (call,
// b, kv head) and thread) costs what the integer side saves: 768 is where the integer path
// started to win in alternated single-thread runs
// (docs/benchmarks.md §Measurements behind kernel choices).
constexpr std::int64_t kMinKeys = 768;

// Bits a code of the kernel `kernel_bits` (CodeRows::bits) takes in memory: E2M1 codes
// lie as nibbles.
// E2M1 codes (signed 2v elsewhere) are read here as 2v + kE2M1Offset, in [0, 24]: the
// caller gives them the biases −kE2M1Offset·s/2 (exact: s/2 is a power of two), so each
// value is still v·s, and the certificate bounds the cancellation as for affine codes.
constexpr float kE2M1Offset = 12;
// Signed byte codes c (kS8: q8_0's as stored, mxfp4's unpacked 2v) are read as the
// unsigned bytes c + kS8Offset (TileCodes flips their sign bits), with the biases
// −kS8Offset·s (exact, or ±inf/NaN, which fails the certificate) and the bound of 8-bit
// codes (ReadCodeBits): so each value is still c·s, vpdpbusd's and tdpbsud's u8 operand
// takes them, and the certificate bounds the cancellation of the offset.
constexpr float kS8Offset = 128;
inline int StorageBits(int kernel_bits) {
  return kernel_bits == kE2M1 ? 4 : kernel_bits == kS8 ? 8 : kernel_bits;
}
// The offset this file adds to a kernel's codes, which the caller's biases take back.
inline float CodeOffset(int kernel_bits) {
  return kernel_bits == kE2M1 ? kE2M1Offset : kernel_bits == kS8 ? kS8Offset : 0.0f;
}
// The bits whose 2^bits − 1 bounds the codes as read here (the side's code_bits else).
inline int ReadCodeBits(int kernel_bits, int code_bits) { return kernel_bits == kS8 ? 8 : code_bits; }

inline bool Eligible(float slack, std::int64_t keys, int kernel_bits, std::size_t dk, std::size_t gs, bool amx) {
  const int storage_bits = StorageBits(kernel_bits);
  return slack > 0 && keys >= kMinKeys && (storage_bits == 4 || (storage_bits == 8 && amx)) && dk <= kMaxDk &&
         dk % 32 == 0 && gs % 32 == 0;
}

// Per row and group: the q digits [r][piece][j] (dwords, tile-vector order; rows padded
// with zeros to a multiple of 4), σ, Q, and
// the bound's per-group factors A_g, B_g (max over rows).
struct Digits {
  std::uint64_t call = 0;  // DecodePlan::call and the (b, kv head) they were made for
  std::int64_t bk = -1;
  bool finite = false;
  std::vector<std::int32_t> words;
  std::vector<std::int32_t> key_rows_b;  // the words as B for keys as A (KeyRowsB), where taken
  std::vector<float> sigma, qsum;  // [r][g]
  std::vector<float> a, b;         // [g]
};

// Tile vector j and byte of element d (see the layout above).
inline void Place(std::size_t d, std::size_t& j, std::size_t& byte) {
  j = 2 * (d / 8) + d % 2;
  byte = d % 8 / 2;
}

// False when a q value is not finite.
inline bool MakeDigits(const float* query, std::size_t rows, std::size_t dk, std::size_t gs, int code_bits,
                       int storage_bits, Digits& dg) {
  const std::size_t groups = dk / gs, J = dk / 4;
  dg.words.assign((rows + 3) / 4 * 4 * kPieces * J, 0);  // whole blocks of 4 rows for AMX's A tile
  dg.sigma.assign(rows * groups, 1.0f);
  dg.qsum.assign(rows * groups, 0.0f);
  dg.a.assign(groups, 0.0f);
  dg.b.assign(groups, 0.0f);
  const double n = std::ldexp(1.0, code_bits) - 1, u = 0x1p-24, G = static_cast<double>(groups);
  const double g_size = static_cast<double>(gs);
  // Bytes as TileCodes leaves them: 4-bit dims 8jj + 2b (+1) in byte b of vectors 2jj
  // (2jj + 1); bytes, dims 4jj + b in byte b of vector jj.
  const __m128i tile_order = storage_bits == 4 ? _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)
                                               : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i half_byte = _mm512_set1_epi32(128), byte_mask = _mm512_set1_epi32(255);
  alignas(64) float q[kMaxDk];  // the row in element order
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t pos = 0; pos < dk; ++pos) {
      const auto element = lane_to_element(static_cast<std::int64_t>(pos), storage_bits, hn::Lanes(DF()));
      q[static_cast<std::size_t>(element)] = query[r * dk + pos];
    }
    for (std::size_t g = 0; g < groups; ++g) {
      __m512 largest_v = _mm512_setzero_ps();
      for (std::size_t d = g * gs; d < (g + 1) * gs; d += 16) {
        const __m512 v = _mm512_load_ps(q + d);
        if (_mm512_fpclass_ps_mask(v, 0x99) != 0) return false;  // QNaN, ±inf, SNaN
        largest_v = _mm512_max_ps(largest_v, _mm512_abs_ps(v));
      }
      const float largest = _mm512_reduce_max_ps(largest_v);
      int e = 0;
      std::frexp(largest, &e);
      if (largest > 0 && (e - 22 < -126 || 22 - e > 127)) return false;  // σ and 1/σ normal
      const float sigma = largest > 0 ? std::ldexp(1.0f, e - 22) : 1.0f;
      const float inverse = largest > 0 ? std::ldexp(1.0f, 22 - e) : 1.0f;  // exact: powers of two
      __m512i total_v = _mm512_setzero_si512(), magnitude_v = total_v;  // |Σ| <= gs·2^22 < 2^31
      for (std::size_t d = g * gs; d < (g + 1) * gs; d += 16) {
        const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(q + d), _mm512_set1_ps(inverse)));
        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(qi, half_byte), byte_mask), half_byte);
        const __m512i rest = _mm512_srai_epi32(_mm512_sub_epi32(qi, lo), 8);
        const __m512i mid = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(rest, half_byte), byte_mask), half_byte);
        const __m512i hi = _mm512_srai_epi32(_mm512_sub_epi32(rest, mid), 8);
        const __m512i digit[kPieces] = {hi, mid, lo};
        for (std::size_t p = 0; p < kPieces; ++p) {
          const __m128i bytes = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(digit[p]), tile_order);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(&dg.words[(r * kPieces + p) * J + d / 4]), bytes);
        }
        total_v = _mm512_add_epi32(total_v, qi);
        magnitude_v = _mm512_add_epi32(magnitude_v, _mm512_abs_epi32(qi));
      }
      const std::int64_t total = _mm512_reduce_add_epi32(total_v), magnitude = _mm512_reduce_add_epi32(magnitude_v);
      dg.sigma[r * groups + g] = sigma;
      dg.qsum[r * groups + g] = static_cast<float>(total);
      const double a = sigma * (g_size * n / 2 + u * n * (32896 * g_size + (3 + G) * static_cast<double>(magnitude)));
      const double b = sigma * (g_size / 2 + u * (2 + G) * std::abs(static_cast<double>(total)));
      dg.a[g] = std::max(dg.a[g], static_cast<float>(a * (1 + 0x1p-10)));
      dg.b[g] = std::max(dg.b[g], static_cast<float>(b * (1 + 0x1p-10)));
    }
  }
  return true;
}

HWY_INLINE __m512i Dot(__m512i acc, __m512i codes, const std::int32_t* digits) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*digits));
  return acc;
}

// A 16×16 dword transpose in two halves, each of four independent quarters (NextTile
// runs them one at a time). Rows: rows 4i..4i+3 in, the vectors 4i..4i+3 of the first
// two stages (unpacks within 128-bit blocks) out.
HWY_INLINE void TransposeRows4(const __m512i r[4], __m512i out[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}
// Columns: those vectors k, 4 + k, 8 + k, 12 + k in, the last two stages (128-bit blocks
// across vectors) make out[i] = the transpose's vector k + 4i.
HWY_INLINE void TransposeColumns4(const __m512i s[4], __m512i out[4]) {
  const __m512i a0 = _mm512_shuffle_i32x4(s[0], s[1], 0x88), a1 = _mm512_shuffle_i32x4(s[0], s[1], 0xDD);
  const __m512i b0 = _mm512_shuffle_i32x4(s[2], s[3], 0x88), b1 = _mm512_shuffle_i32x4(s[2], s[3], 0xDD);
  out[0] = _mm512_shuffle_i32x4(a0, b0, 0x88);
  out[1] = _mm512_shuffle_i32x4(a1, b1, 0x88);
  out[2] = _mm512_shuffle_i32x4(a0, b0, 0xDD);
  out[3] = _mm512_shuffle_i32x4(a1, b1, 0xDD);
}

// 16 rows of 64 bytes → vector jj holds dword jj of every row (lane = row).
HWY_INLINE void Transpose16(__m512i r[16]) {
  __m512i half[16];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) TransposeRows4(r + 4 * i, half + 4 * i);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i column[4] = {half[k], half[4 + k], half[8 + k], half[12 + k]};
    __m512i out[4];
    TransposeColumns4(column, out);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) r[k + 4 * i] = out[i];
  }
}

// Tile vector v (dword v of 16 keys' codes, transposed) stored as TileRows reads it: nibbles
// split into vectors 2v (low) and 2v + 1 (high), E2M1 ones as the bytes kE2M1Offset + 2v
// (one vpshufb each); bytes xor sign_flip (signed ones as c + kS8Offset).
HWY_INLINE void PutTileVector(__m512i x, std::size_t v, bool nibbles, bool e2m1, __m512i sign_flip,
                              __m512i* HWY_RESTRICT tq) {
  if (!nibbles) {
    tq[v] = _mm512_xor_si512(x, sign_flip);
    return;
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i e2m1_bytes =
      _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low = _mm512_and_si512(x, nibble);
  const __m512i high = _mm512_and_si512(_mm512_srli_epi16(x, 4), nibble);
  tq[2 * v] = e2m1 ? _mm512_shuffle_epi8(e2m1_bytes, low) : low;
  tq[2 * v + 1] = e2m1 ? _mm512_shuffle_epi8(e2m1_bytes, high) : high;
}

// The tile's 4-bit codes (keys [0, keys) of `codes`, the others zero) as J vectors of
// four one-byte codes per key, E2M1 nibbles as the unsigned bytes kE2M1Offset + 2v
// (vpdpbusd's u8 operand; one vpshufb each); byte codes (kernel_bits 8) as they are,
// signed ones (kS8) as c + kS8Offset, dims 4jj + b.
HWY_INLINE void TileCodes(const std::uint8_t* HWY_RESTRICT codes, std::size_t row_bytes, std::size_t keys,
                          std::size_t dk, int kernel_bits, __m512i* HWY_RESTRICT tq) {
  const bool nibbles = StorageBits(kernel_bits) == 4, e2m1 = kernel_bits == kE2M1;
  const __m512i sign_flip = _mm512_set1_epi8(kernel_bits == kS8 ? static_cast<char>(0x80) : 0);
  const std::size_t bytes = nibbles ? dk / 2 : dk;  // a multiple of 16
  for (std::size_t block = 0; block < bytes; block += 64) {
    const std::size_t part = std::min<std::size_t>(64, bytes - block);
    const __mmask64 mask = part == 64 ? ~__mmask64{0} : (__mmask64{1} << part) - 1;
    __m512i r[16];
#pragma GCC unroll 16
    for (std::size_t t = 0; t < kTileKeys; ++t) {
      // One line of a key kPrefetchKeys ahead per line read: a tile's worth at once would
      // fill the line fill buffers (ScoreRows).
      hwy::Prefetch(codes + (t + kPrefetchKeys) * row_bytes + block);
      r[t] = t < keys ? _mm512_maskz_loadu_epi8(mask, codes + t * row_bytes + block) : _mm512_setzero_si512();
    }
    Transpose16(r);
    const std::size_t jj0 = block / 4, dwords = part / 4;
#pragma GCC unroll 16
    for (std::size_t v = 0; v < 16; ++v) {
      if (v >= dwords) break;
      PutTileVector(r[v], jj0 + v, nibbles, e2m1, sign_flip, tq);
    }
  }
}

// The next tile's TileCodes in steps that TileRows runs among the current tile's
// vpdpbusd (one every fourth tile vector). Run whole between two tiles, TileCodes and the
// dot products ran one after the other: a tile's vpdpbusd (384 at R = 4, Dk = 128) are
// more instructions than the core reorders across. Interleaved, the loads and shuffles
// run beside them (docs/benchmarks.md §Measurements behind kernel choices). Whole 64-byte
// blocks of nibbles only (Dk a multiple of 128, no AMX): per block, steps 0-3 load 4 rows
// each (TransposeRows4), steps 4-7 finish 4 vectors each (TransposeColumns4) and store
// them as TileCodes does.
struct NextTile {
  __m512i stage[kTileKeys];  // one block's TransposeRows4 outputs
  const std::uint8_t* codes = nullptr;
  std::size_t row_bytes = 0, keys = 0;
  bool e2m1 = false;
  __m512i* tq = nullptr;

  static bool Fits(int kernel_bits, std::size_t dk, bool amx) {
    return !amx && StorageBits(kernel_bits) == 4 && dk % 128 == 0;
  }
  static std::size_t Steps(std::size_t dk) { return dk / 16; }  // 8 per block of 128 dims: one per 4 tile vectors

  HWY_INLINE void Step(std::size_t u) {
    const std::size_t block = u / 8 * 64, w = u % 8;
    if (w < 4) {
      __m512i r[4];
#pragma GCC unroll 4
      for (std::size_t a = 0; a < 4; ++a) {
        const std::size_t t = 4 * w + a;
        hwy::Prefetch(codes + (t + kPrefetchKeys) * row_bytes + block);
        r[a] = t < keys ? _mm512_loadu_si512(codes + t * row_bytes + block) : _mm512_setzero_si512();
      }
      TransposeRows4(r, stage + 4 * w);
      return;
    }
    const std::size_t k = w - 4;
    const __m512i column[4] = {stage[k], stage[4 + k], stage[8 + k], stage[12 + k]};
    __m512i out[4];
    TransposeColumns4(column, out);
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) {  // out[i] is tile vector block/4 + k + 4i
      PutTileVector(out[i], block / 4 + k + 4 * i, true, e2m1, _mm512_setzero_si512(), tq);
    }
  }
};

// The bound E of each key of a tile (the error bound above; s_cols/b_cols at the tile's
// first key) into emax (the largest) and esum (a sum keeps a NaN a max may drop).
HWY_INLINE void TileBound(const Digits& dg, const float* HWY_RESTRICT s_cols, const float* HWY_RESTRICT b_cols,
                          std::size_t groups, std::size_t ncp, __m512& emax, __m512& esum) {
  __m512 e = _mm512_setzero_ps();
  for (std::size_t g = 0; g < groups; ++g) {
    const __m512 s = _mm512_abs_ps(_mm512_loadu_ps(s_cols + g * ncp));
    const __m512 b = _mm512_abs_ps(_mm512_loadu_ps(b_cols + g * ncp));
    e = _mm512_fmadd_ps(s, _mm512_set1_ps(dg.a[g]), _mm512_fmadd_ps(b, _mm512_set1_ps(dg.b[g]), e));
  }
  emax = _mm512_max_ps(emax, e);
  esum = _mm512_add_ps(esum, e);
}

// The certificate: every term finite and Ê <= eps_T/4·Ŝ (slack = eps_T).
inline bool Certified(__m512 emax, __m512 esum, __m512 shat, __m512 probe, float slack) {
  const float bound = _mm512_reduce_max_ps(emax), largest = _mm512_reduce_max_ps(shat);
  if (!std::isfinite(_mm512_reduce_add_ps(esum)) || !std::isfinite(_mm512_reduce_add_ps(probe))) return false;
  return bound <= slack / 4 * largest;
}

#include "kernels/simd/quantized_decode_amx-inl.h"  // the tile multiplies (AMX-INT8)

// Logits of RB rows for the tile's 16 keys: logit[r] and Σ_g |share|·σ (Ŝ's candidates).
// The integer sums by vpdpbusd from tq, or read from `sums` (AmxTile's C of this row
// block, [g][12][16]) where not null.
template <std::size_t RB>
HWY_INLINE void TileRows(const std::int32_t* HWY_RESTRICT sums, const __m512i* HWY_RESTRICT tq, std::size_t J,
                         std::size_t groups, std::size_t gs, const Digits& dg, std::size_t r0,
                         const float* HWY_RESTRICT s_cols,
                         const float* HWY_RESTRICT b_cols, std::size_t ncp, float* HWY_RESTRICT scores,
                         __m512& shat, __m512& probe, NextTile* next = nullptr) {
  __m512 logit[RB], absum[RB];
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) logit[r] = absum[r] = _mm512_setzero_ps();
  const std::size_t per_group = gs / 4;
  for (std::size_t g = 0; g < groups; ++g) {
    __m512i acc[RB][kPieces];
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 3
      for (std::size_t p = 0; p < kPieces; ++p) acc[r][p] = _mm512_setzero_si512();
    }
    const std::int32_t* words = dg.words.data() + r0 * kPieces * J;
    if (sums != nullptr) {  // AMX: C of (this row block, g), made a tile ahead
      const std::int32_t* c = sums + g * kAmxRows * 16;
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 3
        for (std::size_t p = 0; p < kPieces; ++p) acc[r][p] = _mm512_loadu_si512(c + (r * kPieces + p) * 16);
      }
    }
#pragma GCC unroll 16
    for (std::size_t j = g * per_group; j < (g + 1) * per_group && sums == nullptr; ++j) {
      if (next != nullptr && j % 4 == 0) next->Step(j / 4);
      const __m512i c = tq[j];
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RB; ++r) {
#pragma GCC unroll 3
        for (std::size_t p = 0; p < kPieces; ++p) acc[r][p] = Dot(acc[r][p], c, words + (r * kPieces + p) * J + j);
      }
    }
    const __m512 s = _mm512_loadu_ps(s_cols + g * ncp), b = _mm512_loadu_ps(b_cols + g * ncp);
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RB; ++r) {
      const __m512i low = _mm512_add_epi32(_mm512_slli_epi32(acc[r][1], 8), acc[r][2]);
      const __m512 I = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_set1_ps(65536.0f), _mm512_cvtepi32_ps(low));
      const std::size_t rg = (r0 + r) * groups + g;
      const __m512 share = _mm512_fmadd_ps(b, _mm512_set1_ps(dg.qsum[rg]), _mm512_mul_ps(s, I));
      const __m512 sigma = _mm512_set1_ps(dg.sigma[rg]);
      logit[r] = _mm512_fmadd_ps(share, sigma, logit[r]);
      absum[r] = _mm512_fmadd_ps(_mm512_abs_ps(share), sigma, absum[r]);
    }
  }
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) {
    _mm512_storeu_ps(scores + (r0 + r) * ncp, logit[r]);
    shat = _mm512_max_ps(shat, absum[r]);
    probe = _mm512_add_ps(probe, absum[r]);  // max may drop a NaN; a sum keeps it
  }
}

// Raw scores of the chunk's keys [0, nc) for all rows (scores[r][ncp], keys past nc 0),
// or false where the certificate fails (scores then unspecified). s_cols/b_cols: the
// chunk's K scales and biases as columns [g][ncp], zero past nc. mix gets the lanes
// spent, certificate held or not: vpdpbusd's (u8_dot), or with amx, the sums by tile
// multiplies (qdecode::amx_available), tdpbsud's (amx_int8: 12 A rows × 16 keys per
// dword of a step, every row block).
// The digits are made once per (call, b, kv head) per thread: the chunks of one (b, kv
// head) are consecutive tasks, and making them costs as much as scoring ~50 keys.
bool ScoreChunk(std::uint64_t call, std::int64_t bk, const float* query, std::size_t rows, std::size_t dk,
                std::size_t gs, int code_bits, int kernel_bits, float slack, const std::uint8_t* codes,
                std::size_t row_bytes, std::size_t nc, std::size_t ncp, const float* s_cols, const float* b_cols,
                float* scores, bool amx, DecodePlan::MixCounters& mix) {
  static thread_local Digits dg;
  const int storage_bits = StorageBits(kernel_bits);
  const std::size_t groups = dk / gs, J = dk / 4;
  const bool key_rows = amx_key_rows() && KeyRowsFit(amx, kernel_bits, rows, dk, gs);
  if (dg.call != call || dg.bk != bk) {
    dg.finite = MakeDigits(query, rows, dk, gs, code_bits, storage_bits, dg);
    if (dg.finite && key_rows) KeyRowsB(dg, J, dg.key_rows_b);
    dg.call = call;
    dg.bk = bk;
  }
  if (!dg.finite) return false;
  if (key_rows) return KeyRowsChunk(rows, dk, gs, codes, row_bytes, nc, ncp, s_cols, b_cols, scores, slack, dg, mix);
  // Two tiles in flight: the tile multiplies of one run while the previous one's logits
  // are made from their C (tdpbsud's latency hidden; an unpipelined first version gained
  // 3-8 %, its samples waiting on each C).
  alignas(64) __m512i tq[2][kMaxVectors];
  static thread_local std::vector<std::int32_t> sums_store;
  const std::size_t sums_per_tile = (rows + 3) / 4 * groups * kAmxRows * 16;
  const bool resident = amx && AmxResident(rows, dk, gs);
  if (amx) {
    sums_store.resize(2 * sums_per_tile);
    AmxConfigure(AmxStep(gs), resident, dg, J);
  }
  __m512 emax = _mm512_setzero_ps(), esum = emax, shat = emax, probe = emax;
  const std::size_t tiles = (nc + kTileKeys - 1) / kTileKeys;
  const bool staged = NextTile::Fits(kernel_bits, dk, amx);
  NextTile next;
  next.row_bytes = row_bytes;
  next.e2m1 = kernel_bits == kE2M1;
  auto aim = [&](std::size_t t) {  // next's steps make tile t's codes
    next.codes = codes + t * kTileKeys * row_bytes;
    next.keys = std::min(kTileKeys, nc - t * kTileKeys);
    next.tq = tq[t % 2];
  };
  if (staged && tiles > 0) {
    aim(0);
    for (std::size_t u = 0; u < NextTile::Steps(dk); ++u) next.Step(u);
  }
  for (std::size_t t = 0; t <= tiles; ++t) {
    if (t < tiles && !staged) {
      const std::size_t t0 = t * kTileKeys;
      TileCodes(codes + t0 * row_bytes, row_bytes, std::min(kTileKeys, nc - t0), dk, kernel_bits, tq[t % 2]);
      if (amx) AmxTile(resident, dg, rows, J, groups, gs, tq[t % 2], sums_store.data() + t % 2 * sums_per_tile);
    }
    // The tile whose logits are made now: this one (vpdpbusd) or the previous one (AMX).
    if (amx ? t == 0 : t == tiles) continue;
    const std::size_t done = amx ? t - 1 : t;
    const std::size_t t0 = done * kTileKeys;
    const __m512i* codes_of = tq[done % 2];
    const std::int32_t* sums = amx ? sums_store.data() + done % 2 * sums_per_tile : nullptr;
    TileBound(dg, s_cols + t0, b_cols + t0, groups, ncp, emax, esum);
    std::size_t r0 = 0;
    auto block_sums = [&](std::size_t r) { return sums == nullptr ? nullptr : sums + r / 4 * groups * kAmxRows * 16; };
    const float *s_tile = s_cols + t0, *b_tile = b_cols + t0;
    float* scores_tile = scores + t0;
    // The first row block's dot products carry the next tile's codes (every step of it).
    NextTile* ahead = nullptr;
    if (staged && done + 1 < tiles) {
      aim(done + 1);
      ahead = &next;
    }
    auto carry = [&]() { return r0 == 0 ? ahead : nullptr; };
    for (; r0 + 4 <= rows; r0 += 4)
      TileRows<4>(block_sums(r0), codes_of, J, groups, gs, dg, r0, s_tile, b_tile, ncp, scores_tile, shat, probe,
                  carry());
    switch (rows - r0) {
      case 3:
        TileRows<3>(block_sums(r0), codes_of, J, groups, gs, dg, r0, s_tile, b_tile, ncp, scores_tile, shat, probe,
                    carry());
        break;
      case 2:
        TileRows<2>(block_sums(r0), codes_of, J, groups, gs, dg, r0, s_tile, b_tile, ncp, scores_tile, shat, probe,
                    carry());
        break;
      case 1:
        TileRows<1>(block_sums(r0), codes_of, J, groups, gs, dg, r0, s_tile, b_tile, ncp, scores_tile, shat, probe,
                    carry());
        break;
      default: break;
    }
  }
  if (amx) AmxRelease();
  // Per key of the tiles, row and piece, one lane per four dims; AMX multiplies whole
  // blocks of 4 rows (A's 12 rows), padding included.
  const std::size_t tile_keys = (nc + kTileKeys - 1) / kTileKeys * kTileKeys;
  if (amx) {
    mix.amx_int8 += static_cast<std::int64_t>(tile_keys * ((rows + 3) / 4) * kAmxRows * J);
  } else {
    mix.u8_dot += static_cast<std::int64_t>(tile_keys * rows * kPieces * J);
  }
  return Certified(emax, esum, shat, probe, slack);
}

}  // namespace vnni
#endif  // HWY_TARGET == HWY_AVX3_DL
