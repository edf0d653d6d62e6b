// Unit tests of the reference RoPE (reference/rope.h, docs/kernels.md §RoPE).
//
// Expectations come from the rotation's algebra (norms, inverses, composition,
// batching) or from the formula of docs/kernels.md §RoPE evaluated here in double; no number below
// was printed by the implementation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/rope.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_rope {
namespace {

using testing::SeededRng;

RopeParams params_of(int dims, bool traditional, float base = 10000.0f, float scale = 1.0f,
                     std::vector<float> freqs = {}) {
  RopeParams p;
  p.dims = dims;
  p.traditional = traditional;
  p.base = base;
  p.scale = scale;
  p.freqs = std::move(freqs);
  return p;
}

Tensor i32_vector(const std::vector<std::int64_t>& values) {
  return Tensor::from_ints(DType::i32, {static_cast<std::int64_t>(values.size())}, values);
}

// Feature indices (first, second) of rotation pair i, straight from docs/kernels.md §RoPE.
std::pair<std::int64_t, std::int64_t> pair_features(const RopeParams& p, int i) {
  if (p.traditional) return {2 * i, 2 * i + 1};
  return {i, i + p.dims / 2};
}

// Spacing of the float dtype's values around magnitude a (the ulp of the binade
// holding a; subnormal spacing below the smallest normal).
double dtype_spacing(double a, DType t) {
  const double min_normal = t == DType::f16 ? std::ldexp(1.0, -14) : static_cast<double>(FLT_MIN);
  const double eps = dtype_epsilon(t);
  if (a < min_normal) return eps * min_normal;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  return eps * std::ldexp(1.0, e - 1);
}

using testing::expect_error;

// ---- hand-computed tiny cases ------------------------------------------------------

// D = dims = 4, one token at position p = scale·offset. With base 10000 the two
// inverse frequencies are 1 and 10000^(-1/2) = 0.01.
struct TinyCase {
  std::int32_t offset;
  float scale;
};

class RopeTiny : public ::testing::TestWithParam<TinyCase> {};

TEST_P(RopeTiny, TraditionalRotatesAdjacentPairs) {
  const auto [offset, scale] = GetParam();
  const Tensor x = Tensor::from_values(DType::f32, {1, 1, 4}, std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
  const Tensor y = ref::rope(x, params_of(4, true, 10000.0f, scale), offset);
  const double p = static_cast<double>(scale) * offset;
  const double c0 = std::cos(p), s0 = std::sin(p), c1 = std::cos(p * 0.01), s1 = std::sin(p * 0.01);
  const double expected[4] = {1 * c0 - 2 * s0, 1 * s0 + 2 * c0, 3 * c1 - 4 * s1, 3 * s1 + 4 * c1};
  for (int k = 0; k < 4; ++k) {
    EXPECT_NEAR(y.view().load(k), expected[k], dtype_epsilon(DType::f32) * 5.0) << "feature " << k;
  }
}

TEST_P(RopeTiny, NeoxRotatesHalves) {
  const auto [offset, scale] = GetParam();
  const Tensor x = Tensor::from_values(DType::f32, {1, 1, 4}, std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
  const Tensor y = ref::rope(x, params_of(4, false, 10000.0f, scale), offset);
  const double p = static_cast<double>(scale) * offset;
  const double c0 = std::cos(p), s0 = std::sin(p), c1 = std::cos(p * 0.01), s1 = std::sin(p * 0.01);
  // Pairs are (0, 2) with frequency 1 and (1, 3) with frequency 0.01.
  const double expected[4] = {1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 1 * s0 + 3 * c0, 2 * s1 + 4 * c1};
  for (int k = 0; k < 4; ++k) {
    EXPECT_NEAR(y.view().load(k), expected[k], dtype_epsilon(DType::f32) * 5.0) << "feature " << k;
  }
}

// Positive, negative (legal: left padding) and zero positions, and scale multiplying
// the position (p = 0.5·(−3) = −1.5).
INSTANTIATE_TEST_SUITE_P(Positions, RopeTiny,
                         ::testing::Values(TinyCase{3, 1.0f}, TinyCase{-3, 1.0f}, TinyCase{0, 1.0f},
                                           TinyCase{-3, 0.5f}, TinyCase{7, 4.0f}));

// ---- algebraic properties ---------------------------------------------------------

// A rotation preserves the norm of every pair; the tail is untouched, so the whole
// feature vector keeps its norm too. Norms are taken in double from stored values;
// output rounding moves each norm by at most eps·|pair|.
TEST(Rope, RotationPreservesPairAndVectorNorms) {
  KVLAB_SEEDED_RNG(rng, 101);
  const double eps = dtype_epsilon(DType::f32);
  for (bool traditional : {false, true}) {
    const RopeParams p = params_of(48, traditional);
    const Tensor x = testing::random_normal(rng, DType::f32, {2, 3, 7, 64});
    const Tensor y = ref::rope(x, p, 1234);
    const ConstTensorView vx = x.view(), vy = y.view();
    for (std::int64_t row = 0; row < 2 * 3 * 7; ++row) {
      const std::int64_t at = row * 64;
      double nx = 0, ny = 0;
      for (int i = 0; i < p.dims / 2; ++i) {
        const auto [a, b] = pair_features(p, i);
        const double xa = vx.load(at + a), xb = vx.load(at + b), ya = vy.load(at + a), yb = vy.load(at + b);
        const double pin = std::hypot(xa, xb), pout = std::hypot(ya, yb);
        EXPECT_NEAR(pout, pin, eps * pin + 1e-30) << "row " << row << " pair " << i;
      }
      for (int k = 0; k < 64; ++k) {
        nx += static_cast<double>(vx.load(at + k)) * vx.load(at + k);
        ny += static_cast<double>(vy.load(at + k)) * vy.load(at + k);
      }
      EXPECT_NEAR(std::sqrt(ny), std::sqrt(nx), eps * std::sqrt(nx)) << "row " << row;
    }
  }
}

// Per-row offsets must be exactly the per-row calls with that row's scalar offset:
// row b of the batched output is computed from row b's input and offset only.
TEST(Rope, PerRowOffsetsEqualPerRowScalarCalls) {
  KVLAB_SEEDED_RNG(rng, 202);
  for (int rank : {3, 4, 5}) {
    for (std::int64_t batch = 1; batch <= 4; ++batch) {
      for (std::int64_t seq : {1, 5}) {
        for (bool traditional : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "rank " << rank << " B " << batch << " T " << seq << " trad "
                                            << traditional);
          Shape shape{batch};
          for (int a = 1; a < rank - 2; ++a) shape.push_back(a + 1);  // middle axes 2, 3
          shape.push_back(seq);
          shape.push_back(16);
          const Tensor x = testing::random_normal(rng, DType::f32, shape);
          std::vector<std::int64_t> offs;
          for (std::int64_t b = 0; b < batch; ++b) offs.push_back(rng.integer(-40, 300));
          const RopeParams p = params_of(12, traditional);
          const Tensor batched = ref::rope(x, p, i32_vector(offs));
          for (std::int64_t b = 0; b < batch; ++b) {
            const Tensor single = ref::rope(x.slice(0, b, b + 1), p, static_cast<std::int32_t>(offs[static_cast<std::size_t>(b)]));
            EXPECT_TRUE(testing::bit_equal(batched.slice(0, b, b + 1), single)) << "row " << b;
          }
        }
      }
    }
  }
}

// Inverse: scale = −1 with the same offset gives every token the position −p exactly
// (negation is exact in double), so the second call applies R(−θ) = R(θ)ᵀ. The only
// error left is the f32 rounding of the intermediate (≤ ½ulp per element, a vector of
// norm ≤ eps/√2·|pair| that R(−θ) does not grow) plus the final rounding (≤ ½ulp):
// each element is within 2·eps·|pair| of the input.
TEST(Rope, NegatedScaleInvertsTheRotation) {
  KVLAB_SEEDED_RNG(rng, 303);
  const double eps = dtype_epsilon(DType::f32);
  for (bool traditional : {false, true}) {
    for (std::int32_t offset : {0, 17, -9, 40000}) {
      const RopeParams fwd = params_of(32, traditional, 10000.0f, 1.0f);
      const RopeParams inv = params_of(32, traditional, 10000.0f, -1.0f);
      const Tensor x = testing::random_normal(rng, DType::f32, {2, 2, 9, 40});
      const Tensor back = ref::rope(ref::rope(x, fwd, offset), inv, offset);
      const ConstTensorView vx = x.view(), vb = back.view();
      for (std::int64_t row = 0; row < 2 * 2 * 9; ++row) {
        for (int i = 0; i < 16; ++i) {
          const auto [a, b] = pair_features(fwd, i);
          const double norm = std::hypot(vx.load(row * 40 + a), vx.load(row * 40 + b));
          EXPECT_NEAR(vb.load(row * 40 + a), vx.load(row * 40 + a), 2 * eps * norm);
          EXPECT_NEAR(vb.load(row * 40 + b), vx.load(row * 40 + b), 2 * eps * norm);
        }
        for (int k = 32; k < 40; ++k) EXPECT_EQ(vb.load(row * 40 + k), vx.load(row * 40 + k));
      }
    }
  }
}

// With one token (T = 1), offset −a undoes offset a (the same argument as above).
TEST(Rope, NegatedOffsetInvertsASingleToken) {
  KVLAB_SEEDED_RNG(rng, 304);
  const double eps = dtype_epsilon(DType::f32);
  for (std::int32_t a : {1, 5, -77, 123456}) {
    const RopeParams p = params_of(64, a % 2 == 0);
    const Tensor x = testing::random_normal(rng, DType::f32, {3, 4, 1, 64});
    const Tensor back = ref::rope(ref::rope(x, p, a), p, -a);
    double max_abs = 0;
    for (std::int64_t k = 0; k < x.numel(); ++k) max_abs = std::max(max_abs, std::abs(static_cast<double>(x.view().load(k))));
    EXPECT_TRUE(testing::all_close(back, x, 2 * eps * std::sqrt(2.0) * max_abs)) << "a = " << a;
  }
}

// R(a)·R(b) = R(a+b). Composed rotations round twice, the direct one once: within
// 2·eps·|pair| per element as for the inverse.
TEST(Rope, PositionsCompose) {
  KVLAB_SEEDED_RNG(rng, 405);
  const double eps = dtype_epsilon(DType::f32);
  const std::int32_t pairs[][2] = {{3, 4}, {-10, 25}, {1000, -1000}, {-7, -8}, {30000, 2500}};
  for (bool traditional : {false, true}) {
    const RopeParams p = params_of(24, traditional);
    for (const auto& ab : pairs) {
      SCOPED_TRACE(::testing::Message() << "a " << ab[0] << " b " << ab[1] << " trad " << traditional);
      // T = 1: plain scalar offsets.
      const Tensor x1 = testing::random_normal(rng, DType::f32, {2, 3, 1, 24});
      const Tensor direct1 = ref::rope(x1, p, ab[0] + ab[1]);
      const Tensor composed1 = ref::rope(ref::rope(x1, p, ab[1]), p, ab[0]);
      // T > 1: token t is at t + b after the first call; viewing (1, T, D) as T rows of
      // one token each, per-row offsets all equal to a add a to every token.
      const std::int64_t seq = 6;
      const Tensor x = testing::random_normal(rng, DType::f32, {1, seq, 24});
      const Tensor direct = ref::rope(x, p, ab[0] + ab[1]);
      Tensor first = ref::rope(x, p, ab[1]);
      Tensor as_rows(DType::f32, {seq, 1, 24});
      std::memcpy(as_rows.data(), first.data(), first.nbytes());
      const Tensor second = ref::rope(as_rows, p, i32_vector(std::vector<std::int64_t>(seq, ab[0])));
      for (const auto& [got, want] : {std::pair{&composed1, &direct1}, std::pair{&second, &direct}}) {
        const ConstTensorView vg = got->view(), vw = want->view();
        for (std::int64_t row = 0; row < want->numel() / 24; ++row) {
          for (int i = 0; i < 12; ++i) {
            const auto [a, b] = pair_features(p, i);
            const double norm = std::hypot(vw.load(row * 24 + a), vw.load(row * 24 + b));
            EXPECT_NEAR(vg.load(row * 24 + a), vw.load(row * 24 + a), 2 * eps * norm + 1e-30);
            EXPECT_NEAR(vg.load(row * 24 + b), vw.load(row * 24 + b), 2 * eps * norm + 1e-30);
          }
        }
      }
    }
  }
}

// scale = 2 with offset o puts token t at 2(t+o): the same double position as a
// scale-1 call at offset 2(t+o), so the results agree bit for bit.
TEST(Rope, ScaleMultipliesPositions) {
  KVLAB_SEEDED_RNG(rng, 506);
  for (std::int32_t o : {0, 9, -13}) {
    const std::int64_t seq = 5;
    const Tensor x = testing::random_normal(rng, DType::f32, {2, seq, 32});
    const Tensor scaled = ref::rope(x, params_of(32, false, 10000.0f, 2.0f), o);
    for (std::int64_t t = 0; t < seq; ++t) {
      Tensor token(DType::f32, {2, 1, 32});
      for (std::int64_t b = 0; b < 2; ++b) {
        std::memcpy(token.data() + 4 * 32 * b, x.data() + 4 * 32 * (b * seq + t), 4 * 32);
      }
      const Tensor want = ref::rope(token, params_of(32, false), static_cast<std::int32_t>(2 * (t + o)));
      for (std::int64_t b = 0; b < 2; ++b) {
        EXPECT_EQ(std::memcmp(want.data() + 4 * 32 * b, scaled.data() + 4 * 32 * (b * seq + t), 4 * 32), 0)
            << "o " << o << " t " << t << " b " << b;
      }
    }
  }
}

// Explicit wavelengths base^(2i/dims) reproduce the base form. The bases are chosen so
// that every wavelength is exact in float (10000^(i/4) = 10^i, 256^(i/4) = 4^i); a
// rounded wavelength would shift θ by a relative 2^-24, which is not rounding noise.
TEST(Rope, FreqsEqualToBasePowersMatchBase) {
  KVLAB_SEEDED_RNG(rng, 607);
  const double eps = dtype_epsilon(DType::f32);
  const std::pair<float, std::vector<float>> cases[] = {{10000.0f, {1.0f, 10.0f, 100.0f, 1000.0f}},
                                                        {256.0f, {1.0f, 4.0f, 16.0f, 64.0f}}};
  for (bool traditional : {false, true}) {
    for (const auto& [base, freqs] : cases) {
      const Tensor x = testing::random_normal(rng, DType::f32, {2, 6, 10});
      const Tensor by_base = ref::rope(x, params_of(8, traditional, base), 123);
      const Tensor by_freqs = ref::rope(x, params_of(8, traditional, 10000.0f, 1.0f, freqs), 123);
      EXPECT_TRUE(testing::all_close(by_freqs, by_base, 4 * eps * 4.0)) << "base " << base;
      // A scale folds into the wavelengths: scale s ⇔ wavelengths divided by s.
      std::vector<float> stretched;
      for (float w : freqs) stretched.push_back(w * 4.0f);
      const Tensor by_scale = ref::rope(x, params_of(8, traditional, base, 0.25f), 123);
      const Tensor by_stretch = ref::rope(x, params_of(8, traditional, 1.0f, 1.0f, stretched), 123);
      EXPECT_TRUE(testing::all_close(by_stretch, by_scale, 4 * eps * 4.0)) << "base " << base;
    }
  }
}

// ---- copying, aliasing and dtypes -------------------------------------------------

TEST(Rope, InputAndOffsetsAreNotModified) {
  KVLAB_SEEDED_RNG(rng, 708);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = testing::random_normal(rng, t, {3, 2, 4, 20});
    const Tensor x_before = x;
    const Tensor offs = i32_vector({5, -2, 70});
    const Tensor offs_before = offs;
    Tensor out(t, x.shape());
    ref::rope(x.view(), params_of(16, true), 0, offs.view(), out.view());
    EXPECT_TRUE(testing::bit_equal(x, x_before)) << dtype_name(t);
    EXPECT_TRUE(testing::bit_equal(offs, offs_before)) << dtype_name(t);
    (void)ref::rope(x, params_of(16, false), 9);
    EXPECT_TRUE(testing::bit_equal(x, x_before)) << dtype_name(t);
  }
}

// Features [dims, D) are copied bit for bit, even NaN payloads, −0 and infinities
// that a load/convert/store round trip might not keep.
TEST(Rope, TailFeaturesPassThroughBitwise) {
  KVLAB_SEEDED_RNG(rng, 809);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (bool traditional : {false, true}) {
      Tensor x = testing::random_normal(rng, t, {2, 3, 5, 14});
      // Signalling NaN with a payload, −0 and −inf in the tail of row 0.
      if (t == DType::f32) {
        const std::uint32_t bits[3] = {0x7fa00001u, 0x80000000u, 0xff800000u};
        std::memcpy(x.data() + 4 * 10, bits, sizeof bits);
      } else {
        const std::uint16_t bits[3] = {static_cast<std::uint16_t>(t == DType::f16 ? 0x7d01u : 0x7f81u), 0x8000u,
                                       static_cast<std::uint16_t>(t == DType::f16 ? 0xfc00u : 0xff80u)};
        std::memcpy(x.data() + 2 * 10, bits, sizeof bits);
      }
      const Tensor y = ref::rope(x, params_of(6, traditional), i32_vector({3, -4}));
      EXPECT_TRUE(testing::bit_equal(y.slice(-1, 6, 14), x.slice(-1, 6, 14))) << dtype_name(t);
    }
  }
}

// f16/bf16 output vs the f32 output rounded to the dtype: both round the same double
// value, the f32 path twice, so they differ by at most one dtype ulp. A bound of
// eps·max(|ref|, min_normal) admits one ulp and rejects two.
TEST(Rope, HalfPrecisionIsRoundedF32WithinOneUlp) {
  KVLAB_SEEDED_RNG(rng, 910);
  for (DType t : {DType::f16, DType::bf16}) {
    const double min_normal = t == DType::f16 ? std::ldexp(1.0, -14) : static_cast<double>(FLT_MIN);
    const Tensor x = testing::random_normal(rng, t, {3, 2, 6, 32}, 3.0);
    const Tensor x32 = Tensor::from_f32(x.to_f32(), DType::f32);  // exact widening
    const Tensor offs = i32_vector({0, -17, 5000});
    for (bool traditional : {false, true}) {
      const RopeParams p = params_of(24, traditional);
      const Tensor low = ref::rope(x, p, offs);
      const Tensor wide = ref::rope(x32, p, offs);
      for (std::int64_t k = 0; k < x.numel(); ++k) {
        const double want = round_to_dtype(wide.view().load(k), t);
        const double got = low.view().load(k);
        EXPECT_LE(std::abs(got - want), dtype_epsilon(t) * std::max(std::abs(want), min_normal))
            << dtype_name(t) << " element " << k;
      }
    }
  }
}

// Stronger than the above: each output is the RoPE formula evaluated in double and
// rounded to the nearest dtype value (|out − exact| ≤ ½ spacing). Rounding through
// f32 first would fail here for about 2^-14 (f16) / 2^-17 (bf16) of the elements, so
// the tensors are large enough to contain many such cases.
TEST(Rope, EveryDtypeRoundsTheDoubleValueOnce) {
  KVLAB_SEEDED_RNG(rng, 1011);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const Shape shape = t == DType::f32 ? Shape{2, 2, 16, 64}
                        : t == DType::f16 ? Shape{4, 8, 64, 64}
                                          : Shape{4, 8, 256, 128};
    const Tensor x = testing::random_normal(rng, t, shape, 2.0);
    const std::vector<std::int64_t> offs = {-3, 100001, 77, 4096};
    const std::int64_t batch = shape[0], seq = shape[2], d = shape[3];
    const RopeParams p = params_of(static_cast<int>(d * 3 / 4), t != DType::f16, 10000.0f, 0.75f);
    const Tensor y = ref::rope(x, p, i32_vector(std::vector<std::int64_t>(offs.begin(), offs.begin() + batch)));
    const ConstTensorView vx = x.view(), vy = y.view();
    const std::int64_t rows = x.numel() / d, half = p.dims / 2;
    std::vector<double> inv(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i) inv[static_cast<std::size_t>(i)] = std::pow(10000.0, -2.0 * static_cast<double>(i) / p.dims);
    std::int64_t bad = 0;
    std::string first_bad;
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t b = row / (rows / batch), tok = row % seq;
      const double pos = 0.75 * static_cast<double>(tok + offs[static_cast<std::size_t>(b)]);
      for (std::int64_t k = 0; k < p.dims; ++k) {
        // Pair index and role of feature k, read off the layout.
        const std::int64_t i = p.traditional ? k / 2 : k % half;
        const bool first = p.traditional ? k % 2 == 0 : k < half;
        const std::int64_t partner = p.traditional ? (first ? k + 1 : k - 1) : (first ? k + half : k - half);
        const double theta = pos * inv[static_cast<std::size_t>(i)];
        const double self = vx.load(row * d + k), other = vx.load(row * d + partner);
        const double exact = first ? self * std::cos(theta) - other * std::sin(theta)
                                   : other * std::sin(theta) + self * std::cos(theta);
        const double got = vy.load(row * d + k);
        const double bound = 0.5 * dtype_spacing(std::abs(exact), t) + 1e-12 * std::abs(exact);
        if (std::abs(got - exact) > bound && bad++ == 0) {
          first_bad = ::testing::PrintToString(got) + " for exact " + ::testing::PrintToString(exact) + " at row " +
                      std::to_string(row) + " feature " + std::to_string(k);
        }
      }
    }
    EXPECT_EQ(bad, 0) << dtype_name(t) << ": not the nearest value " << bad << " times; first: " << first_bad;
  }
}

TEST(Rope, EmptyTensorsAreAccepted) {
  const Tensor no_tokens(DType::f32, {2, 3, 0, 8});
  EXPECT_EQ(ref::rope(no_tokens, params_of(8, false), 4).shape(), no_tokens.shape());
  const Tensor no_rows(DType::bf16, {0, 5, 8});
  EXPECT_EQ(ref::rope(no_rows, params_of(4, true), Tensor(DType::i32, {0})).shape(), no_rows.shape());
}

// ---- validation -------------------------------------------------------------------

TEST(RopeInvalid, RejectsBadInputsNamingTheValue) {
  const Tensor x(DType::f32, {2, 3, 8});
  using K = ErrorKind;
  expect_error([&] { (void)ref::rope(Tensor(DType::f32, {4, 8}), params_of(8, false), 0); }, K::shape_mismatch,
               {"rank 2", "(4, 8)"});
  expect_error([&] { (void)ref::rope(Tensor(DType::u32, {2, 3, 8}), params_of(8, false), 0); }, K::dtype_mismatch,
               {"u32"});
  expect_error([&] { (void)ref::rope(x, params_of(0, false), 0); }, K::invalid_argument, {"dims 0"});
  expect_error([&] { (void)ref::rope(x, params_of(-6, false), 0); }, K::invalid_argument, {"-6"});
  expect_error([&] { (void)ref::rope(x, params_of(5, false), 0); }, K::invalid_argument, {"5", "odd"});
  expect_error([&] { (void)ref::rope(x, params_of(10, false), 0); }, K::invalid_argument, {"10", "8"});
  expect_error([&] { (void)ref::rope(x, params_of(8, false, 1e4f, 1.0f, {1, 2, 3}), 0); }, K::shape_mismatch,
               {"3", "4"});
  expect_error([&] { (void)ref::rope(x, params_of(4, false, 1e4f, 1.0f, {1, -2.5f}), 0); }, K::invalid_argument,
               {"freqs[1]", "-2.5"});
  expect_error([&] { (void)ref::rope(x, params_of(4, false, 1e4f, 1.0f, {0, 2}), 0); }, K::invalid_argument,
               {"freqs[0] = 0"});
  expect_error([&] { (void)ref::rope(x, params_of(4, false, 1e4f, 1.0f, {1, INFINITY}), 0); }, K::invalid_argument,
               {"inf"});
  expect_error([&] { (void)ref::rope(x, params_of(4, false, 1e4f, 1.0f, {NAN, 1}), 0); }, K::invalid_argument,
               {"nan"});
  expect_error([&] { (void)ref::rope(x, params_of(4, false, -3.0f), 0); }, K::invalid_argument, {"base -3"});
  expect_error([&] { (void)ref::rope(x, params_of(8, false), i32_vector({1, 2, 3})); }, K::shape_mismatch,
               {"(3,)", "(2,)"});
  expect_error([&] { (void)ref::rope(x, params_of(8, false), Tensor(DType::i32, {2, 1})); }, K::shape_mismatch,
               {"(2, 1)"});
  expect_error([&] { (void)ref::rope(x, params_of(8, false), Tensor(DType::u32, {2})); }, K::dtype_mismatch,
               {"u32"});
}

TEST(RopeInvalid, RejectsBadOutputs) {
  const Tensor x(DType::f32, {2, 3, 8});
  Tensor wrong_shape(DType::f32, {2, 4, 8});
  expect_error([&] { ref::rope(x.view(), params_of(8, false), 0, std::nullopt, wrong_shape.view()); },
               ErrorKind::shape_mismatch, {"(2, 4, 8)", "(2, 3, 8)"});
  Tensor wrong_dtype(DType::f16, {2, 3, 8});
  expect_error([&] { ref::rope(x.view(), params_of(8, false), 0, std::nullopt, wrong_dtype.view()); },
               ErrorKind::dtype_mismatch, {"f16"});
}

// out may not alias x, wholly or in part; the rejected call must not write.
TEST(RopeInvalid, RejectsOutputOverlappingInput) {
  KVLAB_SEEDED_RNG(rng, 1112);
  Tensor buffer = testing::random_normal(rng, DType::f32, {96});  // room for two (2, 3, 8) tensors
  const Tensor before = buffer;
  const Shape shape{2, 3, 8};
  const auto at = [&](std::int64_t element) { return buffer.data() + 4 * element; };
  // (x start, out start) in elements: identical, out inside x, x inside out.
  const std::pair<std::int64_t, std::int64_t> overlaps[] = {{0, 0}, {0, 5}, {5, 0}, {47, 0}};
  for (const auto& [xs, os] : overlaps) {
    const ConstTensorView x{at(xs), DType::f32, shape};
    const TensorView out{{at(os), DType::f32, shape}};
    expect_error([&] { ref::rope(x, params_of(8, false), 1, std::nullopt, out); }, ErrorKind::invalid_argument,
                 {"overlaps"});
  }
  EXPECT_TRUE(testing::bit_equal(buffer, before));
  // Adjacent but disjoint memory is fine.
  const TensorView next{{at(48), DType::f32, shape}};
  EXPECT_NO_THROW(ref::rope(ConstTensorView{at(0), DType::f32, shape}, params_of(8, false), 1, std::nullopt, next));
}

}  // namespace
}  // namespace test_rope
}  // namespace kvlab
