#version 450
// Attention over float K/V (reference/sdpa.h): the pass of sdpa_core.glsl.
#define KVLAB_QUANTIZED 0
#include "sdpa_core.glsl"
