// SIMD RoPE (contract: reference/rope.h), within rope's tolerance of the oracle.
//
// Numerics: positions p = scale·(t + offset_b) and angles θ = p·inv_i are computed in
// double exactly as the oracle does, and cos θ / sin θ in double, once per (batch row,
// position, pair) — shared by every head of that position — then rounded to f32. The
// rotation itself is f32: out1 = x1·c − x2·s, out2 = x1·s + x2·c, each product and sum
// rounded separately (-ffp-contract=off, so all targets give identical bits). Against
// the oracle's double math rounded once, the error per output is at most
//   |x1|·|Δc| + |x2|·|Δs|  (c, s rounded to f32: 2^-24 relative each)
//   + 2^-24·(|x1·c| + |x2·s|) (the two products) + 2^-24·|result| (the sum)
//   ≤ 3·2^-24·(|x1| + |x2|) up to second-order terms,
// plus one storage rounding to the output dtype (f16/bf16 outputs are rounded from the
// f32 result, so up to 1 ulp of the dtype instead of the oracle's 0.5). The test checks
// |got − want| ≤ ulp_dtype(want) + 8·2^-24·(|x1| + |x2|).
// Vectorized: the rotation of f32 rows (non-traditional: contiguous halves; traditional:
// LoadInterleaved2/StoreInterleaved2 of the (x[2i], x[2i+1]) pairs), remainders by the
// same f32 ops in scalar. f16/bf16 rows go through an f32 row buffer (exact load(),
// RNE store()). cos/sin stay scalar double (std::cos/std::sin).
#ifndef KVLAB_SIMD_ROPE_COMMON
#define KVLAB_SIMD_ROPE_COMMON
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/rope.h"
#endif  // KVLAB_SIMD_ROPE_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/rope.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rotates the `half` pairs of one f32 row; c/s hold the pair's cos/sin.
void RotateRow(const float* HWY_RESTRICT x, const float* HWY_RESTRICT c, const float* HWY_RESTRICT s,
               std::size_t half, bool traditional, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  if (traditional) {
    for (; i + N <= half; i += N) {
      hn::Vec<decltype(df)> x1, x2;
      hn::LoadInterleaved2(df, x + 2 * i, x1, x2);
      const auto vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
      hn::StoreInterleaved2(hn::Sub(hn::Mul(x1, vc), hn::Mul(x2, vs)), hn::Add(hn::Mul(x1, vs), hn::Mul(x2, vc)), df,
                            out + 2 * i);
    }
    for (; i < half; ++i) {
      const float x1 = x[2 * i], x2 = x[2 * i + 1];
      out[2 * i] = x1 * c[i] - x2 * s[i];
      out[2 * i + 1] = x1 * s[i] + x2 * c[i];
    }
    return;
  }
  for (; i + N <= half; i += N) {
    const auto x1 = hn::LoadU(df, x + i), x2 = hn::LoadU(df, x + half + i);
    const auto vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
    hn::StoreU(hn::Sub(hn::Mul(x1, vc), hn::Mul(x2, vs)), df, out + i);
    hn::StoreU(hn::Add(hn::Mul(x1, vs), hn::Mul(x2, vc)), df, out + half + i);
  }
  for (; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    out[i] = x1 * c[i] - x2 * s[i];
    out[half + i] = x1 * s[i] + x2 * c[i];
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(RotateRow);

namespace {

}  // namespace

void rope(const ConstTensorView& x, const RopeParams& params, std::int32_t offset,
          const std::optional<ConstTensorView>& per_row_offsets, const TensorView& out) {
  ref::validate_rope(x, params, offset, per_row_offsets, out);
  const std::int64_t batch = x.dim(0), seq = x.dim(-2), d = x.dim(-1);
  const std::int64_t rows = x.numel() / d;
  if (rows == 0) return;
  const std::int64_t rows_per_batch = rows / batch;
  const std::int64_t heads = rows_per_batch / seq;  // the * axes between B and T

  std::vector<std::int64_t> row_offset(static_cast<std::size_t>(batch), offset);
  if (per_row_offsets) {
    for (std::int64_t b = 0; b < batch; ++b) row_offset[static_cast<std::size_t>(b)] = per_row_offsets->load_int(b);
  }
  const auto half = static_cast<std::size_t>(params.dims / 2);
  std::vector<double> inv_freq(half);
  for (std::size_t i = 0; i < half; ++i) {
    inv_freq[i] = params.freqs.empty()
                      ? std::pow(static_cast<double>(params.base), -2.0 * static_cast<double>(i) / params.dims)
                      : 1.0 / static_cast<double>(params.freqs[i]);
  }

  const std::size_t elem = dtype_size(x.dtype), n = static_cast<std::size_t>(d);
  const bool is_f32 = x.dtype == DType::f32;
  std::vector<float> cs(half), sn(half), in_f32(is_f32 ? 0 : n), out_f32(is_f32 ? 0 : n);
  // Rows of one batch row run (*, T) with T innermost: for each (b, t) compute cos/sin
  // once and rotate the `heads` rows that share it (stride seq rows).
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const double pos = static_cast<double>(params.scale) *
                         static_cast<double>(t + row_offset[static_cast<std::size_t>(b)]);
      for (std::size_t i = 0; i < half; ++i) {
        const double theta = pos * inv_freq[i];
        cs[i] = static_cast<float>(std::cos(theta));
        sn[i] = static_cast<float>(std::sin(theta));
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t r = b * rows_per_batch + h * seq + t;
        const std::size_t first = static_cast<std::size_t>(r) * n;
        if (is_f32) {
          HWY_DYNAMIC_DISPATCH(RotateRow)(x.as<const float>() + first, cs.data(), sn.data(), half,
                                          params.traditional, out.as<float>() + first);
        } else {
          for (std::size_t i = 0; i < 2 * half; ++i) in_f32[i] = x.load(static_cast<std::int64_t>(first + i));
          HWY_DYNAMIC_DISPATCH(RotateRow)(in_f32.data(), cs.data(), sn.data(), half, params.traditional,
                                          out_f32.data());
          for (std::size_t i = 0; i < 2 * half; ++i) out.store(static_cast<std::int64_t>(first + i), out_f32[i]);
        }
        // Features [dims, D) are copied as bytes (bit-exact, NaN payloads included).
        const std::size_t tail = (first + 2 * half) * elem;
        std::memcpy(out.data + tail, x.data + tail, (n - 2 * half) * elem);
      }
    }
  }
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
