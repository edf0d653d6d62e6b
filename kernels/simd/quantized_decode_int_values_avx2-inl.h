// The integer V side's AVX2 steps: a fragment of quantized_decode_int_values-inl.h,
// included inside its namespace int_values on the AVX2 target only (the arithmetic, the
// error bound and the certificate are that file's; AccumulateChunk there calls these).
//
// AVX2 has no vpdpwssd: each key pair's products are vpmaddwd (two s16 products summed
// exactly into an i32 lane, the same (Q_j, Q_j+1) × (c_j, c_j+1) as vpdpwssd) and one
// vpaddd into the block's accumulator, so a block's Σ Q·c is the same exact integer.
// 512 products a key at R = 4, Dv = 128 take 32 vpmaddwd + 32 vpaddd, where the f32 side
// takes 64 FMAs and widens every code to f32 first: a vpmaddwd does twice an FMA's
// products, and the vpaddd issue beside it (`baseline_s16madd`, docs/benchmarks.md
// §Measurements behind kernel choices).
// Work unit: a stretch of 16 dims (lane order) × RB <= 4 rows, 8 i32 accumulators; with
// 16 ymm registers the f32 partial outputs stay in `out` (L1) and take each block's flush.

constexpr std::size_t kStretch = kWalkDims;  // dims of a stretch: two vectors of 8 lanes

// The codes of dims [0, 16) of a stretch (lane order) of key a and key b (zero where
// has_b is false: past the chunk's last key) as s16 pairs (c_a, c_b), dims 0-7 in
// pair[0] and 8-15 in pair[1]. 8-bit: 16 bytes as stored. 4-bit: 8 bytes, their low
// nibbles (even elements: lanes 0-7, as the f32 side reads them) and their high ones
// (odd: lanes 8-15); E2M1 those nibbles as the signed code 2v.
template <int kBits>
HWY_INLINE void PairCodes(const std::uint8_t* HWY_RESTRICT a, const std::uint8_t* HWY_RESTRICT b, bool has_b,
                          __m256i pair[2]) {
  const auto widen = [](__m128i bytes) {
    return kSignedCodes<kBits> ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
  };
  if constexpr (kCodeWidth<kBits> == 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    const __m128i y = has_b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)) : _mm_setzero_si128();
    pair[0] = widen(_mm_unpacklo_epi8(x, y));
    pair[1] = widen(_mm_unpackhi_epi8(x, y));
  } else {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
    const __m128i y = has_b ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)) : _mm_setzero_si128();
    const __m128i both = _mm_unpacklo_epi8(x, y), low = _mm_set1_epi8(0x0F);
    __m128i even = _mm_and_si128(both, low), odd = _mm_and_si128(_mm_srli_epi16(both, 4), low);
    if constexpr (kBits == kE2M1) {
      const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
      even = _mm_shuffle_epi8(table, even);
      odd = _mm_shuffle_epi8(table, odd);
    }
    pair[0] = widen(even);
    pair[1] = widen(odd);
  }
}

// One key's stretch at p as two vectors of i32 codes (dims 0-7, 8-15; lane order).
template <int kBits>
HWY_INLINE void StretchCodes(const std::uint8_t* HWY_RESTRICT p, __m256i c[2]) {
  __m256i pair[2];
  PairCodes<kBits>(p, p, false, pair);  // (c, 0) pairs: the s16 code, sign-extended, is the i32
  c[0] = kSignedCodes<kBits> ? _mm256_srai_epi32(_mm256_slli_epi32(pair[0], 16), 16) : pair[0];
  c[1] = kSignedCodes<kBits> ? _mm256_srai_epi32(_mm256_slli_epi32(pair[1], 16), 16) : pair[1];
}

// The largest of v's eight lanes (none NaN).
HWY_INLINE float LargestLane(__m256 v) {
  v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
  v = _mm256_max_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
  return _mm256_cvtss_f32(_mm256_max_ps(v, _mm256_shuffle_ps(v, v, 0xB1)));
}

// Largest |s·c + b| over keys 0, N, 2N, ... of the chunk (N = kBlockKeys), all dv dims
// (non-finite values left out; 0 when none is finite). s/b: [g][ncp] columns.
template <int kBits>
float SampledMax(const std::uint8_t* codes, std::size_t row_bytes, std::size_t nc, std::size_t dv, std::size_t gs,
                 std::size_t ncp, const float* s, const float* b) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 largest = _mm256_setzero_ps();
  for (std::size_t j = 0; j < nc; j += kBlockKeys) {
    for (std::size_t s0 = 0; s0 < dv; s0 += kStretch) {
      __m256i c[2];
      StretchCodes<kBits>(codes + j * row_bytes + s0 * kCodeWidth<kBits> / 8, c);
      const std::size_t g = s0 / gs;  // a stretch lies in one group (gs a multiple of 32)
      const __m256 scale = _mm256_set1_ps(s[g * ncp + j]), bias = _mm256_set1_ps(b[g * ncp + j]);
      for (const __m256i& code : c) {
        const __m256 v = _mm256_and_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(code), scale, bias), magnitude);
        const __m256 finite = _mm256_cmp_ps(v, inf, _CMP_LT_OQ);  // false for NaN and ±inf
        largest = _mm256_max_ps(largest, _mm256_and_ps(v, finite));
      }
    }
  }
  return LargestLane(largest);
}

// Rounds one row and group's weights w[0, ncp) (zero past the chunk's keys) to Q and σ;
// returns the error bound E of the row's outputs in that group, or −1 for a non-finite
// weight. The same rounding as the AVX3_DL one: vcvtps2dq rounds to nearest even (MXCSR).
inline double RoundWeights(const float* w, std::size_t nc, std::size_t ncp, double levels_n, std::int16_t* q,
                           float* sigma) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  double bound = 0;
  for (std::size_t j0 = 0, blk = 0; j0 < ncp; j0 += kBlockKeys, ++blk) {
    __m256 v[4], top = _mm256_setzero_ps(), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) {
      v[i] = j0 + 8 * i < ncp ? _mm256_loadu_ps(w + j0 + 8 * i) : _mm256_setzero_ps();
      const __m256 mag = _mm256_and_ps(v[i], magnitude);
      finite = _mm256_and_ps(finite, _mm256_cmp_ps(mag, inf, _CMP_LT_OQ));  // false for NaN and ±inf
      top = _mm256_max_ps(top, mag);
    }
    if (_mm256_movemask_ps(finite) != 0xFF) return -1;
    const float largest = LargestLane(top);
    const double keys = static_cast<double>(std::min(kBlockKeys, nc > j0 ? nc - j0 : 0));
    __m256i k[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    if (largest < kTinyBlock) {
      sigma[blk] = 0;
      bound += static_cast<double>(largest) * keys * levels_n;
    } else {
      const __m256 inverse = _mm256_set1_ps(kLevels / largest);
      for (std::size_t i = 0; i < 4; ++i) k[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
      sigma[blk] = largest / kLevels;
      bound += kWeightError * static_cast<double>(largest) * keys * levels_n;
    }
    // packs interleaves the 128-bit halves of its two inputs; the permute restores order.
    for (std::size_t i = 0; i < 4; i += 2) {
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(k[i], k[i + 1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j0 + 8 * i), packed);
    }
  }
  return bound;
}

// acc[r] += the key pair's products with row r's weights (Q_j, Q_j+1) at q + r·q_stride + j.
template <std::size_t RB>
HWY_INLINE void AddPair(const __m256i pair[2], const std::int16_t* HWY_RESTRICT q, std::size_t q_stride,
                        std::size_t j, __m256i acc[RB][2]) {
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) {
    std::int32_t both;
    std::memcpy(&both, q + r * q_stride + j, sizeof both);
    const __m256i weights = _mm256_set1_epi32(both);
    acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(pair[0], weights));
    acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(pair[1], weights));
  }
}

// Keys [j0, min(j0 + 32, nc)) (block blk) of one stretch (lane-order dims [s0, s0 + 16)
// of every row) for RB <= 4 rows: out[r·dv + s0 ...] += σ·Σ Q·c. q: row r's rounded
// weights at q + r·q_stride; sigma likewise. kPrefetch: this stretch issues the line
// stream's prefetches.
template <int kBits, std::size_t RB, bool kPrefetch>
HWY_INLINE void Stretch(const std::int16_t* HWY_RESTRICT q, std::size_t q_stride, const float* HWY_RESTRICT sigma,
                        std::size_t sigma_stride, const SliceStream& ahead, std::size_t dv, std::size_t s0,
                        std::size_t j0, std::size_t blk, float* HWY_RESTRICT out) {
  const std::uint8_t* HWY_RESTRICT row = ahead.codes + s0 * kCodeWidth<kBits> / 8;
  const std::size_t row_bytes = ahead.row_bytes;
  __m256i acc[RB][2];
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const std::size_t j1 = std::min(ahead.nc, j0 + kBlockKeys);
  std::size_t j = j0;
  for (; j + 1 < j1; j += 2) {  // whole pairs
    if constexpr (kPrefetch) {
      ahead.Prefetch(j);
      ahead.Prefetch(j + 1);
    }
    __m256i pair[2];
    PairCodes<kBits>(row + j * row_bytes, row + (j + 1) * row_bytes, true, pair);
    AddPair<RB>(pair, q, q_stride, j, acc);
  }
  if (j < j1) {  // the chunk's last key alone: its pair's second codes 0 (weight 0 too)
    if constexpr (kPrefetch) ahead.Prefetch(j);
    __m256i pair[2];
    PairCodes<kBits>(row + j * row_bytes, nullptr, false, pair);
    AddPair<RB>(pair, q, q_stride, j, acc);
  }
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RB; ++r) {
    const __m256 s = _mm256_set1_ps(sigma[r * sigma_stride + blk]);
    float* o = out + r * dv + s0;
    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), s, _mm256_loadu_ps(o)));
    _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), s, _mm256_loadu_ps(o + 8)));
  }
}

// Every stretch of RB <= 4 rows, in blocks of 32 keys (every stretch of a block, then
// the next block: a block's rows stay in L1 across its stretches; a pass over the whole
// chunk per stretch read 8-bit rows from DRAM slower than the f32 side's key blocks,
// docs/benchmarks.md §Measurements behind kernel choices); the first stretch of each
// 64-byte line issues its prefetches. A group's
// weights start q_row values (blocks σ) after the previous group's.
template <int kBits, std::size_t RB>
void Rows(const std::int16_t* q, std::size_t q_row, const float* sigma, std::size_t blocks, std::size_t vg,
          const std::uint8_t* codes, std::size_t row_bytes, std::size_t nc, std::size_t dv, std::size_t gs,
          const NextChunk& next, bool prefetch, float* out) {
  constexpr std::size_t kLineDims = 64 * 8 / kCodeWidth<kBits>;
  for (std::size_t r = 0; r < RB; ++r) std::fill(out + r * dv, out + (r + 1) * dv, 0.0f);
  for (std::size_t j0 = 0, blk = 0; j0 < nc; j0 += kBlockKeys, ++blk) {
    for (std::size_t line0 = 0; line0 < dv; line0 += kLineDims) {
      const std::size_t dims = std::min(kLineDims, dv - line0);
      const SliceStream ahead{codes, row_bytes, nc, line0 * kCodeWidth<kBits> / 8, dims * kCodeWidth<kBits> / 8,
                              line0 + dims == dv, next};
      for (std::size_t s0 = line0; s0 < line0 + dims; s0 += kStretch) {
        const std::size_t g = s0 / gs;
        const std::int16_t* qg = q + g * q_row;
        const float* sg = sigma + g * blocks;
        if (prefetch && s0 == line0) {
          Stretch<kBits, RB, true>(qg, vg * q_row, sg, vg * blocks, ahead, dv, s0, j0, blk, out);
        } else {
          Stretch<kBits, RB, false>(qg, vg * q_row, sg, vg * blocks, ahead, dv, s0, j0, blk, out);
        }
      }
    }
  }
}
