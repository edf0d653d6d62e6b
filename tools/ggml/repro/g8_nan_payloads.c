/* G8 (harness/known/ggml): ggml_cpy between float types does not keep NaN payloads: f32 →
 * f16 writes the canonical 0x7E00 for the f32 NaN 0x7FFBC000 (kvlab keeps its high payload
 * bits: 0x7FDE), and f16 → f32 quiets the signalling NaN 0x7D00 (F16C gives 0x7FE00000,
 * kvlab widens bit for bit: 0x7FA00000). Exit 0 when the divergence reproduces.
 * Build: tools/ggml/repro.sh. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <ggml-cpu.h>
#include <ggml.h>

static void run(enum ggml_type from, const void* src, enum ggml_type to, void* dst) {
  struct ggml_init_params p = {16 * 1024 * 1024, NULL, false};
  struct ggml_context* ctx = ggml_init(p);
  struct ggml_tensor* a = ggml_new_tensor_1d(ctx, from, 1);
  struct ggml_tensor* b = ggml_new_tensor_1d(ctx, to, 1);
  memcpy(a->data, src, ggml_type_size(from));
  struct ggml_tensor* c = ggml_cpy(ctx, a, b);
  struct ggml_cgraph* g = ggml_new_graph(ctx);
  ggml_build_forward_expand(g, c);
  ggml_graph_compute_with_ctx(ctx, g, 1);
  memcpy(dst, b->data, ggml_type_size(to));
  ggml_free(ctx);
}

int main(void) {
  ggml_cpu_init();
  const uint32_t f32_nan = 0x7FFBC000u;
  uint16_t half = 0;
  run(GGML_TYPE_F32, &f32_nan, GGML_TYPE_F16, &half);
  const uint16_t snan = 0x7D00u;
  uint32_t wide = 0;
  run(GGML_TYPE_F16, &snan, GGML_TYPE_F32, &wide);
  printf("f32 0x%08X -> f16 0x%04X (kvlab: 0x7FDE)\n", f32_nan, half);
  printf("f16 0x%04X -> f32 0x%08X (kvlab: 0x7FA00000)\n", snan, wide);
  const int differs = half != 0x7FDE || wide != 0x7FA00000u;
  printf("G8 %s\n", differs ? "reproduces: ggml's conversions change NaN payloads" : "does not reproduce here");
  return differs ? 0 : 1;
}
