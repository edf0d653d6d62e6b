// Element access shared by the affine quantize/dequantize shaders: float tensors of
// dtype f32/f16/bf16 read and written as binary32 bit patterns, converted exactly
// (softfloat.glsl), never through the hardware's float conversions.
#ifndef KVLAB_AFFINE_COMMON_GLSL
#define KVLAB_AFFINE_COMMON_GLSL

#include "softfloat.glsl"

// Binary32 bits of a stored element of float dtype `dtype` (its raw bits `raw`).
uint widen_to_f32(uint raw, uint dtype) {
  if (dtype == DT_F16) return f16_bits_to_f32(raw);
  if (dtype == DT_BF16) return bf16_bits_to_f32(raw);
  return raw;
}

// A stored 16-bit float element (raw bits `raw`) as f32, exactly.
float load_float16(uint raw, uint dtype) { return uintBitsToFloat(widen_to_f32(raw, dtype)); }

// Storage rounding (RNE) of binary32 bits to `dtype`.
uint narrow_from_f32(uint bits, uint dtype) {
  if (dtype == DT_F16) return f32_to_f16_bits(bits);
  if (dtype == DT_BF16) return f32_to_bf16_bits(bits);
  return bits;
}

#define KVLAB_FLOAT_ACCESS(name)                                                     \
  uint name##_load_f32(uint i, uint dtype) {                                        \
    return dtype == DT_F32 ? name##_load32(i) : widen_to_f32(name##_load16(i), dtype); \
  }                                                                                  \
  void name##_store_f32(uint i, uint dtype, uint bits) {                            \
    if (dtype == DT_F32) name##_store32(i, bits);                                   \
    else name##_store16(i, narrow_from_f32(bits, dtype));                           \
  }

// Hardware f32 arithmetic is used only on operands in this range (or zero): there it is
// correctly rounded for + − · (Vulkan), and no input or result can be denormal (the
// exact sum of two such values is a multiple of 2^-123; a product of an integer code
// <= 255 and such a value lies in [2^-100, 2^108]), so flushing cannot change anything.
bool in_fast_range(uint bits) {
  const uint field = (bits >> 23) & 0xFFu;
  return field >= 27u && field <= 227u;  // 2^-100 <= |x| < 2^101
}
bool fast_ok(uint bits) { return sf_is_zero(bits) || in_fast_range(bits); }

#endif  // KVLAB_AFFINE_COMMON_GLSL
