/* G1 (harness/known/ggml): ggml's CPU q8_0 quantizer — the from_float of
 * ggml_get_type_traits_cpu(GGML_TYPE_Q8_0), which llama.cpp's K/V cache writes use — is not
 * its own C reference (quantize_row_q8_0_ref, the from_float_ref of ggml_get_type_traits,
 * which kvlab's oracle follows bit for bit). On x86 with AVX/AVX2 it computes
 * id = 127/amax (the reference: 1/(amax/127)) and rounds x·id to nearest even
 * (_MM_ROUND_NEAREST; the reference: roundf, half away from zero). A block holding 127 and
 * 0.5 shows the tie: the reference stores code 1 for 0.5, the CPU quantizer 0.
 * Exit 0 when the divergence reproduces. Build: tools/ggml/repro.sh. */
#include <stdio.h>
#include <string.h>

#include <ggml-cpu.h>
#include <ggml.h>

int main(void) {
  ggml_cpu_init();
  float x[32] = {127.0f, 0.5f, 2.5f, -1.5f};
  unsigned char cpu[34], ref[34];
  memset(cpu, 0, sizeof cpu);
  memset(ref, 0, sizeof ref);
  ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float(x, cpu, 32);
  ggml_get_type_traits(GGML_TYPE_Q8_0)->from_float_ref(x, ref, 32);
  const signed char *qc = (const signed char *)cpu + 2, *qr = (const signed char *)ref + 2;
  printf("x       = 127 0.5 2.5 -1.5\n");
  printf("cpu q   = %d %d %d %d\n", qc[0], qc[1], qc[2], qc[3]);
  printf("ref q   = %d %d %d %d\n", qr[0], qr[1], qr[2], qr[3]);
  const int differs = memcmp(cpu, ref, sizeof cpu) != 0;
  printf("G1 %s\n", differs ? "reproduces: the CPU quantizer's codes differ from quantize_row_q8_0_ref"
                            : "does not reproduce here (no AVX path on this CPU?)");
  return differs ? 0 : 1;
}
