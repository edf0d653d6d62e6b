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

// The chunks are read BATCH at a time: the batch's loads are issued before any of their
// values is used, so a row's hundreds of chunks cost hundreds / BATCH memory latencies, not
// one each (one chunk at a time made the combine a large share of a decode call on an
// NVIDIA H200, growing with the chunk count: bench/records/2026-11-27-nvidia-h200.md).
// The sums still run over the chunks in order (lavapipe's FMA contraction of them moved
// the last bit in 54 of 1026 ci cases: kvlab check --tier ci --op sdpa,quantized_sdpa).
const uint BATCH = 8u;

void main() {
  const uint dv = P[P_DV], chunks = P[P_CHUNKS], stride = dv + PARTIAL_HEADER;
  const uint items = P[P_B] * P[P_HQ] * P[P_LQ] * dv;
  for (uint item = gl_GlobalInvocationID.x; item < items; item += kvlab_stride()) {
    const uint c = item % dv, row = item / dv, h = (row / P[P_LQ]) % P[P_HQ];
    const uint first = P[P_PARTIAL_BASE] + row * chunks * stride;
    // Selects, not branches, on a chunk's flag: no load waits on another chunk's value.
    bool any = false;
    float big_m = 0.0;
    for (uint k0 = 0u; k0 < chunks; k0 += BATCH) {
      float m[BATCH], seen[BATCH];
      [[unroll]] for (uint j = 0u; j < BATCH; ++j) {
        const uint base = first + min(k0 + j, chunks - 1u) * stride;  // past the end: a repeat, unused
        m[j] = WF[base];
        seen[j] = WF[base + 2u];
      }
      [[unroll]] for (uint j = 0u; j < BATCH; ++j) {
        const bool s = k0 + j < chunks && seen[j] != 0.0;
        big_m = s ? (any ? max(big_m, m[j]) : m[j]) : big_m;
        any = any || s;
      }
    }
    float result = 0.0;
    if (!any) {
      if (P[P_MEAN_POLICY] != 0u) {
        for (uint k = 0u; k < chunks; ++k) result += WF[first + k * stride + PARTIAL_HEADER + c];
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
      for (uint k0 = 0u; k0 < chunks; k0 += BATCH) {
        float m[BATCH], l[BATCH], seen[BATCH], a[BATCH];
        [[unroll]] for (uint j = 0u; j < BATCH; ++j) {
          const uint base = first + min(k0 + j, chunks - 1u) * stride;
          m[j] = WF[base];
          l[j] = WF[base + 1u];
          seen[j] = WF[base + 2u];
          a[j] = WF[base + PARTIAL_HEADER + c];
        }
        [[unroll]] for (uint j = 0u; j < BATCH; ++j) {
          const bool s = k0 + j < chunks && seen[j] != 0.0;
          const float w = kvlab_exp((s ? m[j] : big_m) - big_m);
          denominator += s ? w * l[j] : 0.0;  // (an unseen chunk's sums may be a mean's NaN)
          numerator += s ? w * a[j] : 0.0;
        }
      }
      result = numerator / denominator;
    }
    const uint dt = P[P_Q_DTYPE], o = P[P_OUT_OFF] + item;
    const uint bits = floatBitsToUint(result);
    if (dt == DT_F32) out_store32(o, bits); else out_store16(o, narrow_from_f32(bits, dt));
  }
}
