// Per-target pieces of the fused quantized decode (quantized_decode.h) outside its task
// loop: conversions from the stored dtypes to f32 (scales, biases, queries) and back
// (outputs), and the merge of the flash-decoding partials. Per query row, in chunk
// order: M = max of the chunk maxima (and the sink), L = Σ l_c·e^(m_c − M) (+ e^(sink −
// M)), out = Σ o_c·e^(m_c − M) / L, rounded once to out's dtype, written in element
// order. A row no chunk saw a key of takes the FullyMaskedRow policy; a NaN chunk max
// makes the row NaN.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/simd/quantized_decode.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/quantized_decode_combine.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::qdecode::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace hc = kvlab::simd::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// n stored values (scales, biases, queries) of dtype `dt` → f32, exactly (inf/NaN kept;
// f16/bf16 by the shared conversions of half_convert-inl.h).
void MetaToF32(const std::byte* HWY_RESTRICT src, DType dt, std::size_t n, float* HWY_RESTRICT dst) {
  if (dt == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  hc::HalfRowToF32(reinterpret_cast<const std::uint16_t*>(src), dt == DType::bf16, n, dst);
}

// MetaToF32 for the decode's scales and biases: f16 by vcvtph2ps where F16C exists, which
// quiets a signalling NaN. Every use of a scale or bias in the decode is arithmetic (a NaN
// reaches the outputs quiet either way) or a select that drops it, so only the payload's
// quiet bit could differ, and no output keeps it.
void MetaToF32Quieting(const std::byte* HWY_RESTRICT src, DType dt, std::size_t n, float* HWY_RESTRICT dst) {
  if (dt != DType::f16) return MetaToF32(src, dt, n, dst);
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const auto* p = reinterpret_cast<const std::uint16_t*>(src);
  std::size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hc::LoadF16QuietingNaN(df, p + i), df, dst + i);
  for (; i < n; ++i) dst[i] = f16_bits_to_f32(p[i]);
}

// Rows [0, n) of a (Lk, G) scale/bias array → f32 transposed to [g][ncp], zero padded
// to ncp so whole vectors of keys can be read.
void MetaColumns(const std::byte* src, DType dt, std::size_t n, std::size_t groups, std::size_t ncp,
                 std::vector<float>& convert, float* HWY_RESTRICT dst) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  if (groups == 1) {
    MetaToF32Quieting(src, dt, n, dst);
  } else {
    float* flat = aligned_floats(convert, n * groups);
    MetaToF32Quieting(src, dt, n * groups, flat);
    std::size_t j = 0;
    if (groups == 2) {
      for (; j + N <= n; j += N) {
        VF a, b;
        hn::LoadInterleaved2(df, flat + j * 2, a, b);
        hn::StoreU(a, df, dst + j);
        hn::StoreU(b, df, dst + ncp + j);
      }
    } else if (groups == 4) {
      for (; j + N <= n; j += N) {
        VF a, b, c, e;
        hn::LoadInterleaved4(df, flat + j * 4, a, b, c, e);
        hn::StoreU(a, df, dst + j);
        hn::StoreU(b, df, dst + ncp + j);
        hn::StoreU(c, df, dst + 2 * ncp + j);
        hn::StoreU(e, df, dst + 3 * ncp + j);
      }
    }
#if HWY_TARGET != HWY_SCALAR
    else if (groups == 8) {  // nvfp4 at Dk 128: a key's 8 values as 4 pairs of 64 bits
      const hn::Repartition<std::uint64_t, DF> d64;
      const auto* pairs = reinterpret_cast<const std::uint64_t*>(flat);  // 8 floats a key
      for (; j + N <= n; j += N) {
        hn::Vec<decltype(d64)> lo[4], hi[4];  // pair p of keys [j, j + N/2) and the next N/2
        hn::LoadInterleaved4(d64, pairs + j * 4, lo[0], lo[1], lo[2], lo[3]);
        hn::LoadInterleaved4(d64, pairs + (j + N / 2) * 4, hi[0], hi[1], hi[2], hi[3]);
        for (std::size_t p = 0; p < 4; ++p) {
          const VF a = hn::BitCast(df, lo[p]), b = hn::BitCast(df, hi[p]);
          hn::StoreU(hn::ConcatEven(df, b, a), df, dst + 2 * p * ncp + j);  // low floats: group 2p
          hn::StoreU(hn::ConcatOdd(df, b, a), df, dst + (2 * p + 1) * ncp + j);
        }
      }
    }
#endif
    // The rest a group at a time: each store stream contiguous.
    for (std::size_t g = 0; g < groups; ++g) {
      for (std::size_t k = j; k < n; ++k) dst[g * ncp + k] = flat[k * groups + g];
    }
  }
  for (std::size_t g = 0; g < groups; ++g) std::fill(dst + g * ncp + n, dst + (g + 1) * ncp, 0.0f);
}

// n values rounded to nearest-even in dtype `dt` (kvlab's storage rounding; NaN stays NaN;
// f16/bf16 by the shared conversions of half_convert-inl.h).
void StoreRow(const float* HWY_RESTRICT values, std::size_t n, DType dt, std::byte* dst) {
  if (dt == DType::f32) {
    std::memcpy(dst, values, n * sizeof(float));
    return;
  }
  hc::F32RowToHalf(values, dt == DType::bf16, n, reinterpret_cast<std::uint16_t*>(dst));
}

void Combine(const CombineArgs& args, std::int64_t bk) {
  const DecodePlan& plan = *args.plan;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const auto dv = static_cast<std::size_t>(plan.v.d);
  const auto chunks = static_cast<std::size_t>(plan.chunks);
  const std::int64_t b = bk / plan.hkv, kvh = bk % plan.hkv, r_per_kv = plan.hq / plan.hkv;
  const int vbits = plan.v.lane_order();
  std::vector<float> alpha(chunks), acc(dv), row(dv);
  std::vector<std::size_t> element(dv);  // lane order → element order
  for (std::size_t pos = 0; pos < dv; ++pos) {
    element[pos] = static_cast<std::size_t>(lane_to_element(static_cast<std::int64_t>(pos), vbits, N));
  }
  std::vector<double> mean;
  for (std::int64_t rho = 0; rho < plan.rows; ++rho) {
    const std::int64_t h = kvh * r_per_kv + rho / plan.lq, i = rho % plan.lq;
    const auto out_row = static_cast<std::size_t>((b * plan.hq + h) * plan.lq + i);
    std::byte* dst = args.out + out_row * dv * dtype_size(args.out_dtype);
    float m = -INFINITY;
    bool nan = false;
    for (std::size_t c = 0; c < chunks; ++c) {
      const float mc = plan.part_max[(static_cast<std::size_t>(bk) * chunks + c) * static_cast<std::size_t>(plan.rows) +
                                     static_cast<std::size_t>(rho)];
      alpha[c] = mc;
      if (std::isnan(mc)) nan = true;
      else m = std::max(m, mc);
    }
    if (nan) {
      std::fill(row.begin(), row.end(), std::numeric_limits<float>::quiet_NaN());
      StoreRow(row.data(), dv, args.out_dtype, dst);
      continue;
    }
    if (m == -INFINITY) {  // every key hidden: the policy of the mask alone (sdpa.h)
      if (args.fully_masked == FullyMaskedRow::mean_of_values) {
        if (mean.empty()) mean = mean_of_values(plan, bk);
        for (std::size_t d = 0; d < dv; ++d) row[d] = static_cast<float>(mean[d]);
      } else {
        std::fill(row.begin(), row.end(), 0.0f);
      }
      StoreRow(row.data(), dv, args.out_dtype, dst);
      continue;
    }
    // The sink joins the max and the denominator but carries no value.
    double denominator = 0;
    if (args.sinks != nullptr) {
      const float sink = args.sinks[h];
      m = std::max(m, sink);
      denominator += std::exp(static_cast<double>(sink) - static_cast<double>(m));
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (std::size_t c = 0; c < chunks; ++c) {
      if (alpha[c] == -INFINITY) continue;  // this chunk saw no key of the row; its output is unset
      const std::size_t part = (static_cast<std::size_t>(bk) * chunks + c) * static_cast<std::size_t>(plan.rows) +
                               static_cast<std::size_t>(rho);
      const float a = std::exp(alpha[c] - m);
      denominator += static_cast<double>(a) * static_cast<double>(plan.part_sum[part]);
      const VF va = hn::Set(df, a);
      const float* o = plan.part_out + part * dv;
      for (std::size_t d = 0; d < dv; d += N) {
        hn::StoreU(hn::MulAdd(va, hn::LoadU(df, o + d), hn::LoadU(df, acc.data() + d)), df, acc.data() + d);
      }
    }
    const auto inv = static_cast<float>(1.0 / denominator);
    for (std::size_t pos = 0; pos < dv; ++pos) {
      row[element[pos]] = acc[pos] * inv;
    }
    StoreRow(row.data(), dv, args.out_dtype, dst);
  }
}

std::size_t Lanes() { return hn::Lanes(DF()); }

}  // namespace kvlab::simd::qdecode::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd::qdecode {

HWY_EXPORT(Combine);
HWY_EXPORT(Lanes);
HWY_EXPORT(MetaToF32);
HWY_EXPORT(MetaColumns);

std::size_t lanes() { return HWY_DYNAMIC_DISPATCH(Lanes)(); }
void to_f32(const std::byte* src, DType dtype, std::size_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(MetaToF32)(src, dtype, n, dst);
}
void meta_columns(const std::byte* src, DType dtype, std::size_t n, std::size_t groups, std::size_t ncp,
                  std::vector<float>& convert, float* dst) {
  HWY_DYNAMIC_DISPATCH(MetaColumns)(src, dtype, n, groups, ncp, convert, dst);
}
void combine(const CombineArgs& args, std::int64_t bk) { HWY_DYNAMIC_DISPATCH(Combine)(args, bk); }

}  // namespace kvlab::simd::qdecode
#endif  // HWY_ONCE
