// Quantization formats: QuantSpec{mode, bits, group_size} with MLX's validation
// table (spec §1.1) and the shapes it implies.
//
//   mode    group sizes   bits               outputs
//   affine  32, 64, 128   2, 3, 4, 5, 6, 8   wq (u32), scales + biases (input dtype)
//   mxfp4   32            4                  wq (u32), scales (u8, E8M0)
//   mxfp8   32            8                  wq (u32), scales (u8, E8M0)
//   nvfp4   16            4                  wq (u32), scales (u8, E4M3)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvlab/dtype.h"

namespace kvlab {

enum class QuantMode : std::uint8_t { affine, mxfp4, mxfp8, nvfp4 };

std::string_view quant_mode_name(QuantMode m);
QuantMode quant_mode_from_name(std::string_view name);  // throws Error naming the bad name

// Which MLX backend's arithmetic a quantizer reproduces (spec §1.2, §1.7, §1.8).
//   mlx_cpu: running max from the data, rint (ties to even), lower clamp;
//            fp modes: argmin LUT tie-break, E8M0 via rint, zero group -> 127.
//   mlx_gpu: running max starts at 0, round (ties away from zero);
//            fp modes: RNE thresholds, E8M0 half-away, zero group -> 0.
enum class Rounding : std::uint8_t { mlx_cpu, mlx_gpu };
std::string_view rounding_name(Rounding r);
Rounding rounding_from_name(std::string_view name);

struct QuantSpec {
  QuantMode mode = QuantMode::affine;
  int bits = 4;
  int group_size = 64;

  // MLX defaults for a mode (affine 4/64, mxfp4 4/32, mxfp8 8/32, nvfp4 4/16) with
  // optional overrides, validated.
  static QuantSpec make(QuantMode mode, std::optional<int> bits = {}, std::optional<int> group_size = {});

  void validate() const;  // throws invalid_argument naming the bad bits / group size

  bool has_biases() const { return mode == QuantMode::affine; }
  // Validates that the last axis D fits this spec (D > 0, D % group_size == 0).
  void validate_dim(std::int64_t d) const;
  std::int64_t packed_words(std::int64_t d) const;  // D·bits/32 (validates D)
  std::int64_t groups(std::int64_t d) const;        // D/group_size (validates D)
  DType scale_dtype(DType input) const { return mode == QuantMode::affine ? input : DType::u8; }

  // Storage bits per element including scales (and biases) for a float `input` dtype.
  double bits_per_element(DType input) const;

  friend bool operator==(const QuantSpec&, const QuantSpec&) = default;
};

std::string to_string(const QuantSpec& s);  // "affine:b4:g64"

}  // namespace kvlab
