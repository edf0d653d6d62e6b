// Unit tests of the ggml block oracle (reference/ggml_quantize.h, docs/quantization.md
// §ggml block formats).
//
// Every expected code, scale and byte here is derived by hand from the arithmetic of
// ggml's C reference (ggml-quants.c: quantize_row_<fmt>_ref, dequantize_row_<fmt>) on
// blocks chosen so that the derivation is exact (d a power of two, or sums whose f32
// roundings are worked out in the comments) — never printed by the implementation. The
// bit-exact comparison with gguf-py's numpy reference is test_ggml_gguf_vectors.cc.
#include "reference/ggml_quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvlab/error.h"
#include "reference/quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/sdpa.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_ggml_quantize {
namespace {

using namespace kvlab::ref;  // NOLINT(google-build-using-namespace): the unit under test
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::error_message;

using Block = std::array<float, 32>;

// A block: `head` then zeros.
Block block(std::initializer_list<float> head) {
  Block b{};
  std::size_t i = 0;
  for (float v : head) b[i++] = v;
  return b;
}

std::array<std::uint8_t, 32> codes(std::initializer_list<int> head, int rest) {
  std::array<std::uint8_t, 32> c{};
  c.fill(static_cast<std::uint8_t>(rest));
  std::size_t i = 0;
  for (int v : head) c[i++] = static_cast<std::uint8_t>(v);
  return c;
}

GgmlBlock quantize(QuantMode m, const Block& x) { return ggml_quantize_block(m, std::span<const float, 32>(x)); }

// ---- the f16 conversion of d and m (GGML_FP32_TO_FP16) ----------------------------------

TEST(GgmlFp16, RoundsToNearestEvenWithSubnormalsInfAndOneNaN) {
  EXPECT_EQ(ggml_fp16_bits(1.0f), 0x3C00);
  EXPECT_EQ(ggml_fp16_bits(-0.5f), 0xB800);
  EXPECT_EQ(ggml_fp16_bits(-0.0f), 0x8000);
  EXPECT_EQ(ggml_fp16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(ggml_fp16_bits(65520.0f), 0x7C00);           // halfway to 2^16: to even, i.e. inf
  EXPECT_EQ(ggml_fp16_bits(0x1p-14f), 0x0400);           // the smallest normal
  EXPECT_EQ(ggml_fp16_bits(0x1p-25f), 0x0000);           // half the smallest subnormal: to even 0
  EXPECT_EQ(ggml_fp16_bits(0x1.8p-24f), 0x0002);         // 1.5 subnormal steps: to even 2
  EXPECT_EQ(ggml_fp16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(ggml_fp16_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  EXPECT_EQ(ggml_fp16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
}

// ---- q8_0 -------------------------------------------------------------------------------

// amax 127: d = 127/127 = 1, id = 1, so each code is roundf(x): half away from zero
// (0.5 → 1, 2.5 → 3, −2.5 → −3, where rint would give 0, 2, −2).
TEST(GgmlQ8_0, RoundsHalfAwayFromZero) {
  const GgmlBlock b = quantize(QuantMode::q8_0, block({127, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 126.49f, -127, 0.49f}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({127, 1, 0xFF, 2, 3, 0xFD, 126, 0x81, 0}, 0)));
  // ggml's block_q8_0 bytes: d little-endian, then the int8 quants.
  const std::vector<std::uint8_t> bytes = ggml_block_to_bytes(QuantMode::q8_0, b);
  ASSERT_EQ(bytes.size(), 34u);
  EXPECT_EQ(bytes[0], 0x00);
  EXPECT_EQ(bytes[1], 0x3C);
  EXPECT_EQ(bytes[2], 127);
  EXPECT_EQ(bytes[4], 0xFF);
  // value·d
  EXPECT_EQ(ggml_block_value(QuantMode::q8_0, b, 2), -1.0f);
  EXPECT_EQ(ggml_block_value(QuantMode::q8_0, b, 7), -127.0f);
}

TEST(GgmlQ8_0, ZeroBlockHasZeroScaleAndCodes) {
  const GgmlBlock b = quantize(QuantMode::q8_0, block({}));
  EXPECT_EQ(b.d, 0x0000);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({}, 0)));
}

// ---- q8_0 as ggml-cpu quantizes it on x86 (Rounding::ggml_cpu) -------------------------

GgmlBlock quantize_cpu(QuantMode m, const Block& x) {
  return ggml_quantize_block(m, std::span<const float, 32>(x), Rounding::ggml_cpu);
}

// amax 127: id = 127/127 = 1, codes by rint: ties to even (0.5 → 0, 2.5 → 2, −2.5 → −2,
// 1.5 → 2), where the C reference rounds half away (the block of RoundsHalfAwayFromZero).
TEST(GgmlQ8_0Cpu, RoundsTiesToEven) {
  const GgmlBlock b = quantize_cpu(QuantMode::q8_0, block({127, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 126.49f, -127, 0.49f}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({127, 0, 0, 2, 2, 0xFE, 126, 0x81, 0}, 0)));
}

// id = 127/amax, not 1/(amax/127): for amax 11, 127/11 rounds to 11.545455 in f32 and
// 1/(11/127) to 11.545454 (11/127 = 0.08661417 first); times 5.5 they give 63.500004 and
// 63.499996, so the CPU quantizer's code is 64 and the C reference's 63 (no tie involved).
// amax 29 and x = 14.5 go the other way: 127/29 = 4.37931 → 63.499996 → 63, against
// 1/(29/127) = 4.3793106 → 63.500004 → 64.
TEST(GgmlQ8_0Cpu, TakesTheMultiplierAs127OverAmax) {
  EXPECT_EQ(quantize_cpu(QuantMode::q8_0, block({11, 5.5f})).codes[1], 64);
  EXPECT_EQ(quantize(QuantMode::q8_0, block({11, 5.5f})).codes[1], 63);
  EXPECT_EQ(quantize_cpu(QuantMode::q8_0, block({29, 14.5f})).codes[1], 63);
  EXPECT_EQ(quantize(QuantMode::q8_0, block({29, 14.5f})).codes[1], 64);
}

// A NaN in element 5 is dropped from amax (lane 5's MAXPS with the next vector's element 13
// returns that operand), so d comes from the rest (amax 127 → d = 1); its own code is NaN·1
// → CVTPS2DQ's 0x80000000 → −128.
TEST(GgmlQ8_0Cpu, ANaNEarlyInALaneIsDroppedFromAmaxAndBecomesMinus128) {
  Block x = block({127});
  x[5] = std::numeric_limits<float>::quiet_NaN();
  const GgmlBlock b = quantize_cpu(QuantMode::q8_0, x);
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_EQ(b.codes[5], 0x80);
  EXPECT_EQ(b.codes[0], 127);
}

// A NaN in element 27 (lane 3 of the last vector: the second operand of every MAXPS on its
// way, lane 3 → four[3] → two1 → the final max_ss) becomes amax: d = NaN (F16C 0x7E00) and
// id = 127/NaN, so every code is −128.
TEST(GgmlQ8_0Cpu, ANaNThatReachesAmaxMakesEveryCodeMinus128) {
  Block x = block({127, 1, 2});
  x[27] = std::numeric_limits<float>::quiet_NaN();
  const GgmlBlock b = quantize_cpu(QuantMode::q8_0, x);
  EXPECT_EQ(b.d, 0x7E00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({}, 0x80)));
}

// The other formats have no CPU quantizer of their own: ggml_cpu is the C reference there.
TEST(GgmlQ8_0Cpu, OtherFormatsAreTheReference) {
  const Block x = block({-8, 0.5f, -1.5f, 8, 3.25f});
  for (QuantMode m : {QuantMode::q4_0, QuantMode::q4_1, QuantMode::q5_0, QuantMode::q5_1, QuantMode::iq4_nl}) {
    const GgmlBlock a = quantize(m, x), c = quantize_cpu(m, x);
    EXPECT_EQ(a.codes, c.codes) << quant_mode_name(m);
    EXPECT_EQ(a.d, c.d) << quant_mode_name(m);
  }
}

TEST(GgmlQ8_0Cpu, TheRoundingIsRefusedForOtherEncoders) {
  const Tensor x(DType::f32, Shape{1, 64});
  EXPECT_THROW(ref::quantize(x, QuantSpec::make(QuantMode::affine), Rounding::ggml_cpu), Error);
  EXPECT_THROW(ref::quantize(x, QuantSpec::make(QuantMode::mxfp4), Rounding::ggml_ref), Error);
  EXPECT_NO_THROW(ref::quantize(x, QuantSpec::make(QuantMode::q8_0), Rounding::ggml_cpu));
}

// ---- q4_0 and q5_0 -----------------------------------------------------------------------

// max is the first element of largest magnitude (−8, not the later +8): d = −8/−8 = 1,
// id = 1, code = min(15, trunc(x + 8.5)): round half up (−0.5 → 8, 0.5 → 9, −1.5 → 7,
// 1.5 → 10), and +8 clamps to 15 (decodes to 7).
TEST(GgmlQ4_0, SignedMaxOverMinusEightAndTruncatingHalfUp) {
  const GgmlBlock b = quantize(QuantMode::q4_0, block({-8, 7, 8, 0, -0.5f, 0.5f, -1.5f, 1.5f}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({0, 15, 15, 8, 8, 9, 7, 10}, 8)));
  EXPECT_EQ(ggml_block_value(QuantMode::q4_0, b, 0), -8.0f);
  EXPECT_EQ(ggml_block_value(QuantMode::q4_0, b, 2), 7.0f);
  // qs[j] = code[j] | code[j + 16] << 4; the codes of elements 16.. are 8.
  const std::vector<std::uint8_t> bytes = ggml_block_to_bytes(QuantMode::q4_0, b);
  ASSERT_EQ(bytes.size(), 18u);
  EXPECT_EQ(bytes[2], 0x80);
  EXPECT_EQ(bytes[3], 0x8F);
  EXPECT_EQ(bytes[17], 0x88);
}

// A positive max: d = 4/−8 = −0.5 (f16 0xB800), id = −2. 4 → −8 + 8.5 → 0; −4 → 16.5 →
// clamped 15; 1 → 6.5 → 6; 0.25 → 8; −0.25 → 9.
TEST(GgmlQ4_0, PositiveMaxGivesANegativeScale) {
  const GgmlBlock b = quantize(QuantMode::q4_0, block({4, -4, 1, 0.25f, -0.25f}));
  EXPECT_EQ(b.d, 0xB800);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({0, 15, 6, 8, 9}, 8)));
  EXPECT_EQ(ggml_block_value(QuantMode::q4_0, b, 0), 4.0f);   // (0 − 8)·−0.5
  EXPECT_EQ(ggml_block_value(QuantMode::q4_0, b, 1), -3.5f);  // the clamp: −4 decodes to −3.5
}

// d = −16/−16 = 1: code = min(31, trunc(x + 16.5)); +16 clamps to 31.
TEST(GgmlQ5_0, FiveBitCodesAndTheirHighBits) {
  const GgmlBlock b = quantize(QuantMode::q5_0, block({-16, 15, 16, 0.5f, -0.5f, 3}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({0, 31, 31, 17, 16, 19}, 16)));
  EXPECT_EQ(ggml_block_value(QuantMode::q5_0, b, 1), 15.0f);
  // block_q5_0: d, qh (bit j = bit 4 of code j), qs (low nibbles as q4_0).
  // Codes ≥ 16: elements 1..5 and every zero (code 16) → qh = all but bit 0.
  const std::vector<std::uint8_t> bytes = ggml_block_to_bytes(QuantMode::q5_0, b);
  ASSERT_EQ(bytes.size(), 22u);
  EXPECT_EQ(bytes[2], 0xFE);
  EXPECT_EQ(bytes[3], 0xFF);
  EXPECT_EQ(bytes[4], 0xFF);
  EXPECT_EQ(bytes[5], 0xFF);
  EXPECT_EQ(bytes[6], 0x00);  // code 0 | code 16's low nibble (0) << 4
  EXPECT_EQ(bytes[7], 0x0F);  // code 31 & 15
}

// ---- q4_1 and q5_1 -----------------------------------------------------------------------

// min −1, max 14: d = 15/15 = 1, id = 1, m = −1 (f16 0xBC00); code = trunc(x + 1 + 0.5):
// round half up (0.5 → 2, 1.5 → 3, −0.5 → 1; rint would give 2, 2, 0).
TEST(GgmlQ4_1, MinAndRangeWithTruncatingHalfUp) {
  const GgmlBlock b = quantize(QuantMode::q4_1, block({-1, 14, 0.5f, 1.5f, -0.5f}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_EQ(b.m, 0xBC00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({0, 15, 2, 3, 1}, 1)));
  EXPECT_EQ(ggml_block_value(QuantMode::q4_1, b, 2), 1.0f);  // 2·1 + (−1)
  const std::vector<std::uint8_t> bytes = ggml_block_to_bytes(QuantMode::q4_1, b);
  ASSERT_EQ(bytes.size(), 20u);
  EXPECT_EQ(bytes[2], 0x00);  // m
  EXPECT_EQ(bytes[3], 0xBC);
  EXPECT_EQ(bytes[4], 0x10);  // code 0 | code 16 (1) << 4
}

// A constant block: d = 0, id = 0, every code trunc(0.5) = 0, m the constant.
TEST(GgmlQ4_1, ConstantBlockReconstructsFromTheMin) {
  Block x{};
  x.fill(3.0f);
  const GgmlBlock b = quantize(QuantMode::q4_1, x);
  EXPECT_EQ(b.d, 0x0000);
  EXPECT_EQ(b.m, 0x4200);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({}, 0)));
  EXPECT_EQ(ggml_block_value(QuantMode::q4_1, b, 31), 3.0f);
}

// min 0, max 31: d = 1; code = trunc(x + 0.5), no clamp.
TEST(GgmlQ5_1, UnclampedFiveBitCodes) {
  const GgmlBlock b = quantize(QuantMode::q5_1, block({31, 30.5f, 2.5f, 16, 15.49f}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_EQ(b.m, 0x0000);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({31, 31, 3, 16, 15}, 0)));
  const std::vector<std::uint8_t> bytes = ggml_block_to_bytes(QuantMode::q5_1, b);
  ASSERT_EQ(bytes.size(), 24u);
  EXPECT_EQ(bytes[4], 0x0B);  // qh: elements 0, 1, 3
}

// ---- iq4_nl ------------------------------------------------------------------------------

// max −127: d0 = −127/−127 = 1, id = 1, so each code is the nearest table value to x,
// ties to the upper value: −4.5 is halfway between −10 and 1 (→ index 8), 7 between 1 and
// 13 (→ 9); 0 → 8; −127 → 0; 200 → 15.
// The scale is Σ(w·q)·x / Σ(w·q)·q with w = x², summed in order in f32 (ulp 16 near 2.6e8):
//   sumqx: 260144640 (16129·16129 = 260144641 rounded), −91.125 → 260144544, +4459 →
//          260149008; sumq2: 260144640, +20.25 → 260144656, +8281 → 260152944;
//   d = 260149008/260152944 ≈ 0.99998487, which rounds to f16 1.0.
TEST(GgmlIq4Nl, NearestTableValueTiesUpAndLeastSquaresScale) {
  const GgmlBlock b = quantize(QuantMode::iq4_nl, block({-127, -4.5f, 7}));
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({0, 8, 9}, 8)));
  EXPECT_EQ(ggml_block_value(QuantMode::iq4_nl, b, 2), 13.0f);
  EXPECT_EQ(ggml_block_value(QuantMode::iq4_nl, b, 0), -127.0f);
}

// A block that is its own table times 1/2: id = 2 hits every table value exactly, and
// each term of sumqx is exactly half of sumq2's (q = 2x), so d = 0.5 exactly.
TEST(GgmlIq4Nl, ExactTableBlockRecoversItsScale) {
  Block x{};
  for (std::size_t i = 0; i < 32; ++i) x[i] = static_cast<float>(kIq4nlValues[i % 16]) * 0.5f;
  const GgmlBlock b = quantize(QuantMode::iq4_nl, x);
  EXPECT_EQ(b.d, 0x3800);
  for (std::size_t i = 0; i < 32; ++i) EXPECT_EQ(b.codes[i], i % 16) << i;
}

// amax below 1e-15: d = 0; ggml skips the index pass, kvlab writes code 8 (nearest to 0).
TEST(GgmlIq4Nl, TinyBlockHasZeroScale) {
  const GgmlBlock b = quantize(QuantMode::iq4_nl, block({1e-16f, -5e-16f}));
  EXPECT_EQ(b.d, 0x0000);
  EXPECT_THAT(b.codes, ElementsAreArray(codes({}, 8)));
}

// ---- bytes round trip and tensors ----------------------------------------------------------

TEST(GgmlBytes, RoundTripEveryFormat) {
  for (QuantMode m : {QuantMode::q8_0, QuantMode::q4_0, QuantMode::q4_1, QuantMode::q5_0, QuantMode::q5_1,
                      QuantMode::iq4_nl}) {
    const int bits = quant_format(m).default_bits;
    GgmlBlock b;
    for (std::size_t i = 0; i < 32; ++i) b.codes[i] = static_cast<std::uint8_t>((i * 7 + 3) & ((1u << bits) - 1));
    b.d = 0x1234;
    b.m = (m == QuantMode::q4_1 || m == QuantMode::q5_1) ? 0xABCD : 0;
    const GgmlBlock back = ggml_block_from_bytes(m, ggml_block_to_bytes(m, b));
    EXPECT_EQ(back.codes, b.codes) << quant_mode_name(m);
    EXPECT_EQ(back.d, b.d);
    EXPECT_EQ(back.m, b.m);
  }
}

// Through the one dispatch (reference/quantize.h): a (1, 64) row is two blocks; the codes
// land in kvlab's LSB-first bitstream in element order.
TEST(GgmlTensor, QuantizeDispatchAndLayout) {
  std::vector<float> v(64, 0.0f);
  v[0] = -8;  // block 0 as SignedMaxOverMinusEightAndTruncatingHalfUp: codes 0, 15, 8, …
  v[1] = 7;
  v[32] = 4;  // block 1: d = −0.5, code 0
  const Tensor x = Tensor::from_values(DType::f32, {1, 64}, v);
  const QuantizedTensor q = ref::quantize(x, QuantSpec::make(QuantMode::q4_0), Rounding::mlx_cpu);
  ASSERT_EQ(q.wq.shape(), (Shape{1, 8}));
  ASSERT_EQ(q.scales.dtype(), DType::f16);
  const auto* w = q.wq.view().as<const std::uint32_t>();
  EXPECT_EQ(w[0], 0x888888F0u);  // element 0 in the low nibble
  EXPECT_EQ(w[4], 0x88888880u);
  EXPECT_EQ(q.scales.view().as<const std::uint16_t>()[1], 0xB800);
  Tensor out(DType::f32, {1, 64});
  ref::dequantize({q.wq.view(), q.scales.view(), {}, q.spec}, out.view());
  EXPECT_EQ(out.view().load(0), -8.0f);
  EXPECT_EQ(out.view().load(1), 7.0f);
  EXPECT_EQ(out.view().load(32), 4.0f);
  EXPECT_EQ(out.view().load(33), -0.0f);
}

// quantized_sdpa dequantizes any format generically: over q8_0 keys and q4_1 values
// (f16 scales, f16 mins) it is sdpa over the dequantized K and V, bit for bit.
TEST(GgmlTensor, QuantizedSdpaIsSdpaOverTheDequantizedBlocks) {
  std::vector<float> kv(2 * 1 * 5 * 64), qv(2 * 2 * 1 * 64);
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 37) % 23) / 8.0f - 1.4f;
  for (std::size_t i = 0; i < qv.size(); ++i) qv[i] = static_cast<float>((i * 11) % 13) / 16.0f - 0.4f;
  const Tensor keys = Tensor::from_values(DType::f32, {2, 1, 5, 64}, kv);
  const Tensor q = Tensor::from_values(DType::f32, {2, 2, 1, 64}, qv);
  const QuantizedTensor k8 = ggml_quantize(keys, QuantSpec::make(QuantMode::q8_0));
  const QuantizedTensor v41 = ggml_quantize(keys, QuantSpec::make(QuantMode::q4_1));
  AttentionParams params;
  params.scale = 0.125f;
  const Tensor got = ref::quantized_sdpa(q, k8, v41, params);
  const Tensor want = ref::sdpa(q, ggml_dequantize(k8), ggml_dequantize(v41), params);
  ASSERT_EQ(got.shape(), want.shape());
  for (std::int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.view().load(i), want.view().load(i)) << i;
  // u8 scales are not a q8_0 tensor
  Tensor bad_scales(DType::u8, k8.scales.shape());
  const QuantizedTensor bad{k8.wq, bad_scales, Tensor(), k8.spec};
  EXPECT_THAT(error_message([&] { (void)ref::quantized_sdpa(q, bad, v41, params); }, ErrorKind::dtype_mismatch),
              HasSubstr("f16"));
}

// ---- bad input: kvlab::Error naming the value ----------------------------------------------

TEST(GgmlBadInput, ErrorsNameTheValue) {
  const Tensor x48(DType::f32, {2, 48});
  EXPECT_THAT(error_message([&] { (void)ggml_quantize(x48, QuantSpec::make(QuantMode::q4_0)); },
                            ErrorKind::invalid_argument),
              HasSubstr("48"));
  EXPECT_THAT(error_message([&] { QuantSpec::make(QuantMode::q8_0, 4); }, ErrorKind::invalid_argument),
              HasSubstr("bits 4"));
  EXPECT_THAT(error_message([&] { QuantSpec::make(QuantMode::q5_1, std::nullopt, 64); }, ErrorKind::invalid_argument),
              HasSubstr("group_size 64"));
  const Tensor x(DType::f32, {1, 32});
  Tensor wq(DType::u32, {1, 4}), s16(DType::f16, {1, 1}), s32(DType::f32, {1, 1});
  EXPECT_THAT(error_message([&] { ggml_quantize(x.view(), QuantSpec::make(QuantMode::q4_0), wq.view(), s32.view(), {}); },
                            ErrorKind::dtype_mismatch),
              HasSubstr("f32"));
  // q4_1 without its mins; q4_0 with mins it does not have
  EXPECT_THAT(error_message([&] { ggml_quantize(x.view(), QuantSpec::make(QuantMode::q4_1), wq.view(), s16.view(), {}); },
                            ErrorKind::dtype_mismatch),
              HasSubstr("biases"));
  Tensor m16(DType::f16, {1, 1});
  EXPECT_THAT(error_message([&] { ggml_quantize(x.view(), QuantSpec::make(QuantMode::q4_0), wq.view(), s16.view(),
                                                m16.view()); },
                            ErrorKind::invalid_argument),
              HasSubstr("q4_0"));
  // an affine spec is not a ggml one
  EXPECT_THAT(error_message([&] { (void)ggml_quantize(x, QuantSpec::make(QuantMode::affine)); },
                            ErrorKind::invalid_argument),
              HasSubstr("affine"));
}

}  // namespace
}  // namespace test_ggml_quantize
}  // namespace kvlab
