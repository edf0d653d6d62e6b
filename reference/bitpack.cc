#include "reference/bitpack.h"

#include "kvlab/error.h"

namespace kvlab::ref {

namespace {

void require_bits(int bits) {
  KVLAB_REQUIRE(bits >= 1 && bits <= 8, invalid_argument, "code width ", bits, " bits is outside 1..8");
}

void require_words(std::size_t have, std::int64_t n_codes, int bits) {
  const std::int64_t need = packed_word_count(n_codes, bits);
  KVLAB_REQUIRE(static_cast<std::int64_t>(have) == need, shape_mismatch, have, " words given for ", n_codes,
                " codes of ", bits, " bits, which need ", need);
}

}  // namespace

std::int64_t packed_word_count(std::int64_t n_codes, int bits) {
  require_bits(bits);
  KVLAB_REQUIRE(n_codes >= 0, invalid_argument, "negative code count ", n_codes);
  return (n_codes * bits + 31) / 32;
}

// Bit by bit on purpose: the stream definition (code i at stream bits [i·b, i·b+b),
// stream bit k = bit k%32 of word k/32) is the contract, so the oracle states it
// literally instead of using word/byte tricks an optimized backend would use.
void pack_codes(std::span<const std::uint8_t> codes, int bits, std::span<std::uint32_t> words) {
  require_words(words.size(), static_cast<std::int64_t>(codes.size()), bits);
  for (auto& w : words) w = 0;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    KVLAB_REQUIRE(codes[i] >> bits == 0, invalid_argument, "code ", static_cast<int>(codes[i]), " at index ", i,
                  " does not fit in ", bits, " bits");
    for (int j = 0; j < bits; ++j) {
      const std::size_t k = i * static_cast<std::size_t>(bits) + static_cast<std::size_t>(j);
      const std::uint32_t bit = (static_cast<std::uint32_t>(codes[i]) >> j) & 1u;
      words[k / 32] |= bit << (k % 32);
    }
  }
}

std::uint32_t code_at(std::span<const std::uint32_t> words, int bits, std::int64_t i) {
  require_bits(bits);
  KVLAB_REQUIRE(i >= 0 && (i + 1) * bits <= static_cast<std::int64_t>(words.size()) * 32, invalid_argument,
                "code index ", i, " is outside a stream of ", words.size(), " words of ", bits, "-bit codes");
  std::uint32_t code = 0;
  for (int j = 0; j < bits; ++j) {
    const auto k = static_cast<std::size_t>(i * bits + j);
    code |= ((words[k / 32] >> (k % 32)) & 1u) << j;
  }
  return code;
}

void unpack_codes(std::span<const std::uint32_t> words, int bits, std::span<std::uint8_t> codes) {
  require_words(words.size(), static_cast<std::int64_t>(codes.size()), bits);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<std::uint8_t>(code_at(words, bits, static_cast<std::int64_t>(i)));
  }
}

PackedShapes packed_shapes(const ConstTensorView& x, const QuantSpec& spec, const char* who) {
  require_float(x, who);
  KVLAB_REQUIRE(x.rank() >= 1, shape_mismatch, who, " has rank 0 (shape ", shape_str(x.shape),
                "); it needs a last axis to split into groups");
  const std::int64_t d = x.dim(-1);
  return {d, shape_with_last(x.shape, spec.packed_words(d)), shape_with_last(x.shape, spec.groups(d))};
}

}  // namespace kvlab::ref
