/* G4 (harness/known/ggml): ggml_flash_attn_ext over a block-quantized K (q8_0, q4_0, q4_1,
 * q5_0, q5_1, iq4_nl) on the CPU quantizes the query too: the K·q dot runs as K's vec_dot
 * against q converted to K's vec_dot_type, q8_0 (q8_1 for q4_1/q5_1) — 8 bits per 32
 * elements, ~2^-8 of a block's largest |q|. kvlab's contract is attention over the
 * dequantized K in f32 (reference/quantized_sdpa.h). Here one query over two q8_0 keys:
 * ggml's result against the same attention over the keys' dequantized f32 values (ggml's
 * f32 path, which keeps q in f32). Exit 0 when the divergence reproduces. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <ggml-cpu.h>
#include <ggml.h>

enum { D = 32 };

static float attend(enum ggml_type kt, const void *kdata, const float *q) {
  struct ggml_init_params p = {4 * 1024 * 1024, NULL, false};
  struct ggml_context *ctx = ggml_init(p);
  struct ggml_tensor *tq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, 1, 1);
  struct ggml_tensor *tk = ggml_new_tensor_4d(ctx, kt, D, 2, 1, 1);
  struct ggml_tensor *tv = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 2, 1, 1);
  memcpy(tq->data, q, sizeof(float) * D);
  memcpy(tk->data, kdata, ggml_nbytes(tk));
  ((float *)tv->data)[0] = 0.0f;
  ((float *)tv->data)[1] = 1.0f;  /* the output is the second key's softmax weight */
  struct ggml_tensor *r = ggml_flash_attn_ext(ctx, tq, tk, tv, NULL, 1.0f, 0.0f, 0.0f);
  struct ggml_cgraph *g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, r);
  ggml_graph_compute_with_ctx(ctx, g, 1);
  const float out = ((float *)r->data)[0];
  ggml_free(ctx);
  return out;
}

int main(void) {
  ggml_cpu_init();
  float q[D], k[2 * D], kdq[2 * D];
  for (int i = 0; i < D; ++i) {
    q[i] = sinf(0.7f * (float)i + 0.3f) * 1.3f;
    k[i] = cosf(0.45f * (float)i);
    k[D + i] = sinf(0.9f * (float)i + 1.0f);
  }
  unsigned char kq8[2 * 34];
  ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float(k, kq8, 2 * D);
  ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(kq8, kdq, 2 * D);
  const float blocks = attend(GGML_TYPE_Q8_0, kq8, q), f32 = attend(GGML_TYPE_F32, kdq, q);
  double s0 = 0, s1 = 0;
  for (int i = 0; i < D; ++i) {
    s0 += (double)q[i] * kdq[i];
    s1 += (double)q[i] * kdq[D + i];
  }
  const double exact = 1.0 / (1.0 + exp(s0 - s1));
  printf("q8_0 K: %.9g   f32 K (same values): %.9g   exact: %.9g\n", blocks, f32, exact);
  printf("relative error: q8_0 K %.3g, f32 K %.3g\n", fabs(blocks - exact) / exact, fabs(f32 - exact) / exact);
  const int reproduces = fabs(blocks - exact) > 1e-4 * exact && fabs(f32 - exact) < 1e-5 * exact;
  printf("G4 %s\n", reproduces ? "reproduces: a q8_0 K quantizes q, the f32 path does not" : "does not reproduce");
  return reproduces ? 0 : 1;
}
