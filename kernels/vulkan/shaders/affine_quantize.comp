#version 450
// Affine quantize (reference/affine_quantize.h, docs/quantization.md §Affine parameters), bit-exact
// with the oracle: one invocation per group of `group_size` consecutive elements.
//
// Group parameters (a dozen operations per group) use the exact integer arithmetic of
// softfloat.glsl, operation for operation as the oracle. Per element, the code
// R(fl(fl(g − bias) / scale)) takes a hardware fast path when it provably gives the
// oracle's integer (see code_fast), else the exact path.
#include "common.glsl"
#include "affine_common.glsl"

KVLAB_TENSOR16(x, 0)
layout(std430, set = 0, binding = 1) buffer wq_block { uint wq_w[]; };
KVLAB_TENSOR16(scales, 2)
KVLAB_TENSOR16(biases, 3)
KVLAB_FLOAT_ACCESS(x)
KVLAB_FLOAT_ACCESS(scales)
KVLAB_FLOAT_ACCESS(biases)

layout(push_constant) uniform Push {
  uint x_offset;       // elements
  uint wq_offset;      // words
  uint scales_offset;  // elements
  uint biases_offset;  // elements
  uint dtype;          // of x, scales and biases
  uint groups;         // rows · D / group_size
  uint group_size;
  uint bits;
  uint gpu_rounding;   // 1: Rounding::mlx_gpu (round half away, running max from 0)
  uint exact_only;     // 1: never take the hardware fast path (tests)
} pc;

const uint SCALE_FLOOR = 0x33D6BF95u;  // 1e-7f, MLX's floor on the group step
const uint F32_ZERO = 0u;
const uint F32_MINUS_2P31 = 0xCF000000u;

// The oracle's affine_code after rounding: r is R(...) as binary32 bits.
uint code_from_rounded(uint r, uint n_bits) {
  const uint n = (1u << pc.bits) - 1u;
  if (sf_is_nan(r)) return 0u;
  if (pc.gpu_rounding == 0u) {  // mlx_cpu: min(max(r, 0), n)
    if (sf_lt(r, F32_ZERO)) return 0u;
    if (sf_lt(n_bits, r)) return n;
    return uint(sf_integral_to_int(r));
  }
  const uint capped = sf_lt(n_bits, r) ? n_bits : r;  // mlx_gpu: min(r, n), no lower clamp
  if (!sf_lt(capped, F32_ZERO)) return uint(sf_integral_to_int(capped));
  if (sf_lt(capped, F32_MINUS_2P31)) return 0u;  // a multiple of 256: wraps to 0
  return uint(sf_integral_to_int(capped)) & 0xFFu & n;  // Metal's uint8 wrap (oracle header)
}

uint code_exact(uint g, uint bias, uint scale, uint n_bits) {
  const uint q = sf_div(sf_sub(g, bias), scale);
  return code_from_rounded(sf_round_integral(q, pc.gpu_rounding == 0u), n_bits);
}

// Fast path. With every operand in the fast range, d = g − bias is the oracle's f32
// difference, and the hardware quotient q is within 2.5 ulp of x = d/scale (Vulkan's
// bound for OpFDiv with |scale| in [2^-126, 2^126]). The oracle rounds t = fl(x), so
// |q − t| <= 3 ulp(x) <= 3·2^-23·1024 < 2^-11 while |q| < 1024. f = q − floor(q) is
// exact except for q in (−1, 0), where it is off by at most 2^-25. So when f is more
// than 2^-10 away from 1/2, no half-integer lies between q and t and R(t) is the integer
// nearest to q, whichever tie rule R uses. Otherwise (or out of range) returns false.
bool code_fast(uint g, uint bias, uint scale, out uint code) {
  code = 0u;
  if (pc.exact_only != 0u || !fast_ok(g) || !fast_ok(bias) || !in_fast_range(scale)) return false;
  precise float d = uintBitsToFloat(g) - uintBitsToFloat(bias);
  if (!fast_ok(floatBitsToUint(d))) return false;
  precise float q = d / uintBitsToFloat(scale);
  if (!(abs(q) < 1024.0)) return false;
  precise float fl = floor(q);
  precise float f = q - fl;
  if (!(abs(f - 0.5) > 0.0009765625)) return false;  // 2^-10
  const int k = int(fl) + (f > 0.5 ? 1 : 0);
  const int n = int((1u << pc.bits) - 1u);
  if (pc.gpu_rounding == 0u) {
    code = uint(clamp(k, 0, n));
  } else {
    const int capped = min(k, n);
    code = capped >= 0 ? uint(capped) : (uint(capped) & 0xFFu & uint(n));
  }
  return true;
}

void main() {
  const uint gs = pc.group_size;
  const uint words_per_group = gs * pc.bits / 32u;  // group_size is a multiple of 32
  const bool gpu = pc.gpu_rounding != 0u;
  const uint n_bits = sf_from_uint((1u << pc.bits) - 1u);
  for (uint grp = gl_GlobalInvocationID.x; grp < pc.groups; grp += kvlab_stride()) {
    const uint first = pc.x_offset + grp * gs;
    // alpha/beta: the oracle's NaN-skipping `>` / `<` scan; mlx_gpu starts the max at 0.
    uint alpha = gpu ? F32_ZERO : 0xFF800000u, beta = SF_INF;
    for (uint j = 0u; j < gs; ++j) {
      const uint g = x_load_f32(first + j, pc.dtype);
      if (sf_lt(alpha, g)) alpha = g;
      if (sf_lt(g, beta)) beta = g;
    }
    uint s0 = sf_div(sf_sub(alpha, beta), n_bits);
    if (sf_lt(s0, SCALE_FLOOR)) s0 = SCALE_FLOOR;  // std::max(s0, eps)
    const bool anchor_on_min = sf_lt(alpha & SF_MAG, beta & SF_MAG);  // |beta| > |alpha|
    const uint s1 = anchor_on_min ? s0 : (s0 ^ SF_SIGN);
    const uint edge = anchor_on_min ? beta : alpha;
    const uint q0 = sf_round_integral(sf_div(edge, s1), !gpu);
    uint scale = s1, bias = F32_ZERO;
    if (!sf_is_zero(q0)) {  // q0 != 0.0f (a NaN q0 counts as nonzero)
      scale = sf_div(edge, q0);
      bias = edge;
    }
    scales_store_f32(pc.scales_offset + grp, pc.dtype, scale);
    biases_store_f32(pc.biases_offset + grp, pc.dtype, bias);

    // Codes, packed LSB-first (reference/bitpack.h); a group owns whole words.
    uint word = pc.wq_offset + grp * words_per_group, acc = 0u, used = 0u;
    for (uint j = 0u; j < gs; ++j) {
      const uint g = x_load_f32(first + j, pc.dtype);
      uint code;
      if (!code_fast(g, bias, scale, code)) code = code_exact(g, bias, scale, n_bits);
      acc |= code << used;
      used += pc.bits;
      if (used >= 32u) {
        wq_w[word++] = acc;
        used -= 32u;
        acc = used == 0u ? 0u : code >> (pc.bits - used);  // the straddling code's high bits
      }
    }
  }
}
