#version 450
// Attention over affine-packed K/V (reference/quantized_sdpa.h): the subgroup build of
// sdpa_core.glsl (tile reductions through subgroup arithmetic, K codes staged
// coalesced); quantized_sdpa.comp is its fallback.
#define KVLAB_QUANTIZED 1
#define KVLAB_SUBGROUP 1
#include "sdpa_core.glsl"
