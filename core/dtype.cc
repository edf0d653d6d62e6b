#include "kvlab/dtype.h"

#include <bit>
#include <cmath>
#include <string>

#include "kvlab/error.h"

namespace kvlab {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::u32: return "u32";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::u32, DType::i32, DType::u8}) {
    if (dtype_name(t) == name) return t;
  }
  fail(ErrorKind::invalid_argument, cat("unknown dtype '", name, "' (expected f32, f16, bf16, u32, i32, u8)"));
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::u32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

std::uint16_t f32_to_f16_bits(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: keep it NaN and quiet, sign and high payload bits preserved
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {  // normal in f16 (>= 2^-14): round the 13 dropped bits to even
    const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));  // rebias 127 -> 15
  }
  // Subnormal or zero: count units of 2^-24; x·2^24 is exact, nearbyint rounds to even.
  const float units = std::nearbyint(std::bit_cast<float>(a) * 16777216.0f);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(units));
}

float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float mag = static_cast<float>(m) / 16777216.0f;  // m · 2^-24, exact
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

std::uint16_t f32_to_bf16_bits(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // overflow carries to inf
  return static_cast<std::uint16_t>(rounded >> 16);
}

float bf16_bits_to_f32(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

float round_to_dtype(float x, DType t) {
  switch (t) {
    case DType::f32: return x;
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(x));
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(x));
    default: fail(ErrorKind::dtype_mismatch, cat("round_to_dtype needs a float dtype, got ", dtype_name(t)));
  }
}

double dtype_epsilon(DType t) {
  switch (t) {
    case DType::f32: return std::ldexp(1.0, -23);
    case DType::f16: return std::ldexp(1.0, -10);
    case DType::bf16: return std::ldexp(1.0, -7);
    default: fail(ErrorKind::dtype_mismatch, cat("dtype_epsilon needs a float dtype, got ", dtype_name(t)));
  }
}

}  // namespace kvlab
