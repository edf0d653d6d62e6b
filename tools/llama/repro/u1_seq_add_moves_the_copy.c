/* U1 (harness/known/llama.cpp-cells.adapter): llama.cpp keeps one position per cell for
 * every sequence holding it. Sequence 1 gets sequence 0's first 8 cells by
 * llama_memory_seq_cp; a seq_add on sequence 0 alone then moves sequence 1's keys too:
 * sequence 1's largest position goes from 7 to 12, and what its next token attends to
 * changes (a decode of sequence 1 at position 8 is even refused). An operation on one
 * sequence must not change another's positions (sequence isolation). Two contexts, the
 * same calls but the seq_add; exit 0 while the divergence reproduces.
 * Build: tools/llama/repro.sh. */
#include "common.h"

static int positions_of_1(struct llama_model* model, int shift, int* pos_max) {
  struct llama_context* ctx = open_context(model);
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  float* tmp = malloc(sizeof(float) * (size_t)vocab);
  const int rc = decode(ctx, 0, 0, 10, 3, tmp, vocab);          /* sequence 0: positions 0..9 */
  llama_memory_seq_cp(llama_get_memory(ctx), 0, 1, 0, 8);      /* sequence 1: 0..7, shared cells */
  if (shift) llama_memory_seq_add(llama_get_memory(ctx), 0, 4, -1, 5); /* sequence 0 only: 4.. by +5 */
  *pos_max = llama_memory_seq_pos_max(llama_get_memory(ctx), 1);
  printf("  %-26s sequence 1 holds positions up to %d\n", shift ? "after seq_add(0, 4, -1, 5):" : "without it:", *pos_max);
  free(tmp);
  llama_free(ctx);
  return rc;
}

int main(int argc, char** argv) {
  struct llama_model* model = open_model(argc, argv);
  int plain = 0, shifted = 0;
  if (positions_of_1(model, 0, &plain) || positions_of_1(model, 1, &shifted)) return 2;
  printf("U1 %s: a seq_add on sequence 0 moved sequence 1's largest position from %d to %d\n",
         plain != shifted ? "reproduces" : "does not reproduce", plain, shifted);
  llama_model_free(model);
  return plain != shifted ? 0 : 1;
}
