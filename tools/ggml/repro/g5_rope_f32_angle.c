/* G5 (harness/known/ggml): ggml_rope_ext on the CPU forms each angle in f32 as
 * p·s^i, s = powf(base, −2/dims) multiplied in once per pair (ggml_rope_cache_init), so
 * the angle's error grows with the position p and the pair index i; kvlab's oracle forms
 * θ = p·base^(−2i/dims) in double and rounds the output once (reference/rope.h). At
 * position 4093, dims 64, base 10000 the rotated pairs are off by ~1e-4 of the values, far beyond
 * f32 rounding. Exit 0 when the divergence reproduces. */
#include <math.h>
#include <stdio.h>

#include <ggml-cpu.h>
#include <ggml.h>

enum { D = 64 };

int main(void) {
  ggml_cpu_init();
  struct ggml_init_params p = {4 * 1024 * 1024, NULL, false};
  struct ggml_context *ctx = ggml_init(p);
  struct ggml_tensor *x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, 1, 1);
  struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
  for (int i = 0; i < D; ++i) ((float *)x->data)[i] = 1.0f;
  ((int *)pos->data)[0] = 4093;
  /* NEOX: pairs (i, i + D/2) */
  struct ggml_tensor *r = ggml_rope_ext(ctx, x, pos, NULL, D, GGML_ROPE_TYPE_NEOX, 0, 10000.0f, 1.0f, 0.0f, 1.0f,
                                        0.0f, 0.0f);
  struct ggml_cgraph *g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, r);
  ggml_graph_compute_with_ctx(ctx, g, 1);
  double worst = 0;
  int worst_i = 0;
  for (int i = 0; i < D / 2; ++i) {
    const double theta = 4093.0 * pow(10000.0, -2.0 * i / D);
    const double want = cos(theta) - sin(theta); /* x1·cos − x2·sin with x1 = x2 = 1 */
    const double err = fabs(((float *)r->data)[i] - want);
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  printf("position 4093, dims 64: worst |ggml - exact| = %.3g at pair %d\n", worst, worst_i);
  const int reproduces = worst > 1e-5;
  printf("G5 %s\n", reproduces ? "reproduces: the f32 angle is off by far more than an f32 rounding"
                               : "does not reproduce");
  ggml_free(ctx);
  return reproduces ? 0 : 1;
}
