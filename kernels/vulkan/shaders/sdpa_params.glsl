// The work buffer of the attention shaders (sdpa.comp, quantized_sdpa.comp,
// sdpa_stage_q.comp, sdpa_combine.comp), always binding 0, allocated per call by
// kernels/vulkan/sdpa.cc: the parameter table (uints at the indices below, kParam*
// there, same order), then q as f32 (quantized_sdpa), then the chunk partials. (One
// buffer for all three keeps quantized_sdpa within the runtime's 8 bindings per
// dispatch.) Tensor offsets count elements of the tensor's dtype (bytes for the u8
// mask, words for packed codes); P_QF_BASE and P_PARTIAL_BASE count words of W.
#ifndef KVLAB_SDPA_PARAMS_GLSL
#define KVLAB_SDPA_PARAMS_GLSL

layout(std430, set = 0, binding = 0) buffer work_words { uint W[]; };
layout(std430, set = 0, binding = 0) buffer work_floats { float WF[]; };
#define P W

const uint P_Q_OFF = 0u, P_K_OFF = 1u, P_V_OFF = 2u, P_MASK_OFF = 3u, P_SINKS_OFF = 4u, P_OUT_OFF = 5u;
const uint P_Q_DTYPE = 6u, P_K_DTYPE = 7u, P_V_DTYPE = 8u, P_MASK_DTYPE = 9u, P_SINKS_DTYPE = 10u;
const uint P_B = 11u, P_HQ = 12u, P_HKV = 13u, P_LQ = 14u, P_LK = 15u, P_DK = 16u, P_DV = 17u;
const uint P_MASK_KIND = 18u, P_MASK_B = 19u, P_MASK_H = 20u, P_WINDOW = 21u, P_HAS_LPAD = 22u, P_HAS_RPAD = 23u;
const uint P_SCALE = 24u, P_SOFTCAP = 25u, P_CHUNK_LEN = 26u, P_CHUNKS = 27u, P_MEAN_POLICY = 28u, P_HAS_SINKS = 29u;
// quantized_sdpa only: scales/biases offsets and the two specs (K/V dtype = scales dtype).
const uint P_KS_OFF = 30u, P_KB_OFF = 31u, P_VS_OFF = 32u, P_VB_OFF = 33u;
const uint P_KBITS = 34u, P_KGROUP = 35u, P_VBITS = 36u, P_VGROUP = 37u;
const uint P_QF_BASE = 38u, P_PARTIAL_BASE = 39u, P_R_BLOCK = 40u;
const uint P_PADDINGS = 48u;  // left paddings [B] (when given), then right paddings [B]

const uint MASK_NONE = 0u, MASK_CAUSAL = 1u, MASK_BOOLEAN = 2u, MASK_ADDITIVE = 3u;

// The per-(row, chunk) partial result: m, l, any-visible flag, then Dv accumulators.
const uint PARTIAL_HEADER = 3u;

#endif  // KVLAB_SDPA_PARAMS_GLSL
