/* G6 (harness/known/ggml): ggml's CPU flash attention over f16 V keeps the P·V sum of its
 * one-row kernel (decode, and each thread's key chunk of a long decode) in an f16 vector,
 * rounded at every key (ggml_vec_mad_f16 in ggml-cpu/ops.cpp), while the softmax sum S is
 * f32. Under near-uniform attention over a V of nonzero mean the f16 sum stagnates once its
 * ulp exceeds twice the values added (about 8192 for values near 2), while S keeps growing:
 * the output falls far below V's mean. Here 40000 keys, q ~ 0, V in [1, 3] (mean 2): ggml
 * gives ~0.2 on one thread (8192/40000) and ~0.4 on two (a stagnated sum per chunk).
 * Exit 0 when the divergence reproduces. Build: tools/ggml/repro.sh. */
#include <math.h>
#include <stdio.h>

#include <ggml-cpu.h>
#include <ggml.h>

enum { D = 64, L = 40000 };

int main(void) {
  ggml_cpu_init();
  struct ggml_init_params p = {(size_t)32 * 1024 * 1024, NULL, false};
  struct ggml_context *ctx = ggml_init(p);
  struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, 1, 1);
  struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, L, 1, 1);
  struct ggml_tensor *v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, L, 1, 1);
  for (int i = 0; i < D; ++i) ((float *)q->data)[i] = 0.0f;
  double mean = 0;
  for (long i = 0; i < (long)D * L; ++i) {
    const float x = 1.0f + 0.25f * (float)((i * 13) % 9);  /* 1, 1.25, ..., 3 */
    ((ggml_fp16_t *)k->data)[i] = ggml_fp32_to_fp16(0.5f);
    ((ggml_fp16_t *)v->data)[i] = ggml_fp32_to_fp16(x);
    if (i % D == 0) mean += x / L;
  }
  struct ggml_tensor *r = ggml_flash_attn_ext(ctx, q, k, v, NULL, 0.125f, 0.0f, 0.0f);
  struct ggml_cgraph *g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, r);
  ggml_graph_compute_with_ctx(ctx, g, 1);
  const float out = ((float *)r->data)[0];
  printf("uniform attention over %d keys: ggml out[0] = %g, V's mean (the exact output) = %g\n", L, out, mean);
  const int reproduces = fabs(out - mean) > 0.1 * mean;
  printf("G6 %s\n", reproduces ? "reproduces: the f16 P·V sum stagnates" : "does not reproduce");
  ggml_free(ctx);
  return reproduces ? 0 : 1;
}
