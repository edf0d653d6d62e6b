#version 450
// Test probe: evaluates one function of softfloat.glsl / rope_math.glsl per element of
// the inputs, so that tests/vulkan/test_vulkan_softfloat.cc can compare it with the
// host's IEEE arithmetic.
#include "common.glsl"
#include "rope_math.glsl"

layout(std430, set = 0, binding = 0) buffer a_block { uint a[]; };
layout(std430, set = 0, binding = 1) buffer b_block { uint b[]; };
layout(std430, set = 0, binding = 2) buffer out_block { uint result[]; };

layout(push_constant) uniform Push {
  uint op;
  uint count;
} pc;

// Op codes: see enum class Probe in the test.
void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += kvlab_stride()) {
    const uint x = a[i], y = b[i];
    switch (pc.op) {
      case 0u: result[i] = sf_add(x, y); break;
      case 1u: result[i] = sf_sub(x, y); break;
      case 2u: result[i] = sf_mul(x, y); break;
      case 3u: result[i] = sf_div(x, y); break;
      case 4u: result[i] = sf_round_integral(x, true); break;
      case 5u: result[i] = sf_round_integral(x, false); break;
      case 6u: result[i] = f32_to_f16_bits(x); break;
      case 7u: result[i] = f32_to_bf16_bits(x); break;
      case 8u: result[i] = f16_bits_to_f32(x); break;
      case 9u: result[i] = sf_lt(x, y) ? 1u : 0u; break;
      case 10u: result[i] = narrow_double(packDouble2x32(uvec2(x, y)), DT_F32); break;
      case 11u: result[i] = narrow_double(packDouble2x32(uvec2(x, y)), DT_F16); break;
      case 12u: result[i] = narrow_double(packDouble2x32(uvec2(x, y)), DT_BF16); break;
      case 13u: {  // double_from_f32: two output words per element
        const uvec2 d = unpackDouble2x32(double_from_f32(x));
        result[2u * i] = d.x;
        result[2u * i + 1u] = d.y;
        break;
      }
      case 14u: {  // sincos_double: four output words per element (sin, cos)
        double s, c;
        sincos_double(packDouble2x32(uvec2(x, y)), s, c);
        const uvec2 us = unpackDouble2x32(s), uc = unpackDouble2x32(c);
        result[4u * i] = us.x;
        result[4u * i + 1u] = us.y;
        result[4u * i + 2u] = uc.x;
        result[4u * i + 3u] = uc.y;
        break;
      }
      case 15u: result[i] = uint(sf_integral_to_int(x)); break;
      default: result[i] = 0xDEADBEEFu;
    }
  }
}
