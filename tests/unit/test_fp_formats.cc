// Unit tests of the fp element formats of the microscaling oracle (reference/fp_quantize.h,
// docs/quantization.md §Microscaling formats): E2M1, E4M3 and E8M0 decoding, encoding and
// both MLX rounding flavours. Whole tensors are tested in test_fp_quantize.cc.
//
// Expectations come from independent sources: the element formats' bit-field formulas,
// brute-force nearest-value searches over those formulas and hand-derived values — never
// from numbers printed by the implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "reference/fp_quantize.h"
#include "tests/unit/fp_formulas.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_fp_formats {
namespace {

using namespace kvlab::ref;  // NOLINT(google-build-using-namespace): the unit under test
using test_fp_formulas::e2m1_formula;
using test_fp_formulas::e4m3_formula;
using test_fp_formulas::e4m3_nearest;
using test_fp_formulas::nearest_magnitude;

constexpr Rounding kGpu = Rounding::mlx_gpu, kCpu = Rounding::mlx_cpu;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

// E2M1: Metal rounds to even and takes signbit; the CPU argmin scans the LUT upwards, so it
// keeps the smaller magnitude on a tie and +0 (index 0) before any negative code.
int e2m1_nearest(double x, Rounding rounding) {
  const int best = nearest_magnitude(x, 7, e2m1_formula, rounding == kGpu);
  if (rounding == kCpu) return x < 0 && best != 0 ? 8 | best : best;
  return std::signbit(x) ? 8 | best : best;
}

TEST(FpFormats, E2M1DecodesAllSixteenCodesAndRoundTrips) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_decode(static_cast<std::uint8_t>(c)), e2m1_formula(c)) << c;
    EXPECT_EQ(e2m1_encode(static_cast<float>(e2m1_formula(c)), kGpu), c) << c;
    EXPECT_EQ(e2m1_encode(static_cast<float>(e2m1_formula(c)), kCpu), c == 8 ? 0 : c) << c;  // −0 → +0
  }
  EXPECT_TRUE(std::signbit(e2m1_decode(0x8)));  // −0.0, not +0
}

TEST(FpFormats, E4M3DecodesAll256CodesAndRoundTripsTheFiniteOnes) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(e4m3_decode(static_cast<std::uint8_t>(c)), e4m3_formula(c)) << c;
    // 480 (0x7F) is decodable but lies above the saturation point.
    if ((c & 0x7F) != 0x7F) {
      EXPECT_EQ(e4m3_encode(static_cast<float>(e4m3_formula(c))), c) << c;
    }
  }
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x7F), 480.0f);  // OCP's NaN code is not special-cased
  EXPECT_EQ(e4m3_decode(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_TRUE(std::signbit(e4m3_decode(0x80)));
}

TEST(FpFormats, E8M0DecodesPowersOfTwo) {
  for (int c = 0; c < 255; ++c) EXPECT_EQ(e8m0_decode(static_cast<std::uint8_t>(c)), std::ldexp(1.0, c - 127)) << c;
  EXPECT_EQ(e8m0_decode(0), 0x1p-127f);  // an f32 subnormal, not 0
  EXPECT_EQ(e8m0_decode(0xFF), kInf);
}

// docs/quantization.md §Microscaling formats table: each boundary b with the code at b, just below
// and just above.
struct E2M1Boundary { float b; int at, below, above; };
constexpr E2M1Boundary kE2M1Table[] = {{0.25f, 0, 0, 1}, {0.75f, 2, 1, 2}, {1.25f, 2, 2, 3}, {1.75f, 4, 3, 4},
                                       {2.5f, 4, 4, 5},  {3.5f, 6, 5, 6},  {5.0f, 6, 6, 7}};

TEST(FpFormats, E2M1GpuFollowsTheThresholdTable) {
  for (const E2M1Boundary& t : kE2M1Table) {
    for (const float sign : {1.0f, -1.0f}) {
      SCOPED_TRACE(::testing::Message() << "boundary " << sign * t.b);
      const int s = sign < 0 ? 8 : 0;
      EXPECT_EQ(e2m1_encode(sign * t.b, kGpu), s | t.at);
      EXPECT_EQ(e2m1_encode(sign * std::nextafter(t.b, 0.0f), kGpu), s | t.below);
      EXPECT_EQ(e2m1_encode(sign * std::nextafter(t.b, kInf), kGpu), s | t.above);
    }
  }
  // The sign is signbit (−0.0 → 0x8) except for NaN, which is always +6.
  const struct { float x; int code; } cases[] = {{0.0f, 0x0}, {-0.0f, 0x8}, {-1e-3f, 0x8}, {kNaN, 0x7}, {-kNaN, 0x7},
                                                 {6.0f, 0x7}, {1e30f, 0x7}, {kInf, 0x7},  {-kInf, 0xF}};
  for (const auto& c : cases) EXPECT_EQ(e2m1_encode(c.x, kGpu), c.code) << c.x;
}

TEST(FpFormats, E2M1CpuArgminBreaksTiesToTheLowerIndex) {
  // At every tie the CPU keeps the smaller magnitude; Metal keeps the even code, so the
  // two differ at 0.75, 1.75 and 3.5 and agree at 0.25, 1.25, 2.5 and 5.
  const struct { float x; int cpu, gpu; } ties[] = {
      {0.25f, 0, 0}, {0.75f, 1, 2}, {1.25f, 2, 2}, {1.75f, 3, 4}, {2.5f, 4, 4}, {3.5f, 5, 6}, {5.0f, 6, 6}};
  for (const auto& t : ties) {
    EXPECT_EQ(e2m1_encode(t.x, kCpu), t.cpu) << t.x;
    EXPECT_EQ(e2m1_encode(t.x, kGpu), t.gpu) << t.x;
    EXPECT_EQ(e2m1_encode(-t.x, kGpu), 8 | t.gpu) << -t.x;
  }
  const struct { float x; int cpu; } cases[] = {
      // Negative ties: −0.25 is equidistant from +0 (index 0), −0 (8) and −0.5 (9): index 0.
      {-0.25f, 0x0}, {-0.75f, 0x9}, {-1.75f, 0xB}, {-5.0f, 0xE},
      // Zero and tiny negatives land on +0, never −0; larger values resolve normally.
      {-0.0f, 0x0}, {-1e-3f, 0x0}, {-0.3f, 0x9}, {7.0f, 0x7}, {-7.0f, 0xF}, {1e6f, 0x7},
      // Literal f32 argmin: every distance is NaN (NaN) or inf (±inf), and at ±1e30 every
      // f32 distance rounds to 1e30, so nothing beats index 0.
      {kNaN, 0x0}, {kInf, 0x0}, {1e30f, 0x0}, {-1e30f, 0x0}};
  for (const auto& c : cases) EXPECT_EQ(e2m1_encode(c.x, kCpu), c.cpu) << c.x;
}

TEST(FpFormats, E2M1MatchesBruteForceNearestOnAGridAndRandomValues) {
  // Multiples of 1/64 in [−8, 8] hit every tie and every boundary neighbourhood.
  for (int k = -512; k <= 512; ++k) {
    const float x = static_cast<float>(k) / 64.0f;
    for (Rounding r : {kGpu, kCpu}) EXPECT_EQ(e2m1_encode(x, r), e2m1_nearest(x, r)) << x;
  }
  KVLAB_SEEDED_RNG(rng, 20260901);
  for (int i = 0; i < 4000; ++i) {
    const auto x = static_cast<float>(rng.uniform(-9.0, 9.0));
    for (Rounding r : {kGpu, kCpu}) EXPECT_EQ(e2m1_encode(x, r), e2m1_nearest(x, r)) << x;
  }
}

TEST(FpFormats, E4M3MidpointsRoundToEven) {
  for (int c = 0; c < 0x7E; ++c) {
    // The midpoint of two adjacent E4M3 values needs 5 significant bits: exact in f32.
    const auto mid = static_cast<float>((e4m3_formula(c) + e4m3_formula(c + 1)) / 2);
    const int even = c % 2 == 0 ? c : c + 1;
    EXPECT_EQ(e4m3_encode(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(e4m3_encode(-mid), 0x80 | even);
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, kInf)), c + 1);
  }
}

TEST(FpFormats, E4M3SaturatesAt448AndNaNSaturates) {
  EXPECT_EQ(e4m3_encode(432.0f), 0x7E);  // tie 416 (odd 0x7D) / 448 (even 0x7E)
  EXPECT_EQ(e4m3_encode(std::nextafter(432.0f, 0.0f)), 0x7D);
  EXPECT_EQ(e4m3_encode(447.9f), 0x7E);
  for (float x : {448.0f, std::nextafter(448.0f, kInf), 464.0f, 480.0f, 1e30f, kInf, kNaN}) {
    EXPECT_EQ(e4m3_encode(x), 0x7E) << x;
    EXPECT_EQ(e4m3_encode(-x), 0xFE) << -x;
  }
}

TEST(FpFormats, E4M3RoundsDenormals) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const struct { float x; int code; } cases[] = {
      {0x1p-9f, 0x01}, {0x1p-10f, 0x00} /* tie 0 / 1: even */, {std::nextafter(0x1p-10f, 1.0f), 0x01},
      {3 * 0x1p-10f, 0x02} /* tie 1 / 2 */, {5 * 0x1p-10f, 0x02} /* tie 2 / 3 */, {7 * 0x1p-9f, 0x07},
      {15 * 0x1p-10f, 0x08} /* tie 7 / 2^-6 */, {0x1p-6f, 0x08}, {tiny, 0x00}, {-tiny, 0x80}, {0.0f, 0x00},
      {-0.0f, 0x80}};
  for (const auto& c : cases) EXPECT_EQ(e4m3_encode(c.x), c.code) << c.x;
}

TEST(FpFormats, E4M3MatchesBruteForceNearestOnRandomValues) {
  KVLAB_SEEDED_RNG(rng, 448);
  for (int i = 0; i < 20000; ++i) {
    const double magnitude = std::exp2(rng.uniform(-12.0, 9.5));  // subnormals .. saturation
    const auto x = static_cast<float>(rng.integer(0, 1) != 0 ? -magnitude : magnitude);
    EXPECT_EQ(e4m3_encode(x), e4m3_nearest(x)) << x;
  }
}

TEST(FpFormats, E8M0RoundsTheExponentInTheLogDomain) {
  for (Rounding r : {kGpu, kCpu}) {
    SCOPED_TRACE(rounding_name(r));
    for (int k = -127; k <= 127; ++k) EXPECT_EQ(e8m0_encode(std::ldexp(1.0f, k), r), k + 127) << k;
    const auto p = [](double e) { return static_cast<float>(std::exp2(e)); };
    const struct { float x; int code; } cases[] = {
        // Nearest exponent, not OCP's floor: 2^1.6 takes exponent 2 where floor gives 1.
        {p(1.4), 128}, {p(1.6), 129}, {p(-1.4), 126}, {p(-1.6), 125},
        // Clamped to [−127, 127]: f32 subnormals below 2^-127; FLT_MAX (log2 rounds to 128).
        {0x1p-130f, 0}, {std::numeric_limits<float>::denorm_min(), 0}, {std::numeric_limits<float>::max(), 254},
        {-1.0f, 0}, {-1e-30f, 0}, {kInf, 0xFF}, {-kInf, 0xFF}, {kNaN, 0xFF}};
    for (const auto& c : cases) EXPECT_EQ(e8m0_encode(c.x, r), c.code) << c.x;
  }
  // log2 of the f32 nearest to 2^(k+1/2) is within ~0.1 ulp of k + 1/2, so the f32 log2
  // returns k + 1/2 exactly: a true tie. Half away from zero (gpu) and rint (cpu) split
  // at odd k and agree at even k.
  // A zero scale (all-zero group): Metal's log2(0) = −inf clamps to code 0; the CPU graph
  // substitutes exponent 0, code 127.
  const auto p = [](double e) { return static_cast<float>(std::exp2(e)); };
  const struct { float x; int gpu, cpu; } splits[] = {
      {p(10.5), 127 + 11, 127 + 10}, {p(11.5), 127 + 12, 127 + 12}, {p(-10.5), 127 - 11, 127 - 10}, {0.0f, 0, 127},
      {-0.0f, 0, 127}};
  for (const auto& c : splits) {
    EXPECT_EQ(e8m0_encode(c.x, kGpu), c.gpu) << c.x;
    EXPECT_EQ(e8m0_encode(c.x, kCpu), c.cpu) << c.x;
  }
}

}  // namespace
}  // namespace test_fp_formats
}  // namespace kvlab
