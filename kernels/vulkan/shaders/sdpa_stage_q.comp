#version 450
// quantized_sdpa's first pass: q (any float dtype, exact conversion) copied as f32 into
// the work buffer at P_QF_BASE, so the attention pass needs no binding of its own for it
// (the runtime allows 8 bindings per dispatch; quantized_sdpa.comp uses all of them).
#include "common.glsl"
#include "affine_common.glsl"
#include "sdpa_params.glsl"

KVLAB_TENSOR16(q, 1)

void main() {
  const uint n = P[P_B] * P[P_HQ] * P[P_LQ] * P[P_DK], dt = P[P_Q_DTYPE], base = P[P_QF_BASE];
  for (uint i = gl_GlobalInvocationID.x; i < n; i += kvlab_stride()) {
    const uint at = P[P_Q_OFF] + i;
    W[base + i] = dt == DT_F32 ? q_load32(at) : widen_to_f32(q_load16(at), dt);
  }
}
