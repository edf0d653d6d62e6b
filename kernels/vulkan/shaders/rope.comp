#version 450
// RoPE (reference/rope.h, docs/kernels.md §RoPE) with per-row offsets read from a device buffer.
//
// Numerics (needs shaderFloat64): like the oracle, positions and angles are computed in
// double from the same inputs — θ = (scale·(t + offset_b))·inv_i with inv_i computed on
// the host exactly as the oracle does — so θ is the oracle's θ bit for bit. cos θ and
// sin θ: Cody–Waite reduction by π/2 split into three 24-bit parts and a remainder
// (k·P1..P3 are exact while |k| < 2^29, i.e. |θ| < 8e8), then Taylor polynomials to
// degree 17/18 on |r| <= π/4 (truncation < 1e-19), a few ulp of double in all. GLSL's
// sin/cos are float-only and only 2^-11 accurate, so they are not used. The rotation is
// double too, and each output is rounded once (RNE) to its dtype in integer arithmetic,
// so results match the oracle's correctly rounded ones except where the exact value
// lies within ~1e-15 relative of a rounding boundary of the dtype: at most one ulp apart.
// Beyond |θ| = 8e8 the reduction is not exact; sin/cos are clamped to [−1, 1] there,
// where rope's tolerance (|θ|·5·2^-24 per unit of |x|) exceeds 2·|x| anyway.
#include "common.glsl"
#include "rope_math.glsl"

KVLAB_TENSOR16(x, 0)
KVLAB_TENSOR16(out, 1)
layout(std430, set = 0, binding = 2) buffer offsets_block { int offsets_w[]; };
layout(std430, set = 0, binding = 3) buffer inv_freq_block { double inv_freq[]; };

layout(push_constant) uniform Push {
  uint x_offset;        // elements
  uint out_offset;      // elements
  uint offsets_offset;  // elements (i32)
  uint dtype;
  uint batch;           // B
  uint heads;           // product of the axes between B and T
  uint seq;             // T
  uint dim;             // D
  uint dims;            // rotated features (even)
  uint traditional;     // 1: pairs (2i, 2i+1); 0: (i, i + dims/2)
  uint per_row;         // 1: offsets from binding 2; 0: scalar_offset
  int scalar_offset;
  float scale;
} pc;

double load_double(uint i) {
  if (pc.dtype == DT_F32) return double_from_f32(x_load32(i));
  const uint raw = x_load16(i);
  return double_from_f32(pc.dtype == DT_F16 ? f16_bits_to_f32(raw) : bf16_bits_to_f32(raw));
}

void store_double(uint i, double v) {
  const uint bits = narrow_double(v, pc.dtype);
  if (pc.dtype == DT_F32) out_store32(i, bits); else out_store16(i, bits);
}

void copy_element(uint from, uint to) {
  if (pc.dtype == DT_F32) out_store32(to, x_load32(from)); else out_store16(to, x_load16(from));
}

void main() {
  const uint half_dims = pc.dims / 2u;
  const uint items = pc.batch * pc.seq * half_dims;
  for (uint item = gl_GlobalInvocationID.x; item < items; item += kvlab_stride()) {
    const uint i = item % half_dims, t = (item / half_dims) % pc.seq, b = item / (half_dims * pc.seq);
    const int offset = pc.per_row != 0u ? offsets_w[pc.offsets_offset + b] : pc.scalar_offset;
    precise double pos = double_from_f32(floatBitsToUint(pc.scale)) * (double(t) + double(offset));  // t + offset is exact in double
    precise double theta = pos * inv_freq[i];
    double s, c;
    sincos_double(theta, s, c);
    const uint i1 = pc.traditional != 0u ? 2u * i : i;
    const uint i2 = pc.traditional != 0u ? 2u * i + 1u : i + half_dims;
    for (uint h = 0u; h < pc.heads; ++h) {
      const uint base = ((b * pc.heads + h) * pc.seq + t) * pc.dim;
      const double x1 = load_double(pc.x_offset + base + i1), x2 = load_double(pc.x_offset + base + i2);
      precise double o1 = x1 * c - x2 * s;
      precise double o2 = x1 * s + x2 * c;
      store_double(pc.out_offset + base + i1, o1);
      store_double(pc.out_offset + base + i2, o2);
      // Features [dims, D) are copied bit for bit, shared out over the pair index.
      for (uint f = pc.dims + i; f < pc.dim; f += half_dims) copy_element(pc.x_offset + base + f, pc.out_offset + base + f);
    }
  }
}
