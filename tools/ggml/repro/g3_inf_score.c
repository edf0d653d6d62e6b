/* G3 (harness/known/ggml): a +inf attention score (a key holding ±inf) in
 * ggml_flash_attn_ext on the CPU. ggml's online softmax makes the score the new maximum
 * with weight 1 (vs = 1: it never evaluates exp(s − M)), so the row becomes that key's
 * value — the limit of the softmax. kvlab's oracle evaluates e^{s−m} = e^{inf−inf} = NaN
 * (docs/kernels.md §Attention: ±inf in K gives ±inf scores). Here: one query q = [1], two
 * keys k = [+inf], [0.5], values 0.25 and 4: ggml gives 0.25, the oracle NaN.
 * Exit 0 when the divergence reproduces. */
#include <math.h>
#include <stdio.h>

#include <ggml-cpu.h>
#include <ggml.h>

int main(void) {
  ggml_cpu_init();
  struct ggml_init_params p = {16 * 1024 * 1024, NULL, false};
  struct ggml_context *ctx = ggml_init(p);
  struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 1, 1, 1);
  struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 2, 1, 1);
  struct ggml_tensor *v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, 2, 1, 1);
  ((float *)q->data)[0] = 1.0f;
  ((float *)k->data)[0] = INFINITY;
  ((float *)k->data)[1] = 0.5f;
  ((float *)v->data)[0] = 0.25f;
  ((float *)v->data)[1] = 4.0f;
  struct ggml_tensor *r = ggml_flash_attn_ext(ctx, q, k, v, NULL, 1.0f, 0.0f, 0.0f);
  struct ggml_cgraph *g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, r);
  ggml_graph_compute_with_ctx(ctx, g, 1);
  const float out = ((float *)r->data)[0];
  printf("ggml out = %g (the oracle: NaN, from e^(inf - inf))\n", out);
  const int finite = !isnan(out);
  printf("G3 %s\n", finite ? "reproduces: a +inf score gives its key's value, not NaN" : "does not reproduce");
  ggml_free(ctx);
  return finite ? 0 : 1;
}
