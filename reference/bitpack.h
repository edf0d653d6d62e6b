// Reference bit packing (docs/quantization.md §Bit packing): each row is one LSB-first
// little-endian bitstream. Code i occupies stream bits [i·b, i·b + b); stream bit k is bit
// (k mod 32) of word ⌊k/32⌋. 3-, 5- and 6-bit codes straddle word boundaries.
//
// Contract: bits in 1..8; codes must be < 2^bits (else Error naming the code and
// its index); the word span must hold ceil(n·bits/32) words (else shape_mismatch).
#pragma once

#include <cstdint>
#include <span>

#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

std::int64_t packed_word_count(std::int64_t n_codes, int bits);  // ceil(n·bits/32)

// Writes every word of `words` (bits past the last code are zero).
void pack_codes(std::span<const std::uint8_t> codes, int bits, std::span<std::uint32_t> words);
void unpack_codes(std::span<const std::uint32_t> words, int bits, std::span<std::uint8_t> codes);
std::uint32_t code_at(std::span<const std::uint32_t> words, int bits, std::int64_t i);

// The tensors of x packed with `spec`: codes (..., D·bits/32) and scales (..., D/group).
// Error naming `who` for a non-float x or one of rank 0.
struct PackedShapes {
  std::int64_t d = 0;
  Shape wq, scales;
};
PackedShapes packed_shapes(const ConstTensorView& x, const QuantSpec& spec, const char* who);

}  // namespace kvlab::ref
