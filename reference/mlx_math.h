// MLX's CPU approximations of exp, sin and cos (its SIMD math layer, Cephes polynomials
// evaluated with fused multiply-adds), scalar and bit for bit, for the oracle's `mlx`
// flavours: MLX 0.32.4 computes RoPE's inverse frequencies and angles with them, and
// its results differ from libm's by an ulp or more, which at large positions moves an
// angle by many ulps of the output. Measured against the pinned wheel: identical bits.
#pragma once

namespace kvlab::ref {

float mlx_exp(float x);
// sin/cos of x. MLX sends a whole SIMD vector to libm when any lane exceeds 2^23 in
// magnitude (its range reduction is exact only below); this scalar form does so per
// element, so it can differ from MLX in the last bits for a vector that mixes lanes on
// both sides of 2^23.
float mlx_sin(float x);
float mlx_cos(float x);

}  // namespace kvlab::ref
