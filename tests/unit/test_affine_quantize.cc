// Unit tests of the reference affine quantizer (docs/quantization.md §Format table through
// §Worked examples, and §Rounding flavours) and its accuracy anchors (docs/quantization.md §A1).
// Expected numbers come from docs/quantization.md or are derived
// by hand in the comments, never from running the implementation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/affine_quantize.h"
#include "reference/bitpack.h"
#include "tests/unit/test_util.h"


namespace kvlab::ref {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_affine_quantize {
namespace {

using testing::SeededRng;

constexpr Rounding kBothRoundings[] = {Rounding::mlx_cpu, Rounding::mlx_gpu};
constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

QuantSpec affine(int bits, int group) { return QuantSpec{QuantMode::affine, bits, group}; }

Tensor row_of(DType dtype, const std::vector<float>& values) {
  return Tensor::from_values(dtype, {1, static_cast<std::int64_t>(values.size())}, values);
}

// The codes of every row, unpacked with bitpack (tested on its own in test_bitpack).
std::vector<int> codes_of(const QuantizedTensor& q) {
  const std::int64_t words_per_row = q.wq.dim(-1);
  const std::int64_t d = words_per_row * 32 / q.spec.bits;
  const std::int64_t rows = q.wq.numel() / words_per_row;
  const auto* words = reinterpret_cast<const std::uint32_t*>(q.wq.data());
  std::vector<int> codes;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<std::uint8_t> row(static_cast<std::size_t>(d));
    unpack_codes({words + r * words_per_row, static_cast<std::size_t>(words_per_row)}, q.spec.bits, row);
    codes.insert(codes.end(), row.begin(), row.end());
  }
  return codes;
}

float at(const Tensor& t, std::int64_t i) { return t.view().load(i); }

// All elements as f32, for loops over many elements (one view, not one per element).
std::vector<float> values_of(const Tensor& t) {
  const ConstTensorView v = t.view();
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = v.load(static_cast<std::int64_t>(i));
  return out;
}

std::uint16_t f16_bits_at(const Tensor& t, std::int64_t i) {
  return reinterpret_cast<const std::uint16_t*>(t.data())[i];
}

// ---------------------------------------------------------------------------------
// docs/quantization.md §Worked examples. Neither has a value on a rounding tie (4-bit: the code
// arguments are 11k/23, fractions k·11 mod 23 / 23, never 1/2; q0 argument −11.129;
// 3-bit: 7k/31, never 1/2), and both groups contain 0 and a positive max, so the GPU's
// running max starting at 0 changes nothing: the numbers apply to both roundings.

TEST(AffineWorkedExample, FourBitFp16MatchesSpec) {
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(i - 8);
  const std::vector<int> want_codes{15, 14, 14, 13, 13, 12, 12, 11, 11, 11, 10, 10, 9, 9, 8, 8,
                                    7,  7,  6,  6,  5,  5,  4,  4,  3,  3,  2,  2,  1, 1, 0, 0};
  const std::vector<std::int64_t> want_words{0xbccddeef, 0x8899aabb, 0x44556677, 0x00112233};
  // 23/−11 = −2.090909…; fp16 keeps 10 fraction bits: −2·(1 + 47/1024) = −2.091796875,
  // bits 1 10000 0000101111 = 0xC02F. It must also be the RNE rounding of the f32 quotient.
  const std::uint16_t want_scale_bits = 0xC02F;
  const double fp16_scale = -2.091796875;
  for (Rounding rounding : kBothRoundings) {
    SCOPED_TRACE(rounding_name(rounding));
    const QuantizedTensor q = affine_quantize(row_of(DType::f16, w), affine(4, 32), rounding);
    EXPECT_EQ(codes_of(q), want_codes);
    EXPECT_EQ(q.wq.to_ints(), want_words);
    EXPECT_EQ(q.scales.dtype(), DType::f16);
    EXPECT_EQ(f16_bits_at(q.scales, 0), want_scale_bits);
    EXPECT_EQ(f16_bits_at(q.scales, 0), f32_to_f16_bits(23.0f / -11.0f));
    EXPECT_NEAR(at(q.scales, 0), -2.092, 5e-4);
    EXPECT_EQ(at(q.biases, 0), 23.0f);

    // Dequantized from the fp16 scale, in f32: 23 + code·(−2.091796875), exact here.
    const Tensor deq = affine_dequantize(q, DType::f32);
    for (std::size_t i = 0; i < 32; ++i) {
      EXPECT_EQ(double{at(deq, static_cast<std::int64_t>(i))}, 23.0 + want_codes[i] * fp16_scale) << i;
    }
    EXPECT_NEAR(at(deq, 0), -8.377, 5e-4);
    EXPECT_NEAR(at(deq, 1), -6.285, 5e-4);
    EXPECT_NEAR(at(deq, 3), -4.193, 5e-4);
    EXPECT_NEAR(at(deq, 8), -0.00977, 5e-6);  // x = 0 → code 11 → 23 − 23.009765625

    // Default output dtype is the scales' (fp16): the same values rounded once to fp16.
    const Tensor deq16 = affine_dequantize(q);
    EXPECT_EQ(deq16.dtype(), DType::f16);
    for (std::int64_t i = 0; i < 32; ++i) EXPECT_EQ(at(deq16, i), round_to_dtype(at(deq, i), DType::f16)) << i;
    EXPECT_EQ(at(deq16, 0), -8.375f);          // −8.376953125 is 0.25 fp16 ulps from −8.375
    EXPECT_EQ(at(deq16, 8), -0.009765625f);    // 5/512, representable in fp16
    const Tensor deq_bf16 = affine_dequantize(q, DType::bf16);
    for (std::int64_t i = 0; i < 32; ++i) EXPECT_EQ(at(deq_bf16, i), round_to_dtype(at(deq, i), DType::bf16)) << i;
  }
}

TEST(AffineWorkedExample, ThreeBitF32MatchesSpec) {
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const std::vector<int> want_codes{7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 5, 4, 4, 4, 4,
                                    3, 3, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0};
  for (Rounding rounding : kBothRoundings) {
    SCOPED_TRACE(rounding_name(rounding));
    const QuantizedTensor q = affine_quantize(row_of(DType::f32, w), affine(3, 32), rounding);
    EXPECT_EQ(q.wq.to_ints(), (std::vector<std::int64_t>{0x6dbb6dff, 0x26db924b, 0x00124a49}));
    EXPECT_EQ(codes_of(q), want_codes);
    EXPECT_NEAR(at(q.scales, 0), -4.428571, 1e-6);  // 31/−7: edge 31, q0 = R(−7) = −7
    EXPECT_EQ(at(q.scales, 0), 31.0f / -7.0f);
    EXPECT_EQ(at(q.biases, 0), 31.0f);
  }
}

// ---------------------------------------------------------------------------------
// Structural properties of docs/quantization.md §Affine parameters on random groups.

// The extreme a group is anchored on: the larger-magnitude of (alpha, beta), ties to
// alpha; the GPU's alpha starts at 0 (docs/quantization.md §Affine parameters).
float anchored_extreme(const std::vector<float>& g, Rounding rounding) {
  float alpha = *std::max_element(g.begin(), g.end());
  const float beta = *std::min_element(g.begin(), g.end());
  if (rounding == Rounding::mlx_gpu) alpha = std::max(alpha, 0.0f);
  return std::abs(beta) > std::abs(alpha) ? beta : alpha;
}

std::vector<float> random_group(SeededRng& rng, DType dtype, std::size_t n, double lo, double hi) {
  std::vector<float> g(n);
  for (auto& v : g) v = round_to_dtype(static_cast<float>(rng.uniform(lo, hi)), dtype);
  return g;
}

TEST(AffineProperties, CodeZeroDecodesToTheLargerMagnitudeEdge) {
  KVLAB_SEEDED_RNG(rng, 1001);
  const std::pair<double, double> ranges[] = {{-1, 1}, {-5, 2}, {-2, 5}, {0.5, 3}, {-9, -4}, {-1e-3, 4e-3}};
  for (DType dtype : kFloatTypes) {
    for (Rounding rounding : kBothRoundings) {
      for (int bits : {2, 3, 4, 8}) {
        for (const auto& [lo, hi] : ranges) {
          const std::vector<float> g = random_group(rng, dtype, 64, lo, hi);
          const float edge = anchored_extreme(g, rounding);
          const QuantizedTensor q = affine_quantize(row_of(dtype, g), affine(bits, 64), rounding);
          const std::vector<int> codes = codes_of(q);
          // bias is the edge itself, a group element, so storing it in dtype is exact.
          ASSERT_EQ(at(q.biases, 0), edge) << dtype_name(dtype) << " " << bits << " bits [" << lo << ", " << hi << "]";
          const Tensor deq = affine_dequantize(q);
          for (std::size_t i = 0; i < g.size(); ++i) {
            if (g[i] != edge) continue;
            EXPECT_EQ(codes[i], 0);
            EXPECT_EQ(at(deq, static_cast<std::int64_t>(i)), edge);  // reconstructed exactly
          }
        }
      }
    }
  }
}

// Zero maps to the integer code −q0 = −bias/scale, which decodes to 0 up to the f32
// rounding of scale = edge/q0 (docs/quantization.md §Affine parameters: exactly 0 in ~93 % of a
// sweep).
TEST(AffineProperties, ZeroMapsToCodeMinusQ0) {
  KVLAB_SEEDED_RNG(rng, 1002);
  int exact_zero = 0, total = 0;
  for (Rounding rounding : kBothRoundings) {
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int trial = 0; trial < 50; ++trial) {
        std::vector<float> g = random_group(rng, DType::f32, 32, -rng.uniform(0.1, 10), rng.uniform(0.1, 10));
        const auto zero_at = static_cast<std::size_t>(rng.integer(0, 31));
        g[zero_at] = 0.0f;
        const AffineGroupParams p = affine_group_params(g, bits, rounding);
        const double steps_to_zero = -double{p.bias} / double{p.scale};  // = −q0 up to f32 rounding
        const double q0 = std::round(steps_to_zero);
        ASSERT_NEAR(steps_to_zero, q0, 1e-4);
        ASSERT_GE(q0, 0.0);
        ASSERT_LE(q0, (1 << bits) - 1);
        const QuantizedTensor q = affine_quantize(row_of(DType::f32, g), affine(bits, 32), rounding);
        EXPECT_EQ(codes_of(q)[zero_at], static_cast<int>(q0));
        // Decoded in f32 (multiply, add): |q0·s + b| ≤ one f32 rounding of |b|.
        const float decoded = at(affine_dequantize(q), static_cast<std::int64_t>(zero_at));
        EXPECT_LE(std::abs(decoded), std::abs(p.bias) * 0x1p-23f);
        exact_zero += decoded == 0.0f;
        ++total;
      }
    }
  }
  std::printf("[ info     ] code -q0 decoded to exactly 0.0 in %d of %d f32 groups\n", exact_zero, total);
  EXPECT_GT(exact_zero, total * 8 / 10);  // mul-then-add; an fma would leave ~2/3 non-zero
}

TEST(AffineProperties, ConstantGroupsReconstructExactly) {
  // |c| ≥ 5e-8: s0 = eps, s1 = −1e-7, edge = c, q0 = R(−c·1e7) ≠ 0 → bias = c, codes 0.
  for (DType dtype : kFloatTypes) {
    for (float c : {3.5f, -2.25f, 1e-3f, -7e-5f, 1.0e4f, 6e-8f, -1e-6f}) {
      const float cd = round_to_dtype(c, dtype);
      if (std::abs(cd) < 5e-8f) continue;  // flushed below the threshold by the dtype
      const QuantizedTensor q = affine_quantize(row_of(dtype, std::vector<float>(64, cd)), affine(4, 64),
                                                Rounding::mlx_cpu);
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " c = " << cd);
      EXPECT_THAT(codes_of(q), ::testing::Each(0));
      EXPECT_EQ(at(q.biases, 0), cd);
      const Tensor deq = affine_dequantize(q);
      for (std::int64_t i = 0; i < 64; ++i) ASSERT_EQ(at(deq, i), cd);
    }
    // c == 0: q0 = R(0) = 0 → scale = s1 = −1e-7 (then stored in dtype), bias 0.
    const QuantizedTensor z = affine_quantize(row_of(dtype, std::vector<float>(64, 0.0f)), affine(4, 64),
                                              Rounding::mlx_cpu);
    EXPECT_THAT(codes_of(z), ::testing::Each(0));
    EXPECT_EQ(at(z.scales, 0), round_to_dtype(-1e-7f, dtype)) << dtype_name(dtype);
    EXPECT_EQ(at(z.biases, 0), 0.0f);
    EXPECT_THAT(affine_dequantize(z).to_f32(), ::testing::Each(0.0f));
  }
  // |c| < 5e-8 (f32 only): q0 = R(−0.4) = 0, bias 0, code R(−0.4) = 0: decodes to 0, not c.
  const AffineGroupParams tiny = affine_group_params(std::vector<float>(32, 4e-8f), 4, Rounding::mlx_cpu);
  EXPECT_EQ(tiny.scale, -1e-7f);
  EXPECT_EQ(tiny.bias, 0.0f);
  EXPECT_EQ(affine_code(4e-8f, tiny, 4, Rounding::mlx_cpu), 0);
  // GPU, negative constant: alpha = 0 so range = |c|, s0 = |c|/n, edge = c, q0 = −n:
  // scale = c/−n = |c|/n, bias = c, every code 0 — exact too, with a different scale.
  const QuantizedTensor g = affine_quantize(row_of(DType::f32, std::vector<float>(32, -3.0f)), affine(4, 32),
                                            Rounding::mlx_gpu);
  EXPECT_EQ(at(g.scales, 0), 3.0f / 15.0f);
  EXPECT_EQ(at(g.biases, 0), -3.0f);
  EXPECT_THAT(codes_of(g), ::testing::Each(0));
  EXPECT_THAT(affine_dequantize(g).to_f32(), ::testing::Each(-3.0f));
}

TEST(AffineProperties, ScaleIsNegativeWhenTheMaxDominates) {
  std::vector<float> g(32, 0.0f);
  g[3] = 10.0f;
  g[7] = -3.0f;  // |max| > |min| → anchored on max, s1 = −s0 → scale < 0
  for (Rounding rounding : kBothRoundings) {
    const AffineGroupParams p = affine_group_params(g, 4, rounding);
    EXPECT_LT(p.scale, 0.0f);
    EXPECT_EQ(p.bias, 10.0f);
    EXPECT_EQ(affine_code(10.0f, p, 4, rounding), 0);   // the max is code 0
    EXPECT_EQ(affine_code(-3.0f, p, 4, rounding), 15);  // the min is (about) code n
  }
  g[3] = 3.0f;
  g[7] = -10.0f;  // min dominates → positive scale, bias = min
  const AffineGroupParams pos = affine_group_params(g, 4, Rounding::mlx_cpu);
  EXPECT_GT(pos.scale, 0.0f);
  EXPECT_EQ(pos.bias, -10.0f);
  g[3] = 10.0f;  // |min| == |max|: the strict '>' picks the max
  const AffineGroupParams tie = affine_group_params(g, 4, Rounding::mlx_cpu);
  EXPECT_LT(tie.scale, 0.0f);
  EXPECT_EQ(tie.bias, 10.0f);
}

// ---------------------------------------------------------------------------------
// CPU vs GPU (the GPU's running maximum and rounding, docs/quantization.md §Affine parameters,
// docs/quantization.md §Rounding flavours).

double max_abs_error(const Tensor& x, const Tensor& xhat) {
  const std::vector<float> a = values_of(x), b = values_of(xhat);
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double{std::abs(a[i] - b[i])});
  return worst;
}

TEST(AffineCpuVsGpu, AllNegativeGroupSpecExample) {
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[static_cast<std::size_t>(i)] = -4.0f + static_cast<float>(i) / 31.0f;
  const Tensor x = row_of(DType::f32, w);
  // CPU: range [−4, −3], step 1/15, codes 15i/31 → 0..15; worst rounding distance is
  // 15/31 of a step (15i mod 31 ∈ {15, 16}): 15/31 · 1/15 = 1/31 ≈ 0.032.
  const QuantizedTensor cpu = affine_quantize(x, affine(4, 32), Rounding::mlx_cpu);
  EXPECT_NEAR(at(cpu.scales, 0), 1.0 / 15, 1e-6);
  EXPECT_EQ(at(cpu.biases, 0), -4.0f);
  const std::vector<int> cpu_codes = codes_of(cpu);
  EXPECT_EQ(*std::min_element(cpu_codes.begin(), cpu_codes.end()), 0);
  EXPECT_EQ(*std::max_element(cpu_codes.begin(), cpu_codes.end()), 15);
  EXPECT_NEAR(max_abs_error(x, affine_dequantize(cpu)), 1.0 / 31, 1e-5);
  // GPU: running max starts at 0 → range [−4, 0], step 4/15, codes 15i/124 → 0..4;
  // worst distance 61/124 of a step (i = 29: 435 mod 124 = 63): 61/124 · 4/15 ≈ 0.131.
  const QuantizedTensor gpu = affine_quantize(x, affine(4, 32), Rounding::mlx_gpu);
  EXPECT_NEAR(at(gpu.scales, 0), 4.0 / 15, 1e-6);
  EXPECT_EQ(at(gpu.biases, 0), -4.0f);
  const std::vector<int> gpu_codes = codes_of(gpu);
  EXPECT_EQ(*std::min_element(gpu_codes.begin(), gpu_codes.end()), 0);
  EXPECT_EQ(*std::max_element(gpu_codes.begin(), gpu_codes.end()), 4);
  EXPECT_NEAR(max_abs_error(x, affine_dequantize(gpu)), 61.0 / 124 * 4.0 / 15, 1e-5);
}

TEST(AffineCpuVsGpu, DifferOnlyAtAnExactTie) {
  // Code-level tie. Group {0, 15, 2.5, 1, …}: alpha 15, beta 0, s0 = 1, anchored on the
  // max: s1 = −1, q0 = R(−15) = −15, scale = −1, bias = 15, code = R(15 − g), exact in f32.
  // g = 2.5 lands on 12.5: rint → 12 (even), round → 13 (away). Nothing else differs.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(i % 16);
  w[5] = 2.5f;
  const QuantizedTensor cpu = affine_quantize(row_of(DType::f32, w), affine(4, 32), Rounding::mlx_cpu);
  const QuantizedTensor gpu = affine_quantize(row_of(DType::f32, w), affine(4, 32), Rounding::mlx_gpu);
  EXPECT_EQ(at(cpu.scales, 0), -1.0f);
  EXPECT_EQ(at(gpu.scales, 0), -1.0f);
  const std::vector<int> cpu_codes = codes_of(cpu), gpu_codes = codes_of(gpu);
  EXPECT_EQ(cpu_codes[5], 12);
  for (std::size_t i = 0; i < 32; ++i) EXPECT_EQ(cpu_codes[i] + (i == 5 ? 1 : 0), gpu_codes[i]) << i;
  // q0-level tie. 2 bits, alpha 5, beta −1: s0 = 6/3 = 2, s1 = −2, edge/s1 = −2.5 exactly.
  // CPU q0 = −2 → scale −2.5; GPU q0 = −3 → scale −5/3; both keep bias 5.
  const std::vector<float> g{5.0f, -1.0f, 0.0f, 1.0f};
  const AffineGroupParams pc = affine_group_params(g, 2, Rounding::mlx_cpu);
  const AffineGroupParams pg = affine_group_params(g, 2, Rounding::mlx_gpu);
  EXPECT_EQ(pc.scale, -2.5f);
  EXPECT_EQ(pg.scale, 5.0f / -3.0f);
  EXPECT_EQ(pc.bias, 5.0f);
  EXPECT_EQ(pg.bias, 5.0f);
  EXPECT_EQ(affine_code(-1.0f, pc, 2, Rounding::mlx_cpu), 2);  // 6/2.5 = 2.4
  EXPECT_EQ(affine_code(-1.0f, pg, 2, Rounding::mlx_gpu), 3);  // 3.6 → 4 → min(4, 3)
}

// All-positive groups: the min starts at T_max on the GPU, the max is in the data, so
// both modes compute the same params; codes can only differ where (g − b)/s is exactly
// k + 1/2 in f32, which coarse f16/bf16 inputs hit often. f32 random data never does.
TEST(AffineCpuVsGpu, AllPositiveGroupsAgreeExceptAtTiesAllNegativeDoNot) {
  KVLAB_SEEDED_RNG(rng, 1003);
  for (DType dtype : kFloatTypes) {
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << bits << " bits");
      const Tensor pos = testing::random_uniform(rng, dtype, {8, 128}, 0.25, 4.0);
      const QuantizedTensor cpu = affine_quantize(pos, affine(bits, 32), Rounding::mlx_cpu);
      const QuantizedTensor gpu = affine_quantize(pos, affine(bits, 32), Rounding::mlx_gpu);
      EXPECT_TRUE(testing::bit_equal(cpu.scales, gpu.scales));
      EXPECT_TRUE(testing::bit_equal(cpu.biases, gpu.biases));
      const std::vector<int> cpu_codes = codes_of(cpu), gpu_codes = codes_of(gpu);
      int ties = 0;
      for (std::int64_t group = 0; group < 8 * 4; ++group) {
        std::vector<float> g(32);
        for (std::size_t j = 0; j < 32; ++j) g[j] = at(pos, group * 32 + static_cast<std::int64_t>(j));
        const AffineGroupParams p = affine_group_params(g, bits, Rounding::mlx_cpu);
        for (std::size_t j = 0; j < 32; ++j) {
          const auto i = static_cast<std::size_t>(group * 32) + j;
          const float v = (g[j] - p.bias) / p.scale;
          const bool tie = v - std::floor(v) == 0.5f;
          ties += tie && cpu_codes[i] != gpu_codes[i];
          // At a tie rint goes to the even neighbour, round goes up (v > 0).
          EXPECT_EQ(gpu_codes[i] - cpu_codes[i], tie && static_cast<int>(std::floor(v)) % 2 == 0 ? 1 : 0) << i;
        }
      }
      if (dtype == DType::f32) {
        EXPECT_EQ(ties, 0);
      }
      std::printf("[ info     ] %s %d bits: %d codes differ, all at exact ties\n",
                  std::string(dtype_name(dtype)).c_str(), bits, ties);
      // Contrast: all-negative groups in [−4, −2]. The GPU range grows to [min, 0], so its
      // q0 is −n and its step |min|/n; the CPU's |q0| = R(n·|min|/range) ≥ 2n, a finer step.
      const Tensor neg = testing::random_uniform(rng, dtype, {8, 128}, -4.0, -2.0);
      const QuantizedTensor ncpu = affine_quantize(neg, affine(bits, 32), Rounding::mlx_cpu);
      const QuantizedTensor ngpu = affine_quantize(neg, affine(bits, 32), Rounding::mlx_gpu);
      for (std::int64_t i = 0; i < ncpu.scales.numel(); ++i) {
        EXPECT_LT(2 * std::abs(at(ncpu.scales, i)), 1.01 * std::abs(at(ngpu.scales, i))) << dtype_name(dtype) << bits;
      }
    }
  }
}

TEST(AffineCpuVsGpu, OutOfGroupCodesClampOnCpuWrapOnGpu) {
  // Only reachable through affine_code with a value outside its group (see the header):
  // CPU clamps at 0; GPU min(R, n) then uint8 wrap (−100 → 156), low `bits` bits kept.
  const AffineGroupParams p{1.0f, 0.0f};
  EXPECT_EQ(affine_code(-100.0f, p, 8, Rounding::mlx_cpu), 0);
  EXPECT_EQ(affine_code(-100.0f, p, 8, Rounding::mlx_gpu), 156);
  EXPECT_EQ(affine_code(-100.0f, p, 4, Rounding::mlx_gpu), 156 & 15);
  EXPECT_EQ(affine_code(-1.0f, p, 4, Rounding::mlx_gpu), 15);
  EXPECT_EQ(affine_code(-0x1p40f, p, 8, Rounding::mlx_gpu), 0);  // a multiple of 256
  EXPECT_EQ(affine_code(-INFINITY, p, 8, Rounding::mlx_gpu), 0);
  EXPECT_EQ(affine_code(INFINITY, p, 8, Rounding::mlx_gpu), 255);
  EXPECT_EQ(affine_code(300.0f, p, 8, Rounding::mlx_cpu), 255);
  EXPECT_EQ(affine_code(NAN, p, 8, Rounding::mlx_cpu), 0);  // unspecified upstream; pinned to 0
  EXPECT_EQ(affine_code(NAN, p, 8, Rounding::mlx_gpu), 0);
}

// ---------------------------------------------------------------------------------
// Error bound. Per element, with f32 params (s, b), stored (s', b') in the input dtype
// T, code c, y = c·s' + b' evaluated in f32 and x̂ = y rounded to the output dtype (T):
//   x̂ − x = (x̂ − y)                output rounding    ≤ ε_T/2·|x̂| + half a subnormal
//         + (y − (c·s' + b'))       f32 mul, add       ≤ 2^-24·(c·|s'| + |y|)
//         + c·(s' − s) + (b' − b)   storage rounding   ≤ c·Δs, Δs = ε_T/2·|s'| + half a
//                                   subnormal; b' = b exactly (bias is a group element or 0)
//         + (c·s + b − x)           quantization       ≤ |s|/2 + 2^-23·(n+1)·|s| (the f32
//                                   (x − b)/s is rounded twice before R)
// The last term has one exception: a value clamped to code n is |x − b| − n|s| away,
// and the edge/q0 rescale can put the far extreme up to one full step past n (a reading of MLX's
// source said "slightly"; it is up to |s|: docs/quantization.md §Affine parameters), so the
// quantization term is max(|s|/2, |x − b| − n|s|) there — not |s|/2 as a naive bound would say.

double smallest_subnormal(DType t) { return t == DType::f32 ? 0x1p-149 : t == DType::f16 ? 0x1p-24 : 0x1p-133; }

TEST(AffineAccuracy, ErrorBoundEveryBitsGroupDtypeRounding) {
  KVLAB_SEEDED_RNG(rng, 1004);
  const std::pair<double, double> row_sigma_mu[] = {{1, 0}, {0.01, 0}, {100, 0}, {1, 3}, {0.5, -10}, {1e-3, 5}};
  const std::int64_t d = 256, rows = std::size(row_sigma_mu);
  std::int64_t needed_clamp_allowance = 0, checked = 0;
  double worst_error_in_steps = 0;
  for (DType dtype : kFloatTypes) {
    Tensor x(dtype, {rows, d});
    for (std::int64_t i = 0; i < rows * d; ++i) {
      const auto [sigma, mu] = row_sigma_mu[i / d];
      x.view().store(i, static_cast<float>(mu + sigma * rng.normal()));
    }
    const std::vector<float> xs = values_of(x);
    const double eps = dtype_epsilon(dtype), tiny = smallest_subnormal(dtype);
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int group : {32, 64, 128}) {
        for (Rounding rounding : kBothRoundings) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " b" << bits << " g" << group << " "
                                            << rounding_name(rounding));
          const QuantizedTensor q = affine_quantize(x, affine(bits, group), rounding);
          const Tensor xhat_tensor = affine_dequantize(q);
          ASSERT_EQ(xhat_tensor.dtype(), dtype);
          const std::vector<float> xhat = values_of(xhat_tensor), scales = values_of(q.scales),
                                   biases = values_of(q.biases);
          const std::vector<int> codes = codes_of(q);
          const double n = (1 << bits) - 1;
          int failures = 0;
          for (std::size_t i = 0; i < xs.size() && failures < 5; ++i) {
            const double xi = xs[i], xh = xhat[i], c = codes[i];
            const auto g = i / static_cast<std::size_t>(group);
            const double s = std::abs(scales[g]), b = biases[g];
            const double ds = eps / 2 * s + tiny / 2, s_max = s + ds;
            const double arithmetic = c * ds + 0x1p-24 * (c * s + std::abs(xh) * (1 + eps)) +
                                      eps / 2 * std::abs(xh) + tiny / 2;
            const double half_step = s_max / 2 + 0x1p-23 * (n + 1) * s_max;
            const double past_last_level = std::abs(xi - b) - n * s + n * ds;  // ≥ |x − b| − n|s_f32|
            const double quantization = c == n ? std::max(half_step, past_last_level) : half_step;
            const double err = std::abs(xh - xi);
            ++checked;
            needed_clamp_allowance += err > half_step + arithmetic;
            worst_error_in_steps = std::max(worst_error_in_steps, err / s);
            // The clamp overshoot never exceeds one step (up to the storage and f32 slop).
            if (c == n) {
              EXPECT_LE(past_last_level, s_max + 2 * n * ds + 0x1p-20 * std::abs(xi - b)) << i;
            }
            if (err > quantization + arithmetic) {
              ++failures;
              ADD_FAILURE() << "element " << i << ": x " << xi << ", x̂ " << xh << ", code " << c << ", |scale| " << s
                            << ", bias " << b << ": |error| " << err << " > bound " << quantization + arithmetic;
            }
          }
        }
      }
    }
  }
  std::printf("[ info     ] %lld elements; %lld needed the clamp allowance (error > half a step); worst %.3f steps\n",
              static_cast<long long>(checked), static_cast<long long>(needed_clamp_allowance), worst_error_in_steps);
}

// The smallest witness that |s|/2 is not a bound: 2 bits, group {1, −1, 0…}. s0 = 2/3,
// anchored on the max (tie), q0 = R(1/−(2/3)) = R(−1.5) = −2 in both modes, scale −0.5,
// bias 1; −1 → R(4) = 4 → clamped to 3 → decodes to −0.5: error 0.5 = one full step.
TEST(AffineAccuracy, ClampCanCostAFullStep) {
  std::vector<float> w(32, 0.0f);
  w[0] = 1.0f;
  w[1] = -1.0f;
  for (Rounding rounding : kBothRoundings) {
    const QuantizedTensor q = affine_quantize(row_of(DType::f32, w), affine(2, 32), rounding);
    EXPECT_EQ(at(q.scales, 0), -0.5f);
    EXPECT_EQ(codes_of(q)[1], 3);
    EXPECT_EQ(at(affine_dequantize(q), 1), -0.5f);
  }
}

// docs/quantization.md §A1: Σ(x̂ − x)²/Σx² on N(0,1) rows, d = 128, group 64, fp16 input
// (so fp16 scales/biases), 10^4 rows. Anchors asserted within ±3 % for mlx_cpu; the
// GPU rounding and an f32-input run are printed for comparison.
double relative_mse(const Tensor& x, const QuantizedTensor& q) {
  const std::vector<float> xs = values_of(x), xhat = values_of(affine_dequantize(q, DType::f32));
  double err = 0, energy = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double xi = xs[i], e = double{xhat[i]} - xi;
    err += e * e;
    energy += xi * xi;
  }
  return err / energy;
}

TEST(AffineAccuracy, RelativeMseOnGaussianRowsMatchesAnchors) {
  KVLAB_SEEDED_RNG(rng, 6001);
  const Tensor x32 = testing::random_normal(rng, DType::f32, {10000, 128});
  Tensor x16(DType::f16, x32.shape());
  const TensorView x16_view = x16.view();
  const std::vector<float> x32_values = values_of(x32);
  for (std::size_t i = 0; i < x32_values.size(); ++i) x16_view.store(static_cast<std::int64_t>(i), x32_values[i]);
  const std::pair<int, double> anchors[] = {{2, 0.156}, {3, 0.0361}, {4, 8.24e-3}, {8, 2.94e-5}};
  std::printf("[ info     ] relative MSE, N(0,1), d 128, g64, 10^4 rows, seed %llu\n"
              "[ info     ] bits  anchor     f16 mlx_cpu (dev)      f16 mlx_gpu   f32-in mlx_cpu\n",
              static_cast<unsigned long long>(rng.seed()));
  for (const auto& [bits, anchor] : anchors) {
    const double cpu = relative_mse(x16, affine_quantize(x16, affine(bits, 64), Rounding::mlx_cpu));
    const double gpu = relative_mse(x16, affine_quantize(x16, affine(bits, 64), Rounding::mlx_gpu));
    const double f32_in = relative_mse(x32, affine_quantize(x32, affine(bits, 64), Rounding::mlx_cpu));
    std::printf("[ info     ] %4d  %.3e  %.4e (%+5.2f%%)  %.4e    %.4e\n", bits, anchor, cpu,
                100 * (cpu / anchor - 1), gpu, f32_in);
    EXPECT_NEAR(cpu / anchor, 1.0, 0.03) << bits << " bits: " << cpu << " vs anchor " << anchor;
  }
}

// ---------------------------------------------------------------------------------
// Shapes and validation (docs/quantization.md §Format table).

TEST(AffineShapes, LeadingAxesAreIndependentRows) {
  KVLAB_SEEDED_RNG(rng, 1005);
  const Tensor x = testing::random_normal(rng, DType::bf16, {2, 3, 128});
  const QuantizedTensor q = affine_quantize(x, affine(3, 64), Rounding::mlx_cpu);
  EXPECT_EQ(q.wq.shape(), (Shape{2, 3, 12}));
  EXPECT_EQ(q.scales.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(q.biases.shape(), (Shape{2, 3, 2}));
  const Tensor xhat = affine_dequantize(q);
  EXPECT_EQ(xhat.shape(), x.shape());
  for (std::int64_t r = 0; r < 6; ++r) {
    Tensor row(DType::bf16, {128});  // rank 1: the row on its own
    for (std::int64_t j = 0; j < 128; ++j) row.view().store(j, at(x, r * 128 + j));
    const QuantizedTensor qr = affine_quantize(row, affine(3, 64), Rounding::mlx_cpu);
    ASSERT_EQ(qr.wq.shape(), (Shape{12}));
    const std::vector<std::int64_t> all_words = q.wq.to_ints(), row_words = qr.wq.to_ints();
    EXPECT_TRUE(std::equal(row_words.begin(), row_words.end(), all_words.begin() + r * 12)) << "row " << r;
    for (std::int64_t g = 0; g < 2; ++g) {
      EXPECT_EQ(at(qr.scales, g), at(q.scales, r * 2 + g));
      EXPECT_EQ(at(qr.biases, g), at(q.biases, r * 2 + g));
    }
    const Tensor row_hat = affine_dequantize(qr);
    for (std::int64_t j = 0; j < 128; ++j) ASSERT_EQ(at(row_hat, j), at(xhat, r * 128 + j)) << "row " << r;
  }
  // No rows at all is valid and produces empty outputs.
  const QuantizedTensor empty = affine_quantize(Tensor(DType::f32, {0, 64}), affine(4, 64), Rounding::mlx_cpu);
  EXPECT_EQ(empty.wq.shape(), (Shape{0, 8}));
}

TEST(AffineValidation, InvalidCallsThrowNamingTheBadValue) {
  const Tensor x(DType::f32, {2, 64});
  const auto quantize_into = [&x](DType wq_t, Shape wq_s, DType s_t, Shape s_s, DType b_t, Shape b_s,
                                  QuantSpec spec = affine(4, 64)) {
    Tensor wq(wq_t, std::move(wq_s)), scales(s_t, std::move(s_s)), biases(b_t, std::move(b_s));
    affine_quantize(x.view(), spec, Rounding::mlx_cpu, wq.view(), scales.view(), biases.view());
  };
  const DType u32 = DType::u32, f32 = DType::f32;
  EXPECT_KVLAB_ERROR(quantize_into(u32, {2, 8}, f32, {2, 1}, f32, {2, 1}, QuantSpec{QuantMode::mxfp4, 4, 32}),
                     invalid_argument, "mxfp4");
  EXPECT_KVLAB_ERROR(affine_quantize(x, affine(7, 64), Rounding::mlx_cpu), invalid_argument, "bits 7");
  EXPECT_KVLAB_ERROR(affine_quantize(x, affine(4, 48), Rounding::mlx_cpu), invalid_argument, "group_size 48");
  EXPECT_KVLAB_ERROR(affine_quantize(Tensor(f32, {2, 96}), affine(4, 64), Rounding::mlx_cpu), invalid_argument, "96");
  EXPECT_KVLAB_ERROR(affine_quantize(Tensor(DType::i32, {2, 64}), affine(4, 64), Rounding::mlx_cpu), dtype_mismatch,
                     "i32");
  EXPECT_KVLAB_ERROR(affine_quantize(Tensor(f32, {}), affine(4, 64), Rounding::mlx_cpu), shape_mismatch, "rank 0");
  EXPECT_KVLAB_ERROR(quantize_into(u32, {2, 7}, f32, {2, 1}, f32, {2, 1}), shape_mismatch, "(2, 7)");
  EXPECT_KVLAB_ERROR(quantize_into(DType::i32, {2, 8}, f32, {2, 1}, f32, {2, 1}), dtype_mismatch, "i32");
  EXPECT_KVLAB_ERROR(quantize_into(u32, {2, 8}, DType::f16, {2, 1}, f32, {2, 1}), dtype_mismatch, "f16");
  EXPECT_KVLAB_ERROR(quantize_into(u32, {2, 8}, f32, {2, 1}, f32, {2, 2}), shape_mismatch, "(2, 2)");

  const auto dequantize = [](DType wq_t, Shape wq_s, DType s_t, Shape s_s, DType b_t, Shape b_s, DType o_t,
                             Shape o_s) {
    const Tensor wq(wq_t, std::move(wq_s)), scales(s_t, std::move(s_s)), biases(b_t, std::move(b_s));
    Tensor out(o_t, std::move(o_s));
    affine_dequantize(wq.view(), scales.view(), biases.view(), affine(4, 64), out.view());
  };
  EXPECT_NO_THROW(dequantize(u32, {2, 8}, f32, {2, 1}, f32, {2, 1}, DType::bf16, {2, 64}));
  EXPECT_KVLAB_ERROR(dequantize(f32, {2, 8}, f32, {2, 1}, f32, {2, 1}, f32, {2, 64}), dtype_mismatch, "f32");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 8}, DType::u8, {2, 1}, DType::u8, {2, 1}, f32, {2, 64}), dtype_mismatch, "u8");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 8}, f32, {2, 1}, DType::f16, {2, 1}, f32, {2, 64}), dtype_mismatch, "f16");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 8}, f32, {2, 1}, f32, {2, 2}, f32, {2, 64}), shape_mismatch, "(2, 2)");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 8}, f32, {3, 1}, f32, {3, 1}, f32, {2, 64}), shape_mismatch, "(3, 1)");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 16}, f32, {2, 1}, f32, {2, 1}, f32, {2, 128}), shape_mismatch, "16 words");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 8}, f32, {2, 1}, f32, {2, 1}, f32, {2, 32}), shape_mismatch, "(2, 32)");
  EXPECT_KVLAB_ERROR(dequantize(u32, {2, 8}, f32, {2, 1}, f32, {2, 1}, u32, {2, 64}), dtype_mismatch, "u32");

  QuantizedTensor q = affine_quantize(x, affine(4, 64), Rounding::mlx_cpu);
  q.spec.bits = 0;  // a corrupted spec must not reach a division by zero
  EXPECT_KVLAB_ERROR(affine_dequantize(q), invalid_argument, "bits 0");
  q.spec.bits = 4;
  EXPECT_KVLAB_ERROR(affine_dequantize(q, DType::i32), dtype_mismatch, "i32");

  EXPECT_KVLAB_ERROR(affine_group_params(std::vector<float>(4, 1.0f), 9, Rounding::mlx_cpu), invalid_argument,
                     "9 bits");
  EXPECT_KVLAB_ERROR(affine_group_params({}, 4, Rounding::mlx_cpu), invalid_argument, "empty");
  EXPECT_KVLAB_ERROR(affine_code(1.0f, AffineGroupParams{1.0f, 0.0f}, 0, Rounding::mlx_gpu), invalid_argument,
                     "0 bits");
}

}  // namespace
}  // namespace test_affine_quantize
}  // namespace kvlab::ref
