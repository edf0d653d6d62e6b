#version 450
// The combine pass of the attention shaders (sdpa_core.glsl): one invocation per output
// element (row, c) merges the row's chunk partials (m_k, l_k, acc_k) in f32:
//   M = max(sink, max_k m_k);  out = Σ_k e^{m_k−M}·acc_k / (e^{sink−M} + Σ_k e^{m_k−M}·l_k)
// and rounds once (RNE, exact integer arithmetic) to out's dtype. A row no chunk saw a
// visible key in is fully masked: 0, or the mean of all Lk values (mean_of_values).
#include "common.glsl"
#include "affine_common.glsl"
#include "sdpa_math.glsl"
#include "sdpa_params.glsl"

// Bindings: 0 the work buffer (sdpa_params.glsl: table and partials), 1 sinks, 2 out.
KVLAB_TENSOR16(sinks, 1)
KVLAB_TENSOR16(out, 2)

void main() {
  const uint dv = P[P_DV], chunks = P[P_CHUNKS];
  const uint items = P[P_B] * P[P_HQ] * P[P_LQ] * dv;
  for (uint item = gl_GlobalInvocationID.x; item < items; item += kvlab_stride()) {
    const uint c = item % dv, row = item / dv, h = (row / P[P_LQ]) % P[P_HQ];
    const uint first = P[P_PARTIAL_BASE] + row * chunks * (dv + PARTIAL_HEADER);
    // The loops select instead of branching on a chunk's flag, so that the loads of
    // successive chunks do not wait on each other (hundreds of chunks on a GPU).
    bool any = false;
    float big_m = 0.0;
    for (uint k = 0u; k < chunks; ++k) {
      const uint base = first + k * (dv + PARTIAL_HEADER);
      const bool seen = WF[base + 2u] != 0.0;
      const float m = WF[base];
      big_m = seen ? (any ? max(big_m, m) : m) : big_m;
      any = any || seen;
    }
    float result = 0.0;
    if (!any) {
      if (P[P_MEAN_POLICY] != 0u) {
        for (uint k = 0u; k < chunks; ++k) result += WF[first + k * (dv + PARTIAL_HEADER) + PARTIAL_HEADER + c];
        result /= float(P[P_LK]);
      }
    } else {
      float denominator = 0.0, numerator = 0.0;
      if (P[P_HAS_SINKS] != 0u) {
        const uint dt = P[P_SINKS_DTYPE], si = P[P_SINKS_OFF] + h;
        const float sink = uintBitsToFloat(dt == DT_F32 ? sinks_load32(si) : widen_to_f32(sinks_load16(si), dt));
        big_m = max(big_m, sink);
        denominator = kvlab_exp(sink - big_m);
      }
      for (uint k = 0u; k < chunks; ++k) {
        const uint base = first + k * (dv + PARTIAL_HEADER);
        const bool seen = WF[base + 2u] != 0.0;
        const float m = WF[base], l = WF[base + 1u], a = WF[base + PARTIAL_HEADER + c];
        const float w = kvlab_exp((seen ? m : big_m) - big_m);
        denominator += seen ? w * l : 0.0;  // (an unseen chunk's sums may be a mean's NaN)
        numerator += seen ? w * a : 0.0;
      }
      result = numerator / denominator;
    }
    const uint dt = P[P_Q_DTYPE], o = P[P_OUT_OFF] + item;
    const uint bits = floatBitsToUint(result);
    if (dt == DT_F32) out_store32(o, bits); else out_store16(o, narrow_from_f32(bits, dt));
  }
}
