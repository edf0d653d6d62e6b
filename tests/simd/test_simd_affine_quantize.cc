// SIMD affine quantize/dequantize == the oracle, bit for bit (codes, scales, biases,
// dequantized values), on every attainable Highway target, plus the same errors.
// The kernel's internal structure the cases aim at: 2/4/8-bit codes packed in registers
// and the other widths through a byte buffer; parameters computed 32 groups at a time
// (whole and partial blocks); several parallel tasks per call; a scalar path for groups
// with NaN/inf; F16C conversions on AVX2/AVX3 and bit manipulations elsewhere. Rows of
// plain random (or grid) values and the empty batch axis are harness lines
// (harness/cases/affine_*/ci, run on every target by harness.check_ci_host); the rows
// here are built group by group, which a case line cannot state.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_affine_quantize {
namespace {

struct Quantized {
  Tensor wq, scales, biases;
};

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

Quantized quantize_on(Backend& be, const Tensor& x, const QuantSpec& spec, Rounding rounding) {
  const std::int64_t d = x.dim(-1);
  const DTensor dx = be.upload(x);
  const DTensor wq = be.allocate(DType::u32, with_last(x.shape(), spec.packed_words(d)));
  const DTensor sc = be.allocate(x.dtype(), with_last(x.shape(), spec.groups(d)));
  const DTensor bi = be.allocate(x.dtype(), with_last(x.shape(), spec.groups(d)));
  // Poison the outputs so an unwritten element cannot pass by matching zeros.
  be.fill(wq, 0xDEADBEEFu);
  be.fill(sc, 0x7FC1u);
  be.fill(bi, 0x7FC1u);
  be.quantize({dx, rounding, {wq, sc, bi, spec}});
  return {be.download(wq), be.download(sc), be.download(bi)};
}

Tensor dequantize_on(Backend& be, const Quantized& q, const QuantSpec& spec, DType out_dtype) {
  const DTensor out = be.allocate(out_dtype, with_last(q.wq.shape(), q.scales.dim(-1) * spec.group_size));
  be.fill(out, 0x7FC00001u);
  be.dequantize({{be.upload(q.wq), be.upload(q.scales), be.upload(q.biases), spec}, out});
  return be.download(out);
}

// bit_equal, and on a mismatch the first differing element's bits (both tensors), so a
// failure names the value and not only a byte offset.
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  ::testing::AssertionResult r = testing::bit_equal(got, want);
  if (r || got.nbytes() != want.nbytes()) return r;
  const std::size_t es = dtype_size(got.dtype());
  for (std::size_t i = 0; i < got.nbytes(); i += es) {
    std::uint32_t a = 0, b = 0;
    std::memcpy(&a, got.data() + i, es);
    std::memcpy(&b, want.data() + i, es);
    if (a != b) return r << "; element " << i / es << ": got bits " << a << ", oracle bits " << b;
  }
  return r;
}

// Codes, scales and biases bit for bit.
void expect_same_bits(const Quantized& got, const Quantized& want) {
  EXPECT_TRUE(same_bits(got.wq, want.wq));
  EXPECT_TRUE(same_bits(got.scales, want.scales));
  EXPECT_TRUE(same_bits(got.biases, want.biases));
}

// |a| for which a / 1e-7f is the float just below 0.5 (0.49999997f): a group {a, −a, 0…}
// has q0 = 0, scale −1e-7f, bias 0, and −a asks round() about exactly 0.49999997f —
// the value that breaks the `trunc(x + 0.5)` shortcut (the sum rounds to 1.0f).
float just_below_half_tie() {
  const float target = std::nextafter(0.5f, 0.0f);
  for (float a = 0.5f * 1e-7f; a > 0.4f * 1e-7f; a = std::nextafter(a, 0.0f)) {
    if (a / 1e-7f == target) return a;
  }
  ADD_FAILURE() << "no float a with a / 1e-7f == 0.49999997f";
  return 0.0f;
}

// One row of D values made of groups of many kinds: random, constant, all-negative,
// exact .5 ties (group {0, n, k + 0.5…}: scale −1, bias n, so q = n − g exactly),
// huge, tiny/subnormal, the 0.49999997 and exact 0.5 cases at the 1e-7 step floor,
// zeros, offset data, and one NaN/Inf group (unspecified upstream; the scalar paths
// must still agree).
std::vector<float> special_row(testing::SeededRng& rng, std::int64_t d, int gs, int bits, std::int64_t row) {
  const float n = static_cast<float>((1 << bits) - 1);
  const float near_half = just_below_half_tie();
  std::vector<float> v(static_cast<std::size_t>(d));
  for (std::int64_t g = 0; g < d / gs; ++g) {
    float* p = v.data() + g * gs;
    const auto kind = (g + row) % 11;
    for (int j = 0; j < gs; ++j) {
      const auto z = static_cast<float>(rng.normal());
      switch (kind) {
        case 0: p[j] = z; break;
        case 1: p[j] = 0.75f; break;
        case 2: p[j] = -std::abs(z) - 0.1f; break;
        case 3: p[j] = j == 0 ? 0.0f : j == 1 ? n : static_cast<float>(rng.integer(0, (1 << bits) - 2)) + 0.5f; break;
        case 4: p[j] = z * 1e30f; break;
        case 5: p[j] = j % 2 ? z * 1e-30f : z * 1e-40f; break;
        case 6: p[j] = j == 0 ? near_half : j == 1 ? -near_half : 0.0f; break;
        case 7: p[j] = j == 0 ? 0.5e-7f : j == 1 ? -0.5e-7f : 0.0f; break;
        case 8: p[j] = 0.0f; break;
        case 9: p[j] = 1000.0f + z; break;
        default:
          p[j] = j == 3 ? std::numeric_limits<float>::quiet_NaN()
                 : j == 5 ? (row % 2 ? std::numeric_limits<float>::infinity() : -1.0f)
                          : z;
      }
    }
  }
  return v;
}

class SimdAffine : public ::testing::Test {
 protected:
  ReferenceBackend ref_;
  SimdBackend simd_;
};

TEST_F(SimdAffine, QuantizeAndDequantizeMatchTheOracleBitForBitOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 20240611);
  const std::vector<Shape> shapes = {{1, 128}, {3, 384}, {2, 2, 256}};
  int cases = 0;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const int bits : {2, 3, 4, 5, 6, 8})
      for (const int gs : {32, 64, 128})
        for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu})
          for (const Shape& shape : shapes) {
            const QuantSpec spec = QuantSpec::make(QuantMode::affine, bits, gs);
            const std::int64_t d = shape.back(), rows = shape_numel(shape) / d;
            std::vector<float> values;
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::vector<float> row = special_row(rng, d, gs, bits, r + cases);
              values.insert(values.end(), row.begin(), row.end());
            }
            const Tensor x = Tensor::from_values(dtype, shape, values);
            SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << to_string(spec) << " "
                                              << rounding_name(rounding) << " " << shape_str(shape));
            const Quantized want = quantize_on(ref_, x, spec, rounding);
            const Tensor want_deq = dequantize_on(ref_, want, spec, dtype);
            const Tensor want_deq32 = dequantize_on(ref_, want, spec, DType::f32);
            testing::for_each_simd_target([&](const std::string&) {
              const Quantized got = quantize_on(simd_, x, spec, rounding);
              expect_same_bits(got, want);
              EXPECT_TRUE(same_bits(dequantize_on(simd_, want, spec, dtype), want_deq));
              EXPECT_TRUE(same_bits(dequantize_on(simd_, want, spec, DType::f32), want_deq32));
            });
            if (::testing::Test::HasFailure()) return;  // one failing config is enough output
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 6 * 3 * 2 * 3);
}

TEST_F(SimdAffine, RoundingEdgeCasesGiveTheOracleCodes) {
  // Direct pins (f32, 2 bits, group 32) of what the mixed test covers in bulk.
  const float a = just_below_half_tie();
  for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu}) {
    std::vector<float> v(32, 0.0f);
    v[0] = a;
    v[1] = -a;
    const Tensor x = Tensor::from_values(DType::f32, {1, 32}, v);
    const QuantSpec spec = QuantSpec::make(QuantMode::affine, 2, 32);
    const Quantized want = quantize_on(ref_, x, spec, rounding);
    EXPECT_EQ(want.wq.to_ints()[0], 0) << "oracle: 0.49999997 rounds to code 0";
    testing::for_each_simd_target([&](const std::string&) {
      const Quantized got = quantize_on(simd_, x, spec, rounding);
      EXPECT_TRUE(same_bits(got.wq, want.wq));
      EXPECT_TRUE(same_bits(got.scales, want.scales));
    });
  }
}

// The kernel encodes with (g − bias)·(1/scale) and redoes a group with the true
// division when a lane lands within 2^-13 of a half-integer. Values a few ulps around
// bias + (k + 0.5)·scale put q = (g − bias)/scale on both sides of the half and on it,
// where a reciprocal's rounding differs from the division's: every such group must be
// redone. Groups: random extremes at j = 0, 1 (fixing scale and bias, read back from
// the oracle with f32 parameters), the rest near steps of that scale. Around 0 the
// mlx_cpu kernel encodes with one FMA, g·r − fl(bias·r); around 1000 (|bias/scale| in
// the thousands) that form's error would exceed the doubt margin, so such groups must
// take Sub then Mul (affine_quantize.cc header, "the fused form").
TEST_F(SimdAffine, ValuesWithinUlpsOfHalfSteps) {
  KVLAB_SEEDED_RNG(rng, 20261121);
  const std::size_t gs = 64, rows = 96;
  for (const float offset : {0.0f, 1000.0f})
    for (const int bits : {4, 8})
      for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu}) {
        const QuantSpec spec = QuantSpec::make(QuantMode::affine, bits, static_cast<int>(gs));
        std::vector<float> v(rows * gs, offset);  // inside [lo, hi]: the extremes stay j = 0, 1
        for (std::size_t r = 0; r < rows; ++r) {
          v[r * gs] = offset - 0.1f - static_cast<float>(std::abs(rng.normal()));
          v[r * gs + 1] = offset + 0.1f + static_cast<float>(std::abs(rng.normal()));
        }
        const Shape shape = {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(gs)};
        const Quantized params = quantize_on(ref_, Tensor::from_values(DType::f32, shape, v), spec, rounding);
        const auto& scales = params.scales.storage<float>();
        const auto& biases = params.biases.storage<float>();
        for (std::size_t r = 0; r < rows; ++r) {
          const float lo = v[r * gs], hi = v[r * gs + 1];
          for (std::size_t j = 2; j < gs; ++j) {
            const auto k = static_cast<float>(rng.integer(0, (1 << bits) - 2));
            float x = biases(r, 0) + (k + 0.5f) * scales(r, 0);
            for (auto steps = rng.integer(-3, 3); steps != 0; steps += steps > 0 ? -1 : 1)
              x = std::nextafter(x, steps > 0 ? hi : lo);
            v[r * gs + j] = std::min(std::max(x, lo), hi);  // the extremes stay j = 0, 1
          }
        }
        const Tensor x = Tensor::from_values(DType::f32, shape, v);
        SCOPED_TRACE(::testing::Message() << to_string(spec) << " " << rounding_name(rounding) << " around "
                                          << offset);
        const Quantized want = quantize_on(ref_, x, spec, rounding);
        EXPECT_TRUE(same_bits(want.scales, params.scales)) << "the construction moved an extreme";
        testing::for_each_simd_target([&](const std::string&) {
          EXPECT_TRUE(same_bits(quantize_on(simd_, x, spec, rounding).wq, want.wq));
        });
      }
}

// Enough groups for several parallel tasks (the SIMD kernel runs 65536 elements per
// task) and a final block of fewer than 32 groups (parameters are computed 32 groups
// at a time): 557 rows × 256 = 4456 groups of 32 (2 full tasks + 360 = 11·32 + 8) or
// 1114 groups of 128 (2 full tasks + 90 = 2·32 + 26).
// Under ASan (testing::kSanitized) each bit width takes one of the two roundings, in
// turn: the rounding changes arithmetic, not the memory accessed, and the ci build runs
// every combination on every target (docs/ci.md §Test costs).
TEST_F(SimdAffine, ManyGroupsAcrossTasksAndPartialBlocksMatchTheOracle) {
  KVLAB_SEEDED_RNG(rng, 20240612);
  const Shape shape = {557, 256};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const int bits : {2, 3, 4, 8})  // 3: the generic width path (5, 6 above)
      for (const int gs : {32, 128})
        for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu}) {
          if (testing::kSanitized && (rounding == Rounding::mlx_gpu) != (bits % 4 != 0)) continue;
          const QuantSpec spec = QuantSpec::make(QuantMode::affine, bits, gs);
          std::vector<float> values;
          for (std::int64_t r = 0; r < shape[0]; ++r) {
            const std::vector<float> row = special_row(rng, shape[1], gs, bits, r);
            values.insert(values.end(), row.begin(), row.end());
          }
          const Tensor x = Tensor::from_values(dtype, shape, values);
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << to_string(spec) << " "
                                            << rounding_name(rounding));
          const Quantized want = quantize_on(ref_, x, spec, rounding);
          const Tensor want_deq = dequantize_on(ref_, want, spec, dtype);
          testing::for_each_simd_target([&](const std::string&) {
            const Quantized got = quantize_on(simd_, x, spec, rounding);
            expect_same_bits(got, want);
            EXPECT_TRUE(same_bits(dequantize_on(simd_, want, spec, dtype), want_deq));
          });
          if (::testing::Test::HasFailure()) return;
        }
}

Tensor from_bits16(DType dtype, Shape shape, const std::vector<std::uint16_t>& bits) {
  Tensor t(dtype, std::move(shape));
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), bits.size());
  std::memcpy(t.data(), bits.data(), bits.size() * sizeof(std::uint16_t));
  return t;
}

// f16/bf16 inputs given as raw bits, including what Tensor::from_values cannot make:
// signaling NaNs of both signs (F16C quiets them on load), quiet NaNs, ±inf, subnormals
// of both signs, ±max, −0; plus a group made only of subnormals (a step below the
// 1e-7 floor in f16) and groups of random finite bit patterns.
TEST_F(SimdAffine, RawHalfBitPatternsIncludingSignalingNaNMatchTheOracle) {
  KVLAB_SEEDED_RNG(rng, 20240613);
  constexpr int kGroup = 32, kGroups = 8;
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const bool f16 = dtype == DType::f16;
    const std::uint16_t exp_mask = f16 ? 0x7C00 : 0x7F80;
    const auto random_finite = [&] {
      auto b = static_cast<std::uint16_t>(rng.integer(0, 0xFFFF));
      return (b & exp_mask) == exp_mask ? static_cast<std::uint16_t>(b & ~0x0400u & 0xFFFFu) : b;
    };
    const auto random_subnormal = [&] {
      const auto m = static_cast<std::uint16_t>(rng.integer(1, f16 ? 0x03FF : 0x007F));
      return static_cast<std::uint16_t>(rng.integer(0, 1) ? m | 0x8000 : m);
    };
    const std::vector<std::uint16_t> finite_specials =
        f16 ? std::vector<std::uint16_t>{0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x8000, 0x0000, 0x3C00}
            : std::vector<std::uint16_t>{0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x8000, 0x0000, 0x3F80};
    const std::uint16_t snan = f16 ? 0x7C01 : 0x7F81, qnan = f16 ? 0x7E00 : 0x7FC0, inf = exp_mask;
    for (int rows : {1, 3}) {
      std::vector<std::uint16_t> bits;
      for (int r = 0; r < rows; ++r)
        for (int g = 0; g < kGroups; ++g)
          for (int j = 0; j < kGroup; ++j) {
            std::uint16_t b = random_finite();
            switch (g) {
              case 0: if (j < 8) b = finite_specials[static_cast<std::size_t>(j)]; break;
              case 1: if (j == 5) b = snan; break;
              case 2: if (j == 0) b = static_cast<std::uint16_t>(snan | 0x8000); if (j == 31) b = qnan; break;
              case 3: if (j == 7) b = inf; if (j == 9) b = static_cast<std::uint16_t>(inf | 0x8000); break;
              case 4: b = random_subnormal(); break;
              case 5: if (j == 1) b = static_cast<std::uint16_t>(qnan | 0x8000); break;
              default: break;
            }
            bits.push_back(b);
          }
      const Tensor x = from_bits16(dtype, {rows, kGroups * kGroup}, bits);
      for (const int bits_per_code : {2, 3, 4, 8})
        for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu}) {
          const QuantSpec spec = QuantSpec::make(QuantMode::affine, bits_per_code, kGroup);
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows " << rows << " " << to_string(spec) << " "
                                            << rounding_name(rounding));
          const Quantized want = quantize_on(ref_, x, spec, rounding);
          testing::for_each_simd_target([&](const std::string&) {
            const Quantized got = quantize_on(simd_, x, spec, rounding);
            expect_same_bits(got, want);
          });
          if (::testing::Test::HasFailure()) return;
        }
    }
  }
}

// Dequantize of words the quantizer would not necessarily produce (every code of every
// width, random bits) with scales/biases of magnitudes 2^-40..2^40 (f16/bf16 storage
// gives inf, 0 and subnormals) and a few NaN scales, into every float dtype; 2408 / 602
// groups (several tasks, whole and partial parameter blocks).
// Under ASan (testing::kSanitized) each parameter dtype meets one output dtype, a
// different one for each (a diagonal of the 3×3 that visits every dtype on both sides);
// the ci build runs all nine on every target.
TEST_F(SimdAffine, DequantizeOfArbitraryWordsAndParametersMatchesTheOracle) {
  KVLAB_SEEDED_RNG(rng, 20240614);
  const std::int64_t rows = 301, d = 256;
  for (const DType param_dtype : {DType::f32, DType::f16, DType::bf16})
    for (const int bits : {2, 3, 4, 6, 8})
      for (const int gs : {32, 128}) {
        const QuantSpec spec = QuantSpec::make(QuantMode::affine, bits, gs);
        std::vector<std::int64_t> words(static_cast<std::size_t>(rows * spec.packed_words(d)));
        for (auto& w : words) w = rng.integer(0, 0xFFFFFFFF);
        const auto random_params = [&](bool with_nan) {
          std::vector<float> v(static_cast<std::size_t>(rows * spec.groups(d)));
          for (auto& p : v) {
            p = static_cast<float>(std::ldexp(rng.normal(), static_cast<int>(rng.integer(-40, 40))));
            if (with_nan && rng.integer(0, 99) == 0) p = std::numeric_limits<float>::quiet_NaN();
          }
          return Tensor::from_values(param_dtype, {rows, spec.groups(d)}, v);
        };
        // NaN scales only: code·NaN, 0·inf and inf − inf are NaN, and adding a NaN bias
        // to a NaN product would leave the payload to operand order, which the compiler
        // may swap (IEEE add commutes; x86 returns the first NaN) in either backend.
        const Quantized q{Tensor::from_ints(DType::u32, {rows, spec.packed_words(d)}, words), random_params(true),
                          random_params(false)};
        for (const DType out_dtype : {DType::f32, DType::f16, DType::bf16}) {
          if (testing::kSanitized && !((param_dtype == DType::f32 && out_dtype == DType::f16) ||
                                       (param_dtype == DType::f16 && out_dtype == DType::bf16) ||
                                       (param_dtype == DType::bf16 && out_dtype == DType::f32))) {
            continue;
          }
          SCOPED_TRACE(::testing::Message() << "params " << dtype_name(param_dtype) << " " << to_string(spec)
                                            << " out " << dtype_name(out_dtype));
          const Tensor want = dequantize_on(ref_, q, spec, out_dtype);
          testing::for_each_simd_target(
              [&](const std::string&) { EXPECT_TRUE(same_bits(dequantize_on(simd_, q, spec, out_dtype), want)); });
          if (::testing::Test::HasFailure()) return;
        }
      }
}

// The vectorized f32 → f16/bf16 rounding of the dequantize output, value by value: all
// codes 0 and scale 1 make each group's output its bias exactly (0·1 + b = b), so the
// biases below reach the conversion unchanged: ties to even at both ends of the f16
// normal range and in the subnormals, the overflow threshold 65520, bf16 ties, the
// largest f32 (bf16 rounds it to inf), NaNs with payloads (quiet, signaling, negative).
TEST_F(SimdAffine, DequantizeRoundsToHalfPrecisionLikeKvlabsConversions) {
  const std::vector<std::uint32_t> bias_bits = {
      0x3F800000, 0x3F801000, 0x3F803000, 0x3F800001, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x501502F9,
      0x38800000, 0x38000000, 0x33000000, 0x33800000, 0x33C00000, 0x387FC000, 0x387FE000, 0x34000001,
      0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x00000001, 0x80400000,
      0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x80000000, 0xC77FF000, 0xB3000001};
  const auto groups = static_cast<std::int64_t>(bias_bits.size());
  std::vector<float> biases;
  for (const std::uint32_t b : bias_bits) biases.push_back(std::bit_cast<float>(b));
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 4, 32);
  const Quantized q{Tensor(DType::u32, {groups, spec.packed_words(32)}),
                    Tensor::from_values(DType::f32, {groups, 1}, std::vector<float>(bias_bits.size(), 1.0f)),
                    Tensor::from_values(DType::f32, {groups, 1}, biases)};
  for (const DType out_dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(out_dtype));
    const Tensor want = dequantize_on(ref_, q, spec, out_dtype);
    const std::vector<std::uint16_t> want_bits = [&] {  // the oracle really went through dtype.h
      std::vector<std::uint16_t> w(static_cast<std::size_t>(want.numel()));
      std::memcpy(w.data(), want.data(), w.size() * sizeof(std::uint16_t));
      return w;
    }();
    EXPECT_EQ(want_bits[32 * 6], out_dtype == DType::f16 ? 0x7C00 : 0x4780) << "65520 → f16 inf";
    testing::for_each_simd_target(
        [&](const std::string&) { EXPECT_TRUE(same_bits(dequantize_on(simd_, q, spec, out_dtype), want)); });
  }
}

TEST_F(SimdAffine, InvalidInputRaisesTheOraclesErrors) {
  const QuantSpec ok = QuantSpec::make(QuantMode::affine, 4, 64);
  struct Bad {
    const char* what;
    DType x_dtype;
    Shape x_shape;
    QuantSpec spec;
    DType wq_dtype;
    Shape wq_shape;
    DType sc_dtype;
    Shape sc_shape;
    Shape bi_shape;
  };
  QuantSpec bits7 = ok;
  bits7.bits = 7;
  QuantSpec group48 = ok;
  group48.group_size = 48;
  const QuantSpec fp = QuantSpec::make(QuantMode::mxfp4);
  const std::vector<Bad> bad = {
      {"bits 7", DType::f32, {2, 128}, bits7, DType::u32, {2, 16}, DType::f32, {2, 2}, {2, 2}},
      {"group 48", DType::f32, {2, 96}, group48, DType::u32, {2, 12}, DType::f32, {2, 2}, {2, 2}},
      {"fp mode", DType::f32, {2, 128}, fp, DType::u32, {2, 16}, DType::f32, {2, 2}, {2, 2}},
      {"int x", DType::i32, {2, 128}, ok, DType::u32, {2, 16}, DType::i32, {2, 2}, {2, 2}},
      {"rank 0", DType::f32, {}, ok, DType::u32, {}, DType::f32, {}, {}},
      {"D % group", DType::f32, {2, 96}, ok, DType::u32, {2, 12}, DType::f32, {2, 1}, {2, 1}},
      {"wq dtype", DType::f32, {2, 128}, ok, DType::i32, {2, 16}, DType::f32, {2, 2}, {2, 2}},
      {"wq shape", DType::f32, {2, 128}, ok, DType::u32, {2, 15}, DType::f32, {2, 2}, {2, 2}},
      {"scales dtype", DType::bf16, {2, 128}, ok, DType::u32, {2, 16}, DType::f32, {2, 2}, {2, 2}},
      {"scales shape", DType::f32, {2, 128}, ok, DType::u32, {2, 16}, DType::f32, {2, 3}, {2, 2}},
      {"biases shape", DType::f32, {2, 128}, ok, DType::u32, {2, 16}, DType::f32, {2, 2}, {1, 2}},
  };
  for (const Bad& b : bad) {
    auto call = [&](Backend& be) {
      const DTensor x = be.allocate(b.x_dtype, b.x_shape);
      const DTensor wq = be.allocate(b.wq_dtype, b.wq_shape);
      const DTensor sc = be.allocate(b.sc_dtype, b.sc_shape);
      const DTensor bi = be.allocate(b.sc_dtype, b.bi_shape);
      be.quantize({x, Rounding::mlx_cpu, {wq, sc, bi, b.spec}});
    };
    testing::expect_same_error([&] { call(ref_); }, [&] { call(simd_); }, b.what);
  }
  // Dequantize: wq dtype, biases shape, word/group mismatch, out shape, leading axes.
  struct BadDq {
    const char* what;
    DType wq_dtype;
    Shape wq_shape, sc_shape, bi_shape, out_shape;
    DType out_dtype;
  };
  const std::vector<BadDq> bad_dq = {
      {"wq dtype", DType::i32, {2, 16}, {2, 2}, {2, 2}, {2, 128}, DType::f32},
      {"biases shape", DType::u32, {2, 16}, {2, 2}, {2, 1}, {2, 128}, DType::f32},
      {"words vs groups", DType::u32, {2, 16}, {2, 3}, {2, 3}, {2, 192}, DType::f32},
      {"out shape", DType::u32, {2, 16}, {2, 2}, {2, 2}, {2, 64}, DType::f32},
      {"out dtype", DType::u32, {2, 16}, {2, 2}, {2, 2}, {2, 128}, DType::u8},
      {"leading axes", DType::u32, {2, 16}, {3, 2}, {3, 2}, {2, 128}, DType::f32},
  };
  for (const BadDq& b : bad_dq) {
    auto call = [&](Backend& be) {
      const DTensor wq = be.allocate(b.wq_dtype, b.wq_shape);
      const DTensor sc = be.allocate(DType::f32, b.sc_shape);
      const DTensor bi = be.allocate(DType::f32, b.bi_shape);
      const DTensor out = be.allocate(b.out_dtype, b.out_shape);
      be.dequantize({{wq, sc, bi, ok}, out});
    };
    testing::expect_same_error([&] { call(ref_); }, [&] { call(simd_); }, b.what);
  }
}

}  // namespace
}  // namespace test_simd_affine_quantize
}  // namespace kvlab
