// The ggml block oracle (reference/ggml_quantize.h) bit for bit against gguf-py's numpy
// reference (gguf 0.19.0, gguf/quants.py), on the vectors tools/ggml/setup_venv.sh writes
// to build/ggml/gguf_vectors.txt (format: tools/ggml/gguf_vectors.py). Without them the
// test skips with the reason. KVLAB_GGML_VECTORS names another file of the same format
// (e.g. one written by ggml's own C functions).
//
// Known divergence, where ggml's C and gguf-py define different bits
// (docs/quantization.md §ggml block formats): the sign of a zero scale or min in an
// all-zero block holding −0.0. q4_0/q5_0: ggml's running max starts at +0 and never
// moves, so d = +0/−8 = −0 (f16 0x8000), while gguf-py takes the first element of
// largest magnitude, and −0.0 first gives d = −0/−8 = +0. q4_1/q5_1: ggml's `v < min`
// keeps the first zero as the min (−0.0 first gives m = 0x8000); numpy's min does not
// say which zero it returns. The oracle follows ggml's C; such blocks are counted and
// checked to differ in exactly that sign bit. Against ggml's C (tools/ggml/c_vectors.sh),
// an iq4_nl block with every |x| < 1e-15 has d = 0 and stale codes in ggml: only d is
// compared there.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "reference/ggml_quantize.h"

#ifndef KVLAB_GGML_VECTORS_DEFAULT
#define KVLAB_GGML_VECTORS_DEFAULT "build/ggml/gguf_vectors.txt"
#endif

namespace kvlab {
namespace test_ggml_gguf_vectors {
namespace {

using namespace kvlab::ref;  // NOLINT(google-build-using-namespace): the unit under test

std::vector<std::uint8_t> from_hex(const std::string& s) {
  std::vector<std::uint8_t> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::string to_hex(const std::vector<std::uint8_t>& b) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::uint8_t v : b) {
    out += digits[v >> 4];
    out += digits[v & 15];
  }
  return out;
}

float f32_of(const std::string& hex) {
  const auto bits = static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16));
  float f = 0;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

bool same_f32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

bool tiny_block(const std::array<float, 32>& x) {
  for (float v : x) {
    if (std::fabs(v) >= 1e-15f) return false;
  }
  return true;
}

struct Tally {
  int quantized = 0, dequantized = 0, mismatched = 0, known_divergence = 0;
};

TEST(GgmlGgufVectors, OracleMatchesGgufPyBitForBit) {
  const char* env = std::getenv("KVLAB_GGML_VECTORS");
  const std::string path = env != nullptr ? env : KVLAB_GGML_VECTORS_DEFAULT;
  std::ifstream in(path);
  if (!in) {
    std::string reason = "run tools/ggml/setup_venv.sh";
    std::ifstream why(std::string(KVLAB_GGML_VECTORS_DEFAULT).substr(0, std::string(KVLAB_GGML_VECTORS_DEFAULT).rfind('/')) +
                      "/unavailable");
    if (why) std::getline(why, reason);
    GTEST_SKIP() << "no gguf-py vectors at " << path << ": " << reason;
  }
  std::map<std::string, Tally> tally;
  std::string line;
  int reported = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string mode_name, kind;
    fields >> mode_name >> kind;
    const QuantMode mode = quant_mode_from_name(mode_name);
    Tally& t = tally[mode_name];
    std::array<float, 32> x{};
    std::string bytes_hex, word;
    if (kind == "q") {
      for (float& v : x) {
        fields >> word;
        v = f32_of(word);
      }
    }
    fields >> bytes_hex;
    std::array<float, 32> expected{};
    for (float& v : expected) {
      fields >> word;
      v = f32_of(word);
    }
    ASSERT_TRUE(fields) << "malformed line: " << line.substr(0, 80);
    const std::vector<std::uint8_t> bytes = from_hex(bytes_hex);
    bool ok = true;
    std::string why;
    if (kind == "q" && mode == QuantMode::iq4_nl && tiny_block(x)) {
      // amax < 1e-15: ggml skips the block's index pass and leaves stale codes; only its
      // d = 0 is defined, and every value decodes to ±0.
      ++t.quantized;
      ++t.known_divergence;
      const GgmlBlock ours = ggml_quantize_block(mode, std::span<const float, 32>(x));
      if (ours.d != (bytes[0] | (bytes[1] << 8))) {
        ++t.mismatched;
        ADD_FAILURE() << "iq4_nl tiny block: d " << ours.d << " vs " << bytes_hex.substr(0, 4);
      }
      continue;
    }
    if (kind == "q") {
      ++t.quantized;
      const std::vector<std::uint8_t> ours = ggml_block_to_bytes(mode, ggml_quantize_block(mode, std::span<const float, 32>(x)));
      if (ours != bytes) {
        // The documented divergence: an all-zero block holding a −0.0, where only the sign
        // of a zero d (q4_0, q5_0: byte 1) or of a zero m (q4_1, q5_1: byte 3) differs.
        bool zeros = true, negative_zero = false;
        for (float v : x) {
          zeros = zeros && v == 0.0f;
          negative_zero = negative_zero || std::signbit(v);
        }
        const bool with_min = mode == QuantMode::q4_1 || mode == QuantMode::q5_1;
        const std::size_t sign_byte = with_min ? 3 : 1;
        std::vector<std::uint8_t> flipped = bytes;
        flipped[sign_byte] ^= 0x80;
        if (mode != QuantMode::q8_0 && zeros && negative_zero && ours == flipped) {
          ++t.known_divergence;
          continue;
        }
        ok = false;
        why = "quantize: ours " + to_hex(ours) + " gguf-py " + bytes_hex;
      }
    } else {
      ++t.dequantized;
      if (ggml_block_to_bytes(mode, ggml_block_from_bytes(mode, bytes)) != bytes) {
        ok = false;
        why = "bytes do not round-trip through kvlab's layout";
      }
    }
    const GgmlBlock block = ggml_block_from_bytes(mode, bytes);
    for (int i = 0; i < 32 && ok; ++i) {
      const float ours = ggml_block_value(mode, block, i);
      if (!same_f32(ours, expected[static_cast<std::size_t>(i)])) {
        ok = false;
        why = "dequantize element " + std::to_string(i) + ": ours " + std::to_string(ours) + " gguf-py " +
              std::to_string(expected[static_cast<std::size_t>(i)]);
      }
    }
    if (!ok) {
      ++t.mismatched;
      if (reported++ < 10) ADD_FAILURE() << mode_name << " " << kind << ": " << why;
    }
  }
  ASSERT_EQ(tally.size(), 6u) << "every ggml format has vectors";
  for (const auto& [name, t] : tally) {
    RecordProperty(name + "_quantized", t.quantized);
    RecordProperty(name + "_dequantized", t.dequantized);
    std::printf("%s: %d quantized, %d dequantized, %d mismatched, %d known divergences (sign of a zero d/m; iq4_nl tiny blocks)\n",
                name.c_str(), t.quantized, t.dequantized, t.mismatched, t.known_divergence);
    EXPECT_EQ(t.mismatched, 0) << name;
    EXPECT_GT(t.dequantized, 0) << name;
    if (name != "iq4_nl") EXPECT_GT(t.quantized, 0) << name;  // gguf-py has no IQ4_NL quantizer
  }
}

}  // namespace
}  // namespace test_ggml_gguf_vectors
}  // namespace kvlab
