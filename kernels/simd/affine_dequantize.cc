// SIMD affine dequantize (contract: reference/affine_quantize.h), bit-exact with the
// oracle on every Highway target. Per group: the stored scale/bias → f32 (a block of
// kBlock groups at a time, affine_block-inl.h), codes unpacked (2/4/8 bits in registers,
// other widths and the SCALAR target through a u8 buffer: affine_pack-inl.h),
// code·scale + bias as a multiply then an add (the build never fuses them), then one
// RNE rounding to f16/bf16 in vectors (half_convert-inl.h).
#include "kernels/simd/affine_common.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/affine_dequantize.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/affine_block-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {

// out = code·scale + bias in f32, multiply then add (never fused; see CMakeLists), then
// one RNE rounding to the output dtype; in blocks of kBlock groups (their parameters
// converted together).
template <int kBits>
void DequantizeGroupsT(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  const DF df;
  const DI di;
  const hn::Rebind<std::uint8_t, DI> du8;
  const hn::Rebind<std::uint16_t, DF> du16;
  const std::size_t N = hn::Lanes(df);
  const auto len = static_cast<std::size_t>(job.gs);
  const std::size_t group_bytes = len * static_cast<std::size_t>(job.bits) / 8;
  alignas(64) std::uint8_t codes[ad::kMaxGroup];
  alignas(64) float scale[kBlock], bias[kBlock];

  const auto run = [&](auto store) {
    for (std::int64_t b0 = g0; b0 < g1; b0 += static_cast<std::int64_t>(kBlock)) {
      const auto first = static_cast<std::size_t>(b0);
      const std::size_t count = std::min(kBlock, static_cast<std::size_t>(g1 - b0));
      LoadParams(job.param_dtype, job.scales_in, first, count, scale);
      LoadParams(job.param_dtype, job.biases_in, first, count, bias);
      for (std::size_t j = 0; j < count; ++j) {
        const auto* const in = reinterpret_cast<const std::uint8_t*>(job.in) + (first + j) * group_bytes;
        const auto vs = hn::Set(df, scale[j]), vb = hn::Set(df, bias[j]);
        if constexpr (!ap::kInRegisters<kBits>) ad::unpack_codes(in, len, job.bits, codes);
        for (std::size_t i = 0; i < len; i += N) {
          VI ci;
          if constexpr (ap::kInRegisters<kBits>) {
            ci = ap::LoadCodes<kBits>(di, in + i * kBits / 8);
          } else {
            ci = hn::PromoteTo(di, hn::LoadU(du8, codes + i));
          }
          store(hn::Add(hn::Mul(hn::ConvertTo(df, ci), vs), vb), (first + j) * len + i);
        }
      }
    }
  };
  auto* const out32 = reinterpret_cast<float*>(job.out);
  auto* const out16 = reinterpret_cast<std::uint16_t*>(job.out);
  switch (job.data_dtype) {
    case DType::f16: return run([&](VF v, std::size_t e) { hn::StoreU(DemoteToF16(df, v), du16, out16 + e); });
    case DType::bf16: return run([&](VF v, std::size_t e) { hn::StoreU(DemoteToBF16(df, v), du16, out16 + e); });
    default: return run([&](VF v, std::size_t e) { hn::StoreU(v, df, out32 + e); });
  }
}

void DequantizeGroups(const ad::GroupJob& job, std::int64_t g0, std::int64_t g1) {
  switch (job.bits) {
    case 2: return DequantizeGroupsT<2>(job, g0, g1);
    case 4: return DequantizeGroupsT<4>(job, g0, g1);
    case 8: return DequantizeGroupsT<8>(job, g0, g1);
    default: return DequantizeGroupsT<0>(job, g0, g1);
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(DequantizeGroups);

void affine_dequantize(const ConstTensorView& wq, const ConstTensorView& scales, const ConstTensorView& biases,
                       const QuantSpec& spec, const TensorView& out) {
  ref::validate_affine_dequantize(wq, scales, biases, spec, out);  // the oracle's checks and messages
  affine_detail::GroupJob job = affine_detail::job_of(spec, out.dtype, scales.dtype, wq.data, out.data);
  job.scales_in = scales.data;
  job.biases_in = biases.data;
  affine_detail::run_in_tasks(&HWY_DYNAMIC_DISPATCH(DequantizeGroups), job, scales.numel());
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
