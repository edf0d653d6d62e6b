// kernels/simd/half_convert-inl.h against kvlab's scalar conversions (include/kvlab/dtype.h),
// bit for bit, on every attainable Highway target, through each of its entry points
// (memory loads/stores, the 16-bit-pattern-in-u32-lane layer, RoundToBF16High for
// non-NaN inputs, whole rows with tails):
//   load:  all 65536 f16 and all 65536 bf16 patterns (inf, NaN payloads, signalling
//          NaNs, subnormals, ±0 included);
//   store: every f16/bf16 value, the midpoints to both neighbours and ±1 f32 ulp around
//          them (ties to even, overflow to inf at 65520 / past bf16's max, subnormal
//          rounding, the f16 subnormal/normal seam), f32 NaNs with assorted payloads,
//          f32 subnormals, and seeded random f32 patterns;
// plus hand-derived cases, so a wrong scalar conversion could not hide either.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/simd/test_simd_half_convert.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/half_convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;

// n (a multiple of 16, the widest lane count) 16-bit patterns -> f32 three ways.
// via_bits puts junk in the upper half of each u32 lane, which must be ignored.
const char* LoadAll(const std::uint16_t* in, std::size_t n, bool bf16, float* via_load, float* via_bits,
                    float* via_row) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint16_t, decltype(df)> d16;
  const std::size_t N = hn::Lanes(df);
  const auto junk = hn::Set(du, 0xA5C30000u);
  for (std::size_t i = 0; i < n; i += N) {
    const auto h = hn::Or(hn::PromoteTo(du, hn::LoadU(d16, in + i)), junk);
    if (bf16) {
      hn::StoreU(LoadBF16(df, in + i), df, via_load + i);
      hn::StoreU(BF16BitsToF32(df, h), df, via_bits + i);
    } else {
      hn::StoreU(LoadF16(df, in + i), df, via_load + i);
      hn::StoreU(F16BitsToF32(df, h), df, via_bits + i);
    }
  }
  // Rows of lengths 0, 1, 2, ... so every tail length of every target is taken.
  for (std::size_t i = 0, len = 0; i < n; i += len, ++len) {
    HalfRowToF32(in + i, bf16, std::min(len, n - i), via_row + i);
  }
  return hwy::TargetName(HWY_TARGET);
}

// n (a multiple of 16) f32 values -> 16-bit patterns three ways; via_bits keeps the
// whole u32 lane so the test can check the upper half is zero.
const char* StoreAll(const float* in, std::size_t n, bool bf16, std::uint16_t* via_store, std::uint32_t* via_bits,
                     std::uint16_t* via_row) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t i = 0; i < n; i += N) {
    const auto v = hn::LoadU(df, in + i);
    if (bf16) {
      StoreBF16(v, df, via_store + i);
      hn::StoreU(F32ToBF16Bits(df, v), du, via_bits + i);
    } else {
      StoreF16(v, df, via_store + i);
      hn::StoreU(F32ToF16Bits(df, v), du, via_bits + i);
    }
  }
  for (std::size_t i = 0, len = 0; i < n; i += len, ++len) {
    F32RowToHalf(in + i, bf16, std::min(len, n - i), via_row + i);
  }
  return hwy::TargetName(HWY_TARGET);
}

// RoundToBF16High of n (a multiple of 16) values: whole u32 lanes.
const char* RoundHighAll(const float* in, std::size_t n, std::uint32_t* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  for (std::size_t i = 0; i < n; i += hn::Lanes(df)) hn::StoreU(RoundToBF16High(df, hn::LoadU(df, in + i)), du, out + i);
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace
}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kvlab/dtype.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab::simd {
namespace {
HWY_EXPORT(LoadAll);
HWY_EXPORT(StoreAll);
HWY_EXPORT(RoundHighAll);
}  // namespace
}  // namespace kvlab::simd

namespace kvlab {
namespace {

std::string hex(std::uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

float f32_of(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits_of(float v) { return std::bit_cast<std::uint32_t>(v); }

// Pads to a multiple of 16 (every lane count divides it) with copies of the first value.
template <class T>
void pad16(std::vector<T>& v) {
  while (v.size() % 16 != 0) v.push_back(v.front());
}

// Reports the first few mismatches of got vs want (as bit patterns) for input `in`.
template <class In, class Out>
::testing::AssertionResult same_bits(const std::vector<In>& in, const std::vector<Out>& got,
                                     const std::vector<Out>& want, const char* path) {
  std::size_t bad = 0;
  std::ostringstream msg;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (bad++ < 5) {
      std::uint32_t in_bits = 0;
      if constexpr (sizeof(In) == 4) in_bits = std::bit_cast<std::uint32_t>(in[i]);
      else in_bits = in[i];
      msg << "\n  " << path << ": input " << hex(in_bits) << " -> " << hex(static_cast<std::uint32_t>(got[i]))
          << ", kvlab scalar gives " << hex(static_cast<std::uint32_t>(want[i]));
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " differ" << msg.str();
}

void check_loads(bool bf16) {
  std::vector<std::uint16_t> in(65536);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint16_t>(i);
  std::vector<std::uint32_t> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = bits_of(bf16 ? bf16_bits_to_f32(in[i]) : f16_bits_to_f32(in[i]));
  testing::for_each_simd_target([&](const std::string& target) {
    std::vector<float> load(in.size()), bits(in.size()), row(in.size());
    const std::string ran =
        HWY_DYNAMIC_DISPATCH(simd::LoadAll)(in.data(), in.size(), bf16, load.data(), bits.data(), row.data());
    EXPECT_EQ(ran, target);  // the forced target really ran
    auto as_bits = [](const std::vector<float>& v) {
      std::vector<std::uint32_t> b(v.size());
      std::transform(v.begin(), v.end(), b.begin(), bits_of);
      return b;
    };
    EXPECT_TRUE(same_bits(in, as_bits(load), want, "Load"));
    EXPECT_TRUE(same_bits(in, as_bits(bits), want, "BitsToF32"));
    EXPECT_TRUE(same_bits(in, as_bits(row), want, "HalfRowToF32"));
  });
}

TEST(SimdHalfConvert, LoadsEveryF16PatternExactlyOnEveryTarget) { check_loads(false); }
TEST(SimdHalfConvert, LoadsEveryBF16PatternExactlyOnEveryTarget) { check_loads(true); }

// Every value of the 16-bit format (as f32), the midpoint to the next value away from
// zero (so, over both signs and all values, the midpoints to both neighbours of each
// value), and ±1 f32 ulp around each midpoint. The neighbour above the largest finite
// value is 2^16 (f16) / 2^128 (bf16), so the overflow threshold is covered too.
std::vector<float> store_inputs(bool bf16) {
  std::vector<float> in;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits16 = static_cast<std::uint16_t>(h);
    const float v = bf16 ? bf16_bits_to_f32(bits16) : f16_bits_to_f32(bits16);
    in.push_back(v);
    if (!std::isfinite(v)) continue;
    if (bf16) {
      // The next bf16 magnitude is 2^16 f32 ulps further; the midpoint is exact in f32.
      const std::uint32_t b = bits_of(v);
      for (const std::uint32_t delta : {0x7FFFu, 0x8000u, 0x8001u, 1u}) in.push_back(f32_of(b + delta));
      if ((b & 0x7FFFFFFFu) != 0) in.push_back(f32_of(b - 1));
      continue;
    }
    const std::uint16_t mag = bits16 & 0x7FFFu;
    const double next = mag == 0x7BFF ? 65536.0 : double{f16_bits_to_f32(static_cast<std::uint16_t>(mag + 1))};
    const double mid = (std::abs(double{v}) + next) / 2;  // exact: needs 12 significant bits
    const float m = static_cast<float>(std::signbit(v) ? -mid : mid);
    in.push_back(m);
    in.push_back(std::nextafter(m, std::numeric_limits<float>::infinity()));
    in.push_back(std::nextafter(m, -std::numeric_limits<float>::infinity()));
  }
  // NaNs: quiet/signalling, payloads in the kept and the dropped bits, both signs.
  for (const std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FA00000u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7F802000u,
                                  0x7FC01FFFu, 0x7F801FFFu})
    for (const std::uint32_t sign : {0u, 0x80000000u}) in.push_back(f32_of(nan | sign));
  // f32 subnormals and tiny normals (far below f16's range, and bf16's subnormals).
  for (const std::uint32_t b : {0x00000001u, 0x00000002u, 0x00400000u, 0x007FFFFFu, 0x00800000u, 0x00808000u,
                                0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x33400000u, 0x387FFFFFu, 0x387FF000u,
                                0x387FEFFFu})
    for (const std::uint32_t sign : {0u, 0x80000000u}) in.push_back(f32_of(b | sign));
  // Overflow edges: f32 max, inf, and the values around the f16 and bf16 thresholds.
  for (const std::uint32_t b : {0x7F7FFFFFu, 0x7F800000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x477FE000u,
                                0x7F7F7FFFu, 0x7F7F8000u, 0x7F7F8001u})
    for (const std::uint32_t sign : {0u, 0x80000000u}) in.push_back(f32_of(b | sign));
  return in;
}

void check_stores(const std::vector<float>& input, bool bf16) {
  std::vector<float> in = input;
  pad16(in);
  std::vector<std::uint16_t> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = bf16 ? f32_to_bf16_bits(in[i]) : f32_to_f16_bits(in[i]);
  testing::for_each_simd_target([&](const std::string& target) {
    std::vector<std::uint16_t> store(in.size()), row(in.size());
    std::vector<std::uint32_t> bits(in.size());
    const std::string ran =
        HWY_DYNAMIC_DISPATCH(simd::StoreAll)(in.data(), in.size(), bf16, store.data(), bits.data(), row.data());
    EXPECT_EQ(ran, target);
    std::vector<std::uint32_t> want32(want.begin(), want.end());  // upper half must be 0
    EXPECT_TRUE(same_bits(in, store, want, "Store"));
    EXPECT_TRUE(same_bits(in, bits, want32, "F32ToBits"));
    EXPECT_TRUE(same_bits(in, row, want, "F32RowToHalf"));
  });
}

TEST(SimdHalfConvert, StoresF16LikeKvlabAtEveryValueMidpointAndEdgeOnEveryTarget) {
  check_stores(store_inputs(false), false);
}
TEST(SimdHalfConvert, StoresBF16LikeKvlabAtEveryValueMidpointAndEdgeOnEveryTarget) {
  check_stores(store_inputs(true), true);
}

TEST(SimdHalfConvert, StoresRandomF32PatternsLikeKvlabOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 20261121);
  std::vector<float> in(1 << 18);
  for (float& v : in) v = f32_of(static_cast<std::uint32_t>(rng.integer(0, 0xFFFFFFFFll)));
  check_stores(in, false);
  check_stores(in, true);
}

// RoundToBF16High (rope keeps the upper halves without shifting) is f32_to_bf16_bits in
// the upper 16 bits for every non-NaN input: all bf16 values, midpoints, ±1 ulp, edges.
TEST(SimdHalfConvert, RoundToBF16HighMatchesKvlabForEveryNonNaNInputOnEveryTarget) {
  std::vector<float> in;
  for (const float v : store_inputs(true)) {
    if (!std::isnan(v)) in.push_back(v);
  }
  pad16(in);
  std::vector<std::uint32_t> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = f32_to_bf16_bits(in[i]);
  testing::for_each_simd_target([&](const std::string& target) {
    std::vector<std::uint32_t> got(in.size());
    EXPECT_EQ(std::string(HWY_DYNAMIC_DISPATCH(simd::RoundHighAll)(in.data(), in.size(), got.data())), target);
    for (std::uint32_t& g : got) g >>= 16;
    EXPECT_TRUE(same_bits(in, got, want, "RoundToBF16High"));
  });
}

// Hand-derived results, independent of core/dtype.cc: the store paths must give them.
TEST(SimdHalfConvert, StoresHandDerivedRoundingCasesOnEveryTarget) {
  struct Case {
    float x;
    std::uint16_t f16, bf16;
  };
  const std::vector<Case> cases = {
      {1.0f, 0x3C00, 0x3F80},
      {-2.0f, 0xC000, 0xC000},
      {1.0f + 0x1p-11f, 0x3C00, 0x3F80},             // f16 tie 1 | 1+2^-10: even (1) wins
      {1.0f + 3 * 0x1p-11f, 0x3C02, 0x3F80},         // f16 tie 1+2^-10 | 1+2^-9: even (1+2^-9)
      {1.0f + 0x1p-8f, 0x3C04, 0x3F80},              // bf16 tie 1 | 1+2^-7: even (1)
      {1.0f + 3 * 0x1p-8f, 0x3C0C, 0x3F82},          // bf16 tie up to the even 1+2^-6
      {65519.996f, 0x7BFF, 0x4780},                  // just below f16's overflow midpoint
      {65520.0f, 0x7C00, 0x4780},                    // the midpoint: ties to even = inf
      {0x1p-25f, 0x0000, 0x3300},                    // half the smallest f16 subnormal: to 0
      {3 * 0x1p-25f, 0x0002, 0x33C0},                // 1.5 units: even (2)
      {-0x1p-14f, 0x8400, 0xB880},                   // smallest f16 normal
      {0x1p-14f - 0x1p-25f, 0x0400, 0x3880},         // 1023.5 units: up to 1024 (normal)
      {std::numeric_limits<float>::max(), 0x7C00, 0x7F80},
      {-std::numeric_limits<float>::infinity(), 0xFC00, 0xFF80},
      {f32_of(0x7F800001u), 0x7E00, 0x7FC0},        // signalling NaN comes out quiet
      {f32_of(0xFFA02000u), 0xFF01, 0xFFE0},        // sign and top payload bits kept
  };
  std::vector<float> in;
  for (const Case& c : cases) in.push_back(c.x);
  pad16(in);
  testing::for_each_simd_target([&](const std::string&) {
    for (const bool bf16 : {false, true}) {
      std::vector<std::uint16_t> store(in.size()), row(in.size());
      std::vector<std::uint32_t> bits(in.size());
      HWY_DYNAMIC_DISPATCH(simd::StoreAll)(in.data(), in.size(), bf16, store.data(), bits.data(), row.data());
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const std::uint16_t want = bf16 ? cases[i].bf16 : cases[i].f16;
        EXPECT_EQ(hex(store[i]), hex(want)) << (bf16 ? "bf16" : "f16") << " of " << hex(bits_of(cases[i].x));
        EXPECT_EQ(hex(row[i]), hex(want)) << (bf16 ? "bf16" : "f16") << " row of " << hex(bits_of(cases[i].x));
      }
    }
  });
}

}  // namespace
}  // namespace kvlab
#endif  // HWY_ONCE
