/* Vectors from ggml's own C reference (ggml/src/ggml-quants.c: quantize_row_<fmt>_ref,
 * dequantize_row_<fmt>), in the format of tools/ggml/gguf_vectors.py, for
 * tests/unit/test_ggml_gguf_vectors.cc (KVLAB_GGML_VECTORS=...). Built and run by
 * tools/ggml/c_vectors.sh against a llama.cpp source tree; not part of kvlab's build.
 *
 * stdin: a gguf_vectors.txt. Each distinct input of its `q8_0 q` lines is quantized and
 * dequantized in all six formats (`q` lines); each `d` line's block is dequantized again. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

/* ggml-quants.c refers to these from ggml.c; the functions used here never call them. */
void ggml_abort(const char* file, int line, const char* fmt, ...) {
  fprintf(stderr, "ggml_abort at %s:%d\n", file, line);
  abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
const char* ggml_type_name(enum ggml_type type) { (void)type; return "?"; }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }

static void print_f32(const float* y) {
  for (int i = 0; i < 32; ++i) {
    uint32_t u;
    memcpy(&u, &y[i], 4);
    printf(" %08x", u);
  }
}

static void print_bytes(const void* p, size_t n) {
  printf(" ");
  for (size_t i = 0; i < n; ++i) printf("%02x", ((const uint8_t*)p)[i]);
}

/* Block bytes → f32 through ggml's dequantizer; returns the block size, 0 if unknown. */
static size_t dequantize(const char* mode, const uint8_t* block, float* y) {
  if (!strcmp(mode, "q8_0")) { dequantize_row_q8_0((const block_q8_0*)block, y, 32); return sizeof(block_q8_0); }
  if (!strcmp(mode, "q4_0")) { dequantize_row_q4_0((const block_q4_0*)block, y, 32); return sizeof(block_q4_0); }
  if (!strcmp(mode, "q4_1")) { dequantize_row_q4_1((const block_q4_1*)block, y, 32); return sizeof(block_q4_1); }
  if (!strcmp(mode, "q5_0")) { dequantize_row_q5_0((const block_q5_0*)block, y, 32); return sizeof(block_q5_0); }
  if (!strcmp(mode, "q5_1")) { dequantize_row_q5_1((const block_q5_1*)block, y, 32); return sizeof(block_q5_1); }
  if (!strcmp(mode, "iq4_nl")) { dequantize_row_iq4_nl((const block_iq4_nl*)block, y, 32); return sizeof(block_iq4_nl); }
  return 0;
}

static void quantize_all(const float* x) {
  static const char* modes[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"};
  for (int m = 0; m < 6; ++m) {
    uint8_t block[64];
    memset(block, 0, sizeof block);
    switch (m) {
      case 0: quantize_row_q8_0_ref(x, (block_q8_0*)block, 32); break;
      case 1: quantize_row_q4_0_ref(x, (block_q4_0*)block, 32); break;
      case 2: quantize_row_q4_1_ref(x, (block_q4_1*)block, 32); break;
      case 3: quantize_row_q5_0_ref(x, (block_q5_0*)block, 32); break;
      case 4: quantize_row_q5_1_ref(x, (block_q5_1*)block, 32); break;
      case 5: quantize_row_iq4_nl_ref(x, (block_iq4_nl*)block, 32); break;
    }
    float y[32];
    const size_t size = dequantize(modes[m], block, y);
    printf("%s q", modes[m]);
    print_f32(x);
    print_bytes(block, size);
    print_f32(y);
    printf("\n");
  }
}

int main(void) {
  static char line[8192];
  while (fgets(line, sizeof line, stdin)) {
    char mode[16], kind[4];
    int used = 0;
    if (sscanf(line, "%15s %3s%n", mode, kind, &used) != 2) continue;
    const char* p = line + used;
    if (!strcmp(kind, "q")) {
      if (strcmp(mode, "q8_0") != 0) continue;  /* each input once */
      float x[32];
      for (int i = 0; i < 32; ++i) {
        unsigned u;
        int n = 0;
        sscanf(p, " %x%n", &u, &n);
        p += n;
        uint32_t bits = u;
        memcpy(&x[i], &bits, 4);
      }
      quantize_all(x);
    } else {
      char hex[256];
      int n = 0;
      sscanf(p, " %255s%n", hex, &n);
      uint8_t block[128];
      const size_t size = strlen(hex) / 2;
      for (size_t i = 0; i < size; ++i) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        block[i] = (uint8_t)v;
      }
      float y[32];
      if (dequantize(mode, block, y) != size) continue;
      printf("%s d %s", mode, hex);
      print_f32(y);
      printf("\n");
    }
  }
  return 0;
}
