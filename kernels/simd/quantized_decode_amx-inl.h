// The AMX-INT8 K side of the fused quantized decode (qdecode::amx_available), included
// by quantized_decode_vnni-inl.h inside its namespace: the integer sums acc[r][piece] of
// that file's arithmetic, by tile multiplies instead of vpdpbusd. tdpbsud/tdpbusd multiply
// u8 by s8 and add four products per i32 exactly, as vpdpbusd does, so either layout
// below gives vpdpbusd's sums bit for bit and the certificate of the vnni file holds
// unchanged. Raw instructions: no target attribute needed, and GCC's intrinsics would have
// to be inlined into AMX-targeted functions only.

// Keys as B (any row count, group and head dim Eligible allows): tmm0 = A, the digits
// of a block of 4 rows: 12 rows (r, piece) of kb bytes (the dims of one step, in tile
// order), s8; tmm1 = B, kb/4 tile vectors of TileCodes (the 16×16 dword transpose): row
// j holds dword j of the 16 keys, u8; tmm2 = C, 12 rows of 16 i32 lanes, one per key:
// tdpbsud, C row (r, p) is acc[r][p].
struct alignas(64) AmxConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
constexpr std::size_t kAmxRows = 4 * kPieces;

// Step bytes: 64 where the group allows (the most A takes), else 32 (Eligible: gs % 32 == 0).
inline std::size_t AmxStep(std::size_t gs) { return gs % 64 == 0 ? 64 : 32; }

// Two layouts. Resident (rows <= 4 and at most two steps per key tile, as at R = 4, D =
// 128, gs 64): each step's A stays in a tile for the whole chunk (tmm0, tmm1), B and C
// get a tile per step (tmm2/3, tmm4/5), so the two multiplies of a key tile overlap.
// Otherwise one A, B and C tile, reloaded per step (tmm0, tmm1, tmm2).
inline bool AmxResident(std::size_t rows, std::size_t dk, std::size_t gs) {
  return rows <= 4 && dk / AmxStep(gs) <= 2;
}

inline void AmxConfigure(std::size_t kb, bool resident, const Digits& dg, std::size_t J) {
  AmxConfig c;
  const std::size_t a_tiles = resident ? 2 : 1;
  for (std::size_t i = 0; i < a_tiles; ++i) {
    c.colsb[i] = static_cast<std::uint16_t>(kb);
    c.rows[i] = kAmxRows;
    c.colsb[a_tiles + i] = 64;
    c.rows[a_tiles + i] = static_cast<std::uint8_t>(kb / 4);
    c.colsb[2 * a_tiles + i] = 64;
    c.rows[2 * a_tiles + i] = kAmxRows;
  }
  asm volatile("ldtilecfg %0" ::"m"(c));
  if (resident) {
    const long a_stride = static_cast<long>(J * 4);
    asm volatile("tileloadd (%0,%1,1), %%tmm0" ::"r"(dg.words.data()), "r"(a_stride) : "memory");
    if (J > kb / 4)
      asm volatile("tileloadd (%0,%1,1), %%tmm1" ::"r"(dg.words.data() + kb / 4), "r"(a_stride) : "memory");
  }
}
inline void AmxRelease() { asm volatile("tilerelease" ::); }

// C[(r, p)][key] for rows [r0, r0 + 4) and the group starting at tile vector j0.
inline void AmxGroup(const std::int32_t* words, std::size_t J, const __m512i* tq, std::size_t j0, std::size_t gs,
                     std::int32_t* HWY_RESTRICT c) {
  const std::size_t kb = AmxStep(gs);
  const long a_stride = static_cast<long>(J * 4), b_stride = 64, c_stride = 64;
  asm volatile("tilezero %%tmm2" ::);
  for (std::size_t j = j0; j < j0 + gs / 4; j += kb / 4) {
    asm volatile("tileloadd (%0,%1,1), %%tmm0" ::"r"(words + j), "r"(a_stride) : "memory");
    asm volatile("tileloadd (%0,%1,1), %%tmm1" ::"r"(tq + j), "r"(b_stride) : "memory");
    asm volatile("tdpbsud %%tmm1, %%tmm0, %%tmm2" ::);
  }
  asm volatile("tilestored %%tmm2, (%0,%1,1)" ::"r"(c), "r"(c_stride) : "memory");
}

// C of every block of 4 rows and group of a key tile → sums[block][g][12][16].
inline void AmxTile(bool resident, const Digits& dg, std::size_t rows, std::size_t J, std::size_t groups,
                    std::size_t gs, const __m512i* tq, std::int32_t* sums) {
  if (resident) {  // one block; step 0 (and 1) with A in tmm0 (tmm1); one group or two
    const std::size_t kb = AmxStep(gs), steps = J / (kb / 4);
    const long stride = 64;
    const std::size_t second = groups == 2 ? kAmxRows * 16 : 0;  // C of step 1: group 1's, or group 0's again
    asm volatile("tileloadd (%0,%1,1), %%tmm2" ::"r"(tq), "r"(stride) : "memory");
    asm volatile("tilezero %%tmm4" ::);
    asm volatile("tdpbsud %%tmm2, %%tmm0, %%tmm4" ::);
    if (steps == 2) {
      asm volatile("tileloadd (%0,%1,1), %%tmm3" ::"r"(tq + kb / 4), "r"(stride) : "memory");
      if (second == 0) {
        asm volatile("tdpbsud %%tmm3, %%tmm1, %%tmm4" ::);
      } else {
        asm volatile("tilezero %%tmm5" ::);
        asm volatile("tdpbsud %%tmm3, %%tmm1, %%tmm5" ::);
        asm volatile("tilestored %%tmm5, (%0,%1,1)" ::"r"(sums + second), "r"(stride) : "memory");
      }
    }
    asm volatile("tilestored %%tmm4, (%0,%1,1)" ::"r"(sums), "r"(stride) : "memory");
    return;
  }
  for (std::size_t r0 = 0; r0 < rows; r0 += 4) {
    for (std::size_t g = 0; g < groups; ++g) {
      AmxGroup(dg.words.data() + r0 * kPieces * J, J, tq, g * (gs / 4), gs,
               sums + ((r0 / 4) * groups + g) * kAmxRows * 16);
    }
  }
}

// Keys as A (KeyRowsFit: byte codes, rows <= 4, gs % 64 == 0, Dk 64 or 128), which
// needs no transpose of the codes: A = 16 key rows × 64 bytes (one step of 64 dims)
// loaded straight from the chunk with its row stride, u8; B = the digits of that step in
// VNNI order, 16 rows of four dims × 12 columns n = piece·4 + row, s8, resident for the
// chunk; C = 16 keys × 12 i32: tdpbusd, C[key][piece·4 + r] is acc[r][piece]. Tiles:
// tmm0/1 B of steps 0/1, tmm2/3 A of steps 0/1, tmm4/5 and tmm6/7 C of groups 0/1 for
// even and odd key tiles. The vector side (KeyRowsLogits) turns four keys' C rows into
// lanes 4·key + row with seven 128-bit shuffles. Against keys as B (a 16×16 dword
// transpose per 64 bytes of codes, stored and loaded again as B) it measured 16 % less
// time in L2 and 1.5-3 % less from DRAM; for 4-bit K, unpacked into a staging tile, it
// was slower (docs/benchmarks.md §Measurements behind kernel choices).
// Unsigned bytes only (kernel_bits 8): signed ones are offset while TileCodes transposes.
inline bool KeyRowsFit(bool amx, int kernel_bits, std::size_t rows, std::size_t dk, std::size_t gs) {
  return amx && kernel_bits == 8 && rows <= 4 && gs % 64 == 0 && dk % 64 == 0 && dk <= 128;
}

// B of each step: [step][16 dim quads][16] dwords (columns 12-15 unused) from the digit
// words (rows padded to 4).
inline void KeyRowsB(const Digits& dg, std::size_t J, std::vector<std::int32_t>& b) {
  const std::size_t steps = J / 16;
  b.assign(steps * 256, 0);
  for (std::size_t s = 0; s < steps; ++s) {
    for (std::size_t k = 0; k < 16; ++k) {
      for (std::size_t r = 0; r < 4; ++r) {
        for (std::size_t p = 0; p < kPieces; ++p) b[s * 256 + k * 16 + p * 4 + r] = dg.words[(r * kPieces + p) * J + s * 16 + k];
      }
    }
  }
}

inline void KeyRowsConfigure(std::size_t steps, const std::int32_t* b) {
  AmxConfig c;
  for (std::size_t i = 0; i < 8; ++i) {
    c.colsb[i] = i == 2 || i == 3 ? 64 : 4 * kAmxRows;  // A: 64 bytes of codes; B and C: 12 columns
    c.rows[i] = 16;
  }
  asm volatile("ldtilecfg %0" ::"m"(c));
  const long stride = 64;
  asm volatile("tileloadd (%0,%1,1), %%tmm0" ::"r"(b), "r"(stride) : "memory");
  if (steps == 2) asm volatile("tileloadd (%0,%1,1), %%tmm1" ::"r"(b + 256), "r"(stride) : "memory");
}

// The multiplies of the key tile whose 16 rows start at a (stride row_bytes) into the C
// tiles of its parity (tmm4/5 or tmm6/7, one per group); KeyRowsStore stores them after
// the next tile's multiplies are issued, so no store waits on its own multiply.
template <int kParity>
HWY_INLINE void KeyRowsTile(const std::uint8_t* a, std::size_t row_bytes, std::size_t steps, std::size_t groups) {
  const long stride = static_cast<long>(row_bytes);
  asm volatile("tileloadd (%0,%1,1), %%tmm2" ::"r"(a), "r"(stride) : "memory");
  if (steps == 2) asm volatile("tileloadd (%0,%1,1), %%tmm3" ::"r"(a + 64), "r"(stride) : "memory");
  if constexpr (kParity == 0) {
    asm volatile("tilezero %%tmm4" ::);
    asm volatile("tdpbusd %%tmm0, %%tmm2, %%tmm4" ::);
    if (steps == 2 && groups == 2) {
      asm volatile("tilezero %%tmm5" ::);
      asm volatile("tdpbusd %%tmm1, %%tmm3, %%tmm5" ::);
    } else if (steps == 2) {
      asm volatile("tdpbusd %%tmm1, %%tmm3, %%tmm4" ::);
    }
  } else {
    asm volatile("tilezero %%tmm6" ::);
    asm volatile("tdpbusd %%tmm0, %%tmm2, %%tmm6" ::);
    if (steps == 2 && groups == 2) {
      asm volatile("tilezero %%tmm7" ::);
      asm volatile("tdpbusd %%tmm1, %%tmm3, %%tmm7" ::);
    } else if (steps == 2) {
      asm volatile("tdpbusd %%tmm1, %%tmm3, %%tmm6" ::);
    }
  }
}

// C of a tile of that parity → c[g][16 keys][16] (columns 12-15 not written).
template <int kParity>
HWY_INLINE void KeyRowsStore(std::size_t groups, std::int32_t* c) {
  const long stride = 64;
  if constexpr (kParity == 0) {
    asm volatile("tilestored %%tmm4, (%0,%1,1)" ::"r"(c), "r"(stride) : "memory");
    if (groups == 2) asm volatile("tilestored %%tmm5, (%0,%1,1)" ::"r"(c + 256), "r"(stride) : "memory");
  } else {
    asm volatile("tilestored %%tmm6, (%0,%1,1)" ::"r"(c), "r"(stride) : "memory");
    if (groups == 2) asm volatile("tilestored %%tmm7, (%0,%1,1)" ::"r"(c + 256), "r"(stride) : "memory");
  }
}

// Per group, Q and σ of each row in lanes 4·key + row (zero past rows).
struct RowTerms {
  __m512 qsum[2], sigma[2];
};
inline RowTerms KeyRowsTerms(const Digits& dg, std::size_t rows, std::size_t groups) {
  RowTerms v;
  for (std::size_t g = 0; g < groups; ++g) {
    alignas(64) float qsum[16], sigma[16];
    for (std::size_t l = 0; l < 16; ++l) {
      const std::size_t r = l % 4;
      qsum[l] = r < rows ? dg.qsum[r * groups + g] : 0.0f;
      sigma[l] = r < rows ? dg.sigma[r * groups + g] : 0.0f;
    }
    v.qsum[g] = _mm512_load_ps(qsum);
    v.sigma[g] = _mm512_load_ps(sigma);
  }
  return v;
}

// Logits of rows [0, rows) for the tile's 16 keys from its C (KeyRowsTile), the same
// operations per (row, key) as TileRows, in lanes 4·key + row of four keys at a time.
HWY_INLINE void KeyRowsLogits(const std::int32_t* HWY_RESTRICT c, std::size_t rows, std::size_t groups,
                              const RowTerms& rv, const float* HWY_RESTRICT s_cols,
                              const float* HWY_RESTRICT b_cols, std::size_t ncp, float* HWY_RESTRICT scores,
                              __m512& shat, __m512& probe) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __mmask16 real = _mm512_cmplt_epu32_mask(_mm512_and_si512(lane, _mm512_set1_epi32(3)),
                                                 _mm512_set1_epi32(static_cast<int>(rows)));
  __m512 logit[4], absum[4];
#pragma GCC unroll 4
  for (std::size_t q = 0; q < 4; ++q) logit[q] = absum[q] = _mm512_setzero_ps();
  for (std::size_t g = 0; g < groups; ++g) {
    const std::int32_t* cg = c + g * 256;
    const __m512 qv = rv.qsum[g], sv = rv.sigma[g];
    const __m512 s16 = _mm512_loadu_ps(s_cols + g * ncp), b16 = _mm512_loadu_ps(b_cols + g * ncp);
#pragma GCC unroll 4
    for (std::size_t q = 0; q < 4; ++q) {  // keys 4q..4q+3: C rows [hi(4) mid(4) lo(4) 0(4)]
      const __m512i x0 = _mm512_load_si512(cg + (4 * q) * 16), x1 = _mm512_load_si512(cg + (4 * q + 1) * 16);
      const __m512i x2 = _mm512_load_si512(cg + (4 * q + 2) * 16), x3 = _mm512_load_si512(cg + (4 * q + 3) * 16);
      const __m512i t0 = _mm512_shuffle_i32x4(x0, x1, 0x44), t1 = _mm512_shuffle_i32x4(x2, x3, 0x44);
      const __m512i t2 = _mm512_shuffle_i32x4(x0, x1, 0xEE), t3 = _mm512_shuffle_i32x4(x2, x3, 0xEE);
      const __m512i hi = _mm512_shuffle_i32x4(t0, t1, 0x88), mid = _mm512_shuffle_i32x4(t0, t1, 0xDD);
      const __m512i lo = _mm512_shuffle_i32x4(t2, t3, 0x88);
      const __m512i low = _mm512_add_epi32(_mm512_slli_epi32(mid, 8), lo);
      const __m512 I = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_set1_ps(65536.0f), _mm512_cvtepi32_ps(low));
      const __m512i key = _mm512_add_epi32(_mm512_srli_epi32(lane, 2), _mm512_set1_epi32(static_cast<int>(4 * q)));
      const __m512 s = _mm512_permutexvar_ps(key, s16), b = _mm512_permutexvar_ps(key, b16);
      const __m512 share = _mm512_fmadd_ps(b, qv, _mm512_mul_ps(s, I));
      logit[q] = _mm512_fmadd_ps(share, sv, logit[q]);
      absum[q] = _mm512_fmadd_ps(_mm512_abs_ps(share), sv, absum[q]);
    }
  }
#pragma GCC unroll 4
  for (std::size_t q = 0; q < 4; ++q) {
    shat = _mm512_mask_max_ps(shat, real, shat, absum[q]);
    probe = _mm512_mask_add_ps(probe, real, probe, absum[q]);  // max may drop a NaN; a sum keeps it
  }
  // Lanes 4·key + row of four key blocks → one vector of 16 keys per row.
  const __m512i by_row = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512 t[4];
#pragma GCC unroll 4
  for (std::size_t q = 0; q < 4; ++q) t[q] = _mm512_permutexvar_ps(by_row, logit[q]);  // lane 4·row + key
  const __m512 u0 = _mm512_shuffle_f32x4(t[0], t[1], 0x44), u1 = _mm512_shuffle_f32x4(t[2], t[3], 0x44);
  const __m512 u2 = _mm512_shuffle_f32x4(t[0], t[1], 0xEE), u3 = _mm512_shuffle_f32x4(t[2], t[3], 0xEE);
  const __m512 out[4] = {_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD),
                         _mm512_shuffle_f32x4(u2, u3, 0x88), _mm512_shuffle_f32x4(u2, u3, 0xDD)};
  for (std::size_t r = 0; r < rows; ++r) _mm512_storeu_ps(scores + r * ncp, out[r]);
}

// ScoreChunk by KeyRowsTile/KeyRowsLogits (KeyRowsFit): the same scores and certificate.
inline bool KeyRowsChunk(std::size_t rows, std::size_t dk, std::size_t gs, const std::uint8_t* codes,
                         std::size_t row_bytes, std::size_t nc, std::size_t ncp, const float* s_cols,
                         const float* b_cols, float* scores, float slack, const Digits& dg,
                         DecodePlan::MixCounters& mix) {
  const std::size_t groups = dk / gs, J = dk / 4, steps = dk / 64;
  // Tile t: its multiplies, then tile t−1's C stored, then tile t−2's logits (the vector
  // loads of a C a tile after its store).
  alignas(64) std::int32_t c[2][2 * 256] = {};  // zero: the shuffles read columns 12-15 too
  alignas(64) std::uint8_t tail[16 * 128];  // the last tile's keys, zero past nc
  KeyRowsConfigure(steps, dg.key_rows_b.data());
  const RowTerms rv = KeyRowsTerms(dg, rows, groups);
  __m512 emax = _mm512_setzero_ps(), esum = emax, shat = emax, probe = emax;
  const std::size_t tiles = (nc + kTileKeys - 1) / kTileKeys;
  for (std::size_t t = 0; t < tiles + 2; ++t) {
    if (t < tiles) {
      const std::size_t t0 = t * kTileKeys, keys = std::min(kTileKeys, nc - t0);
      const std::uint8_t* a = codes + t0 * row_bytes;
      std::size_t stride = row_bytes;
      for (std::size_t k = 0; k < kTileKeys; ++k) {
        for (std::size_t l = 0; l < dk; l += 64) hwy::Prefetch(a + (k + kPrefetchKeys) * row_bytes + l);
      }
      if (keys < kTileKeys) {
        std::memset(tail, 0, sizeof tail);
        for (std::size_t k = 0; k < keys; ++k) std::memcpy(tail + k * dk, a + k * row_bytes, dk);
        a = tail;
        stride = dk;
      }
      if (t % 2 == 0) {
        KeyRowsTile<0>(a, stride, steps, groups);
      } else {
        KeyRowsTile<1>(a, stride, steps, groups);
      }
    }
    if (t >= 1 && t - 1 < tiles) {
      if ((t - 1) % 2 == 0) {
        KeyRowsStore<0>(groups, c[(t - 1) % 2]);
      } else {
        KeyRowsStore<1>(groups, c[(t - 1) % 2]);
      }
    }
    if (t < 2) continue;
    const std::size_t t0 = (t - 2) * kTileKeys;
    TileBound(dg, s_cols + t0, b_cols + t0, groups, ncp, emax, esum);
    KeyRowsLogits(c[(t - 2) % 2], rows, groups, rv, s_cols + t0, b_cols + t0, ncp, scores + t0, shat, probe);
  }
  AmxRelease();
  mix.amx_int8 += static_cast<std::int64_t>(tiles * kTileKeys * kAmxRows * J);  // 12 columns of C per key
  return Certified(emax, esum, shat, probe, slack);
}

