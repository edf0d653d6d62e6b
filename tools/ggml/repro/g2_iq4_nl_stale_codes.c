/* G2 (harness/known/ggml): an iq4_nl block whose largest magnitude is below 1e-15 gets
 * d = 0, and quantize_row_iq4_nl_ref (which the CPU from_float calls) skips its index pass
 * but still packs its codes from the scratch array L — a stack array declared once per row
 * and never cleared: the block's codes are the previous block's (or, for a row's first
 * block, uninitialized stack memory). The values are 0 either way (d = 0); kvlab's oracle
 * writes code 8 there (reference/ggml_quantize.h). A row of a normal block then a tiny one
 * shows it: the tiny block's 16 code bytes equal the first block's.
 * Exit 0 when the divergence reproduces. Build: tools/ggml/repro.sh. */
#include <stdio.h>
#include <string.h>

#include <ggml-cpu.h>
#include <ggml.h>

int main(void) {
  ggml_cpu_init();
  float x[64];
  for (int i = 0; i < 32; ++i) x[i] = (float)(i - 13) * 0.37f;  /* a normal block */
  for (int i = 32; i < 64; ++i) x[i] = (i % 2 ? 1e-20f : -3e-21f);  /* amax < 1e-15 */
  unsigned char out[36];  /* two block_iq4_nl: f16 d, 16 bytes of codes */
  memset(out, 0, sizeof out);
  ggml_get_type_traits_cpu(GGML_TYPE_IQ4_NL)->from_float(x, out, 64);
  printf("block 0 qs[0..3] = 0x%02X 0x%02X 0x%02X 0x%02X\n", out[2], out[3], out[4], out[5]);
  printf("block 1 d = 0x%02X%02X, qs[0..3] = 0x%02X 0x%02X 0x%02X 0x%02X (the oracle: d = 0, every byte 0x88)\n",
         out[19], out[18], out[20], out[21], out[22], out[23]);
  const int stale = out[18] == 0 && out[19] == 0 && memcmp(out + 2, out + 20, 16) == 0 && out[20] != 0x88;
  printf("G2 %s\n", stale ? "reproduces: the tiny block's codes are the previous block's" : "does not reproduce");
  return stale ? 0 : 1;
}
