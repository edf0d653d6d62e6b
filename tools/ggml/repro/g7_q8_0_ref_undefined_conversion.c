/* G7 (harness/known/ggml): ggml's q8_0 C reference (quantize_row_q8_0_ref, the from_float_ref
 * of ggml_get_type_traits(GGML_TYPE_Q8_0)) on a block of tiny values: d = amax/127 is a
 * subnormal f32, id = 1/d overflows to inf, so every x·id is ±inf and roundf(±inf) is
 * converted to int8, which C leaves undefined. The oracle saturates (±127/−128); ggml as
 * built here gives 0 (x86's cvttss2si yields 0x80000000, whose low byte is 0).
 * Exit 0 when the divergence reproduces. Build: tools/ggml/repro.sh. */
#include <stdio.h>
#include <string.h>

#include <ggml-cpu.h>
#include <ggml.h>

int main(void) {
  ggml_cpu_init();
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * 1e-39f * (float)(i + 1);
  unsigned char ref[34];
  ggml_get_type_traits(GGML_TYPE_Q8_0)->from_float_ref(x, ref, 32);
  const signed char* q = (const signed char*)ref + 2;
  printf("amax 3.2e-38, d = amax/127 = 2.5e-40 (subnormal), id = 1/d = inf\n");
  printf("codes   = %d %d %d %d (the oracle: 127 -128 127 -128)\n", q[0], q[1], q[2], q[3]);
  const int zero = q[0] == 0 && q[1] == 0;
  printf("G7 %s\n", zero ? "reproduces: ±inf converts to code 0" : "does not reproduce here");
  return zero ? 0 : 1;
}
