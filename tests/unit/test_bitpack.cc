// Unit tests of reference/bitpack (docs/quantization.md §Bit packing): one LSB-first little-endian
// bitstream per row, code i at stream bits [i·b, i·b + b). The expectations below are written
// independently of bitpack.cc: a 64-bit window extraction, the per-byte decodes the
// MLX kernels use, and hand-computed words for the straddling example.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvlab/error.h"
#include "reference/bitpack.h"
#include "tests/unit/test_util.h"


namespace kvlab::ref {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_bitpack {
namespace {

using testing::SeededRng;

std::vector<std::uint8_t> random_codes(SeededRng& rng, std::size_t n, int bits) {
  std::vector<std::uint8_t> codes(n);
  for (auto& c : codes) c = static_cast<std::uint8_t>(rng.integer(0, (std::int64_t{1} << bits) - 1));
  return codes;
}

std::vector<std::uint32_t> pack(const std::vector<std::uint8_t>& codes, int bits) {
  const auto n_codes = static_cast<std::int64_t>(codes.size());
  std::vector<std::uint32_t> words(static_cast<std::size_t>(packed_word_count(n_codes, bits)));
  pack_codes(codes, bits, words);
  return words;
}

// Independent extraction: read the 64-bit little-endian window that starts at the word
// holding stream bit i·b and shift. A code spans at most two words because b ≤ 8.
std::uint32_t window_extract(const std::vector<std::uint32_t>& words, int bits, std::size_t i) {
  const std::size_t first_bit = i * static_cast<std::size_t>(bits);
  const std::size_t w = first_bit / 32;
  std::uint64_t window = words[w];
  if (w + 1 < words.size()) window |= std::uint64_t{words[w + 1]} << 32;
  return static_cast<std::uint32_t>((window >> (first_bit % 32)) & ((std::uint64_t{1} << bits) - 1));
}

// Byte k of the stream: the uint32 array read as little-endian bytes (how the kernels,
// which write bytes, see it). Computed with shifts so the test is host-endian-agnostic.
std::uint32_t stream_byte(const std::vector<std::uint32_t>& words, std::size_t k) {
  return (words[k / 4] >> (8 * (k % 4))) & 0xFFu;
}

// Bits [lo, hi) of a byte, as docs/quantization.md §Bit packing writes w[lo:hi].
std::uint32_t bits_of(std::uint32_t byte, int lo, int hi) { return (byte >> lo) & ((1u << (hi - lo)) - 1u); }

TEST(Bitpack, WordCountIsCeilOfStreamBits) {
  EXPECT_EQ(packed_word_count(0, 3), 0);
  EXPECT_EQ(packed_word_count(10, 3), 1);   // 30 bits
  EXPECT_EQ(packed_word_count(11, 3), 2);   // 33 bits
  EXPECT_EQ(packed_word_count(32, 3), 3);   // the 3-byte pack unit × 4
  EXPECT_EQ(packed_word_count(128, 5), 20);
  EXPECT_EQ(packed_word_count(128, 6), 24);
  EXPECT_EQ(packed_word_count(64, 8), 16);
  EXPECT_EQ(packed_word_count(1, 1), 1);
}

// pack∘unpack and unpack∘pack are identities at every width, including the word-
// straddling 3, 5 and 6 and odd lengths whose last word is partly padding.
TEST(Bitpack, RoundTripEveryWidth) {
  KVLAB_SEEDED_RNG(rng, 20240611);
  for (int bits = 1; bits <= 8; ++bits) {
    for (std::size_t n : {1u, 7u, 31u, 64u, 129u, 1000u}) {
      SCOPED_TRACE(::testing::Message() << bits << " bits, " << n << " codes");
      const std::vector<std::uint8_t> codes = random_codes(rng, n, bits);
      const std::vector<std::uint32_t> words = pack(codes, bits);
      std::vector<std::uint8_t> back(n);
      unpack_codes(words, bits, back);
      EXPECT_EQ(back, codes);
    }
    // The other direction: any word content whose bit count is a whole number of codes.
    const std::size_t n = 32 * 5;  // 5·bits words exactly
    std::vector<std::uint32_t> words(static_cast<std::size_t>(packed_word_count(static_cast<std::int64_t>(n), bits)));
    for (auto& w : words) w = static_cast<std::uint32_t>(rng.integer(0, 0xFFFFFFFF));
    std::vector<std::uint8_t> codes(n);
    unpack_codes(words, bits, codes);
    EXPECT_EQ(pack(codes, bits), words) << bits << " bits";
  }
}

TEST(Bitpack, ElementIAtStreamBitsIbToIbPlusB) {
  KVLAB_SEEDED_RNG(rng, 77);
  for (int bits = 1; bits <= 8; ++bits) {
    const std::vector<std::uint8_t> codes = random_codes(rng, 257, bits);
    const std::vector<std::uint32_t> words = pack(codes, bits);
    for (std::size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ(window_extract(words, bits, i), codes[i]) << bits << " bits, element " << i;
      ASSERT_EQ(code_at(words, bits, static_cast<std::int64_t>(i)), codes[i]) << bits << " bits, element " << i;
    }
  }
}

// docs/quantization.md §Bit packing: "3-bit element 10 = word0 bits 30–31 plus word1 bit 0".
TEST(Bitpack, ThreeBitElementTenStraddlesWordsZeroAndOne) {
  for (std::uint8_t value = 0; value < 8; ++value) {
    std::vector<std::uint8_t> codes(11, 0);
    codes[10] = value;
    const std::vector<std::uint32_t> words = pack(codes, 3);
    ASSERT_EQ(words.size(), 2u);
    const std::uint32_t low_two = value & 0x3u, high_one = (value >> 2) & 0x1u;
    EXPECT_EQ(words[0], low_two << 30) << "value " << int{value};
    EXPECT_EQ(words[1], high_one) << "value " << int{value};
    EXPECT_EQ(code_at(words, 3, 10), value);
  }
  // And the reverse: set exactly those three bits by hand.
  const std::vector<std::uint32_t> words{0xC0000000u, 0x00000001u};
  EXPECT_EQ(code_at(words, 3, 10), 7u);
  EXPECT_EQ(code_at(words, 3, 9), 0u);
  EXPECT_EQ(code_at(words, 3, 11), 0u);
}

// docs/quantization.md §Bit packing, the per-byte decodes of the kernels (3 bytes → 8 three-bit
// codes).
TEST(Bitpack, ThreeBitMatchesPerByteKernelDecode) {
  KVLAB_SEEDED_RNG(rng, 3);
  const std::vector<std::uint8_t> codes = random_codes(rng, 8 * 40, 3);
  const std::vector<std::uint32_t> words = pack(codes, 3);
  for (std::size_t unit = 0; unit < codes.size() / 8; ++unit) {
    const std::uint32_t w0 = stream_byte(words, 3 * unit), w1 = stream_byte(words, 3 * unit + 1),
                        w2 = stream_byte(words, 3 * unit + 2);
    const std::uint32_t e[8] = {
        bits_of(w0, 0, 3),
        bits_of(w0, 3, 6),
        bits_of(w0, 6, 8) | bits_of(w1, 0, 1) << 2,
        bits_of(w1, 1, 4),
        bits_of(w1, 4, 7),
        bits_of(w1, 7, 8) | bits_of(w2, 0, 2) << 1,
        bits_of(w2, 2, 5),
        bits_of(w2, 5, 8),
    };
    for (std::size_t k = 0; k < 8; ++k) ASSERT_EQ(e[k], codes[8 * unit + k]) << "unit " << unit << " e" << k;
  }
}

// docs/quantization.md §Bit packing: 3 bytes → 4 six-bit codes.
TEST(Bitpack, SixBitMatchesPerByteKernelDecode) {
  KVLAB_SEEDED_RNG(rng, 6);
  const std::vector<std::uint8_t> codes = random_codes(rng, 4 * 64, 6);
  const std::vector<std::uint32_t> words = pack(codes, 6);
  for (std::size_t unit = 0; unit < codes.size() / 4; ++unit) {
    const std::uint32_t w0 = stream_byte(words, 3 * unit), w1 = stream_byte(words, 3 * unit + 1),
                        w2 = stream_byte(words, 3 * unit + 2);
    const std::uint32_t e[4] = {
        bits_of(w0, 0, 6),
        bits_of(w0, 6, 8) | bits_of(w1, 0, 4) << 2,
        bits_of(w1, 4, 8) | bits_of(w2, 0, 2) << 4,
        bits_of(w2, 2, 8),
    };
    for (std::size_t k = 0; k < 4; ++k) ASSERT_EQ(e[k], codes[4 * unit + k]) << "unit " << unit << " e" << k;
  }
}

// docs/quantization.md §Bit packing: 5-bit "follows the same bitstream over 5 bytes" (8 codes per
// 40-bit unit).
TEST(Bitpack, FiveBitUnitIsFortyBitLittleEndian) {
  KVLAB_SEEDED_RNG(rng, 5);
  const std::vector<std::uint8_t> codes = random_codes(rng, 8 * 32, 5);
  const std::vector<std::uint32_t> words = pack(codes, 5);
  for (std::size_t unit = 0; unit < codes.size() / 8; ++unit) {
    std::uint64_t forty = 0;
    for (std::size_t k = 0; k < 5; ++k) forty |= std::uint64_t{stream_byte(words, 5 * unit + k)} << (8 * k);
    for (std::size_t k = 0; k < 8; ++k) {
      ASSERT_EQ((forty >> (5 * k)) & 0x1Fu, codes[8 * unit + k]) << "unit " << unit << " e" << k;
    }
  }
}

// docs/quantization.md §Bit packing table: 2, 4, 8 bits never straddle; element j of a word sits at
// bits [b·(j mod 32/b), …) of word ⌊j/(32/b)⌋, element 0 in the low bits.
TEST(Bitpack, PowerOfTwoWidthsAlignToWords) {
  KVLAB_SEEDED_RNG(rng, 248);
  for (int bits : {2, 4, 8}) {
    const std::size_t per_word = static_cast<std::size_t>(32 / bits);
    const std::vector<std::uint8_t> codes = random_codes(rng, per_word * 16, bits);
    const std::vector<std::uint32_t> words = pack(codes, bits);
    ASSERT_EQ(words.size(), 16u);
    for (std::size_t j = 0; j < codes.size(); ++j) {
      const std::uint32_t field = (words[j / per_word] >> (static_cast<std::size_t>(bits) * (j % per_word))) &
                                  ((1u << bits) - 1u);
      ASSERT_EQ(field, codes[j]) << bits << " bits, element " << j;
    }
  }
  // Hand example: 4-bit codes 0..7 → nibbles 0x76543210, low nibble first.
  EXPECT_EQ(pack({0, 1, 2, 3, 4, 5, 6, 7}, 4), (std::vector<std::uint32_t>{0x76543210u}));
  EXPECT_EQ(pack({0xAB, 0xCD, 0xEF, 0x01}, 8), (std::vector<std::uint32_t>{0x01EFCDABu}));
}

TEST(Bitpack, PaddingBitsAreZeroedEvenIfTheOutputHeldGarbage) {
  std::vector<std::uint32_t> words(2, 0xFFFFFFFFu);
  const std::vector<std::uint8_t> codes{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};  // 33 bits
  pack_codes(codes, 3, words);
  EXPECT_EQ(words[0], 0xFFFFFFFFu);
  EXPECT_EQ(words[1], 0x1u);
}

TEST(Bitpack, RejectsCodesThatDoNotFit) {
  std::vector<std::uint32_t> words(1);
  const std::vector<std::uint8_t> three_bit{1, 2, 3, 8};  // 8 needs 4 bits
  EXPECT_KVLAB_ERROR(pack_codes(three_bit, 3, words), invalid_argument, "code 8 at index 3");
  const std::vector<std::uint8_t> two_bit{4};
  EXPECT_KVLAB_ERROR(pack_codes(two_bit, 2, words), invalid_argument, "code 4 at index 0");
  const std::vector<std::uint8_t> one_bit{0, 1, 2};
  EXPECT_KVLAB_ERROR(pack_codes(one_bit, 1, words), invalid_argument, "code 2 at index 2");
}

TEST(Bitpack, RejectsWrongWordCounts) {
  const std::vector<std::uint8_t> codes(32, 1);  // 3-bit: 96 bits → 3 words
  std::vector<std::uint32_t> too_few(2), too_many(4);
  EXPECT_KVLAB_ERROR(pack_codes(codes, 3, too_few), shape_mismatch, "2 words");
  EXPECT_KVLAB_ERROR(pack_codes(codes, 3, too_many), shape_mismatch, "4 words");
  std::vector<std::uint8_t> out(32);
  EXPECT_KVLAB_ERROR(unpack_codes(too_few, 3, out), shape_mismatch, "need 3");
  EXPECT_KVLAB_ERROR(unpack_codes(too_many, 3, out), shape_mismatch, "need 3");
}

TEST(Bitpack, RejectsBadWidthsAndIndices) {
  std::vector<std::uint32_t> words(1);
  const std::vector<std::uint8_t> codes{0};
  EXPECT_KVLAB_ERROR(pack_codes(codes, 0, words), invalid_argument, "0 bits");
  EXPECT_KVLAB_ERROR(pack_codes(codes, 9, words), invalid_argument, "9 bits");
  EXPECT_KVLAB_ERROR(packed_word_count(4, 9), invalid_argument, "9 bits");
  EXPECT_KVLAB_ERROR(packed_word_count(-1, 4), invalid_argument, "-1");
  EXPECT_KVLAB_ERROR(code_at(words, 3, 10), invalid_argument, "index 10");  // needs bits 30..32
  EXPECT_KVLAB_ERROR(code_at(words, 4, -1), invalid_argument, "index -1");
  EXPECT_EQ(code_at(words, 3, 9), 0u);  // bits 27..29 are still inside word 0
}

}  // namespace
}  // namespace test_bitpack
}  // namespace kvlab::ref
