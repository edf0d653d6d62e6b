/* Shared by the llama.cpp repros (tools/llama/repro.sh): a context over a GGUF with an f32
 * cache, flash attention off and one unified cell pool, and a decode of tokens of one
 * sequence returning the last token's logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>

static void quiet(enum ggml_log_level level, const char* text, void* user) {
  (void)user;
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static struct llama_context* open_context(struct llama_model* model) {
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  cp.n_batch = cp.n_ubatch = 256;
  cp.n_seq_max = 4;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.kv_unified = true;
  return llama_init_from_model(model, cp);
}

/* Tokens [0, n) of a fixed stream at positions from..from+n-1 of sequence seq; copies the
 * last token's logits (vocab of them) into out. Returns 0 on success. */
static int decode(struct llama_context* ctx, int seq, int from, int n, int first_token, float* out, int vocab) {
  struct llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = (first_token + 37 * i) % vocab;
    b.pos[i] = from + i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = i == n - 1;
  }
  b.n_tokens = n;
  const int rc = llama_decode(ctx, b);
  llama_batch_free(b);
  if (rc != 0) return rc;
  memcpy(out, llama_get_logits_ith(ctx, n - 1), sizeof(float) * (size_t)vocab);
  return 0;
}

static double max_abs_diff(const float* a, const float* b, int n) {
  double m = 0;
  for (int i = 0; i < n; ++i) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

static struct llama_model* open_model(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODEL.gguf (adapters/llama/gguf_model.py of golden llama_dense)\n", argv[0]);
    exit(2);
  }
  llama_log_set(quiet, NULL);
  llama_backend_init();
  struct llama_model* m = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!m) {
    fprintf(stderr, "cannot load %s\n", argv[1]);
    exit(2);
  }
  return m;
}
