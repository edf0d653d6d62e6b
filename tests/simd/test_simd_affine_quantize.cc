// SIMD affine quantize/dequantize == the oracle, bit for bit (codes, scales, biases,
// dequantized values), on every attainable Highway target, plus the same errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
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
  be.affine_quantize(dx, spec, rounding, wq, sc, bi);
  return {be.download(wq), be.download(sc), be.download(bi)};
}

Tensor dequantize_on(Backend& be, const Quantized& q, const QuantSpec& spec, DType out_dtype) {
  const DTensor out = be.allocate(out_dtype, with_last(q.wq.shape(), q.scales.dim(-1) * spec.group_size));
  be.fill(out, 0x7FC00001u);
  be.affine_dequantize(be.upload(q.wq), be.upload(q.scales), be.upload(q.biases), spec, out);
  return be.download(out);
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
              EXPECT_TRUE(testing::bit_equal(got.wq, want.wq));
              EXPECT_TRUE(testing::bit_equal(got.scales, want.scales));
              EXPECT_TRUE(testing::bit_equal(got.biases, want.biases));
              EXPECT_TRUE(testing::bit_equal(dequantize_on(simd_, want, spec, dtype), want_deq));
              EXPECT_TRUE(testing::bit_equal(dequantize_on(simd_, want, spec, DType::f32), want_deq32));
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
      EXPECT_TRUE(testing::bit_equal(got.wq, want.wq));
      EXPECT_TRUE(testing::bit_equal(got.scales, want.scales));
    });
  }
}

TEST_F(SimdAffine, EmptyBatchWritesNothingAndMatches) {
  const Tensor x(DType::f32, {0, 64});
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 4, 64);
  testing::for_each_simd_target([&](const std::string&) {
    const Quantized got = quantize_on(simd_, x, spec, Rounding::mlx_cpu);
    EXPECT_EQ(got.wq.shape(), (Shape{0, 8}));
  });
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
      be.affine_quantize(x, b.spec, Rounding::mlx_cpu, wq, sc, bi);
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
      be.affine_dequantize(wq, sc, bi, ok, out);
    };
    testing::expect_same_error([&] { call(ref_); }, [&] { call(simd_); }, b.what);
  }
}

}  // namespace
}  // namespace kvlab
