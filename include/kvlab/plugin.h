/* kvlab plugin ABI, version 1: bring-your-own-kernel backends through a C interface.
 *
 * A plugin is a shared library exporting one function
 *
 *     const kvlab_plugin_v1* kvlab_plugin_entry(void);
 *
 * that returns a table (static storage, valid until the library is unloaded): the ABI
 * version it was built against (KVLAB_PLUGIN_ABI_VERSION), a name, and one function
 * pointer per kernel op of kvlab (include/kvlab/op_list.h, in its order). A null slot
 * means "not implemented": kvlab reports the op as unsupported for that plugin.
 *
 *     kvlab check --backend plugin:/path/to/libmykernels.so --tier ci --op rope
 *
 * loads it (harness/plugin_backend.h) and judges it against the oracle like any other
 * backend. This header is C99 and C++; it uses no C++ type.
 *
 * Calling convention. Every op takes a pointer to its argument struct plus a message
 * buffer, and returns a status:
 *     int32_t op(const kvlab_<op>_args* args, char* msg, size_t msg_len);
 *   KVLAB_PLUGIN_OK (0)           done; the outputs hold the result
 *   KVLAB_PLUGIN_UNSUPPORTED (1)  the plugin does not implement these parameters (a
 *                                 dtype, a mode, ...): kvlab reports the case
 *                                 UNIMPLEMENTED, not failed
 *   KVLAB_PLUGIN_INVALID (2)      invalid input (kvlab::Error invalid_argument)
 *   KVLAB_PLUGIN_INTERNAL (3)     anything else (kvlab::Error internal); so is any other
 *                                 value
 * On a non-zero status the plugin may write a NUL-terminated message of at most msg_len
 * bytes (including the NUL) into msg; kvlab carries it in the error. msg may be NULL
 * when msg_len is 0.
 *
 * Memory. kvlab owns every buffer: tensors are host memory, dense row-major, and stay
 * valid for the duration of the call only. A plugin writes only into the output tensors
 * of an op (documented per op; kv_append_advance also advances its offsets tensor) and
 * must not keep pointers after returning. kvlab validates every call with the oracle's
 * own checks (reference/<stem>.h: shapes, dtypes, ranges, overlaps) before calling, so a
 * plugin may trust geometry and indices; the contract of each op (what the result must
 * be) is the oracle's, documented in reference/<stem>.h.
 *
 * Threads: the harness calls a plugin from one thread at a time. */
#ifndef KVLAB_PLUGIN_H
#define KVLAB_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVLAB_PLUGIN_ABI_VERSION 1u
#define KVLAB_PLUGIN_ENTRY_SYMBOL "kvlab_plugin_entry"
#define KVLAB_PLUGIN_MAX_RANK 8

/* ---- status codes ------------------------------------------------------------------ */
#define KVLAB_PLUGIN_OK 0
#define KVLAB_PLUGIN_UNSUPPORTED 1
#define KVLAB_PLUGIN_INVALID 2
#define KVLAB_PLUGIN_INTERNAL 3

/* ---- element types (kvlab::DType, same order) -------------------------------------- */
/* f16 and bf16 elements are raw uint16_t bit patterns (IEEE binary16; the upper half of a
 * binary32). */
#define KVLAB_DTYPE_F32 0
#define KVLAB_DTYPE_F16 1
#define KVLAB_DTYPE_BF16 2
#define KVLAB_DTYPE_U32 3
#define KVLAB_DTYPE_I32 4
#define KVLAB_DTYPE_U8 5

/* A dense row-major tensor in host memory. shape[rank..8) are 0. An absent optional
 * tensor is passed as a NULL pointer (or, inside kvlab_quantized, data == NULL).
 * Inputs are not written even though data is not const. */
typedef struct kvlab_tensor {
  void* data;
  int32_t dtype; /* KVLAB_DTYPE_* */
  int32_t rank;  /* 0..KVLAB_PLUGIN_MAX_RANK */
  int64_t shape[KVLAB_PLUGIN_MAX_RANK];
} kvlab_tensor;

/* ---- quantization formats (kvlab/quant_spec.h) ------------------------------------- */
#define KVLAB_QUANT_AFFINE 0 /* bits 1..6, 8; group 32/64/128; scales+biases in the float dtype */
#define KVLAB_QUANT_MXFP4 1  /* bits 4, group 32, u8 E8M0 scales, no biases */
#define KVLAB_QUANT_MXFP8 2  /* bits 8, group 32, u8 E8M0 scales */
#define KVLAB_QUANT_NVFP4 3  /* bits 4, group 16, u8 E4M3 scales, optional global scale */
/* ggml's blocks of 32 (docs/quantization.md): f16 scales whatever the input dtype. */
#define KVLAB_QUANT_Q8_0 4   /* bits 8, codes int8 (two's complement) */
#define KVLAB_QUANT_Q4_0 5   /* bits 4, codes offset by 8 */
#define KVLAB_QUANT_Q4_1 6   /* bits 4, unsigned codes, f16 mins as biases */
#define KVLAB_QUANT_Q5_0 7   /* bits 5, codes offset by 16 */
#define KVLAB_QUANT_Q5_1 8   /* bits 5, unsigned codes, f16 mins as biases */
#define KVLAB_QUANT_IQ4_NL 9 /* bits 4, indices into ggml's 16-value table */

/* Arithmetic flavours (kvlab::Rounding): the contract, Metal's, the pinned MLX's; for the
 * ggml block formats, ggml's C reference and its CPU backend's quantizer. */
#define KVLAB_ROUNDING_MLX_CPU 0
#define KVLAB_ROUNDING_MLX_GPU 1
#define KVLAB_ROUNDING_MLX 2
#define KVLAB_ROUNDING_GGML_REF 3
#define KVLAB_ROUNDING_GGML_CPU 4

/* A packed tensor: codes wq (..., D·bits/32) u32, LSB-first bitstream per row
 * (reference/bitpack.h); scales (..., D/group); biases of the scales' shape and dtype
 * for affine, q4_1 and q5_1 (biases.data == NULL otherwise). */
typedef struct kvlab_quantized {
  kvlab_tensor wq, scales, biases;
  int32_t mode; /* KVLAB_QUANT_* */
  int32_t bits;
  int32_t group_size;
  int32_t has_global_scale; /* nvfp4 only */
  float global_scale;
} kvlab_quantized;

/* ---- attention parameters (kvlab/ops.h AttentionParams, MaskSpec) ------------------ */
#define KVLAB_MASK_NONE 0
#define KVLAB_MASK_CAUSAL 1   /* lower-right aligned, optional window and paddings */
#define KVLAB_MASK_BOOLEAN 2  /* mask tensor u8 (1|B, 1|Hq, Lq, Lk), nonzero keeps */
#define KVLAB_MASK_ADDITIVE 3 /* mask tensor, float, added to the scores */

#define KVLAB_FULLY_MASKED_ZERO 0           /* a row with no visible key is 0 */
#define KVLAB_FULLY_MASKED_MEAN_OF_VALUES 1 /* ... the mean of V over all keys */

typedef struct kvlab_attention_params {
  float scale;
  float softcap;     /* > 0: s = softcap·tanh(s/softcap) */
  int32_t mask_kind; /* KVLAB_MASK_* */
  int32_t window;    /* causal only; 0 = unbounded */
  const int32_t* left_padding;  /* causal only: B entries, or NULL with count 0 */
  int64_t left_padding_count;
  const int32_t* right_padding; /* causal only */
  int64_t right_padding_count;
  int32_t fully_masked; /* KVLAB_FULLY_MASKED_* */
} kvlab_attention_params;

/* ---- one argument struct per op (kvlab/op_list.h) ---------------------------------- */

/* quantize (reference/quantize.h): x (..., D) float -> out.wq, out.scales (out.biases). */
typedef struct kvlab_quantize_args {
  const kvlab_tensor* x;
  int32_t rounding; /* KVLAB_ROUNDING_* */
  const kvlab_quantized* out; /* outputs: its tensors */
} kvlab_quantize_args;

/* dequantize: in's codes -> out (..., D) float, in the arithmetic of `flavour`. */
typedef struct kvlab_dequantize_args {
  const kvlab_quantized* in;
  const kvlab_tensor* out; /* output */
  int32_t flavour;         /* KVLAB_ROUNDING_* */
} kvlab_dequantize_args;

/* rope (reference/rope.h): position of token t in batch row b = scale·(t + offset_b),
 * offset_b = offset, or per_row_offsets[b] when per_row_offsets is not NULL (i32 (B,),
 * offset then 0). */
typedef struct kvlab_rope_args {
  const kvlab_tensor* x; /* (B, *, T, D) float */
  int32_t dims;
  int32_t traditional;   /* 1: pairs (2i, 2i+1); 0: (i, i + dims/2) */
  float base;            /* used when freqs_count == 0 */
  float scale;
  const float* freqs;    /* dims/2 wavelengths, or NULL */
  int64_t freqs_count;
  int32_t mlx_arithmetic; /* 1: MLX 0.32.4's CPU arithmetic (reference/rope.h) */
  int32_t offset;
  const kvlab_tensor* per_row_offsets; /* or NULL */
  const kvlab_tensor* out;             /* output, x's shape and dtype */
} kvlab_rope_args;

/* sdpa (reference/sdpa.h): q (B,Hq,Lq,Dk), k (B,Hkv,Lk,Dk), v (B,Hkv,Lk,Dv) -> out
 * (B,Hq,Lq,Dv). mask: for MASK_BOOLEAN / MASK_ADDITIVE, else NULL; sinks: (Hq,) or NULL. */
typedef struct kvlab_sdpa_args {
  const kvlab_tensor *q, *k, *v;
  const kvlab_attention_params* params;
  const kvlab_tensor* mask;
  const kvlab_tensor* sinks;
  const kvlab_tensor* out; /* output */
} kvlab_sdpa_args;

/* quantized_sdpa (reference/quantized_sdpa.h): sdpa over K and V dequantized to f32. */
typedef struct kvlab_quantized_sdpa_args {
  const kvlab_tensor* q;
  const kvlab_quantized *k, *v;
  const kvlab_attention_params* params;
  const kvlab_tensor* mask;
  const kvlab_tensor* sinks;
  const kvlab_tensor* out; /* output */
} kvlab_quantized_sdpa_args;

/* A TurboQuant codec (kvlab/ops.h TurboQuantCodec, reference/turboquant.h). */
typedef struct kvlab_turboquant_codec {
  int32_t dim, bits;
  const float* signs; int64_t signs_count;         /* RHT: dim entries of ±1, else 0 */
  const float* rotation; int64_t rotation_count;   /* dense: dim·dim row-major, else 0 */
  const float* codebook; int64_t codebook_count;   /* 2^bits levels, ascending */
  const int32_t* channels; int64_t channels_count; /* 0 = all channels */
} kvlab_turboquant_codec;

typedef struct kvlab_turboquant_encode_args {
  const kvlab_tensor* x; /* (..., W) float */
  const kvlab_turboquant_codec* codec;
  const kvlab_tensor* norms;   /* output, f16 */
  const kvlab_tensor* indices; /* output, u32 */
} kvlab_turboquant_encode_args;

typedef struct kvlab_turboquant_decode_args {
  const kvlab_tensor* norms;
  const kvlab_tensor* indices;
  const kvlab_turboquant_codec* codec;
  const kvlab_tensor* out; /* output; only codec channels written when given */
} kvlab_turboquant_decode_args;

/* Cache data movement (reference/kv_move.h): 4-D blocks (B, H, L, W) of any dtype,
 * copied byte for byte; index tensors are i32. */
typedef struct kvlab_kv_scatter_args {
  const kvlab_tensor* src;   /* (B,H,S,W) */
  const kvlab_tensor* slots; /* (B,S): dst[b,h,slots[b,s]] = src[b,h,s] */
  const kvlab_tensor* dst;   /* output (B,H,L,W); other rows untouched */
} kvlab_kv_scatter_args;

typedef struct kvlab_kv_gather_args {
  const kvlab_tensor* src;         /* (Bs,H,L,W) */
  const kvlab_tensor* batch_index; /* (Bd,): dst[d] = src[batch_index[d]] */
  const kvlab_tensor* dst;         /* output (Bd,H,L,W) */
} kvlab_kv_gather_args;

/* kvlab::SeqBlock */
typedef struct kvlab_seq_block {
  int64_t src_batch, src_seq, dst_batch, dst_seq, length;
} kvlab_seq_block;

typedef struct kvlab_kv_copy_blocks_args {
  const kvlab_tensor* src;
  const kvlab_seq_block* blocks;
  int64_t block_count;
  const kvlab_tensor* dst; /* output; rows outside the blocks untouched */
} kvlab_kv_copy_blocks_args;

typedef struct kvlab_kv_roll_args {
  const kvlab_tensor* src;    /* (B,H,L,W) */
  const kvlab_tensor* shifts; /* (B,): dst[b,h,i] = src[b,h,(i - shifts[b]) mod L] */
  const kvlab_tensor* dst;    /* output */
} kvlab_kv_roll_args;

/* reference/kv_append.h */
typedef struct kvlab_kv_append_advance_args {
  const kvlab_tensor *k, *v;          /* (B,H,S,Dk), (B,H,S,Dv) */
  const kvlab_tensor* left_padding;   /* i32 (B,) */
  const kvlab_tensor* offsets;        /* i32 (B,): read, then advanced by S (output) */
  const kvlab_tensor *k_cache, *v_cache; /* outputs (B,H,C,Dk), (B,H,C,Dv) */
} kvlab_kv_append_advance_args;

typedef struct kvlab_kv_snapshot_args {
  const kvlab_tensor* src;
  const kvlab_tensor* dst; /* output: dst = src byte for byte */
} kvlab_kv_snapshot_args;

/* ---- the table ---------------------------------------------------------------------- */
typedef struct kvlab_plugin_v1 {
  uint32_t abi_version; /* KVLAB_PLUGIN_ABI_VERSION */
  const char* name;     /* for messages */
  int32_t (*quantize)(const kvlab_quantize_args* args, char* msg, size_t msg_len);
  int32_t (*dequantize)(const kvlab_dequantize_args* args, char* msg, size_t msg_len);
  int32_t (*rope)(const kvlab_rope_args* args, char* msg, size_t msg_len);
  int32_t (*sdpa)(const kvlab_sdpa_args* args, char* msg, size_t msg_len);
  int32_t (*quantized_sdpa)(const kvlab_quantized_sdpa_args* args, char* msg, size_t msg_len);
  int32_t (*turboquant_encode)(const kvlab_turboquant_encode_args* args, char* msg, size_t msg_len);
  int32_t (*turboquant_decode)(const kvlab_turboquant_decode_args* args, char* msg, size_t msg_len);
  int32_t (*kv_scatter)(const kvlab_kv_scatter_args* args, char* msg, size_t msg_len);
  int32_t (*kv_gather)(const kvlab_kv_gather_args* args, char* msg, size_t msg_len);
  int32_t (*kv_copy_blocks)(const kvlab_kv_copy_blocks_args* args, char* msg, size_t msg_len);
  int32_t (*kv_roll)(const kvlab_kv_roll_args* args, char* msg, size_t msg_len);
  int32_t (*kv_append_advance)(const kvlab_kv_append_advance_args* args, char* msg, size_t msg_len);
  int32_t (*kv_snapshot)(const kvlab_kv_snapshot_args* args, char* msg, size_t msg_len);
} kvlab_plugin_v1;

typedef const kvlab_plugin_v1* (*kvlab_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KVLAB_PLUGIN_H */
