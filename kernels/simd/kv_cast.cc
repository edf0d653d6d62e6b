// SIMD dtype cast (contract: reference/kv_cast.h), bit-exact with the oracle on every
// Highway target: half_convert-inl.h's row conversions give exactly the bits of kvlab's
// scalar conversions (f16/bf16 -> f32 exact, NaN payloads and the signalling bit kept;
// f32 -> f16/bf16 rounded to nearest even with subnormals, overflow to ±inf and NaN
// quieted as the oracle does). f16 <-> bf16 goes through f32 in blocks held in a stack
// buffer: the widening is exact, so the one rounding is the narrowing, as in the oracle.
// A cast to the same dtype is a byte copy. Validation is the oracle's own.
#include "kernels/simd/simd_kernels.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "reference/kv_cast.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/kv_cast.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {

// n elements from `from` to `to`, two different float dtypes.
void CastElements(const std::byte* HWY_RESTRICT src, DType from, std::byte* HWY_RESTRICT dst, DType to,
                  std::size_t n) {
  if (from == DType::f32) {
    F32RowToHalf(reinterpret_cast<const float*>(src), to == DType::bf16, n, reinterpret_cast<std::uint16_t*>(dst));
    return;
  }
  const auto* half = reinterpret_cast<const std::uint16_t*>(src);
  if (to == DType::f32) {
    HalfRowToF32(half, from == DType::bf16, n, reinterpret_cast<float*>(dst));
    return;
  }
  constexpr std::size_t kBlock = 1024;
  HWY_ALIGN float widened[kBlock];
  auto* out = reinterpret_cast<std::uint16_t*>(dst);
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = std::min(kBlock, n - i);
    HalfRowToF32(half + i, from == DType::bf16, m, widened);
    F32RowToHalf(widened, to == DType::bf16, m, out + i);
  }
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(CastElements);

void kv_cast(const ConstTensorView& src, const TensorView& dst) {
  ref::validate_kv_cast(src, dst);  // the oracle's checks and messages
  const auto n = static_cast<std::size_t>(src.numel());
  if (n == 0) return;
  if (src.dtype == dst.dtype) {
    std::memcpy(dst.data, src.data, n * dtype_size(src.dtype));
    return;
  }
  HWY_DYNAMIC_DISPATCH(CastElements)(src.data, src.dtype, dst.data, dst.dtype, n);
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
