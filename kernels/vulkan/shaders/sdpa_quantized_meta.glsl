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

// Branch-free (one word load, then selects): in the decode pass's V loop a branch on the
// dtype per scale and bias load kept the loads of a batch of keys from issuing together.
float ks_at(uint i) { return uintBitsToFloat(widen_to_f32(ks_load_bits(i, g_k_dtype == DT_F32), g_k_dtype)); }
float kb_at(uint i) { return uintBitsToFloat(widen_to_f32(kb_load_bits(i, g_k_dtype == DT_F32), g_k_dtype)); }
float vs_at(uint i) { return uintBitsToFloat(widen_to_f32(vs_load_bits(i, g_v_dtype == DT_F32), g_v_dtype)); }
float vb_at(uint i) { return uintBitsToFloat(widen_to_f32(vb_load_bits(i, g_v_dtype == DT_F32), g_v_dtype)); }

#endif  // KVLAB_SDPA_QUANTIZED_META_GLSL
