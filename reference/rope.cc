#include "reference/rope.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kvlab/error.h"
#include "reference/mlx_math.h"

namespace kvlab::ref {

namespace {

// The oracle works in double and must round each output exactly once to the storage
// dtype. TensorView::store() takes a float, so a plain double -> float -> f16/bf16 path
// would round twice and can land one ulp off when the float lands on an f16/bf16 tie.
// Rounding the double to float with round-to-odd first (inexact results keep an odd
// last bit, so they can never look like a tie) makes the second RNE step give the
// correctly rounded double -> f16/bf16 result: float has >= 2 more significand bits
// than either, over the whole range f16/bf16 can represent.
float narrow_for_dtype(double v, DType dtype) {
  const float nearest = static_cast<float>(v);
  if (dtype == DType::f32 || std::isnan(v) || static_cast<double>(nearest) == v) return nearest;
  if ((std::bit_cast<std::uint32_t>(nearest) & 1u) != 0) return nearest;
  // The other float bracketing v has the odd bit pattern (neighbours alternate parity).
  return std::nextafter(nearest, v > static_cast<double>(nearest) ? std::numeric_limits<float>::infinity()
                                                                  : -std::numeric_limits<float>::infinity());
}

bool bytes_overlap(const std::byte* a, std::size_t a_len, const std::byte* b, std::size_t b_len) {
  if (a_len == 0 || b_len == 0) return false;
  // std::less gives a total order even for pointers into unrelated objects.
  const std::less<const std::byte*> lt;
  return lt(a, b + b_len) && lt(b, a + a_len);
}

// MLX 0.32.4's CPU graph (mlx/fast.cpp's fallback): positions f32(t) + f32(offset), times
// scale; inverse frequencies MLX's exp(−i · (logf(base)/half)) (or 1/freqs); angles, all
// in f32; MLX's cos and sin rounded to T; each product and the sum or difference
// rounded to T (reference/mlx_math.h).
void rope_row_mlx(const ConstTensorView& x, const RopeParams& params, std::int64_t offset, std::int64_t t,
                  std::int64_t base_index, const TensorView& out) {
  const DType dt = x.dtype;
  const int half = params.dims / 2;
  const float pos = (static_cast<float>(t) + static_cast<float>(offset)) * params.scale;
  const float ln_step = std::log(params.base) / static_cast<float>(half);
  const auto in_t = [dt](float v) { return round_to_dtype(v, dt); };
  for (int i = 0; i < half; ++i) {
    const float inv = params.freqs.empty() ? mlx_exp(static_cast<float>(-i) * ln_step)
                                           : 1.0f / params.freqs[static_cast<std::size_t>(i)];
    const float theta = pos * inv;
    const float c = in_t(mlx_cos(theta)), s = in_t(mlx_sin(theta));
    const std::int64_t i1 = params.traditional ? 2 * i : i;
    const std::int64_t i2 = params.traditional ? 2 * i + 1 : i + half;
    const float x1 = x.load(base_index + i1), x2 = x.load(base_index + i2);
    out.store(base_index + i1, in_t(in_t(x1 * c) - in_t(x2 * s)));
    out.store(base_index + i2, in_t(in_t(x1 * s) + in_t(x2 * c)));
  }
}

}  // namespace

void validate_rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
                   const std::optional<ConstTensorView>& per_row_offsets, const ConstTensorView& out) {
  KVLAB_REQUIRE(x.rank() >= 3, shape_mismatch, "rope input has rank ", x.rank(), " (shape ", shape_str(x.shape),
                "), expected rank >= 3 read as (B, *, T, D)");
  require_float(x, "rope input");
  const std::int64_t d = x.dim(-1);
  KVLAB_REQUIRE(params.dims > 0, invalid_argument, "rope dims ", params.dims, " is not positive");
  KVLAB_REQUIRE(params.dims % 2 == 0, invalid_argument, "rope dims ", params.dims, " is odd");
  KVLAB_REQUIRE(params.dims <= d, invalid_argument, "rope dims ", params.dims, " exceeds the feature size D = ", d);
  const auto half = static_cast<std::size_t>(params.dims / 2);
  if (params.freqs.empty()) {
    // base^(-2i/dims) is NaN for a negative base and degenerate for 0 or inf.
    KVLAB_REQUIRE(std::isfinite(params.base) && params.base > 0.0f, invalid_argument, "rope base ", params.base,
                  " is not a positive finite number");
  } else {
    KVLAB_REQUIRE(params.freqs.size() == half, shape_mismatch, "rope freqs has ", params.freqs.size(),
                  " entries, expected dims/2 = ", half);
    for (std::size_t i = 0; i < half; ++i) {
      KVLAB_REQUIRE(std::isfinite(params.freqs[i]) && params.freqs[i] > 0.0f, invalid_argument, "rope freqs[", i,
                    "] = ", params.freqs[i], " is not a positive finite wavelength");
    }
  }
  if (per_row_offsets) {
    // Both forms at once is ambiguous: reject instead of silently dropping the scalar.
    KVLAB_REQUIRE(offset == 0, invalid_argument, "rope got scalar offset ", offset,
                  " together with per_row_offsets; pass one or the other");
    require_dtype(*per_row_offsets, DType::i32, "rope per_row_offsets");
    require_shape(*per_row_offsets, Shape{x.dim(0)}, "rope per_row_offsets");
  }
  require_shape(out, x.shape, "rope out");
  require_dtype(out, x.dtype, "rope out");
  KVLAB_REQUIRE(!bytes_overlap(x.data, x.nbytes(), out.data, out.nbytes()), invalid_argument,
                "rope out overlaps the input x (in-place rope is not supported)");
}


void rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
          const std::optional<ConstTensorView>& per_row_offsets, const TensorView& out) {
  validate_rope(x, params, offset, per_row_offsets, out);
  const std::int64_t batch = x.dim(0), seq = x.dim(-2), d = x.dim(-1);
  const std::int64_t rows = x.numel() / d;  // d >= dims > 0 after validation
  if (rows == 0) return;
  const std::int64_t rows_per_batch = rows / batch;  // the (*, T) rows of one batch row

  // Offsets are read up front so that nothing written to out can change a position.
  std::vector<std::int64_t> row_offset(static_cast<std::size_t>(batch), offset);
  if (per_row_offsets) {
    for (std::int64_t b = 0; b < batch; ++b) row_offset[static_cast<std::size_t>(b)] = per_row_offsets->load_int(b);
  }

  const int half = params.dims / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) {
    inv_freq[static_cast<std::size_t>(i)] =
        params.freqs.empty()
            ? std::pow(static_cast<double>(params.base), -2.0 * i / params.dims)
            : 1.0 / static_cast<double>(params.freqs[static_cast<std::size_t>(i)]);
  }

  const std::size_t elem = dtype_size(x.dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t b = r / rows_per_batch;
    const std::int64_t t = r % seq;  // rows run over (B, *, T) in row-major order, so T is innermost
    const double pos = static_cast<double>(params.scale) *
                       static_cast<double>(t + row_offset[static_cast<std::size_t>(b)]);
    const std::int64_t base_index = r * d;
    if (params.mlx_arithmetic) {
      rope_row_mlx(x, params, row_offset[static_cast<std::size_t>(b)], t, base_index, out);
    }
    for (int i = 0; i < half && !params.mlx_arithmetic; ++i) {
      // Which two features form pair i is the only difference between the layouts.
      const std::int64_t i1 = params.traditional ? 2 * i : i;
      const std::int64_t i2 = params.traditional ? 2 * i + 1 : i + half;
      const double theta = pos * inv_freq[static_cast<std::size_t>(i)];
      const double c = std::cos(theta), s = std::sin(theta);
      const double x1 = x.load(base_index + i1), x2 = x.load(base_index + i2);
      out.store(base_index + i1, narrow_for_dtype(x1 * c - x2 * s, x.dtype));
      out.store(base_index + i2, narrow_for_dtype(x1 * s + x2 * c, x.dtype));
    }
    // The tail is copied as bytes, not load()/store(): that keeps it bit-exact, NaN
    // payloads included, whatever the dtype.
    const auto tail_begin = static_cast<std::size_t>(base_index + params.dims) * elem;
    std::memcpy(out.data + tail_begin, x.data + tail_begin, static_cast<std::size_t>(d - params.dims) * elem);
  }
}

Tensor rope(const Tensor& x, const RopeParams& params, std::int32_t offset) {
  Tensor out(x.dtype(), x.shape());
  rope(x.view(), params, offset, std::nullopt, out.view());
  return out;
}

Tensor rope(const Tensor& x, const RopeParams& params, const Tensor& per_row_offsets) {
  Tensor out(x.dtype(), x.shape());
  rope(x.view(), params, 0, per_row_offsets.view(), out.view());
  return out;
}

}  // namespace kvlab::ref
