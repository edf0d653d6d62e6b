// Per-target bit packing of affine codes (kernels/simd/affine_quantize.cc),
// docs/quantization.md §Bit packing: each row is an LSB-first bitstream read as little-endian u32
// words, so on a little-endian host the stream is plain byte order and a group of gs codes (gs a
// multiple of 32) fills exactly gs·bits/32 whole words of its own.
//
// In registers, for the widths whose codes never straddle a byte (2, 4, 8): N codes in
// i32 lanes become N·bits/8 stream bytes and back. The low byte of each lane is a code
// < 2^bits (the quantizer clamps or masks it; the bits above may be anything), so
// truncating never saturates and ORing fields never carries.
//   8 bits: one byte per code (TruncateTo / PromoteTo).
//   4 bits: packing reads the i32 lanes in pairs as u64 lanes c0 | c1<<32 and keeps
//           bits 0..3 of x and bits 4..7 of x>>28 (c0 | c1<<4, the stream byte) before
//           truncating to bytes. Unpacking spreads byte b into u16 b | b<<4, masked
//           0x0F0F: low byte = low nibble (code 2k), high byte = code 2k+1.
//   2 bits: the same with u32 lanes c0 | c1<<8 | c2<<16 | c3<<24 and four fields.
// Every step is a lane-local integer op in lane order, so the result does not depend on
// the target's block structure (no ReorderDemote2To / Interleave). Needs >= 4 i32 lanes:
// the SCALAR target (1 lane) and the other widths use a u8 code buffer and the scalar
// pack_codes/unpack_codes below instead.
#ifndef KVLAB_SIMD_AFFINE_PACK_SCALAR
#define KVLAB_SIMD_AFFINE_PACK_SCALAR
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvlab::simd::affine_detail {

static_assert(std::endian::native == std::endian::little,
              "the packing writes the LSB-first bitstream as little-endian bytes");

// LSB-first bitstream (reference/bitpack.h) of n codes, n % 8 == 0: 8 codes fill exactly
// `bits` bytes, so each 8-code chunk is assembled in a u64 and its low `bits` bytes are
// the next stream bytes (little-endian). Codes are < 2^bits by construction.
inline void pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out) {
  const auto width = static_cast<std::size_t>(bits);  // bits per code = bytes per 8 codes
  for (std::size_t i = 0; i < n; i += 8, out += width) {
    std::uint64_t acc = 0;
    for (std::size_t k = 0; k < 8; ++k) acc |= std::uint64_t{codes[i + k]} << (k * width);
    std::memcpy(out, &acc, width);
  }
}

inline void unpack_codes(const std::uint8_t* in, std::size_t n, int bits, std::uint8_t* codes) {
  const auto width = static_cast<std::size_t>(bits);
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  for (std::size_t i = 0; i < n; i += 8, in += width) {
    std::uint64_t acc = 0;
    std::memcpy(&acc, in, width);
    for (std::size_t k = 0; k < 8; ++k) codes[i + k] = static_cast<std::uint8_t>((acc >> (k * width)) & mask);
  }
}

}  // namespace kvlab::simd::affine_detail
#endif  // KVLAB_SIMD_AFFINE_PACK_SCALAR

#if defined(KVLAB_SIMD_AFFINE_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVLAB_SIMD_AFFINE_PACK_INL_H_
#undef KVLAB_SIMD_AFFINE_PACK_INL_H_
#else
#define KVLAB_SIMD_AFFINE_PACK_INL_H_
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE::affine_pack {
namespace hn = hwy::HWY_NAMESPACE;

// The low byte of each lane, as hn::TruncateTo(du8, v). Highway 1.0.3's AVX3_DL overload
// for 16 u32 lanes permutes by a byte-index table with vpermd instead of vpermb and
// returns wrong bytes; vpmovdb does the narrowing there.
template <class DU8, class V>
HWY_INLINE auto LowBytes(DU8 du8, V v) {
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (sizeof(hn::TFromV<V>) == 4 && hn::MaxLanes(hn::DFromV<V>()) == 16) {
    return hn::Vec128<std::uint8_t, 16>{_mm512_cvtepi32_epi8(v.raw)};
  } else {
    return hn::TruncateTo(du8, v);
  }
#else
  return hn::TruncateTo(du8, v);
#endif
}

// Whether codes of this width are packed in registers on this target.
template <int kBits>
constexpr bool kInRegisters = HWY_TARGET != HWY_SCALAR && (kBits == 2 || kBits == 4 || kBits == 8);

// Writes the Lanes(di) codes of `codes` as the next Lanes(di)·kBits/8 stream bytes.
template <int kBits, class DI>
HWY_INLINE void StoreCodes(DI /*di*/, hn::Vec<DI> codes, std::uint8_t* HWY_RESTRICT out) {
  static_assert(kInRegisters<kBits>);
  const hn::Rebind<std::uint8_t, DI> du8;  // one byte per code, in lane order
  if constexpr (kBits == 8) {
    hn::StoreU(LowBytes(du8, hn::BitCast(hn::RebindToUnsigned<DI>(), codes)), du8, out);
  } else if constexpr (kBits == 4) {
    // u64 lanes hold a pair, c0 in bits 0..31 and c1 in bits 32..63 (anything above each
    // code's low byte); x >> 28 puts c1's low nibble at bits 4..7, a bitwise select (one
    // ternlog on AVX3) takes bits 0..3 from x and 4..7 from x >> 28, and the u64 → u8
    // truncation keeps that byte.
    const hn::Repartition<std::uint64_t, DI> du64;
    const hn::Rebind<std::uint8_t, decltype(du64)> dout;
    const auto x = hn::BitCast(du64, codes);
    const auto low_nibble = hn::Set(du64, 0x0Fu);  // not IfVecThenElse: SSE4/AVX2 blend by byte sign bits
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // The select as one ternlog (0xCA: a ? b : c bitwise; GCC emits two), and vpmovqb:
    // 2 µops where Highway 1.0.3's TruncateTo takes 4.
    const __m512i pair = _mm512_ternarylogic_epi64(low_nibble.raw, x.raw, hn::ShiftRight<28>(x).raw, 0xCA);
    hn::StoreU(hn::Vec128<std::uint8_t, 8>{_mm512_cvtepi64_epi8(pair)}, dout, out);
#else
    const auto pair = hn::Or(hn::And(x, low_nibble), hn::AndNot(low_nibble, hn::ShiftRight<28>(x)));
    hn::StoreU(hn::TruncateTo(dout, pair), dout, out);
#endif
  } else {
    const auto bytes = LowBytes(du8, hn::BitCast(hn::RebindToUnsigned<DI>(), codes));
    const hn::Repartition<std::uint32_t, decltype(du8)> du32;  // lanes c0 | c1<<8 | c2<<16 | c3<<24
    const hn::RebindToSigned<decltype(du32)> di32;
    const hn::Rebind<std::uint8_t, decltype(du32)> dout;
    const auto x = hn::BitCast(du32, bytes);
    const auto f0 = hn::And(x, hn::Set(du32, 0x03u));
    const auto f1 = hn::And(hn::ShiftRight<6>(x), hn::Set(du32, 0x0Cu));
    const auto f2 = hn::And(hn::ShiftRight<12>(x), hn::Set(du32, 0x30u));
    const auto f3 = hn::And(hn::ShiftRight<18>(x), hn::Set(du32, 0xC0u));
    const auto packed = hn::Or(hn::Or(f0, f1), hn::Or(f2, f3));
    hn::StoreU(hn::DemoteTo(dout, hn::BitCast(di32, packed)), dout, out);
  }
}

// Whether StoreCodesFour (below) packs this width on this target.
template <int kBits>
constexpr bool kPacksFour =
    (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2) && (kBits == 2 || kBits == 4 || kBits == 8);

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Four vectors at a time (AVX3): codes as plain integers k (i32, any value; not yet
// clamped), 64 of them in k[0..3] in stream order, → clamp(k, 0, 2^bits − 1) packed into
// the next 8·bits stream bytes (only the first 4·bits, 32 codes, when `half`: k[2..3]
// are then ignored). The saturating packs do the clamp to [0, 255] on the way (i32 →
// u16 → u8), a byte Min the rest; what they leave per 128-bit block B is
// [k0[4B..4B+3] k1[4B..] k2[4B..] k3[4B..]], consecutive codes side by side, so a
// multiply-add of byte pairs (c0 + c1·2^bits) packs them within the block and one
// permutation puts the blocks' pieces in stream order. 8 bits: 4 µops per 64 codes,
// 4 bits: 7, 2 bits: 7, where StoreCodes takes 8–16 plus the clamp (2 per vector).
template <int kBits>
HWY_INLINE void StoreCodesFour(const __m512i* k, bool half, std::uint8_t* HWY_RESTRICT out) {
  static_assert(kPacksFour<kBits>);
  __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(k[0], k[1]), _mm512_packus_epi32(k[2], k[3]));
  // Dword (B, v) (block B, source vector v) holds codes 16v + 4B .. 16v + 4B + 3;
  // stream order wants it at 4v + B: a 4×4 transpose of dwords.
  const __m512i transpose = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  if constexpr (kBits == 8) {
    bytes = _mm512_permutexvar_epi32(transpose, bytes);
    if (half) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_castsi512_si256(bytes));
    return _mm512_storeu_si512(out, bytes);
  }
  bytes = _mm512_min_epu8(bytes, _mm512_set1_epi8(static_cast<char>((1 << kBits) - 1)));
  // u8 pairs → u16 c0 + c1·2^bits (< 256: no saturation).
  const __m512i pairs = _mm512_maddubs_epi16(bytes, _mm512_set1_epi16(static_cast<short>(1 | (1 << kBits) << 8)));
  if constexpr (kBits == 4) {
    // Words ≤ 255 → bytes; per block B its 4 byte pairs (one per source vector v) sit in
    // words 8B .. 8B + 3 of the zmm; stream order wants pair (B, v) at word 4v + B.
    const __m512i packed = _mm512_packus_epi16(pairs, pairs);
    const __m512i order = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                           27, 19, 11, 3, 26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0);
    const __m512i stream = _mm512_permutexvar_epi16(order, packed);
    if (half) return _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_castsi512_si128(stream));
    return _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_castsi512_si256(stream));
  } else {
    // u16 pairs → u32 (c0 + 4c1) + (c2 + 4c3)·16 < 256: one stream byte per dword, which
    // the transpose puts in order and vpmovdb narrows.
    const __m512i quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(1 | 16 << 16));
    const __m128i stream = _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(transpose, quads));
    if (half) return _mm_storel_epi64(reinterpret_cast<__m128i*>(out), stream);
    return _mm_storeu_si128(reinterpret_cast<__m128i*>(out), stream);
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// Whether StoreHighHalfCodes (below) packs this width on this target.
template <int kBits>
constexpr bool kPacksHighHalves = kBits == 2 || kBits == 4 || kBits == 8;

// Byte-index tables of StoreHighHalfCodes: word j ← word 2j + 1 of two tables (the high
// half of their i32 lane j); per width, the stream bytes of the packed block in order.
constexpr std::array<std::uint16_t, 32> HighHalfWords() {
  std::array<std::uint16_t, 32> t{};
  for (std::size_t j = 0; j < 32; ++j) t[j] = static_cast<std::uint16_t>(2 * j + 1);
  return t;
}
// Block B (0..3) of the packed bytes holds codes 8B..8B+7, then 32+8B..32+8B+7. 8 bits:
// qwords 0, 2, 4, 6 then 1, 3, 5, 7 are the stream. 4 bits: stream byte p is the pair
// word 8B + (p mod 4) (p < 16, B = p/4) or 8B + 4 + (p mod 4) (p >= 16, B = (p − 16)/4),
// its low byte. 2 bits: stream byte p the quad dword 4B + (p mod 2) (p < 8, B = p/2) or
// 4B + 2 + (p mod 2) (B = (p − 8)/2), its low byte.
template <int kBits>
constexpr std::array<std::uint8_t, 64> HighHalfStream() {
  std::array<std::uint8_t, 64> t{};
  for (std::size_t p = 0; p < 64; ++p) {
    std::size_t from = 0;
    if constexpr (kBits == 8) {
      from = 8 * (p / 8 < 4 ? 2 * (p / 8) : 2 * (p / 8 - 4) + 1) + p % 8;
    } else if constexpr (kBits == 4) {
      if (p < 32) from = 2 * (p < 16 ? 8 * (p / 4) + p % 4 : 8 * ((p - 16) / 4) + 4 + p % 4);
    } else {
      if (p < 16) from = 4 * (p < 8 ? 4 * (p / 2) + p % 2 : 4 * ((p - 8) / 2) + 2 + p % 2);
    }
    t[p] = static_cast<std::uint8_t>(from);
  }
  return t;
}

// 64 codes K as the signed high 16-bit halves of k[0..3]'s i32 lanes (stream order; the
// low halves are ignored) → clamp(K, 0, 2^bits − 1) packed into the next 8·bits stream
// bytes. Two-table word permutations take the high halves of k[0], k[1] and of k[2], k[3]
// (codes 0..31, 32..63), a saturating pack clamps them to [0, 255] (block B: codes
// 8B..8B+7, 32+8B..32+8B+7), a byte Min the rest; multiply-adds join pairs (and quads)
// as in StoreCodesFour, and one permutation puts the stream bytes in order.
// 4 µops per 64 codes at 8 bits, 6 at 4, 7 at 2.
template <int kBits>
HWY_INLINE void StoreHighHalfCodes(const __m512i* k, std::uint8_t* HWY_RESTRICT out) {
  static_assert(kPacksHighHalves<kBits>);
  alignas(64) static constexpr std::array<std::uint16_t, 32> kWords = HighHalfWords();
  alignas(64) static constexpr std::array<std::uint8_t, 64> kStream = HighHalfStream<kBits>();
  const __m512i words = _mm512_load_si512(kWords.data()), stream = _mm512_load_si512(kStream.data());
  __m512i bytes = _mm512_packus_epi16(_mm512_permutex2var_epi16(k[0], words, k[1]),
                                      _mm512_permutex2var_epi16(k[2], words, k[3]));
  if constexpr (kBits == 8) return _mm512_storeu_si512(out, _mm512_permutexvar_epi8(stream, bytes));
  bytes = _mm512_min_epu8(bytes, _mm512_set1_epi8(static_cast<char>((1 << kBits) - 1)));
  __m512i joined = _mm512_maddubs_epi16(bytes, _mm512_set1_epi16(static_cast<short>(1 | (1 << kBits) << 8)));
  if constexpr (kBits == 2) joined = _mm512_madd_epi16(joined, _mm512_set1_epi32(1 | 16 << 16));
  const __m512i packed = _mm512_permutexvar_epi8(stream, joined);
  if constexpr (kBits == 4) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_castsi512_si256(packed));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_castsi512_si128(packed));
}
#endif
#elif HWY_TARGET == HWY_AVX2
// Four vectors at a time (AVX2), as on AVX3: 32 codes in k[0..3] (16 when `half`), plain
// integers not yet clamped, → the next 4·bits stream bytes (2·bits when `half`). The packs
// clamp to [0, 255] and leave per 128-bit block B (0 or 1) the dwords
// [k0[4B..4B+3] k1[4B..] k2[4B..] k3[4B..]]: dword 4B + v holds codes 8v + 4B .. 8v + 4B + 3,
// which stream order puts at dword 2v + B. 8 bits: one vpermd restores that order. 4 and
// 2 bits: byte Min, then pairs (and quads) packed within the block by multiply-adds, and
// one in-block byte shuffle per block puts each block's stream bytes at their final
// positions (the other block's positions zero), so an OR of the two halves is the stream.
// 8 bits: 4 µops per 32 codes, 4 bits: 8, 2 bits: 9, where StoreCodes takes 4 × (4–8).
// `half` cannot occur here (groups hold 32+ codes, four AVX2 vectors); it is kept so
// the shared call site in affine_quantize.cc means the same on both targets.
template <int kBits>
HWY_INLINE void StoreCodesFour(const __m256i* k, bool half, std::uint8_t* HWY_RESTRICT out) {
  static_assert(kPacksFour<kBits>);
  __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(k[0], k[1]), _mm256_packus_epi32(k[2], k[3]));
  if constexpr (kBits == 8) {
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (half) return _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(bytes));
    return _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
  }
  bytes = _mm256_min_epu8(bytes, _mm256_set1_epi8(static_cast<char>((1 << kBits) - 1)));
  // u8 pairs → u16 c0 + c1·2^bits (< 256: no saturation).
  const __m256i pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(static_cast<short>(1 | (1 << kBits) << 8)));
  constexpr char Z = -128;  // vpshufb: a set top bit writes zero
  __m256i placed;
  if constexpr (kBits == 4) {
    // Word 2v + h of block B (codes 8v + 4B + 2h, +1) is stream byte 4v + 2B + h; its
    // value is its low byte, at byte 4v + 2h of the block.
    placed = _mm256_shuffle_epi8(pairs, _mm256_setr_epi8(0, 2, Z, Z, 4, 6, Z, Z, 8, 10, Z, Z, 12, 14, Z, Z,  //
                                                         Z, Z, 0, 2, Z, Z, 4, 6, Z, Z, 8, 10, Z, Z, 12, 14));
  } else {
    // u16 pairs → u32 (c0 + 4c1) + (c2 + 4c3)·16 < 256: dword v of block B (codes
    // 8v + 4B .. + 3) is stream byte 2v + B, its value at byte 4v of the block.
    const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(1 | 16 << 16));
    placed = _mm256_shuffle_epi8(quads, _mm256_setr_epi8(0, Z, 4, Z, 8, Z, 12, Z, Z, Z, Z, Z, Z, Z, Z, Z,  //
                                                         Z, 0, Z, 4, Z, 8, Z, 12, Z, Z, Z, Z, Z, Z, Z, Z));
  }
  const __m128i stream = _mm_or_si128(_mm256_castsi256_si128(placed), _mm256_extracti128_si256(placed, 1));
  // 4·bits bytes, 2·bits when half: 16 or 8 (4 bits), 8 or 4 (2 bits).
  if (kBits == 4 && !half) return _mm_storeu_si128(reinterpret_cast<__m128i*>(out), stream);
  if (kBits == 4 || !half) return _mm_storel_epi64(reinterpret_cast<__m128i*>(out), stream);
  const std::int32_t word = _mm_cvtsi128_si32(stream);
  std::memcpy(out, &word, sizeof word);
}
#endif

// Reads the next Lanes(di) codes (Lanes(di)·kBits/8 stream bytes) into i32 lanes.
template <int kBits, class DI>
HWY_INLINE hn::Vec<DI> LoadCodes(DI di, const std::uint8_t* HWY_RESTRICT in) {
  static_assert(kInRegisters<kBits>);
  const hn::Rebind<std::uint8_t, DI> du8;
  if constexpr (kBits == 8) {
    return hn::PromoteTo(di, hn::LoadU(du8, in));
  } else if constexpr (kBits == 4) {
    const hn::Repartition<std::uint16_t, decltype(du8)> du16;
    const hn::Rebind<std::uint8_t, decltype(du16)> din;
    const auto b = hn::PromoteTo(du16, hn::LoadU(din, in));
    const auto spread = hn::And(hn::Or(b, hn::ShiftLeft<4>(b)), hn::Set(du16, 0x0F0F));
    return hn::PromoteTo(di, hn::BitCast(du8, spread));
  } else {
    const hn::Repartition<std::uint32_t, decltype(du8)> du32;
    const hn::Rebind<std::uint8_t, decltype(du32)> din;
    const auto b = hn::PromoteTo(du32, hn::LoadU(din, in));
    const auto spread = hn::Or(hn::Or(b, hn::ShiftLeft<6>(b)), hn::Or(hn::ShiftLeft<12>(b), hn::ShiftLeft<18>(b)));
    return hn::PromoteTo(di, hn::BitCast(du8, hn::And(spread, hn::Set(du32, 0x03030303u))));
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE::affine_pack
HWY_AFTER_NAMESPACE();

#endif  // KVLAB_SIMD_AFFINE_PACK_INL_H_
