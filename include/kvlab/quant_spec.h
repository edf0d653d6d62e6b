// Quantization formats: one row per format in the format table (core/quant_spec.cc),
// QuantSpec{mode, bits, group_size} validated against it, and the shapes it implies.
//
//   mode    group sizes   bits               outputs
//   affine  32, 64, 128   1, 2, 3, 4, 5, 6, 8 wq (u32), scales + biases (input dtype)
//   mxfp4   32            4                  wq (u32), scales (u8, E8M0)
//   mxfp8   32            8                  wq (u32), scales (u8, E8M0)
//   nvfp4   16            4                  wq (u32), scales (u8, E4M3)
//   q8_0    32            8                  wq (u32), scales (f16)            ggml blocks
//   q4_0    32            4                  wq (u32), scales (f16)
//   q4_1    32            4                  wq (u32), scales + mins (f16)
//   q5_0    32            5                  wq (u32), scales (f16)
//   q5_1    32            5                  wq (u32), scales + mins (f16)
//   iq4_nl  32            4                  wq (u32), scales (f16)
//
// Adding a format: its QuantMode, its row in the table, and its encoder (reference and
// each backend that implements it); backends dispatch on QuantFormat::encoder in one
// place each (their quantize/dequantize ops), so no caller switches on the mode.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/dtype.h"

namespace kvlab {

enum class QuantMode : std::uint8_t { affine, mxfp4, mxfp8, nvfp4, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl };

// Which encoder implements a format: affine (reference/affine_quantize.h), the
// microscaling float formats (reference/fp_quantize.h) or ggml's 32-element blocks
// (reference/ggml_quantize.h).
enum class QuantEncoder : std::uint8_t { affine, fp, ggml };
// How a group's scale (and bias, where the format has one) is stored: in the input
// dtype, as a u8 E8M0 or E4M3 code, or as f16 whatever the input dtype (ggml).
enum class ScaleEncoding : std::uint8_t { input_dtype, e8m0, e4m3, f16 };
// How one element's code is interpreted: an unsigned integer (affine, q4_1, q5_1), a
// float code (E2M1, E4M3), a two's-complement integer (q8_0), an integer offset by
// 2^(bits-1) (q4_0, q5_0: code − 8, code − 16), or an index into ggml's non-linear
// table of 16 values (iq4_nl).
enum class ElementEncoding : std::uint8_t { unsigned_int, e2m1, e4m3, signed_int, offset_int, iq4nl_table };

// One row of the format table (docs/quantization.md §Format table: MLX's validation table).
struct QuantFormat {
  QuantMode mode;
  std::string_view name;
  QuantEncoder encoder;
  std::span<const int> bits;    // accepted bit widths
  std::span<const int> groups;  // accepted group sizes
  int default_bits, default_group;
  bool has_biases;              // affine: a float bias per group beside the scale (q4_1, q5_1: the min)
  ScaleEncoding scale;
  ElementEncoding element;
  bool takes_global_scale;      // nvfp4: an optional tensor-wide f32 scale
};

std::span<const QuantFormat> quant_formats();          // every row, in QuantMode order
const QuantFormat& quant_format(QuantMode m);
std::vector<std::string> quant_mode_names();          // every format's name, in table order
std::string_view quant_mode_name(QuantMode m);
QuantMode quant_mode_from_name(std::string_view name);  // throws Error naming the bad name

// Which arithmetic a quantizer (and affine dequantize) reproduces: three flavours.
//   mlx_cpu: the single-rounding contract written from MLX's CPU sources
//            (docs/quantization.md §Affine parameters, §Microscaling formats): running
//            max from the data, rint (ties to even), lower clamp; fp modes in f32
//            whatever the input dtype: argmin LUT tie-break, E8M0 via rint,
//            zero group -> 127; affine dequantize rounds code·scale + bias once to T.
//   mlx_gpu: Metal's arithmetic: running max starts at 0, round (ties away from zero);
//            fp modes: RNE thresholds, E8M0 half-away, zero group -> 0.
//   mlx:     the pinned MLX (0.32.4, CPU backend) bit for bit, measured against the
//            real library over the conformance grid. Affine quantize and nvfp4 are
//            mlx_cpu's arithmetic. It differs from mlx_cpu in two places (changed since
//            MLX's older sources): mx modes take the E8M0 exponent as
//            ceil(log2(amax/max)) of amax/max rounded to the input dtype, the element
//            division and the E2M1 argmin distances also rounded to it
//            (reference/fp_quantize.h); affine dequantize to f16/bf16 rounds code·scale
//            to T and then adds the bias in T — two roundings
//            (reference/affine_quantize.h).
// For the ggml block formats (whose C reference is one arithmetic) two more:
//   ggml_ref: ggml's C reference (quantize_row_<fmt>_ref), the oracle of
//             reference/ggml_quantize.h; the MLX flavours above mean it too there.
//   ggml_cpu: what ggml's CPU backend quantizes with (ggml_get_type_traits_cpu's
//             from_float, what llama.cpp's K/V cache writes use): the C reference but for
//             q8_0 on x86 with AVX, whose own quantizer takes 127/amax and rounds to
//             nearest even (reference/ggml_quantize.h). The affine and fp formats refuse
//             both.
enum class Rounding : std::uint8_t { mlx_cpu, mlx_gpu, mlx, ggml_ref, ggml_cpu };
// Whether r is one of the ggml block formats' flavours.
constexpr bool is_ggml_rounding(Rounding r) { return r == Rounding::ggml_ref || r == Rounding::ggml_cpu; }
std::string_view rounding_name(Rounding r);
Rounding rounding_from_name(std::string_view name);

struct QuantSpec {
  QuantMode mode = QuantMode::affine;
  int bits = 4;
  int group_size = 64;

  // MLX defaults for a mode (affine 4/64, mxfp4 4/32, mxfp8 8/32, nvfp4 4/16; the ggml
  // formats have one width each and group 32) with optional overrides, validated.
  static QuantSpec make(QuantMode mode, std::optional<int> bits = {}, std::optional<int> group_size = {});

  void validate() const;  // throws invalid_argument naming the bad bits / group size

  const QuantFormat& format() const { return quant_format(mode); }
  bool has_biases() const { return format().has_biases; }
  // Validates that the last axis D fits this spec (D > 0, D % group_size == 0).
  void validate_dim(std::int64_t d) const;
  std::int64_t packed_words(std::int64_t d) const;  // D·bits/32 (validates D)
  std::int64_t groups(std::int64_t d) const;        // D/group_size (validates D)
  // The dtype of the scales (and biases): the input's, f16 for ggml's blocks, else u8.
  DType scale_dtype(DType input) const {
    switch (format().scale) {
      case ScaleEncoding::input_dtype: return input;
      case ScaleEncoding::f16: return DType::f16;
      case ScaleEncoding::e8m0:
      case ScaleEncoding::e4m3: return DType::u8;
    }
    return DType::u8;
  }
  // The element count D that `words` packed u32 words hold (words·32/bits): how a
  // kernel recovers Dv from V's codes.
  std::int64_t unpacked_dim(std::int64_t words) const { return words * 32 / bits; }

  // Storage bits per element including scales (and biases) for a float `input` dtype.
  double bits_per_element(DType input) const;

  friend bool operator==(const QuantSpec&, const QuantSpec&) = default;
};

std::string to_string(const QuantSpec& s);  // "affine:b4:g64"

}  // namespace kvlab
