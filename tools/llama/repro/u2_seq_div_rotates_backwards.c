/* U2 (harness/known/llama.cpp-cells.adapter): llama_memory_seq_div records the K-shift with
 * the wrong sign. llama_kv_cells::pos_div adds p_old - p_new to the cell's pending shift,
 * where pos_add adds p_new - p_old, and the K-shift rotates each key by its pending shift;
 * so a key moved from p to p/d is rotated to p + (p - p/d) instead of p/d.
 * seq_div(0, 0, 2, 2) moves position 1 to 0 and leaves 0; seq_add(0, 1, 2, -1) sets the
 * same positions. The next token's logits must be the same either way. Exit 0 while the
 * divergence reproduces. Build: tools/llama/repro.sh. */
#include "common.h"

static int run(struct llama_model* model, int use_div, float* out, int vocab) {
  struct llama_context* ctx = open_context(model);
  float* tmp = malloc(sizeof(float) * (size_t)vocab);
  int rc = decode(ctx, 0, 0, 3, 5, tmp, vocab);  /* positions 0, 1, 2 */
  if (use_div) llama_memory_seq_div(llama_get_memory(ctx), 0, 0, 2, 2);
  else llama_memory_seq_add(llama_get_memory(ctx), 0, 1, 2, -1);
  if (!rc) rc = decode(ctx, 0, 3, 1, 9, out, vocab);  /* positions held: 0, 0, 2; next is 3 */
  free(tmp);
  llama_free(ctx);
  return rc;
}

int main(int argc, char** argv) {
  struct llama_model* model = open_model(argc, argv);
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  float* a = malloc(sizeof(float) * (size_t)vocab);
  float* b = malloc(sizeof(float) * (size_t)vocab);
  if (run(model, 1, a, vocab) || run(model, 0, b, vocab)) return 2;
  const double d = max_abs_diff(a, b, vocab);
  printf("U2 %s: seq_div and the seq_add giving the same positions differ by max |dlogit| %.3g\n",
         d > 1e-3 ? "reproduces" : "does not reproduce", d);
  llama_model_free(model);
  return d > 1e-3 ? 0 : 1;
}
