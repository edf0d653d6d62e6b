// Element types of the lab and exact conversions between them.
//
// f16 (IEEE binary16) and bf16 (the upper half of binary32) are stored as raw
// uint16_t bit patterns. Conversions from f32 round to nearest, ties to even,
// with subnormals, overflow to ±inf, and NaN kept NaN (quiet, sign preserved).
// These conversions are the "storage rounding" of every reference kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvlab {

enum class DType : std::uint8_t { f32, f16, bf16, u32, i32, u8 };

std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // throws Error naming the bad name
std::size_t dtype_size(DType t);
constexpr bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

std::uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(std::uint16_t bits);
std::uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(std::uint16_t bits);

// x rounded to the nearest value representable in the float dtype t (RNE), as f32.
float round_to_dtype(float x, DType t);

// Machine epsilon (distance from 1 to the next value) of a float dtype:
// 2^-23 f32, 2^-10 f16, 2^-7 bf16. Tolerance objects derive their bounds from it.
double dtype_epsilon(DType t);

}  // namespace kvlab
