// Parameters of the attention-side kernels, shared by the oracle and every backend.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kvlab {

// RoPE (docs/kernels.md §RoPE). Positions are scale·(t + offset_b); pairs are (2i, 2i+1) when
// `traditional`, else (i, i + dims/2). Features [dims, D) pass through.
struct RopeParams {
  int dims = 0;             // rotary dims: positive, even, <= D
  bool traditional = false;
  float base = 10000.0f;    // used when freqs is empty
  float scale = 1.0f;
  std::vector<float> freqs; // optional explicit wavelengths, dims/2 of them (θ = pos / freqs[i])
  // false: the contract (double, one rounding). true: MLX 0.32.4's CPU arithmetic
  // (reference/rope.h), so a comparison with the real library measures ulps, not the
  // precision MLX chose.
  bool mlx_arithmetic = false;
};

// What SDPA returns for a query row whose every key is masked (docs/kernels.md §Attention: backend
// dependent). zero: MLX's fused vector kernel; mean_of_values: MLX's fallback, which
// fills masked scores with finfo.min and so averages V uniformly.
enum class FullyMaskedRow : std::uint8_t { zero, mean_of_values };

enum class MaskKind : std::uint8_t {
  none,      // every key visible
  causal,    // lower-right aligned: key j visible to query i iff j <= i + (Lk - Lq)
  boolean,   // explicit array, nonzero = keep (u8)
  additive,  // explicit array added to the scores (float dtype; -inf hides)
};

// Structured causal masks carry their options here; array masks travel as a tensor
// argument of shape (1|B, 1|Hq, Lq, Lk) beside this struct.
struct MaskSpec {
  MaskKind kind = MaskKind::none;
  // causal only. window W > 0: a query at position p also needs j > p - W, so it sees
  // exactly min(W, p+1) keys (mlx-lm#390). 0 = unbounded.
  int window = 0;
  std::vector<std::int32_t> left_padding;   // causal only: keys j < left_padding[b] hidden
  std::vector<std::int32_t> right_padding;  // causal only: keys j >= Lk - right_padding[b] hidden
};

struct AttentionParams {
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: s = softcap·tanh(s/softcap) after scaling, before masking
  MaskSpec mask;
  FullyMaskedRow fully_masked = FullyMaskedRow::zero;
};

// One block move of cache data movement: rows [src_seq, src_seq+length) of batch row
// src_batch in the source go to [dst_seq, dst_seq+length) of batch row dst_batch in the
// destination, for every head.
struct SeqBlock {
  std::int64_t src_batch = 0, src_seq = 0;
  std::int64_t dst_batch = 0, dst_seq = 0;
  std::int64_t length = 0;
};

// A TurboQuant MSE codec (docs/turboquant.md §MSE codec) for vectors of `dim` channels (or the
// subset `channels` of a wider vector, for the split codec of fractional bits): a random
// rotation — randomized Hadamard (`signs`, dim a power of two) or a dense orthogonal
// matrix (`rotation`, dim×dim row-major) — and a Lloyd–Max `codebook` of 2^bits levels,
// ascending. Built deterministically by reference/turboquant.h make_turboquant_codec().
struct TurboQuantCodec {
  int dim = 0;
  int bits = 0;
  std::vector<float> signs;          // RHT: ±1, dim entries
  std::vector<float> rotation;       // dense: dim·dim entries (empty for RHT)
  std::vector<float> codebook;       // 2^bits levels, ascending
  std::vector<std::int32_t> channels;  // empty = all channels [0, dim)
};

}  // namespace kvlab
