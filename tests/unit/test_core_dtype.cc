// Unit tests of the dtype vocabulary: f16/bf16 <-> f32 conversions, round_to_dtype,
// epsilons, sizes and names.
//
// The conversions are the "storage rounding" of every reference kernel, so a 1-ulp error
// here silently shifts every oracle. Expected values therefore never come from the code
// under test:
//   * decoding is checked against the textbook formula sign·2^(e−bias)·(1+m/2^M);
//   * encoding is checked against an exact double-arithmetic RNE oracle written below,
//     against the compiler's own _Float16 conversion (a second, unrelated oracle), and
//     against the format's structure (an exact midpoint rounds to the even neighbour).
// Domains of 2^16 are swept exhaustively; the 2^32 float domain is swept with a prime
// stride (so the dropped low bits take every residue) plus every pattern in the ranges
// where rounding code typically breaks (overflow threshold, normal/subnormal boundary,
// the smallest-subnormal ties, zero, inf/NaN).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_core_dtype {
namespace {

using ::testing::HasSubstr;

float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// A binary format with M stored mantissa bits, E exponent bits and the IEEE bias.
struct Format {
  const char* name;
  int mant_bits;
  int exp_bits;
  int bias;
  std::uint16_t (*encode)(float);  // the implementation under test
  float (*decode)(std::uint16_t);
};
const Format kF16{"f16", 10, 5, 15, f32_to_f16_bits, f16_bits_to_f32};
const Format kBF16{"bf16", 7, 8, 127, f32_to_bf16_bits, bf16_bits_to_f32};

int exp_field(const Format& f, std::uint16_t h) { return (h >> f.mant_bits) & ((1 << f.exp_bits) - 1); }
int mant_field(const Format& f, std::uint16_t h) { return h & ((1 << f.mant_bits) - 1); }
int exp_all_ones(const Format& f) { return (1 << f.exp_bits) - 1; }
std::uint16_t inf_bits(const Format& f) { return static_cast<std::uint16_t>(exp_all_ones(f) << f.mant_bits); }
bool is_nan_bits(const Format& f, std::uint16_t h) {
  return exp_field(f, h) == exp_all_ones(f) && mant_field(f, h) != 0;
}
bool is_quiet_nan_bits(const Format& f, std::uint16_t h) {
  return is_nan_bits(f, h) && (mant_field(f, h) >> (f.mant_bits - 1)) == 1;
}

// The value of a bit pattern, straight from the definition (exact in double).
double formula(const Format& f, std::uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int e = exp_field(f, h);
  const double frac = std::ldexp(static_cast<double>(mant_field(f, h)), -f.mant_bits);  // m / 2^M
  if (e == exp_all_ones(f)) return frac == 0.0 ? sign * INFINITY : NAN;
  if (e == 0) return sign * std::ldexp(frac, 1 - f.bias);  // subnormal: 2^(1-bias) · m/2^M
  return sign * std::ldexp(1.0 + frac, e - f.bias);
}

// Bit pattern of a non-negative value r that is exactly representable and finite.
std::uint16_t pattern_of(const Format& f, double r) {
  const int emin = 1 - f.bias;
  if (r < std::ldexp(1.0, emin)) return static_cast<std::uint16_t>(std::ldexp(r, f.mant_bits - emin));
  int e = 0;
  const double frac = std::frexp(r, &e);  // r = frac · 2^e, frac in [0.5, 1)
  const int m = static_cast<int>(std::ldexp(2.0 * frac - 1.0, f.mant_bits));
  return static_cast<std::uint16_t>(((e - 1 + f.bias) << f.mant_bits) | m);
}

// Exact round-to-nearest-even of a non-NaN float into the format, in double arithmetic:
// count x in units of the format's ulp at x (exact: a power-of-two scaling of a value with
// 24 significant bits), pick the nearer integer with ties to even, overflow past the
// largest finite value (after rounding) to inf.
std::uint16_t rne_oracle(const Format& f, float x) {
  const int sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | inf_bits(f));
  int e = 0;
  std::frexp(a, &e);
  const int ulp_exp = std::max(e - 1, 1 - f.bias) - f.mant_bits;  // subnormals share emin's ulp
  const double units = std::ldexp(a, -ulp_exp);
  double k = std::floor(units);
  const double rem = units - k;
  if (rem > 0.5 || (rem == 0.5 && std::fmod(k, 2.0) != 0.0)) k += 1.0;
  const double r = std::ldexp(k, ulp_exp);
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -f.mant_bits), f.bias);
  if (r > max_finite) return static_cast<std::uint16_t>(sign | inf_bits(f));
  return static_cast<std::uint16_t>(sign | pattern_of(f, r));
}

// Collects the first few mismatches of a sweep instead of printing thousands.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  ~Mismatches() { EXPECT_EQ(count_, 0u) << count_ << " mismatches in " << what_ << "; first:" << first_; }
  void add(const std::string& line) {
    if (count_++ < 8) first_ += "\n  " + line;
  }

 private:
  std::string what_, first_;
  std::size_t count_ = 0;
};

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Checks the implementation's f32 -> format conversion of one pattern against an oracle.
// NaN inputs must give a quiet NaN of the same sign (payloads are not compared: no oracle
// agrees on them).
void check_encode(const Format& f, std::uint32_t u, const std::function<std::uint16_t(float)>& oracle,
                  Mismatches& bad) {
  const float x = float_of(u);
  const std::uint16_t got = f.encode(x);
  if (std::isnan(x)) {
    if (!is_quiet_nan_bits(f, got) || ((got & 0x8000) != 0) != std::signbit(x)) {
      bad.add(hex(u) + " (NaN) -> " + hex(got) + ", not a quiet NaN of the same sign");
    }
    return;
  }
  const std::uint16_t want = oracle(x);
  if (got != want) bad.add(hex(u) + " -> " + hex(got) + ", oracle " + hex(want));
}

// Every pattern within ±radius of each anchor, for both signs.
std::vector<std::uint32_t> critical_patterns(std::initializer_list<std::uint32_t> anchors, std::uint32_t radius) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t anchor : anchors) {
    const std::uint32_t lo = anchor > radius ? anchor - radius : 0;
    const std::uint32_t hi = std::min<std::uint32_t>(anchor + radius, 0x7fffffffu);
    for (std::uint32_t u = lo; u <= hi; ++u) {
      out.push_back(u);
      out.push_back(u | 0x80000000u);
    }
  }
  return out;
}

// f16: 65504 = max finite, 65520 = its midpoint to 2^16 (ties to inf), 2^-14 = smallest
// normal, 2^-25 / 3·2^-25 = ties at the first subnormals, 2^-24 = smallest subnormal,
// plus zero and inf (followed by the NaNs).
const std::vector<std::uint32_t>& f16_critical() {
  static const auto v = critical_patterns({bits_of(65504.0f), bits_of(65520.0f), bits_of(65536.0f),
                                           bits_of(std::ldexp(1.0f, -14)), bits_of(std::ldexp(1.0f, -24)),
                                           bits_of(std::ldexp(1.0f, -25)), bits_of(std::ldexp(3.0f, -25)),
                                           0u, 0x7f800000u},
                                          1u << 14);
  return v;
}

// bf16 shares f32's exponent: the interesting spots are FLT_MAX / the bf16 overflow
// threshold, the smallest normal, zero, 1.0, and inf/NaN.
const std::vector<std::uint32_t>& bf16_critical() {
  static const auto v = critical_patterns(
      {0x7f7f8000u, 0x7f7fffffu, 0x00800000u, 0u, bits_of(1.0f), 0x7f800000u, 0x7fc00000u}, 1u << 14);
  return v;
}

// The strided sweep over all 2^32 patterns: a prime stride hits every residue of the
// 13 (f16) / 16 (bf16) dropped bits many times. ~1M samples keeps ASan builds fast.
constexpr std::uint64_t kStride = 4093;

void sweep(const Format& f, const std::vector<std::uint32_t>& critical,
           const std::function<std::uint16_t(float)>& oracle, const std::string& oracle_name) {
  Mismatches bad(std::string(f.name) + " encode vs " + oracle_name);
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += kStride) check_encode(f, static_cast<std::uint32_t>(u), oracle, bad);
  for (std::uint32_t u : critical) check_encode(f, u, oracle, bad);
}

// ---- decoding and round trips: exhaustive over all 65536 patterns ----------------------

void expect_decode_matches_formula(const Format& f) {
  Mismatches bad(std::string(f.name) + " decode vs formula");
  for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float got = f.decode(h);
    const double want = formula(f, h);
    const bool sign_ok = std::signbit(got) == ((h & 0x8000) != 0);
    if (std::isnan(want) ? !(std::isnan(got) && sign_ok) : !(static_cast<double>(got) == want && sign_ok)) {
      bad.add(hex(h) + " -> " + std::to_string(got) + ", formula " + std::to_string(want));
    }
  }
}

void expect_round_trip_identity(const Format& f) {
  Mismatches bad(std::string(f.name) + " -> f32 -> " + f.name);
  for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const std::uint16_t back = f.encode(f.decode(h));
    const bool ok = is_nan_bits(f, h) ? is_nan_bits(f, back) && (back & 0x8000) == (h & 0x8000) : back == h;
    if (!ok) bad.add(hex(h) + " -> " + hex(back));
  }
}

TEST(DTypeF16, DecodeMatchesFormulaForAllPatterns) { expect_decode_matches_formula(kF16); }
TEST(DTypeBF16, DecodeMatchesFormulaForAllPatterns) { expect_decode_matches_formula(kBF16); }
TEST(DTypeF16, RoundTripThroughF32IsIdentityForAllPatterns) { expect_round_trip_identity(kF16); }
TEST(DTypeBF16, RoundTripThroughF32IsIdentityForAllPatterns) { expect_round_trip_identity(kBF16); }

// The oracle must itself be right before it can judge: re-encoding every finite value
// of the format has to give back its pattern (this also checks pattern_of for -0).
TEST(DTypeOracle, ReencodesEveryFiniteValueOfBothFormats) {
  for (const Format* f : {&kF16, &kBF16}) {
    Mismatches bad(std::string("oracle self-check ") + f->name);
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
      const auto h = static_cast<std::uint16_t>(i);
      if (exp_field(*f, h) == exp_all_ones(*f)) continue;
      const std::uint16_t back = rne_oracle(*f, static_cast<float>(formula(*f, h)));
      if (back != h) bad.add(hex(h) + " -> " + hex(back));
    }
  }
}

// ---- f32 -> f16 ------------------------------------------------------------------------

#if defined(__FLT16_MAX__)
// __extension__ keeps -Wpedantic quiet on compilers that flag _Float16 in C++.
__extension__ typedef _Float16 CompilerHalf;
std::uint16_t f16_by_compiler(float x) { return std::bit_cast<std::uint16_t>(static_cast<CompilerHalf>(x)); }
#endif

TEST(DTypeF16, EncodeMatchesCompilerFloat16) {
#if defined(__FLT16_MAX__)
  // The compiler's conversion is RNE with IEEE overflow/subnormal handling (libgcc soft-fp
  // or F16C): an oracle that shares no code with ours.
  sweep(kF16, f16_critical(), f16_by_compiler, "_Float16");
#else
  GTEST_SKIP() << "this compiler has no _Float16; the exact oracle test still runs";
#endif
}

TEST(DTypeF16, EncodeMatchesExactOracle) {
  sweep(kF16, f16_critical(), [](float x) { return rne_oracle(kF16, x); }, "exact oracle");
}

// Between every two adjacent finite f16 values (and between 65504 and 2^16, the value
// that would follow it): the midpoint rounds to the neighbour with an even mantissa, and
// one f32 ulp either side rounds to the nearer neighbour. No oracle needed.
void expect_midpoints_round_to_even(const Format& f) {
  Mismatches bad(std::string(f.name) + " midpoints");
  const std::uint16_t inf = inf_bits(f);
  for (std::uint16_t h = 0; h < inf; ++h) {
    const double lo = formula(f, h);
    const double hi = h + 1 == inf ? std::ldexp(1.0, f.bias + 1) : formula(f, static_cast<std::uint16_t>(h + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact: needs M+2 significant bits
    const auto up = static_cast<std::uint16_t>(h + 1);
    const std::uint16_t even = (h % 2 == 0) ? h : up;
    for (int s : {0, 1}) {
      const float sgn = s ? -1.0f : 1.0f;
      const auto sbit = static_cast<std::uint16_t>(s ? 0x8000 : 0);
      const std::pair<float, std::uint16_t> cases[] = {
          {mid, even}, {std::nextafter(mid, 0.0f), h}, {std::nextafter(mid, INFINITY), up}};
      for (const auto& [x, want] : cases) {
        const std::uint16_t got = f.encode(sgn * x);
        const auto signed_want = static_cast<std::uint16_t>(want | sbit);
        if (got != signed_want) bad.add(hex(bits_of(sgn * x)) + " -> " + hex(got) + ", want " + hex(signed_want));
      }
    }
  }
}

TEST(DTypeF16, MidpointsRoundToEvenAndNeighboursToNearest) { expect_midpoints_round_to_even(kF16); }
TEST(DTypeBF16, MidpointsRoundToEvenAndNeighboursToNearest) { expect_midpoints_round_to_even(kBF16); }

// Hand-derived landmarks, so a reader can see the edge semantics at a glance.
TEST(DTypeF16, EncodeLandmarks) {
  EXPECT_EQ(f32_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bff);                      // max finite
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff); // just below the tie
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);                      // tie: 0x7bff is odd -> inf
  EXPECT_EQ(f32_to_f16_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16_bits(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);          // smallest normal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);          // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);          // tie with 0 -> 0
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);          // tie 1.5 ulp -> 2
  EXPECT_EQ(f32_to_f16_bits(-std::ldexp(1.0f, -26)), 0x8000);         // underflow keeps the sign
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
}

// ---- f32 -> bf16 -----------------------------------------------------------------------

TEST(DTypeBF16, EncodeMatchesExactOracle) {
  sweep(kBF16, bf16_critical(), [](float x) { return rne_oracle(kBF16, x); }, "exact oracle");
}

TEST(DTypeBF16, EncodeLandmarks) {
  // bf16 max finite is (2 − 2^-7)·2^127 ≈ 3.3895e38; the midpoint to 2^128 is ≈ 3.3961e38.
  EXPECT_EQ(f32_to_bf16_bits(3.39e38f), 0x7f7f);
  EXPECT_EQ(f32_to_bf16_bits(3.4e38f), 0x7f80);
  EXPECT_EQ(f32_to_bf16_bits(-3.4e38f), 0xff80);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7f7f7fffu)), 0x7f7f);  // just below the tie
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7f7f8000u)), 0x7f80);  // tie: 0x7f7f is odd -> inf
  EXPECT_EQ(f32_to_bf16_bits(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);       // tie -> even (1.0)
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(3.0f, -8)), 0x3f82);       // tie -> even (up)
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x00008000u)), 0x0000);             // subnormal tie -> 0
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x00018000u)), 0x0002);             // subnormal tie -> 2
}

// NaNs of every kind (quiet, signalling, max payload, both signs) stay NaN, become
// quiet and keep their sign — including signalling NaNs whose payload lies only in the
// bits that the narrowing drops (the classic "NaN truncated to inf" bug).
TEST(DTypeNaN, EncodeKeepsNaNQuietWithSign) {
  for (std::uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7f801000u, 0x7f80ffffu, 0x7fffffffu, 0x7fa00000u}) {
    for (std::uint32_t s : {0u, 0x80000000u}) {
      const float x = float_of(u | s);
      for (const Format* f : {&kF16, &kBF16}) {
        const std::uint16_t h = f->encode(x);
        EXPECT_TRUE(is_quiet_nan_bits(*f, h)) << f->name << " " << hex(u | s) << " -> " << hex(h);
        EXPECT_EQ((h & 0x8000) != 0, s != 0) << f->name << " " << hex(u | s);
      }
    }
  }
}

// ---- round_to_dtype, epsilon, size, names ------------------------------------------------

TEST(DTypeRound, MatchesExactOracleOnRandomValues) {
  KVLAB_SEEDED_RNG(rng, 20240611);
  for (int i = 0; i < 20000; ++i) {
    // log-uniform magnitudes from f16-subnormal to beyond f16 overflow, random sign
    const auto x = static_cast<float>((rng.integer(0, 1) ? -1 : 1) * std::exp2(rng.uniform(-30.0, 20.0)));
    EXPECT_EQ(bits_of(round_to_dtype(x, DType::f32)), bits_of(x));
    EXPECT_EQ(static_cast<double>(round_to_dtype(x, DType::f16)), formula(kF16, rne_oracle(kF16, x))) << x;
    EXPECT_EQ(static_cast<double>(round_to_dtype(x, DType::bf16)), formula(kBF16, rne_oracle(kBF16, x))) << x;
  }
}

TEST(DTypeRound, TiesAndSpecials) {
  const float one = 1.0f;
  EXPECT_EQ(round_to_dtype(one + std::ldexp(1.0f, -11), DType::f16), one);  // tie -> even
  EXPECT_EQ(round_to_dtype(one + std::ldexp(3.0f, -11), DType::f16), one + std::ldexp(1.0f, -9));
  EXPECT_EQ(round_to_dtype(70000.0f, DType::f16), INFINITY);
  EXPECT_EQ(round_to_dtype(70000.0f, DType::bf16), 70144.0f);  // 70000 = 1.068·2^16, ulp 2^9
  EXPECT_TRUE(std::isnan(round_to_dtype(NAN, DType::f16)));
  EXPECT_TRUE(std::isnan(round_to_dtype(NAN, DType::bf16)));
  EXPECT_TRUE(std::signbit(round_to_dtype(-0.0f, DType::bf16)));
}

TEST(DTypeRound, IntegerDTypeIsAnError) {
  for (DType t : {DType::u32, DType::i32, DType::u8}) {
    try {
      round_to_dtype(1.0f, t);
      ADD_FAILURE() << "round_to_dtype accepted " << dtype_name(t);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::dtype_mismatch);
      EXPECT_THAT(e.what(), HasSubstr(std::string(dtype_name(t))));
    }
    EXPECT_THROW(dtype_epsilon(t), Error);
  }
}

// Epsilon is the gap from 1 to the next representable value, derived here from the
// format itself (the pattern after 1.0), and 1 + eps/2 must round back to 1 (tie -> even).
TEST(DTypeEpsilon, IsTheGapAfterOne) {
  EXPECT_EQ(dtype_epsilon(DType::f32), std::ldexp(1.0, -23));
  EXPECT_EQ(dtype_epsilon(DType::f32), static_cast<double>(std::numeric_limits<float>::epsilon()));
  EXPECT_EQ(dtype_epsilon(DType::f16), std::ldexp(1.0, -10));
  EXPECT_EQ(dtype_epsilon(DType::f16), formula(kF16, 0x3c01) - 1.0);
  EXPECT_EQ(dtype_epsilon(DType::bf16), std::ldexp(1.0, -7));
  EXPECT_EQ(dtype_epsilon(DType::bf16), formula(kBF16, 0x3f81) - 1.0);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const double eps = dtype_epsilon(t);
    EXPECT_EQ(round_to_dtype(static_cast<float>(1.0 + eps), t), static_cast<float>(1.0 + eps)) << dtype_name(t);
    EXPECT_EQ(round_to_dtype(static_cast<float>(1.0 + eps / 2), t), 1.0f) << dtype_name(t);
  }
}

TEST(DTypeSize, MatchesStorageTypes) {
  EXPECT_EQ(dtype_size(DType::f32), sizeof(float));
  EXPECT_EQ(dtype_size(DType::f16), sizeof(std::uint16_t));
  EXPECT_EQ(dtype_size(DType::bf16), sizeof(std::uint16_t));
  EXPECT_EQ(dtype_size(DType::u32), sizeof(std::uint32_t));
  EXPECT_EQ(dtype_size(DType::i32), sizeof(std::int32_t));
  EXPECT_EQ(dtype_size(DType::u8), sizeof(std::uint8_t));
  static_assert(is_float(DType::f32) && is_float(DType::f16) && is_float(DType::bf16));
  static_assert(!is_float(DType::u32) && !is_float(DType::i32) && !is_float(DType::u8));
}

// The names are the vocabulary of case files and the CLI, so they are pinned exactly.
TEST(DTypeName, RoundTripsAndIsPinned) {
  const std::pair<DType, const char*> all[] = {{DType::f32, "f32"}, {DType::f16, "f16"}, {DType::bf16, "bf16"},
                                               {DType::u32, "u32"}, {DType::i32, "i32"}, {DType::u8, "u8"}};
  for (const auto& [t, name] : all) {
    EXPECT_EQ(dtype_name(t), name);
    EXPECT_EQ(dtype_from_name(name), t);
  }
}

TEST(DTypeName, UnknownNameIsAnErrorNamingIt) {
  for (const char* name : {"f64", "F32", "float16", "bfloat16", "f16 ", "int8"}) {
    try {
      dtype_from_name(name);
      ADD_FAILURE() << "accepted '" << name << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
      EXPECT_THAT(e.what(), HasSubstr(name));
    }
  }
  EXPECT_THROW(dtype_from_name(""), Error);
}

}  // namespace
}  // namespace test_core_dtype
}  // namespace kvlab
