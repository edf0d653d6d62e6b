// The dense parts of the tiny golden models, as plain host loops: f32 storage, every
// sum and every fused chain of element-wise math in double, rounded once to f32 (the
// oracle's style). Where mlx-lm issues two separate array ops (e.g. gelu_approx, then a
// multiply), each is its own function here, so both sides round at the same points.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/tensor.h"

namespace kvlab::golden::dense {

// `rows` row vectors of `width` f32 values, row-major: the hidden states of B·L tokens,
// or the same memory read as B·L·H head vectors (reshaped()).
struct Mat {
  std::int64_t rows = 0, width = 0;
  std::vector<float> v;

  Mat() = default;
  Mat(std::int64_t r, std::int64_t w);
  float* row(std::int64_t r) { return v.data() + r * width; }
  const float* row(std::int64_t r) const { return v.data() + r * width; }
  // The same values read with another row width (width must divide the element count).
  Mat reshaped(std::int64_t new_width) const;
  // Columns [begin, begin + count) of every row.
  Mat columns(std::int64_t begin, std::int64_t count) const;
};

// y = x Wᵀ with W (out, in) f32, as mlx.nn.Linear stores it (no bias).
Mat linear(const Mat& x, const Tensor& w);
// Rows of `table` (vocab, dim) picked by token id; an id outside [0, vocab) is an Error.
Mat embedding(std::span<const std::int32_t> tokens, const Tensor& table);
// mx.fast.rms_norm over each row: x / sqrt(mean(x²) + eps) · weight. weight nullptr:
// mlx-lm's RMSNormNoScale (gemma4's v_norm).
Mat rms_norm(const Mat& x, const Tensor* weight, float eps);
// mlx.nn.silu(gate) · x (mlx-lm's swiglu).
Mat swiglu(const Mat& gate, const Mat& x);
// mlx.nn.gelu_approx: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), of one value.
double gelu_approx(double x);
Mat gelu_approx(const Mat& x);
// gelu_approx(gate) · x (gemma4's geglu, one compiled mlx function: one rounding).
Mat geglu(const Mat& gate, const Mat& x);
// Element-wise f32 ops as mlx does them (each result rounded once).
void add_into(Mat& acc, const Mat& x);        // acc += x
Mat multiply(const Mat& a, const Mat& b);      // a · b
void scale_by(Mat& x, float s);                // x · s
// tanh(x / cap) · cap, mlx-lm's logit_softcap.
void softcap(Mat& x, float cap);

}  // namespace kvlab::golden::dense
