// E2M1 element codes (mxfp4) as bytes for the fused quantized decode, one chunk's rows at
// a time (PackedSide::e2m1; kernels/simd/quantized_sdpa.cc, mxfp4_as_affine): the code c
// of E2M1 value v becomes the signed byte 2v, an integer in [−12, 12], so that with the
// group's scale s taken as scale s/2 (and no bias) 2v·(s/2) is v·s exactly
// (docs/quantization.md §Microscaling formats). A packed byte holds elements
// 2b (low nibble) and 2b + 1 (high nibble), the 4-bit stream order; each becomes a byte.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/fp_transcode.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/quantized_decode.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::qdecode::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2v as a two's-complement byte for the E2M1 codes 0..15 (bit 3 the sign; magnitudes 0,
// 0.5, 1, 1.5, 2, 3, 4, 6).
alignas(16) constexpr std::uint8_t kE2M1Bytes[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, 255, 254, 253, 252, 250, 248, 244};

// n packed bytes → 2n code bytes. 128-bit vectors on every target: the pass moves bytes
// (one table lookup per nibble), and a 16-byte block's interleave is already stream order.
void E2M1ToBytes(const std::uint8_t* HWY_RESTRICT src, std::size_t n, std::uint8_t* HWY_RESTRICT dst) {
  std::size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<std::uint8_t> d;
  const auto table = hn::Load(d, kE2M1Bytes);
  const auto low_nibble = hn::Set(d, 0x0F);
  for (; i + 16 <= n; i += 16) {
    const auto packed = hn::LoadU(d, src + i);
    const auto even = hn::TableLookupBytes(table, hn::And(packed, low_nibble));
    const auto odd = hn::TableLookupBytes(table, hn::ShiftRight<4>(packed));
    hn::StoreU(hn::InterleaveLower(d, even, odd), d, dst + 2 * i);
    hn::StoreU(hn::InterleaveUpper(d, even, odd), d, dst + 2 * i + 16);
  }
#endif
  for (; i < n; ++i) {
    dst[2 * i] = kE2M1Bytes[src[i] & 0x0F];
    dst[2 * i + 1] = kE2M1Bytes[src[i] >> 4];
  }
}

}  // namespace kvlab::simd::qdecode::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd::qdecode {

HWY_EXPORT(E2M1ToBytes);

void e2m1_to_bytes(const std::uint8_t* src, std::size_t n, std::uint8_t* dst) {
  HWY_DYNAMIC_DISPATCH(E2M1ToBytes)(src, n, dst);
}

}  // namespace kvlab::simd::qdecode
#endif  // HWY_ONCE
