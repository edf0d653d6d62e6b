// Reference TurboQuant MSE codec (docs/turboquant.md §MSE codec; targets docs/turboquant.md §A3,
// §Reference codebooks).
//
// make_turboquant_codec(dim, bits, seed), bits 1..8, dim >= 1:
// - rotation: a randomized Hadamard transform (RHT) when dim is a power of two — signs
//   ±1 from kvlab's own splitmix64 stream seeded with seed + dim·7919 (mlx-vlm's seed
//   derivation; numpy's default_rng stream is NOT reproduced, so signs, and hence codes,
//   differ from mlx-vlm's bit for bit while following the same distribution) — else a
//   dense Haar-orthogonal Q: Householder QR of a (dim, dim) standard-normal matrix from
//   the same stream (Box–Muller), columns multiplied by sign(diag R) (sign 0 -> +1),
//   computed in double and stored as f32 in TurboQuantCodec::rotation.
// - codebook: Lloyd–Max with 2^bits levels for one coordinate of a uniform unit vector
//   in R^dim, density ∝ (1 − x²)^((dim−3)/2) on [−1, 1], quantile init at
//   (k + 0.5)/2^bits. Cell masses come from a 32 768-interval table in θ (x = sin θ, so
//   the density is bounded even for dim 2) and first moments are exact, both continuous
//   in the cell edges; iterated to convergence (≤ 20 000 steps, stop below 1e-12), not
//   mlx-vlm's 100 steps / 1e-6 on a sampled grid, which stalls short of the optimum at
//   4 bits (details in turboquant.cc). Made exactly antisymmetric, ascending, stored f32.
//   dim 1 (a unit vector is ±1) gets evenly spread levels holding ±1.
// Deterministic in (dim, bits, seed) on one platform (libm log/cos/sqrt are used).
//
// turboquant_encode(x, codec, norms, indices):
// - x (..., W) float. codec.channels empty: W == dim and the codec reads every channel;
//   else it reads x[..., channels[j]] for j < dim (split codec; W > max channel).
// - norms: f16, shape (...) or (..., 1) (the cache keeps row-aligned (B, H, L, 1) blocks).
// - indices: u32 (..., ceil(dim·bits/32)), the LSB-first bitstream of
//   docs/quantization.md §Bit packing (reference/bitpack.h), bits past the last code zero.
// - per vector: norm = ‖x‖ accumulated in double and rounded to f32 (mlx computes it in
//   f32: within an ulp), stored f16; u = x / max(norm_f32, 1e-6); y = R u in double
//   (RHT: H(signs ⊙ u)/√dim with an unnormalised fast Walsh–Hadamard transform; dense:
//   y = Q u); idx_d = #{m : y_d > midpoint_m}, midpoint_m = (c_m + c_{m+1})/2 in double
//   from the f32 codebook. The comparison is strict: a tie goes to the lower index.
//
// turboquant_decode(norms, indices, codec, out):
// - out (..., W) float; norms/indices shaped from out's leading axes as above.
// - x̂ = norm_f16 · R⁻¹(codebook[idx]) in double (RHT: signs ⊙ H(y)/√dim; dense: Qᵀ y),
//   rounded once to out.dtype. With codec.channels only those channels of out are
//   written; the others keep their contents (the split codec decodes twice into one out).
//
// Errors (kvlab::Error naming the value): bits outside 1..8, dim < 1, an inconsistent
// codec (codebook size/order, signs not ±1 or dim not a power of two, rotation size,
// both or neither rotation), channel indices out of range or repeated, wrong
// dtypes (x/out float, norms f16, indices u32) or shapes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

// Which rotation a codec uses. automatic = RHT for powers of two, dense otherwise (what
// mlx-vlm does). hadamard / dense force one (tests compare both at the same dim);
// identity is the no-rotation control of docs/turboquant.md §A4, expressed as a dense
// identity matrix so the kernels have no special path.
enum class TurboQuantRotation : std::uint8_t { automatic, hadamard, dense, identity };

TurboQuantCodec make_turboquant_codec(int dim, int bits, std::uint64_t seed);
TurboQuantCodec make_turboquant_codec(int dim, int bits, std::uint64_t seed, TurboQuantRotation rotation);

void turboquant_encode(const ConstTensorView& x, const TurboQuantCodec& codec, const TensorView& norms,
                       const TensorView& indices);
void turboquant_decode(const ConstTensorView& norms, const ConstTensorView& indices, const TurboQuantCodec& codec,
                       const TensorView& out);

// ---- building blocks, exposed for tests and for other backends' set-up -----------------

// The Lloyd–Max levels in double, ascending (the codec stores them rounded to f32).
std::vector<double> turboquant_codebook(int dim, int bits);
// The dense Haar rotation in double, row-major (dim·dim); y = Q u.
std::vector<double> turboquant_haar_rotation(int dim, std::uint64_t seed);
// The RHT sign vector (dim entries of ±1; dim a power of two).
std::vector<float> turboquant_rht_signs(int dim, std::uint64_t seed);
// y = R v and v = R⁻¹ y in place, in double, exactly as encode/decode apply them.
void turboquant_rotate(const TurboQuantCodec& codec, std::span<double> v);
void turboquant_unrotate(const TurboQuantCodec& codec, std::span<double> v);
// Throws invalid_argument naming the inconsistency; `width` > 0 also checks the channel
// subset against a vector of that many channels.
void validate_turboquant_codec(const TurboQuantCodec& codec, std::int64_t width = 0);

}  // namespace kvlab::ref
