// Unit tests of the microscaling fp oracle's quantize and dequantize (reference/fp_quantize.h,
// docs/quantization.md §Bit packing, docs/quantization.md §Microscaling formats); its
// element formats alone are tested in test_fp_formats.cc.
//
// Expectations come from independent sources: the element formats' bit-field formulas,
// brute-force nearest-value searches over those formulas, hand-derived values, and error
// bounds derived below — never from numbers printed by the implementation.
#include "reference/fp_quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "tests/unit/fp_formulas.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_fp_quantize {
namespace {

using namespace kvlab::ref;  // NOLINT(google-build-using-namespace): the unit under test
using ::testing::ElementsAre;

constexpr Rounding kGpu = Rounding::mlx_gpu, kCpu = Rounding::mlx_cpu;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
using test_fp_formulas::e2m1_formula;
using test_fp_formulas::e4m3_formula;
using test_fp_formulas::e4m3_nearest;

// Largest |v − y| for v a nearest E2M1 (fp4) / E4M3 (fp8) value to y. Inside the range the
// grid points around |y| lie in (or on the upper edge of) the binade of |y|, so the error
// is at most half its spacing: E2M1 steps 0.5 below 2, 1 in [2, 4), 2 in [4, 6]; E4M3
// 2^-9 below 2^-6 (subnormals), else 2^(⌊log2|y|⌋ − 3). Beyond the maximum v is the maximum.
double element_error_bound(double y, bool fp8) {
  const double a = std::fabs(y);
  if (!fp8) {
    if (a >= 6) return a - 6;
    return a < 2 ? 0.25 : a < 4 ? 0.5 : 1.0;
  }
  if (a >= 448) return a - 448;
  if (a < 0x1p-6) return 0x1p-10;
  int exponent = 0;
  std::frexp(a, &exponent);  // a in [2^(exponent−1), 2^exponent)
  return std::ldexp(1.0, exponent - 1 - 4);
}

// Code j of a row read with the layout of docs/quantization.md §Bit packing (bits 4 or 8 never
// straddle words).
int code_of(const QuantizedTensor& q, std::int64_t row, std::int64_t j) {
  const std::int64_t words_per_row = q.wq.dim(-1), per_word = 32 / q.spec.bits;
  const auto word = static_cast<std::uint32_t>(q.wq.view().load_int(row * words_per_row + j / per_word));
  const auto shift = static_cast<std::uint32_t>(q.spec.bits * (j % per_word));
  return static_cast<int>((word >> shift) & ((1u << q.spec.bits) - 1));
}

std::vector<int> codes_of(const QuantizedTensor& q, std::int64_t row, std::int64_t first, std::int64_t count) {
  std::vector<int> out;
  for (std::int64_t j = first; j < first + count; ++j) out.push_back(code_of(q, row, j));
  return out;
}

int scale_of(const QuantizedTensor& q, std::int64_t row, std::int64_t group) {
  return static_cast<int>(q.scales.view().load_int(row * q.scales.dim(-1) + group));
}

Tensor row_tensor(const std::vector<float>& values) {
  return Tensor::from_values(DType::f32, {1, static_cast<std::int64_t>(values.size())}, values);
}

// One row of n values: `head` followed by copies of `fill`.
Tensor padded_row(std::size_t n, float fill, std::initializer_list<float> head) {
  std::vector<float> v(n, fill);
  std::copy(head.begin(), head.end(), v.begin());
  return row_tensor(v);
}

template <class F>
std::string error_message(F&& f) {
  try { f(); } catch (const Error& e) { return e.what(); }
  return "<no kvlab::Error thrown>";
}
#define EXPECT_ERROR_MENTIONS(statement, text) \
  EXPECT_THAT(error_message([&] { statement; }), ::testing::HasSubstr(text))

TEST(FpQuantize, Fp4PacksElement2kIntoTheLowNibbleOfByteK) {
  // Row 0: group 0 holds every E2M1 value (amax 6: scale 2^0, codes j%16); group 1 the
  // reversed codes times 4 (amax 24: scale 2^2, code 129). Row 1 holds the codes shifted.
  std::vector<float> values;
  std::vector<int> expected;
  for (int j = 0; j < 128; ++j) {
    const int row = j / 64, g = (j % 64) / 32, k = j % 32;
    const int c = row == 0 ? (g == 0 ? k % 16 : 15 - k % 16) : (k + 5) % 16;
    expected.push_back(c);
    values.push_back(static_cast<float>(e2m1_formula(c) * (g == 1 && row == 0 ? 4.0 : 1.0)));
  }
  const QuantizedTensor q = ref::fp_quantize(Tensor::from_values(DType::f32, {2, 64}, values),
                                             QuantSpec::make(QuantMode::mxfp4), kGpu);
  ASSERT_EQ(q.wq.shape(), (Shape{2, 8}));
  ASSERT_EQ(q.scales.shape(), (Shape{2, 2}));
  EXPECT_EQ(scale_of(q, 0, 0), 127);
  EXPECT_EQ(scale_of(q, 0, 1), 129);
  const std::vector<std::int64_t> words = q.wq.to_ints();
  for (int j = 0; j < 128; ++j) {
    const int row = j / 64, e = j % 64, want = expected[static_cast<std::size_t>(j)];
    EXPECT_EQ(code_of(q, row, e), want) << j;  // bits [4e, 4e+4) of word e/8
    // The same fact in bytes: byte k of the row holds element 2k (low) and 2k+1 (high).
    const auto byte = static_cast<int>((words[static_cast<std::size_t>(row * 8 + e / 8)] >> (8 * ((e / 2) % 4))) & 0xFF);
    EXPECT_EQ(e % 2 == 0 ? byte & 0xF : byte >> 4, want) << j;
  }
}

TEST(FpQuantize, Fp8PacksOneBytePerElement) {
  // Exact E4M3 values, the largest 448 (0x7E), so the scale is 2^0 and codes are the inputs.
  std::vector<float> values;
  std::vector<int> expected;
  for (int j = 0; j < 32; ++j) {
    const int c = j == 0 ? 0x7E : ((j * 37 + 11) % 0x7E) | (j % 2 == 1 ? 0x80 : 0);
    expected.push_back(c);
    values.push_back(static_cast<float>(e4m3_formula(c)));
  }
  const QuantizedTensor q = ref::fp_quantize(row_tensor(values), QuantSpec::make(QuantMode::mxfp8), kGpu);
  ASSERT_EQ(q.wq.shape(), (Shape{1, 8}));
  EXPECT_EQ(scale_of(q, 0, 0), 127);
  EXPECT_THAT(codes_of(q, 0, 0, 32), ::testing::ElementsAreArray(expected));  // bits [8j, 8j+8) of word j/4
}

TEST(FpQuantize, LeadingAxesAreIndependentRows) {
  KVLAB_SEEDED_RNG(rng, 77);
  const Tensor x = testing::random_normal(rng, DType::f32, {2, 3, 64});
  const QuantizedTensor all = ref::fp_quantize(x, QuantSpec::make(QuantMode::mxfp4), kGpu);
  ASSERT_EQ(all.wq.shape(), (Shape{2, 3, 8}));
  ASSERT_EQ(all.scales.shape(), (Shape{2, 3, 2}));
  const xt::xarray<float> xs = x.to_f32();
  const Tensor flat = Tensor::from_values(DType::f32, {6, 64}, std::span<const float>(xs.data(), xs.size()));
  for (std::int64_t r = 0; r < 6; ++r) {
    const QuantizedTensor one = ref::fp_quantize(flat.slice(0, r, r + 1), QuantSpec::make(QuantMode::mxfp4), kGpu);
    for (std::int64_t j = 0; j < 64; ++j) EXPECT_EQ(code_of(all, r, j), code_of(one, 0, j));
    for (std::int64_t g = 0; g < 2; ++g) EXPECT_EQ(scale_of(all, r, g), scale_of(one, 0, g));
  }
}

TEST(FpQuantize, MxScaleTieSplitsGpuAndCpu) {
  // amax/6 lies within a few ulps of 2^10.5 (precondition checked), so the f32 log2 is
  // exactly 10.5: gpu takes exponent 11, cpu 10, and every element code follows.
  const float amax = 8688.928f;
  ASSERT_EQ(std::log2(amax / 6.0f), 10.5f);
  const Tensor x = padded_row(32, 1000.0f, {amax});
  const QuantizedTensor gpu = ref::fp_quantize(x, QuantSpec::make(QuantMode::mxfp4), kGpu);
  const QuantizedTensor cpu = ref::fp_quantize(x, QuantSpec::make(QuantMode::mxfp4), kCpu);
  EXPECT_EQ(scale_of(gpu, 0, 0), 138);
  EXPECT_EQ(scale_of(cpu, 0, 0), 137);
  EXPECT_THAT(codes_of(gpu, 0, 0, 2), ElementsAre(6, 1));  // 8688.9/2048 = 4.24 → 4; 1000/2048 = 0.49 → 0.5
  EXPECT_THAT(codes_of(cpu, 0, 0, 2), ElementsAre(7, 2));  // 8688.9/1024 = 8.49 → 6 (saturated); 0.98 → 1
}

TEST(FpQuantize, MxScaleIsTheNearestExponentAndElementsSaturate) {
  const QuantSpec fp4 = QuantSpec::make(QuantMode::mxfp4), fp8 = QuantSpec::make(QuantMode::mxfp8);
  for (Rounding r : {kGpu, kCpu}) {
    SCOPED_TRACE(rounding_name(r));
    // amax 4.1: log2(4.1/6) = −0.55 rounds to −1 (OCP's floor(log2 4.1) − 2 would give 0),
    // so 4.1/0.5 = 8.2 saturates to 6 and dequantizes to 3.
    QuantizedTensor q = ref::fp_quantize(padded_row(32, 0.5f, {4.1f}), fp4, r);
    EXPECT_EQ(scale_of(q, 0, 0), 126);
    EXPECT_THAT(codes_of(q, 0, 0, 2), ElementsAre(7, 2));  // 0.5/0.5 = 1
    EXPECT_EQ(ref::fp_dequantize(q, {}, DType::f32).view().load(0), 3.0f);
    // amax 6·2^0.45 keeps exponent 0; the max and its negation saturate to ±6.
    const auto big4 = static_cast<float>(6 * std::exp2(0.45));
    q = ref::fp_quantize(padded_row(32, 1.0f, {big4, -big4}), fp4, r);
    EXPECT_EQ(scale_of(q, 0, 0), 127);
    EXPECT_THAT(codes_of(q, 0, 0, 3), ElementsAre(0x7, 0xF, 0x2));
    // mxfp8: amax 448·2^0.45 = 611 keeps exponent 0; 611 and 460 saturate, 440 rounds up
    // to 448, −420 down to −416.
    const auto big8 = static_cast<float>(448 * std::exp2(0.45));
    q = ref::fp_quantize(padded_row(32, 1.0f, {big8, 460.0f, 440.0f, -420.0f}), fp8, r);
    EXPECT_EQ(scale_of(q, 0, 0), 127);
    EXPECT_THAT(codes_of(q, 0, 0, 5), ElementsAre(0x7E, 0x7E, 0x7E, 0xFD, 0x38));
  }
}

TEST(FpQuantize, ZeroGroupsStoreScaleCode0OnGpuAnd127OnCpu) {
  std::vector<float> v(64, 0.0f);
  v[3] = -0.0f;
  for (int j = 32; j < 64; ++j) v[static_cast<std::size_t>(j)] = 1.0f;
  const QuantSpec fp4 = QuantSpec::make(QuantMode::mxfp4), fp8 = QuantSpec::make(QuantMode::mxfp8);
  const QuantizedTensor gpu = ref::fp_quantize(row_tensor(v), fp4, kGpu);
  const QuantizedTensor cpu = ref::fp_quantize(row_tensor(v), fp4, kCpu);
  EXPECT_EQ(scale_of(gpu, 0, 0), 0);
  EXPECT_EQ(scale_of(cpu, 0, 0), 127);
  EXPECT_EQ(code_of(gpu, 0, 3), 0x8);  // −0.0 keeps its sign on Metal
  EXPECT_EQ(code_of(cpu, 0, 3), 0x0);
  for (const QuantizedTensor* q : {&gpu, &cpu}) {
    // The all-ones group: 1/6 = 2^-2.58 rounds to exponent −3 (code 124), so 1/2^-3 = 8
    // saturates at 6 and every one comes back as 6·2^-3 = 0.75.
    EXPECT_EQ(scale_of(*q, 0, 1), 124);
    const Tensor out = ref::fp_dequantize(*q, {}, DType::f32);
    for (std::int64_t j = 0; j < 32; ++j) EXPECT_EQ(out.view().load(j), 0.0f);
    for (std::int64_t j = 32; j < 64; ++j) EXPECT_EQ(out.view().load(j), 0.75f);
  }
  EXPECT_EQ(scale_of(ref::fp_quantize(row_tensor(v), fp8, kGpu), 0, 0), 0);
  EXPECT_EQ(scale_of(ref::fp_quantize(row_tensor(v), fp8, kCpu), 0, 0), 127);
  EXPECT_EQ(code_of(ref::fp_quantize(row_tensor(v), fp8, kCpu), 0, 3), 0x80);  // E4M3 has −0
}

TEST(FpQuantize, Mxfp8CoversManyBinades) {
  // One group per scale 2^k: amax 448·2^k fixes the scale exactly, the other elements
  // walk down 31 binades (normals, E4M3 subnormals, then values that round to 0).
  for (int k : {-120, -100, -20, 0, 37, 100}) {
    SCOPED_TRACE(::testing::Message() << "k = " << k);
    std::vector<float> v(32);
    v[0] = std::ldexp(448.0f, k);
    for (int j = 1; j < 32; ++j) {
      const double y = (1.0 + (j % 8) / 8.0) * std::ldexp(1.0, 8 - j) * (j % 2 == 1 ? -1 : 1);
      v[static_cast<std::size_t>(j)] = static_cast<float>(std::ldexp(y, k));
    }
    const QuantizedTensor q = ref::fp_quantize(row_tensor(v), QuantSpec::make(QuantMode::mxfp8), kGpu);
    ASSERT_EQ(scale_of(q, 0, 0), k + 127);
    const Tensor out = ref::fp_dequantize(q, {}, DType::f32);
    for (std::int64_t j = 0; j < 32; ++j) {
      const double y = std::ldexp(static_cast<double>(v[static_cast<std::size_t>(j)]), -k);  // exact
      const int expected = e4m3_nearest(y);
      EXPECT_EQ(code_of(q, 0, j), expected) << j;
      EXPECT_EQ(out.view().load(j), std::ldexp(e4m3_formula(expected), k)) << j;
    }
  }
}

TEST(FpQuantize, Nvfp4WithAndWithoutGlobalScale) {
  // amax 3: scale E4M3(0.5) = 0.5 (code 0x30), elements 2x.
  const Tensor x = padded_row(16, 0.0f, {3, -3, 1.5f, -0.75f, 0.375f, 0.125f, 0.6f, 2.2f});
  const int gpu_codes[] = {0x7, 0xF, 0x5, 0xB, 0x2, 0x0, 0x2, 0x6};  // 6 −6 3 −1.5 0.75 0.25 1.2 4.4
  const int cpu_codes[] = {0x7, 0xF, 0x5, 0xB, 0x1, 0x0, 0x2, 0x6};  // the tie 0.75 goes down
  const QuantSpec spec = QuantSpec::make(QuantMode::nvfp4);
  for (Rounding r : {kGpu, kCpu}) {
    SCOPED_TRACE(rounding_name(r));
    const int* codes = r == kGpu ? gpu_codes : cpu_codes;
    const QuantizedTensor plain = ref::fp_quantize(x, spec, r);
    EXPECT_EQ(scale_of(plain, 0, 0), 0x30);
    const Tensor plain_out = ref::fp_dequantize(plain, {}, DType::f32);
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(code_of(plain, 0, j), codes[j]) << j;
      EXPECT_EQ(plain_out.view().load(j), 0.5 * e2m1_formula(codes[j])) << j;
    }
    // global 2688: enc = 1, the decode factor is 1 — identical to no global scale.
    const QuantizedTensor unit = ref::fp_quantize(x, spec, r, 2688.0f);
    EXPECT_TRUE(testing::bit_equal(unit.wq, plain.wq));
    EXPECT_TRUE(testing::bit_equal(unit.scales, plain.scales));
    EXPECT_TRUE(testing::bit_equal(ref::fp_dequantize(unit, 2688.0f, DType::f32), plain_out));
    // global 6: enc = 448, the scale 0.5·448 = 224 = 1.75·2^7 (code 0x76), elements
    // (x·448)/224 = 2x again; dequant lut·224·(6/2688) = lut/2 up to f32 rounding.
    const QuantizedTensor g6 = ref::fp_quantize(x, spec, r, 6.0f);
    EXPECT_EQ(scale_of(g6, 0, 0), 0x76);
    EXPECT_TRUE(testing::bit_equal(g6.wq, plain.wq));
    const Tensor g6_out = ref::fp_dequantize(g6, 6.0f, DType::f32);
    for (int j = 0; j < 8; ++j) {
      const double want = 0.5 * e2m1_formula(codes[j]);
      EXPECT_NEAR(g6_out.view().load(j), want, std::fabs(want) * 0x1p-22) << j;
    }
    // global 1 is far too small: enc = 2688, (3/6)·2688 = 1344 saturates the scale at 448
    // (0x7E), 3·2688/448 = 18 saturates the element at 6, so 3 comes back as 6·448/2688 = 1.
    const QuantizedTensor g1 = ref::fp_quantize(x, spec, r, 1.0f);
    EXPECT_EQ(scale_of(g1, 0, 0), 0x7E);
    EXPECT_EQ(code_of(g1, 0, 0), 0x7);
    EXPECT_NEAR(ref::fp_dequantize(g1, 1.0f, DType::f32).view().load(0), 1.0, 0x1p-22);
  }
}

TEST(FpQuantize, Nvfp4ZeroScaleStoresZeroCodes) {
  // amax/6 below 2^-10 rounds to the E4M3 zero, so every element is code 0 (even −0.0 and
  // values that would otherwise be large relative to the scale).
  for (Rounding r : {kGpu, kCpu}) {
    const QuantizedTensor q =
        ref::fp_quantize(padded_row(16, 0.0f, {-0.0f, 1e-4f, -1e-4f}), QuantSpec::make(QuantMode::nvfp4), r);
    EXPECT_EQ(scale_of(q, 0, 0), 0);
    EXPECT_THAT(codes_of(q, 0, 0, 16), ::testing::Each(0));
    const Tensor out = ref::fp_dequantize(q, {}, DType::f32);
    for (std::int64_t j = 0; j < 16; ++j) EXPECT_EQ(out.view().load(j), 0.0f);
  }
}

TEST(FpQuantize, NonFiniteInputsHaveDefinedCodes) {
  // NaN is ignored by amax and encodes by itself (gpu E2M1: +6; cpu argmin: index 0).
  // amax 2: log2(2/6) = −1.58 → exponent −2, so 1 → 4 (code 6).
  const QuantSpec fp4 = QuantSpec::make(QuantMode::mxfp4);
  for (Rounding r : {kGpu, kCpu}) {
    const QuantizedTensor q = ref::fp_quantize(padded_row(32, 1.0f, {kNaN, 2.0f}), fp4, r);
    EXPECT_EQ(scale_of(q, 0, 0), 125);
    EXPECT_THAT(codes_of(q, 0, 0, 3), ElementsAre(r == kGpu ? 0x7 : 0x0, 0x7, 0x6));
  }
  // ±inf makes the E8M0 scale 0xFF (+inf): finite elements become 0, inf/inf is NaN, and
  // dequantization gives NaN (0·inf) or inf everywhere in the group.
  const QuantizedTensor inf_gpu = ref::fp_quantize(padded_row(32, 1.0f, {-kInf}), fp4, kGpu);
  EXPECT_EQ(scale_of(inf_gpu, 0, 0), 0xFF);
  EXPECT_THAT(codes_of(inf_gpu, 0, 0, 2), ElementsAre(0x7, 0x0));
  const Tensor out = ref::fp_dequantize(inf_gpu, {}, DType::f32);
  EXPECT_EQ(out.view().load(0), kInf);
  EXPECT_TRUE(std::isnan(out.view().load(1)));
  // mxfp8 and nvfp4: E4M3 saturates NaN and inf at ±448.
  EXPECT_EQ(code_of(ref::fp_quantize(padded_row(32, 1.0f, {kNaN}), QuantSpec::make(QuantMode::mxfp8), kCpu), 0, 0),
            0x7E);
  const QuantizedTensor nq = ref::fp_quantize(padded_row(16, 1.0f, {kInf}), QuantSpec::make(QuantMode::nvfp4), kGpu);
  EXPECT_EQ(scale_of(nq, 0, 0), 0x7E);                       // E4M3(inf/6) = 448
  EXPECT_THAT(codes_of(nq, 0, 0, 2), ElementsAre(0x7, 0x0));  // inf/448 = inf → 6; 1/448 → 0
  EXPECT_EQ(ref::fp_dequantize(nq, {}, DType::f32).view().load(0), 2688.0f);
}

// Per element: mx: y = x/S is exact (S = 2^k) and lut·S is exact, so |x̂ − x| ≤ S·bound(y)
// with no slack. nvfp4: y = (x·enc)/S carries ≤ 3 f32 roundings (enc, product, quotient),
// and the dequant lut·S·fl(g/2688) ≤ 2 more; |x̂ − x| ≤ S·dec·(bound(y) + 2^-20·(|y| + 6))
// covers them (bound is measured to the nearest grid point, which is 1-Lipschitz in y).
TEST(FpQuantize, RoundTripErrorIsWithinHalfASpacingTimesTheScale) {
  KVLAB_SEEDED_RNG(rng, 1234567);
  struct Case { QuantMode mode; bool global; };
  for (const Case c : {Case{QuantMode::mxfp4, false}, Case{QuantMode::mxfp8, false}, Case{QuantMode::nvfp4, false},
                       Case{QuantMode::nvfp4, true}}) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (Rounding r : {kGpu, kCpu}) {
        SCOPED_TRACE(::testing::Message() << quant_mode_name(c.mode) << (c.global ? "+global " : " ")
                                          << dtype_name(dtype) << " " << rounding_name(r));
        const QuantSpec spec = QuantSpec::make(c.mode);
        const Tensor x = testing::random_normal(rng, dtype, {4, 96});
        const xt::xarray<float> xs = x.to_f32();
        float tensor_amax = 0;
        for (float w : xs) tensor_amax = std::max(tensor_amax, std::fabs(w));
        // MLX's convention: global_scale is the tensor amax (enc maps it to 2688).
        const std::optional<float> global = c.global ? std::optional<float>(tensor_amax) : std::nullopt;
        const float enc = global ? 2688.0f / *global : 1.0f;
        const double dec = global ? static_cast<double>(*global) / 2688.0 : 1.0;
        const QuantizedTensor q = ref::fp_quantize(x, spec, r, global);
        const Tensor out = ref::fp_dequantize(q, global, DType::f32);
        const Tensor out_bf16 = ref::fp_dequantize(q, global);  // MLX's default dtype
        ASSERT_EQ(out_bf16.dtype(), DType::bf16);
        const bool fp8 = c.mode == QuantMode::mxfp8;
        const std::int64_t gs = spec.group_size;
        for (std::int64_t row = 0; row < 4; ++row) {
          for (std::int64_t g = 0; g < 96 / gs; ++g) {
            float amax = 0;
            for (std::int64_t j = g * gs; j < (g + 1) * gs; ++j) amax = std::max(amax, std::fabs(xs(row, j)));
            const int sc = scale_of(q, row, g);
            double scale = 0;
            if (c.mode == QuantMode::nvfp4) {
              ASSERT_EQ(sc, e4m3_nearest(amax / 6.0f * enc));
              scale = e4m3_formula(sc);
            } else {
              // The exponent is log2(amax/max) rounded to nearest (either tie rule).
              const float s = amax / (fp8 ? 448.0f : 6.0f);
              ASSERT_LE(std::fabs(std::log2(static_cast<double>(s)) - (sc - 127)), 0.5 + 1e-6);
              scale = std::ldexp(1.0, sc - 127);
            }
            for (std::int64_t j = g * gs; j < (g + 1) * gs; ++j) {
              const double w = xs(row, j), got = out.view().load(row * 96 + j);
              if (scale == 0) {
                EXPECT_EQ(got, 0.0);
                continue;
              }
              const double y = w * enc / scale;
              const double bound = c.mode == QuantMode::nvfp4
                                       ? scale * dec * (element_error_bound(y, false) + 0x1p-20 * (std::fabs(y) + 6))
                                       : scale * element_error_bound(y, fp8);
              EXPECT_LE(std::fabs(got - w), bound) << "row " << row << " element " << j << " x " << w;
              // The default bf16 output is the f32 result rounded once.
              EXPECT_EQ(out_bf16.view().load(row * 96 + j), round_to_dtype(static_cast<float>(got), DType::bf16));
            }
          }
        }
      }
    }
  }
}

TEST(FpQuantize, InvalidCallsNameTheBadValue) {
  const QuantSpec mxfp4 = QuantSpec::make(QuantMode::mxfp4), nvfp4 = QuantSpec::make(QuantMode::nvfp4);
  const Tensor x(DType::f32, {2, 64});
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, QuantSpec::make(QuantMode::affine), kGpu), "affine");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, QuantSpec{QuantMode::mxfp4, 4, 64}, kGpu), "64");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, QuantSpec{QuantMode::mxfp8, 4, 32}, kGpu), "bits 4");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(Tensor(DType::f32, {2, 48}), mxfp4, kGpu), "48");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(Tensor(DType::u8, {2, 64}), mxfp4, kGpu), "u8");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(Tensor(DType::f32, {}), mxfp4, kGpu), "rank 0");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, mxfp4, kGpu, 1.0f), "global_scale");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, QuantSpec::make(QuantMode::mxfp8), kGpu, 1.0f), "mxfp8");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, nvfp4, kGpu, kNaN), "nan");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x, nvfp4, kGpu, kInf), "inf");

  Tensor wq(DType::u32, {2, 8}), scales(DType::u8, {2, 2}), bad_wq(DType::u32, {2, 7}), int_wq(DType::i32, {2, 8});
  Tensor f32_scales(DType::f32, {2, 2}), short_scales(DType::u8, {2, 1}), out(DType::f32, {2, 64});
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x.view(), mxfp4, kGpu, {}, bad_wq.view(), scales.view()), "(2, 7)");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x.view(), mxfp4, kGpu, {}, int_wq.view(), scales.view()), "i32");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x.view(), mxfp4, kGpu, {}, wq.view(), f32_scales.view()), "f32");
  EXPECT_ERROR_MENTIONS(ref::fp_quantize(x.view(), mxfp4, kGpu, {}, wq.view(), short_scales.view()), "(2, 1)");

  Tensor other_rows(DType::u8, {3, 2}), three_groups(DType::u8, {2, 3}), out_short(DType::f32, {2, 63});
  Tensor out_int(DType::u32, {2, 64}), u8_wq(DType::u8, {2, 8});
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(wq.view(), other_rows.view(), mxfp4, {}, out.view()), "(3, 2)");
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(wq.view(), three_groups.view(), mxfp4, {}, out.view()),
                        "scales last dim 3");
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(wq.view(), scales.view(), mxfp4, {}, out_short.view()), "(2, 63)");
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(wq.view(), scales.view(), mxfp4, {}, out_int.view()), "u32");
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(u8_wq.view(), scales.view(), mxfp4, {}, out.view()), "u8");
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(wq.view(), scales.view(), mxfp4, 2.0f, out.view()), "global_scale");
  EXPECT_ERROR_MENTIONS(
      ref::fp_dequantize(wq.view(), scales.view(), QuantSpec::make(QuantMode::affine), {}, out.view()), "affine");
  EXPECT_ERROR_MENTIONS(ref::fp_dequantize(QuantizedTensor{wq, scales, Tensor(), mxfp4}, {}, DType::i32), "i32");
  EXPECT_ERROR_MENTIONS(e2m1_decode(16), "16");
}

}  // namespace
}  // namespace test_fp_quantize
}  // namespace kvlab
