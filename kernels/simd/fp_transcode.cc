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

// The code bytes of a vector of packed bytes: the low nibbles' (even elements) and the
// high nibbles', each 128-bit block on its own.
template <class D>
HWY_INLINE void NibbleCodes(D d, hn::Vec<D> packed, hn::Vec<D>& even, hn::Vec<D>& odd) {
  const auto table = hn::LoadDup128(d, kE2M1Bytes);
  even = hn::TableLookupBytes(table, hn::And(packed, hn::Set(d, 0x0F)));
  odd = hn::TableLookupBytes(table, hn::ShiftRight<4>(packed));
}

// n packed bytes → 2n code bytes, one table lookup per nibble. A 16-byte block's
// interleave is already stream order; on AVX2 the 256-bit steps put their two blocks back
// in order (−2.7 % of the nvfp4 decode in L2 on a Zen 3, docs/benchmarks.md).
// AVX-512 reads mxfp4/nvfp4 nibbles in place and never calls this in the decode.
void E2M1ToBytes(const std::uint8_t* HWY_RESTRICT src, std::size_t n, std::uint8_t* HWY_RESTRICT dst) {
  std::size_t i = 0;
#if HWY_TARGET == HWY_AVX2
  const hn::Full256<std::uint8_t> d32;  // the interleaves stay within blocks; vperm2i128 orders them
  for (; i + 32 <= n; i += 32) {
    hn::Vec<decltype(d32)> even, odd;
    NibbleCodes(d32, hn::LoadU(d32, src + i), even, odd);
    const auto lower = hn::InterleaveLower(d32, even, odd), upper = hn::InterleaveUpper(d32, even, odd);
    hn::StoreU(hn::ConcatLowerLower(d32, upper, lower), d32, dst + 2 * i);
    hn::StoreU(hn::ConcatUpperUpper(d32, upper, lower), d32, dst + 2 * i + 32);
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<std::uint8_t> d;
  for (; i + 16 <= n; i += 16) {
    hn::Vec<decltype(d)> even, odd;
    NibbleCodes(d, hn::LoadU(d, src + i), even, odd);
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
