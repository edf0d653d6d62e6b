// Shared declarations of the kvlab compute shaders.
//
// Storage paths (one SPIR-V build each, chosen by the host):
//   KVLAB_SMALL_STORAGE=1: 16-bit and 8-bit elements are loaded and stored directly
//     (VK_KHR_16bit_storage / VK_KHR_8bit_storage);
//   KVLAB_SMALL_STORAGE=0: memory is touched only as 32-bit words. Loads extract the
//     element; a store that covers part of a word clears and sets its bits with
//     atomicAnd/atomicOr, so neighbouring elements written by other invocations (or
//     bytes outside the tensor, e.g. the harness's guard bands) are never clobbered.
// Tensors are bound from an aligned-down offset (minStorageBufferOffsetAlignment), so
// every access adds the tensor's element (or byte) offset from the push constants.
#ifndef KVLAB_COMMON_GLSL
#define KVLAB_COMMON_GLSL

#extension GL_EXT_control_flow_attributes : enable
#if KVLAB_SMALL_STORAGE
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#endif

#define KVLAB_LOCAL_SIZE 64
layout(local_size_x = KVLAB_LOCAL_SIZE) in;

// dtype codes (kvlab::DType order)
const uint DT_F32 = 0u, DT_F16 = 1u, DT_BF16 = 2u, DT_U32 = 3u, DT_I32 = 4u, DT_U8 = 5u;

// The invocations of the whole dispatch walk the work items with this stride.
uint kvlab_stride() { return gl_NumWorkGroups.x * KVLAB_LOCAL_SIZE; }

// Clears `mask` bits of a word and sets `bits` (already inside the mask) atomically with
// respect to other invocations touching the word's other bits.
#define KVLAB_MASKED_STORE(array, word, mask, bits) \
  do {                                               \
    atomicAnd(array[word], ~(mask));                 \
    atomicOr(array[word], (bits));                   \
  } while (false)

// KVLAB_TENSOR16(name, binding): a tensor of 16- or 32-bit elements.
//   name_load32(i) / name_store32(i, v): element i of a 32-bit tensor;
//   name_load16(i) / name_store16(i, v): element i (16 bits) of a 16-bit tensor; the
//   words build stores through a masked atomic update.
#if KVLAB_SMALL_STORAGE
#define KVLAB_TENSOR16(name, b)                                                                        \
  layout(std430, set = 0, binding = b) buffer name##_words_block { uint name##_w[]; };              \
  layout(std430, set = 0, binding = b) buffer name##_halves_block { uint16_t name##_h[]; };         \
  uint name##_load32(uint i) { return name##_w[i]; }                                                 \
  void name##_store32(uint i, uint v) { name##_w[i] = v; }                                           \
  uint name##_load16(uint i) { return uint(name##_h[i]); }                                           \
  void name##_store16(uint i, uint v) { name##_h[i] = uint16_t(v); }
#else
#define KVLAB_TENSOR16(name, b)                                                                        \
  layout(std430, set = 0, binding = b) buffer name##_words_block { uint name##_w[]; };              \
  uint name##_load32(uint i) { return name##_w[i]; }                                                 \
  void name##_store32(uint i, uint v) { name##_w[i] = v; }                                           \
  uint name##_load16(uint i) { return (name##_w[i >> 1] >> ((i & 1u) * 16u)) & 0xFFFFu; }          \
  void name##_store16(uint i, uint v) {                                                              \
    const uint shift = (i & 1u) * 16u;                                                               \
    KVLAB_MASKED_STORE(name##_w, i >> 1, 0xFFFFu << shift, (v & 0xFFFFu) << shift);                 \
  }
#endif

// KVLAB_TENSOR8(name, binding): byte access for the data-movement kernels.
//   name_load_byte(i); name_store_partial(word, mask, bits): the bytes of `word` selected
//   by the byte-aligned `mask` (not all four) get `bits`; 8-bit stores where available.
#if KVLAB_SMALL_STORAGE
#define KVLAB_TENSOR8(name, b)                                                                         \
  layout(std430, set = 0, binding = b) buffer name##_words_block { uint name##_w[]; };              \
  layout(std430, set = 0, binding = b) buffer name##_bytes_block { uint8_t name##_b[]; };           \
  uint name##_load_byte(uint i) { return uint(name##_b[i]); }                                        \
  void name##_store_partial(uint word, uint mask, uint bits) {                                       \
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {                                                      \
      if (((mask >> (8u * k)) & 0xFFu) != 0u) name##_b[4u * word + k] = uint8_t((bits >> (8u * k)) & 0xFFu); \
    }                                                                                                \
  }
#else
#define KVLAB_TENSOR8(name, b)                                                                         \
  layout(std430, set = 0, binding = b) buffer name##_words_block { uint name##_w[]; };              \
  uint name##_load_byte(uint i) { return (name##_w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }          \
  void name##_store_partial(uint word, uint mask, uint bits) { KVLAB_MASKED_STORE(name##_w, word, mask, bits); }
#endif

#endif  // KVLAB_COMMON_GLSL
