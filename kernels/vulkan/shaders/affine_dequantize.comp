#version 450
// Affine dequantize (reference/affine_quantize.h, docs/quantization.md §Affine dequantization),
// bit-exact with the oracle: out = fl(fl(code·scale) + bias) in binary32 from the stored
// scale/bias, then one storage rounding (RNE) to out's dtype. One invocation per group.
#include "common.glsl"
#include "affine_common.glsl"

layout(std430, set = 0, binding = 0) buffer wq_block { uint wq_w[]; };
KVLAB_TENSOR16(scales, 1)
KVLAB_TENSOR16(biases, 2)
KVLAB_TENSOR16(out, 3)
KVLAB_FLOAT_ACCESS(scales)
KVLAB_FLOAT_ACCESS(biases)

layout(push_constant) uniform Push {
  uint wq_offset;      // words
  uint scales_offset;  // elements
  uint biases_offset;  // elements
  uint out_offset;     // elements
  uint scales_dtype;   // of scales and biases
  uint out_dtype;
  uint groups;
  uint group_size;
  uint bits;
  uint exact_only;     // 1: never take the hardware fast path (tests)
} pc;

// Code j of the group whose codes start at word `base` (codes may straddle two words).
uint code_at(uint base, uint j) {
  const uint bit = j * pc.bits, w = base + (bit >> 5), shift = bit & 31u;
  uint v = wq_w[w] >> shift;
  if (shift + pc.bits > 32u) v |= wq_w[w + 1u] << (32u - shift);
  return v & ((1u << pc.bits) - 1u);
}

// Binary32 bits of code·scale + bias, each operation rounded (never fused).
uint dequantize(uint code, uint scale, uint bias) {
  // Fast path: with scale and bias zero or in the fast range (affine_common.glsl) the
  // hardware's correctly rounded multiply and add see no denormal operand or result.
  // A zero result takes the exact path: its sign needs SignedZeroInfNanPreserve.
  if (pc.exact_only == 0u && fast_ok(scale) && fast_ok(bias)) {
    precise float p = float(code) * uintBitsToFloat(scale);
    precise float v = p + uintBitsToFloat(bias);
    const uint bits = floatBitsToUint(v);
    if (!sf_is_zero(bits)) return bits;
  }
  return sf_add(sf_mul(sf_from_uint(code), scale), bias);
}

void main() {
  const uint gs = pc.group_size, words_per_group = gs * pc.bits / 32u;
  for (uint grp = gl_GlobalInvocationID.x; grp < pc.groups; grp += kvlab_stride()) {
    const uint scale = scales_load_f32(pc.scales_offset + grp, pc.scales_dtype);
    const uint bias = biases_load_f32(pc.biases_offset + grp, pc.scales_dtype);
    const uint base = pc.wq_offset + grp * words_per_group;
    const uint first = pc.out_offset + grp * gs;
    if (pc.out_dtype == DT_F32) {
      for (uint j = 0u; j < gs; ++j) out_store32(first + j, dequantize(code_at(base, j), scale, bias));
      continue;
    }
    for (uint j = 0u; j < gs; ++j) {
      const uint lo = narrow_from_f32(dequantize(code_at(base, j), scale, bias), pc.out_dtype);
#if !KVLAB_SMALL_STORAGE
      // A word holding two elements of this group is written whole; only the group's
      // edge elements (odd element offsets) need the masked store.
      if (((first + j) & 1u) == 0u && j + 1u < gs) {
        const uint hi = narrow_from_f32(dequantize(code_at(base, j + 1u), scale, bias), pc.out_dtype);
        out_store32((first + j) >> 1, lo | (hi << 16));
        ++j;
        continue;
      }
#endif
      out_store16(first + j, lo);
    }
  }
}
