#version 450
// Attention over float K/V (reference/sdpa.h): the subgroup build of sdpa_core.glsl
// (tile reductions through subgroup arithmetic); sdpa.comp is its fallback.
#define KVLAB_QUANTIZED 0
#define KVLAB_SUBGROUP 1
#include "sdpa_core.glsl"
