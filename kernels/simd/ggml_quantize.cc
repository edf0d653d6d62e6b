// SIMD ggml block quantize and dequantize, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl
// (contract: reference/ggml_quantize.h), bit-exact with the oracle on every Highway target.
//
// Vectorized, per block of 32: the input row → f32, the block scans (max |x|, min/max),
// the codes (one f32 multiply, add or subtract per oracle operation, in its order;
// -ffp-contract=off), and dequantize's code → value. Scalar, once per block: d, 1/d and
// the f16 roundings of d and m, the latter with the oracle's own ref::ggml_fp16_bits so
// stored scales cannot differ; and the bit packing (affine_pack-inl.h's 8-code chunks).
//
// Exactness argument (the oracle's f32 ops are single correctly rounded operations, so are
// Highway's Mul/Add/Sub and scalar f32 ÷):
// * Scans. ggml's `amax < fabsf(v)` skips NaN and keeps the first element of largest
//   magnitude: the vector max over NaN-zeroed |x|, then the first lane equal to it.
//   q8_0's MAX(a, b) keeps a NaN until the next element replaces it (order-dependent): a
//   block holding a NaN is scanned by that scalar fold. q4_1/q5_1's `v < min`, `v > max`
//   skip NaN (NaN lanes → ±FLT_MAX, the initial values) and keep the first of equal
//   values, which only shows for ±0: a zero min (max) is the block's first zero element.
// * Codes. C's (int8_t) conversion truncates; the oracle gives 0 for NaN and saturates.
//   NaN lanes → 0, then a clamp to the code's range before the truncating conversion:
//   clamping and truncation are monotone and the bounds integers, so this equals
//   saturate-then-clamp. q8_0's roundf (half away from zero) is t = trunc(p) plus
//   copysign(1, p) where |p − t| ≥ 0.5 (p − trunc(p) is exact).
// * iq4_nl's best_index: y ≤ −127 → 0; y ≥ 113 or NaN → 15; else hi = #{table ≤ y} (the
//   binary search's bracket), and lo = hi − 1 wins when (y − v[lo]) < (v[hi] − y). Its
//   Σ (w·v)·x and Σ (w·v)·v are sums in element order: the products are vectors, the two
//   sums of 32 terms scalar in that order (reassociating them would change bits).
// * Dequantize: code·d is exact in f32 (and d·table[c]), then + m (q4_1/q5_1) as its own
//   rounding, then one RNE rounding to out.dtype (half_convert-inl.h's exact conversions).
#ifndef KVLAB_SIMD_GGML_COMMON
#define KVLAB_SIMD_GGML_COMMON
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "reference/ggml_quantize.h"

namespace kvlab::simd::ggml_detail {

constexpr std::size_t kBlock = ref::kGgmlBlock;
// Rows per parallel task: a fixed split (every op is exact, so it cannot change bits).
constexpr std::int64_t kRowsPerTask = 64;

// What a row's kernel needs besides the data.
struct RowJob {
  QuantMode mode = QuantMode::q8_0;
  std::int64_t blocks = 0;  // per row
  DType out_dtype = DType::f32;  // dequantize
};

}  // namespace kvlab::simd::ggml_detail
#endif  // KVLAB_SIMD_GGML_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/ggml_quantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/affine_pack-inl.h"
#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace gd = kvlab::simd::ggml_detail;

namespace ggml_impl {

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
constexpr std::size_t kBlock = gd::kBlock;

// Lanes (clamped into [0, 255] or masked to a byte by the caller) → one byte each.
void StoreCodes(VI c, std::uint8_t* HWY_RESTRICT out) {
  const hn::Rebind<std::uint8_t, DF> du8;
  hn::StoreU(hn::DemoteTo(du8, c), du8, out);
}

// C's float → integer conversion as the oracle defines it (NaN → 0, saturated), clamped
// to [lo, hi] ⊆ the integer type: NaN zeroed, clamped, then truncated (ConvertTo).
VI TruncClamp(VF v, float lo, float hi) {
  const DF df;
  const VF clean = hn::IfThenZeroElse(hn::IsNaN(v), v);
  return hn::ConvertTo(DI(), hn::Min(hn::Max(clean, hn::Set(df, lo)), hn::Set(df, hi)));
}

// max |x| over the block with NaN skipped (ggml's `amax < fabsf(v)`), and the number of
// NaN elements.
float BlockAmax(const float* HWY_RESTRICT x, std::size_t* nans) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF m = hn::Zero(df);
  std::size_t count = 0;
  for (std::size_t i = 0; i < kBlock; i += N) {
    const VF v = hn::LoadU(df, x + i);
    const auto nan = hn::IsNaN(v);
    count += hn::CountTrue(df, nan);
    m = hn::Max(m, hn::IfThenZeroElse(nan, hn::Abs(v)));
  }
  *nans = count;
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

// The first element whose magnitude is amax (> 0, so NaN never matches).
float FirstOfMagnitude(const float* HWY_RESTRICT x, float amax) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t i = 0; i < kBlock; i += N) {
    const std::intptr_t k = hn::FindFirstTrue(df, hn::Eq(hn::Abs(hn::LoadU(df, x + i)), hn::Set(df, amax)));
    if (k >= 0) return x[i + static_cast<std::size_t>(k)];
  }
  return 0.0f;  // unreachable: amax is some element's magnitude
}

// q4_0, q5_0, iq4_nl's `max`: the first element of largest |x|, 0 when all are 0 or NaN.
float SignedMax(const float* HWY_RESTRICT x, float* amax_out) {
  std::size_t nans = 0;
  const float amax = BlockAmax(x, &nans);
  *amax_out = amax;
  return amax > 0.0f ? FirstOfMagnitude(x, amax) : 0.0f;
}

// q8_0 (quantize_row_q8_0_ref).
std::uint16_t QuantizeQ8_0(const float* HWY_RESTRICT x, std::uint8_t* HWY_RESTRICT codes) {
  const DF df;
  const DI di;
  const std::size_t N = hn::Lanes(df);
  std::size_t nans = 0;
  float amax = BlockAmax(x, &nans);
  if (nans != 0) {  // MAX(a, b) = a > b ? a : b: a NaN stays only until the next element
    amax = 0.0f;
    for (std::size_t j = 0; j < kBlock; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const VF vid = hn::Set(df, id), half = hn::Set(df, 0.5f), one = hn::Set(df, 1.0f);
  for (std::size_t i = 0; i < kBlock; i += N) {
    const VF p = hn::Mul(hn::LoadU(df, x + i), vid);
    const VF t = hn::Trunc(p);
    const auto away = hn::Ge(hn::Abs(hn::Sub(p, t)), half);  // false for inf and NaN
    const VF r = hn::Add(t, hn::IfThenElseZero(away, hn::CopySign(one, p)));
    // The int8 code as its two's-complement byte.
    StoreCodes(hn::And(TruncClamp(r, -128.0f, 127.0f), hn::Set(di, 0xFF)), codes + i);
  }
  return ref::ggml_fp16_bits(d);
}

// q4_0 and q5_0 (quantize_row_q4_0_ref, quantize_row_q5_0_ref): n = 8 or 16.
std::uint16_t QuantizeOffset(const float* HWY_RESTRICT x, int n, std::uint8_t* HWY_RESTRICT codes) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  float amax = 0.0f;
  const float max = SignedMax(x, &amax);
  const float d = max / static_cast<float>(-n);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const VF vid = hn::Set(df, id), half_up = hn::Set(df, static_cast<float>(n) + 0.5f);
  const auto top = static_cast<float>(2 * n - 1);
  for (std::size_t i = 0; i < kBlock; i += N) {
    // MIN(top, (int8_t)(x·id + n + 0.5)); kvlab's code is that quant, never below 0.
    StoreCodes(TruncClamp(hn::Add(hn::Mul(hn::LoadU(df, x + i), vid), half_up), 0.0f, top), codes + i);
  }
  return ref::ggml_fp16_bits(d);
}

// The first element of the block equal to 0 (±0 as stored), for a min or max that is 0.
float FirstZero(const float* HWY_RESTRICT x) {
  for (std::size_t j = 0; j < kBlock; ++j) {
    if (x[j] == 0.0f) return x[j];
  }
  return 0.0f;  // unreachable when the min or max is 0
}

// q4_1 and q5_1 (quantize_row_q4_1_ref, quantize_row_q5_1_ref): top = 15 or 31.
std::uint16_t QuantizeMin(const float* HWY_RESTRICT x, int top, std::uint16_t* m_bits,
                          std::uint8_t* HWY_RESTRICT codes) {
  const DF df;
  const DI di;
  const std::size_t N = hn::Lanes(df);
  VF vmin = hn::Set(df, FLT_MAX), vmax = hn::Set(df, -FLT_MAX);
  for (std::size_t i = 0; i < kBlock; i += N) {
    const VF v = hn::LoadU(df, x + i);
    const auto nan = hn::IsNaN(v);
    vmin = hn::Min(vmin, hn::IfThenElse(nan, hn::Set(df, FLT_MAX), v));
    vmax = hn::Max(vmax, hn::IfThenElse(nan, hn::Set(df, -FLT_MAX), v));
  }
  float min = hn::GetLane(hn::MinOfLanes(df, vmin));
  float max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (min == 0.0f) min = FirstZero(x);  // the strict `<` keeps the first of +0 and −0
  if (max == 0.0f) max = FirstZero(x);
  const float d = (max - min) / static_cast<float>(top);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const VF vid = hn::Set(df, id), vm = hn::Set(df, min), half = hn::Set(df, 0.5f);
  for (std::size_t i = 0; i < kBlock; i += N) {
    const VF y = hn::Add(hn::Mul(hn::Sub(hn::LoadU(df, x + i), vm), vid), half);
    // q4_1: MIN(15, (int8_t)y); q5_1: (uint8_t)y unclamped, of which ggml keeps 5 bits.
    const VI q = top == 15 ? TruncClamp(y, 0.0f, 15.0f) : hn::And(TruncClamp(y, 0.0f, 255.0f), hn::Set(di, 0x1F));
    StoreCodes(q, codes + i);
  }
  *m_bits = ref::ggml_fp16_bits(min);
  return ref::ggml_fp16_bits(d);
}

// iq4_nl (quantize_row_iq4_nl_ref: no importance weights, no scale search).
std::uint16_t QuantizeIq4nl(const float* HWY_RESTRICT x, std::uint8_t* HWY_RESTRICT codes) {
  const DF df;
  const DI di;
  const std::size_t N = hn::Lanes(df);
  const auto& table = ref::kIq4nlValues;
  float amax = 0.0f;
  const float max = SignedMax(x, &amax);
  if (amax < 1e-15f) {  // GROUP_MAX_EPS: d = 0, and kvlab writes best_index(0) = 8
    std::memset(codes, 8, kBlock);
    return ref::ggml_fp16_bits(0.0f);
  }
  const float d0 = max / static_cast<float>(table[0]);
  const float id = 1.0f / d0;
  alignas(64) float qx[kBlock], q2[kBlock];
  alignas(64) float values[16];
  for (std::size_t k = 0; k < 16; ++k) values[k] = static_cast<float>(table[k]);
  const VF vid = hn::Set(df, id);
  for (std::size_t i = 0; i < kBlock; i += N) {
    const VF xv = hn::LoadU(df, x + i);
    const VF y = hn::Mul(vid, xv);
    // hi = #{k : table[k] ≤ y} for y inside (table[0], table[15]); vlo = table[hi − 1].
    VI hi = hn::Set(di, 1);
    VF vlo = hn::Set(df, values[0]);
    for (std::size_t k = 1; k < 15; ++k) {
      const auto le = hn::Le(hn::Set(df, values[k]), y);
      hi = hn::Add(hi, hn::IfThenElseZero(hn::RebindMask(di, le), hn::Set(di, 1)));
      vlo = hn::IfThenElse(le, hn::Set(df, values[k]), vlo);
    }
    const VF vhi = hn::GatherIndex(df, values, hi);
    const auto take_lo = hn::RebindMask(di, hn::Lt(hn::Sub(y, vlo), hn::Sub(vhi, y)));
    VI code = hn::IfThenElse(take_lo, hn::Sub(hi, hn::Set(di, 1)), hi);
    code = hn::IfThenElse(hn::RebindMask(di, hn::Not(hn::Lt(y, hn::Set(df, values[15])))), hn::Set(di, 15), code);
    code = hn::IfThenElse(hn::RebindMask(di, hn::Le(y, hn::Set(df, values[0]))), hn::Zero(di), code);
    StoreCodes(code, codes + i);
    const VF q = hn::GatherIndex(df, values, code);
    const VF wq = hn::Mul(hn::Mul(xv, xv), q);  // w = x², then w·v
    hn::StoreU(hn::Mul(wq, xv), df, qx + i);
    hn::StoreU(hn::Mul(wq, q), df, q2 + i);
  }
  float sumqx = 0.0f, sumq2 = 0.0f;  // in element order, as ggml
  for (std::size_t j = 0; j < kBlock; ++j) {
    sumqx += qx[j];
    sumq2 += q2[j];
  }
  return ref::ggml_fp16_bits(sumq2 > 0.0f ? sumqx / sumq2 : 0.0f);
}

}  // namespace ggml_impl

// n stored f32/f16/bf16 elements → f32, exactly.
void GgmlRowToF32(const std::byte* src, DType dtype, std::size_t n, float* HWY_RESTRICT dst) {
  if (dtype == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  HalfRowToF32(reinterpret_cast<const std::uint16_t*>(src), dtype == DType::bf16, n, dst);
}

// One row of blocks·32 f32 values → codes (one byte each), d and m bits.
void GgmlQuantizeRow(const gd::RowJob& job, const float* HWY_RESTRICT x, std::uint16_t* HWY_RESTRICT d,
                     std::uint16_t* HWY_RESTRICT m, std::uint8_t* HWY_RESTRICT codes) {
  namespace gi = ggml_impl;
  for (std::int64_t b = 0; b < job.blocks; ++b) {
    const std::size_t at = static_cast<std::size_t>(b) * gi::kBlock;
    const auto ub = static_cast<std::size_t>(b);
    switch (job.mode) {
      case QuantMode::q8_0: d[ub] = gi::QuantizeQ8_0(x + at, codes + at); break;
      case QuantMode::q4_0: d[ub] = gi::QuantizeOffset(x + at, 8, codes + at); break;
      case QuantMode::q5_0: d[ub] = gi::QuantizeOffset(x + at, 16, codes + at); break;
      case QuantMode::q4_1: d[ub] = gi::QuantizeMin(x + at, 15, m + ub, codes + at); break;
      case QuantMode::q5_1: d[ub] = gi::QuantizeMin(x + at, 31, m + ub, codes + at); break;
      default: d[ub] = gi::QuantizeIq4nl(x + at, codes + at); break;
    }
  }
}

// One row: codes (one byte each, unpacked), d and m bits → values in job.out_dtype.
void GgmlDequantizeRow(const gd::RowJob& job, const std::uint8_t* HWY_RESTRICT codes,
                       const std::uint16_t* HWY_RESTRICT d, const std::uint16_t* HWY_RESTRICT m, std::byte* out) {
  namespace gi = ggml_impl;
  const gi::DF df;
  const gi::DI di;
  const hn::Rebind<std::uint8_t, gi::DF> du8;
  const hn::Rebind<std::uint16_t, gi::DF> du16;
  const std::size_t N = hn::Lanes(df);
  alignas(64) float values[16];
  for (std::size_t k = 0; k < 16; ++k) values[k] = static_cast<float>(ref::kIq4nlValues[k]);
  auto* const out32 = reinterpret_cast<float*>(out);
  auto* const out16 = reinterpret_cast<std::uint16_t*>(out);
  for (std::int64_t b = 0; b < job.blocks; ++b) {
    const auto ub = static_cast<std::size_t>(b);
    const gi::VF vd = hn::Set(df, f16_bits_to_f32(d[ub]));
    const gi::VF vm = hn::Set(df, m != nullptr ? f16_bits_to_f32(m[ub]) : 0.0f);
    for (std::size_t i = 0; i < gi::kBlock; i += N) {
      const std::size_t e = ub * gi::kBlock + i;
      const gi::VI c = hn::PromoteTo(di, hn::LoadU(du8, codes + e));
      gi::VF v;
      switch (job.mode) {
        case QuantMode::q8_0: v = hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<24>(c))), vd); break;
        case QuantMode::q4_0: v = hn::Mul(hn::ConvertTo(df, hn::Sub(c, hn::Set(di, 8))), vd); break;
        case QuantMode::q5_0: v = hn::Mul(hn::ConvertTo(df, hn::Sub(c, hn::Set(di, 16))), vd); break;
        case QuantMode::q4_1:
        case QuantMode::q5_1: v = hn::Add(hn::Mul(hn::ConvertTo(df, c), vd), vm); break;  // never fused
        default: v = hn::Mul(vd, hn::GatherIndex(df, values, hn::And(c, hn::Set(di, 0x0F)))); break;
      }
      switch (job.out_dtype) {
        case DType::f16: hn::StoreU(DemoteToF16(df, v), du16, out16 + e); break;
        case DType::bf16: hn::StoreU(DemoteToBF16(df, v), du16, out16 + e); break;
        default: hn::StoreU(v, df, out32 + e); break;
      }
    }
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(GgmlRowToF32);
HWY_EXPORT(GgmlQuantizeRow);
HWY_EXPORT(GgmlDequantizeRow);

void ggml_quantize(const ConstTensorView& x, const QuantSpec& spec, const TensorView& wq, const TensorView& scales,
                   const TensorView& biases) {
  namespace gd = ggml_detail;
  ref::validate_ggml_quantize(x, spec, wq, scales, biases);  // the oracle's checks and messages
  const std::int64_t d = x.dim(-1);
  const std::int64_t rows = x.numel() / d;
  const gd::RowJob job{spec.mode, d / ref::kGgmlBlock, DType::f32};
  const auto n = static_cast<std::size_t>(d);
  const auto blocks = static_cast<std::size_t>(job.blocks);
  const std::size_t row_bytes = n * dtype_size(x.dtype);
  const std::size_t wq_row_bytes = static_cast<std::size_t>(wq.dim(-1)) * sizeof(std::uint32_t);
  auto* const to_f32 = &HWY_DYNAMIC_DISPATCH(GgmlRowToF32);
  auto* const quantize_row = &HWY_DYNAMIC_DISPATCH(GgmlQuantizeRow);
  auto* const wq_bytes = reinterpret_cast<std::uint8_t*>(wq.data);
  auto* const d_bits = scales.as<std::uint16_t>();
  auto* const m_bits = spec.has_biases() ? biases.as<std::uint16_t>() : nullptr;
  parallel_for((rows + gd::kRowsPerTask - 1) / gd::kRowsPerTask, [&](std::int64_t task) {
    std::vector<float> row(n);
    std::vector<std::uint8_t> codes(n);
    std::vector<std::uint16_t> no_min(m_bits == nullptr ? blocks : 0);
    const std::int64_t r1 = std::min(rows, (task + 1) * gd::kRowsPerTask);
    for (std::int64_t r = task * gd::kRowsPerTask; r < r1; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      to_f32(x.data + ur * row_bytes, x.dtype, n, row.data());
      quantize_row(job, row.data(), d_bits + ur * blocks, m_bits != nullptr ? m_bits + ur * blocks : no_min.data(),
                   codes.data());
      // The LSB-first bitstream in little-endian words is plain byte order.
      std::uint8_t* dst = wq_bytes + ur * wq_row_bytes;
      if (spec.bits == 8) std::memcpy(dst, codes.data(), n);
      else affine_detail::pack_codes(codes.data(), n, spec.bits, dst);
    }
  });
}

void ggml_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                     const QuantSpec& spec, const TensorView& out) {
  namespace gd = ggml_detail;
  ref::validate_ggml_dequantize(wq, scales, biases, spec, out);  // the oracle's checks and messages
  const std::int64_t blocks = scales.dim(-1);
  const std::int64_t d = blocks * ref::kGgmlBlock;
  const std::int64_t rows = d == 0 ? 0 : out.numel() / d;
  const gd::RowJob job{spec.mode, blocks, out.dtype};
  const auto n = static_cast<std::size_t>(d);
  const auto ublocks = static_cast<std::size_t>(blocks);
  const std::size_t wq_row_bytes = static_cast<std::size_t>(wq.dim(-1)) * sizeof(std::uint32_t);
  const std::size_t out_row_bytes = n * dtype_size(out.dtype);
  auto* const dequantize_row = &HWY_DYNAMIC_DISPATCH(GgmlDequantizeRow);
  const auto* const wq_bytes = reinterpret_cast<const std::uint8_t*>(wq.data);
  const auto* const d_bits = scales.as<const std::uint16_t>();
  const auto* const m_bits = spec.has_biases() ? biases.as<const std::uint16_t>() : nullptr;
  parallel_for((rows + gd::kRowsPerTask - 1) / gd::kRowsPerTask, [&](std::int64_t task) {
    std::vector<std::uint8_t> codes(n);
    const std::int64_t r1 = std::min(rows, (task + 1) * gd::kRowsPerTask);
    for (std::int64_t r = task * gd::kRowsPerTask; r < r1; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const std::uint8_t* src = wq_bytes + ur * wq_row_bytes;
      if (spec.bits == 8) std::memcpy(codes.data(), src, n);
      else affine_detail::unpack_codes(src, n, spec.bits, codes.data());
      dequantize_row(job, codes.data(), d_bits + ur * ublocks, m_bits != nullptr ? m_bits + ur * ublocks : nullptr,
                     out.data + ur * out_row_bytes);
    }
  });
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
