/* An example kvlab kernel plugin in plain C99 (include/kvlab/plugin.h, ABI v1).
 *
 * Implements, simply and exactly:
 *   kv_scatter, kv_gather, kv_copy_blocks, kv_roll, kv_snapshot   any dtype (byte copies)
 *   rope        f32, the contract arithmetic (double, one rounding); not mlx_arithmetic
 *   dequantize  affine with f32 scales/biases and f32 output
 * Everything else is a null slot (kvlab reports "does not implement the op"), and the
 * parameters it does not cover return KVLAB_PLUGIN_UNSUPPORTED (UNIMPLEMENTED cases).
 *
 * Built twice (CMakeLists.txt): as is, and with -DKVLAB_EXAMPLE_BUG=1, which shifts
 * every RoPE position by one token, to show `kvlab check` catching and shrinking a bug.
 *
 * kvlab validates every call with the oracle's checks before calling, so the geometry
 * and indices here are trusted. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvlab/plugin.h"

#ifndef KVLAB_EXAMPLE_BUG
#define KVLAB_EXAMPLE_BUG 0
#endif
/* -DKVLAB_EXAMPLE_CRASH=1: the plugin a newcomer writes first. rope dereferences a null
 * pointer on sequences of exactly 3 tokens and kv_gather never returns when it gathers
 * 3 batch rows of 9 f32 rows of 128; kvlab's crash isolation turns each into that case's FAILED
 * (docs/plugins.md) and judges every other case. */
#ifndef KVLAB_EXAMPLE_CRASH
#define KVLAB_EXAMPLE_CRASH 0
#endif

#if defined(_WIN32)
#define KVLAB_EXPORT __declspec(dllexport)
#else
#define KVLAB_EXPORT __attribute__((visibility("default")))
#endif

static size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case KVLAB_DTYPE_F32: case KVLAB_DTYPE_U32: case KVLAB_DTYPE_I32: return 4;
    case KVLAB_DTYPE_F16: case KVLAB_DTYPE_BF16: return 2;
    default: return 1;
  }
}

static int64_t numel(const kvlab_tensor* t) {
  int64_t n = 1;
  int32_t i;
  for (i = 0; i < t->rank; ++i) n *= t->shape[i];
  return n;
}

static int32_t unsupported(char* msg, size_t msg_len, const char* what) {
  if (msg != NULL && msg_len > 0) snprintf(msg, msg_len, "%s", what);
  return KVLAB_PLUGIN_UNSUPPORTED;
}

/* ---- cache data movement: (B, H, L, W) blocks, rows of W elements ----------------- */

static size_t row_bytes(const kvlab_tensor* t) { return (size_t)t->shape[3] * dtype_size(t->dtype); }

static char* row_at(const kvlab_tensor* t, int64_t b, int64_t h, int64_t l) {
  return (char*)t->data + (size_t)((b * t->shape[1] + h) * t->shape[2] + l) * row_bytes(t);
}

static int32_t kv_scatter(const kvlab_kv_scatter_args* a, char* msg, size_t msg_len) {
  const int64_t B = a->src->shape[0], H = a->src->shape[1], S = a->src->shape[2];
  const int32_t* slots = (const int32_t*)a->slots->data;
  const size_t rb = row_bytes(a->src);
  int64_t b, h, s;
  (void)msg, (void)msg_len;
  for (b = 0; b < B; ++b)
    for (h = 0; h < H; ++h)
      for (s = 0; s < S; ++s) memcpy(row_at(a->dst, b, h, slots[b * S + s]), row_at(a->src, b, h, s), rb);
  return KVLAB_PLUGIN_OK;
}

static int32_t kv_gather(const kvlab_kv_gather_args* a, char* msg, size_t msg_len) {
  const int64_t Bd = a->dst->shape[0], H = a->src->shape[1], L = a->src->shape[2];
  const int32_t* index = (const int32_t*)a->batch_index->data;
  const size_t batch_bytes = (size_t)(H * L) * row_bytes(a->src);
  int64_t d;
  (void)msg, (void)msg_len;
  if (batch_bytes == 0) return KVLAB_PLUGIN_OK;
#if KVLAB_EXAMPLE_CRASH
  if (Bd == 3 && L == 9 && row_bytes(a->src) == 512) { /* two ci cases: f32 rows of 128 */
    volatile int spin = 1;
    while (spin) {
    }
  }
#endif
  for (d = 0; d < Bd; ++d) memcpy(row_at(a->dst, d, 0, 0), row_at(a->src, index[d], 0, 0), batch_bytes);
  return KVLAB_PLUGIN_OK;
}

static int32_t kv_copy_blocks(const kvlab_kv_copy_blocks_args* a, char* msg, size_t msg_len) {
  const int64_t H = a->src->shape[1];
  const size_t rb = row_bytes(a->src);
  int64_t i, h, t;
  (void)msg, (void)msg_len;
  for (i = 0; i < a->block_count; ++i) {
    const kvlab_seq_block* k = &a->blocks[i];
    for (h = 0; h < H; ++h)
      for (t = 0; t < k->length; ++t)
        memcpy(row_at(a->dst, k->dst_batch, h, k->dst_seq + t), row_at(a->src, k->src_batch, h, k->src_seq + t), rb);
  }
  return KVLAB_PLUGIN_OK;
}

static int32_t kv_roll(const kvlab_kv_roll_args* a, char* msg, size_t msg_len) {
  const int64_t B = a->src->shape[0], H = a->src->shape[1], L = a->src->shape[2];
  const int32_t* shifts = (const int32_t*)a->shifts->data;
  const size_t rb = row_bytes(a->src);
  int64_t b, h, i;
  (void)msg, (void)msg_len;
  if (L == 0) return KVLAB_PLUGIN_OK;
  for (b = 0; b < B; ++b) {
    const int64_t r = ((int64_t)shifts[b] % L + L) % L; /* mathematical mod */
    for (h = 0; h < H; ++h)
      for (i = 0; i < L; ++i) memcpy(row_at(a->dst, b, h, i), row_at(a->src, b, h, (i - r + L) % L), rb);
  }
  return KVLAB_PLUGIN_OK;
}

static int32_t kv_snapshot(const kvlab_kv_snapshot_args* a, char* msg, size_t msg_len) {
  const size_t bytes = (size_t)numel(a->src) * dtype_size(a->src->dtype);
  (void)msg, (void)msg_len;
  if (bytes > 0) memcpy(a->dst->data, a->src->data, bytes);
  return KVLAB_PLUGIN_OK;
}

/* ---- RoPE, f32: positions, angles and products in double, one rounding ------------ */

static int32_t rope(const kvlab_rope_args* a, char* msg, size_t msg_len) {
  const kvlab_tensor* x = a->x;
  const int64_t batch = x->shape[0], seq = x->shape[x->rank - 2], d = x->shape[x->rank - 1];
  const int64_t rows = numel(x) / d;
  const int half = a->dims / 2;
  const float* in = (const float*)x->data;
#if KVLAB_EXAMPLE_CRASH
  if (seq == 3) {
    volatile float* nowhere = NULL;
    *nowhere = 1.0f;
  }
#endif
  float* out = (float*)a->out->data;
  const int32_t* per_row = a->per_row_offsets != NULL ? (const int32_t*)a->per_row_offsets->data : NULL;
  double inv_freq[4096];
  int64_t r;
  int i;
  if (x->dtype != KVLAB_DTYPE_F32) return unsupported(msg, msg_len, "the example rope is f32 only");
  if (a->mlx_arithmetic) return unsupported(msg, msg_len, "the example rope has no MLX arithmetic");
  if (half > 4096) return unsupported(msg, msg_len, "the example rope takes dims <= 8192");
  if (rows == 0) return KVLAB_PLUGIN_OK;
  for (i = 0; i < half; ++i)
    inv_freq[i] = a->freqs != NULL ? 1.0 / (double)a->freqs[i] : pow((double)a->base, -2.0 * i / a->dims);
  for (r = 0; r < rows; ++r) {
    const int64_t b = r / (rows / batch), t = r % seq;
    const int64_t offset = (per_row != NULL ? per_row[b] : a->offset) + (KVLAB_EXAMPLE_BUG ? 1 : 0);
    const double pos = (double)a->scale * (double)(t + offset);
    const float* xr = in + r * d;
    float* o = out + r * d;
    for (i = 0; i < half; ++i) {
      const int64_t i1 = a->traditional ? 2 * i : i, i2 = a->traditional ? 2 * i + 1 : i + half;
      const double theta = pos * inv_freq[i];
      const double c = cos(theta), s = sin(theta);
      const double x1 = xr[i1], x2 = xr[i2];
      o[i1] = (float)(x1 * c - x2 * s);
      o[i2] = (float)(x1 * s + x2 * c);
    }
    memcpy(o + a->dims, xr + a->dims, (size_t)(d - a->dims) * sizeof(float));
  }
  return KVLAB_PLUGIN_OK;
}

/* ---- affine dequantize, f32: code·scale then + bias in f32, never fused ------------ */

static int32_t dequantize(const kvlab_dequantize_args* a, char* msg, size_t msg_len) {
  const kvlab_quantized* q = a->in;
  const int64_t words = q->wq.shape[q->wq.rank - 1];
  const int64_t d = a->out->shape[a->out->rank - 1];
  const int64_t rows = d > 0 ? numel(a->out) / d : 0;
  const int64_t groups = d / q->group_size;
  const uint32_t mask = (1u << q->bits) - 1u;
  const uint32_t* wq = (const uint32_t*)q->wq.data;
  const float* scales = (const float*)q->scales.data;
  const float* biases = (const float*)q->biases.data;
  float* out = (float*)a->out->data;
  int64_t r, i;
  if (q->mode != KVLAB_QUANT_AFFINE) return unsupported(msg, msg_len, "the example dequantize is affine only");
  if (q->scales.dtype != KVLAB_DTYPE_F32 || a->out->dtype != KVLAB_DTYPE_F32)
    return unsupported(msg, msg_len, "the example dequantize takes f32 scales and output only");
  for (r = 0; r < rows; ++r) {
    for (i = 0; i < d; ++i) {
      const int64_t bit = i * q->bits, w = bit / 32, shift = bit % 32;
      uint64_t pair = wq[r * words + w];
      uint32_t code;
      float scale, bias, v;
      if (shift + q->bits > 32) pair |= (uint64_t)wq[r * words + w + 1] << 32;
      code = (uint32_t)(pair >> shift) & mask;
      scale = scales[r * groups + i / q->group_size];
      bias = biases[r * groups + i / q->group_size];
      v = (float)code * scale;
      v = v + bias;
      out[r * d + i] = v;
    }
  }
  return KVLAB_PLUGIN_OK;
}

/* ---- the table ---------------------------------------------------------------------- */

static const kvlab_plugin_v1 table = {
    KVLAB_PLUGIN_ABI_VERSION,
#if KVLAB_EXAMPLE_BUG
    "example-c-buggy",
#elif KVLAB_EXAMPLE_CRASH
    "example-c-crashing",
#else
    "example-c",
#endif
    NULL,           /* quantize */
    dequantize,     /* dequantize */
    rope,           /* rope */
    NULL,           /* sdpa */
    NULL,           /* quantized_sdpa */
    NULL,           /* turboquant_encode */
    NULL,           /* turboquant_decode */
    kv_scatter,     /* kv_scatter */
    kv_gather,      /* kv_gather */
    kv_copy_blocks, /* kv_copy_blocks */
    kv_roll,        /* kv_roll */
    NULL,           /* kv_append_advance */
    kv_snapshot,    /* kv_snapshot */
};

KVLAB_EXPORT const kvlab_plugin_v1* kvlab_plugin_entry(void) { return &table; }
