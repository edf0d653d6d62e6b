#version 450
// Attention over affine-packed K/V (reference/quantized_sdpa.h): the pass of
// sdpa_core.glsl reading codes, scales and biases directly (no dequantized copy).
#define KVLAB_QUANTIZED 1
#include "sdpa_core.glsl"
