// The K/V scales and biases of the quantized attention passes (sdpa_core.glsl's quantized
// builds, sdpa_quantized_decode.comp): bindings 4..7, their offsets and the K/V scale
// dtypes (a side's biases share its scales' dtype), loaded from the table once per
// invocation by load_meta_params(), and element access as f32. Include after
// sdpa_params.glsl and affine_common.glsl.
#ifndef KVLAB_SDPA_QUANTIZED_META_GLSL
#define KVLAB_SDPA_QUANTIZED_META_GLSL

KVLAB_TENSOR16(ks, 4)
KVLAB_TENSOR16(kb, 5)
KVLAB_TENSOR16(vs, 6)
KVLAB_TENSOR16(vb, 7)

uint g_k_dtype, g_v_dtype, g_ks_off, g_kb_off, g_vs_off, g_vb_off;
void load_meta_params() {
  g_k_dtype = P[P_K_DTYPE];
  g_v_dtype = P[P_V_DTYPE];
  g_ks_off = P[P_KS_OFF];
  g_kb_off = P[P_KB_OFF];
  g_vs_off = P[P_VS_OFF];
  g_vb_off = P[P_VB_OFF];
}

float ks_at(uint i) { return g_k_dtype == DT_F32 ? uintBitsToFloat(ks_load32(i)) : load_float16(ks_load16(i), g_k_dtype); }
float kb_at(uint i) { return g_k_dtype == DT_F32 ? uintBitsToFloat(kb_load32(i)) : load_float16(kb_load16(i), g_k_dtype); }
float vs_at(uint i) { return g_v_dtype == DT_F32 ? uintBitsToFloat(vs_load32(i)) : load_float16(vs_load16(i), g_v_dtype); }
float vb_at(uint i) { return g_v_dtype == DT_F32 ? uintBitsToFloat(vb_load32(i)) : load_float16(vb_load16(i), g_v_dtype); }

#endif  // KVLAB_SDPA_QUANTIZED_META_GLSL
