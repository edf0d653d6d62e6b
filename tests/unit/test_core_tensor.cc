// Unit tests of the host tensor vocabulary: Tensor, TensorView / ConstTensorView,
// shapes and the require_* guards.
//
// Expected values are computed here from first principles: row-major offsets by hand,
// f16/bf16 storage rounding through the scalar conversions (themselves verified
// exhaustively in test_core_dtype.cc) or from hand-derived ties. Error messages must name
// the offending value (docs/design.md §Errors), so each error test checks the kind and that
// the bad value appears in what().
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "kvlab/tensor.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_core_tensor {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::u32, DType::i32, DType::u8};
constexpr DType kFloatDTypes[] = {DType::f32, DType::f16, DType::bf16};

using testing::error_message;

// Bits of v after storage in dtype t, by the scalar conversions.
std::uint32_t stored_bits(float v, DType t) {
  switch (t) {
    case DType::f16: return f32_to_f16_bits(v);
    case DType::bf16: return f32_to_bf16_bits(v);
    default: return std::bit_cast<std::uint32_t>(v);
  }
}
float stored_value(float v, DType t) {
  switch (t) {
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(v));
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(v));
    default: return v;
  }
}
bool same_float(float a, float b) {  // NaN equals NaN; otherwise bitwise (so -0 != +0)
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// ---- construction ------------------------------------------------------------------------

TEST(TensorCtor, ZeroFilledForEveryDType) {
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(dtype_name(t));
    {  // dirty the heap first, so that recycled memory would show if the ctor skipped zeroing
      std::vector<unsigned char> junk(30 * 4, 0xab);
      EXPECT_EQ(junk[7], 0xab);
    }
    Tensor x(t, {2, 3, 5});
    EXPECT_EQ(x.dtype(), t);
    EXPECT_EQ(x.shape(), (Shape{2, 3, 5}));
    EXPECT_EQ(x.rank(), 3);
    EXPECT_EQ(x.numel(), 30);
    EXPECT_EQ(x.nbytes(), 30 * dtype_size(t));
    EXPECT_EQ(x.dim(0), 2);
    EXPECT_EQ(x.dim(-1), 5);
    for (std::size_t b = 0; b < x.nbytes(); ++b) ASSERT_EQ(std::to_integer<int>(x.data()[b]), 0) << "byte " << b;
    const ConstTensorView v = x.view();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      if (is_float(t)) {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(v.load(i)), 0u);  // +0, not -0
      } else {
        EXPECT_EQ(v.load_int(i), 0);
      }
    }
  }
}

TEST(TensorCtor, RankZeroEmptyAndDefault) {
  const Tensor scalar(DType::f32, {});
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);  // a 0-d tensor holds one element
  EXPECT_EQ(scalar.nbytes(), 4u);
  EXPECT_EQ(scalar.to_f32()(), 0.0f);

  const Tensor empty(DType::f16, {0, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_EQ(empty.to_f32().size(), 0u);

  // A default Tensor must be a consistent f32 scalar: numel() says 1, so one element
  // has to exist (ASan would flag a read past an empty buffer).
  const Tensor dflt;
  EXPECT_EQ(dflt.dtype(), DType::f32);
  EXPECT_EQ(dflt.numel(), 1);
  EXPECT_EQ(dflt.view().load(0), 0.0f);
}

TEST(TensorShape, NegativeDimensionIsAnErrorNamingIt) {
  const std::string msg = error_message([] { Tensor(DType::f32, {2, -3}); }, ErrorKind::invalid_argument);
  EXPECT_THAT(msg, HasSubstr("-3"));
  EXPECT_THAT(msg, HasSubstr("(2, -3)"));
  EXPECT_THAT(error_message([] { shape_numel({-1}); }, ErrorKind::invalid_argument), HasSubstr("-1"));
}

TEST(TensorShape, NumelOverflowIsAnErrorNotAWrap) {
  // 2^32 · 2^32 wraps to 0 in int64; a wrapped numel would allocate nothing and every
  // later index would be out of bounds.
  const std::int64_t big = std::int64_t{1} << 32;
  EXPECT_THAT(error_message([&] { shape_numel({big, big}); }, ErrorKind::invalid_argument),
              HasSubstr(shape_str({big, big})));
  error_message([&] { Tensor(DType::u8, {big, big, 2}); }, ErrorKind::invalid_argument);
  EXPECT_EQ(shape_numel({std::numeric_limits<std::int64_t>::max(), 1}), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(shape_numel({big, 0, big, big}), 0);  // a zero extent anywhere cannot overflow
  // ...but an owning tensor's strides are products of trailing extents, zero or not.
  EXPECT_THAT(error_message([&] { Tensor(DType::u8, {0, big, big}); }, ErrorKind::invalid_argument),
              HasSubstr("strides"));
  EXPECT_EQ(Tensor(DType::u8, {big, 0, 4}).numel(), 0);
}

TEST(TensorShape, LastAxisEditsKeepTheLeadingAxesAndRefuseRankZero) {
  EXPECT_EQ(shape_leading({2, 8, 128}), (Shape{2, 8}));
  EXPECT_EQ(shape_with_last({2, 8, 128}, 16), (Shape{2, 8, 16}));
  EXPECT_EQ(shape_appended({2, 8}, 4), (Shape{2, 8, 4}));
  EXPECT_EQ(shape_appended({}, 4), (Shape{4}));
  // A rank-0 shape has no last axis: an error, never a read before the vector's start.
  EXPECT_THAT(error_message([] { shape_leading({}); }, ErrorKind::invalid_argument), HasSubstr("rank-0"));
  EXPECT_THAT(error_message([] { shape_with_last({}, 3); }, ErrorKind::invalid_argument), HasSubstr("rank-0"));
}

TEST(TensorShape, NumelIsTheProduct) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({7}), 7);
  EXPECT_EQ(shape_numel({2, 8, 128}), 2 * 8 * 128);
  EXPECT_EQ(shape_numel({3, 0, 5}), 0);
}

// Python's tuple notation, as the error messages and reports print shapes.
TEST(TensorShape, ShapeStrFormats) {
  EXPECT_EQ(shape_str({}), "()");
  EXPECT_EQ(shape_str({5}), "(5,)");
  EXPECT_EQ(shape_str({2, 8, 128}), "(2, 8, 128)");
  EXPECT_EQ(shape_str({0, 3}), "(0, 3)");
  EXPECT_EQ(shape_str({-1, 2}), "(-1, 2)");
}

TEST(TensorShape, RowMajorIndexMatchesHandFormula) {
  const Shape s{3, 4, 5};
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 4; ++j) {
      for (std::int64_t k = 0; k < 5; ++k) EXPECT_EQ(row_major_index(s, {i, j, k}), (i * 4 + j) * 5 + k);
    }
  }
  EXPECT_THAT(error_message([&] { row_major_index(s, {1, 2}); }, ErrorKind::internal), HasSubstr("(3, 4, 5)"));
}

// Tensor::dim with an axis outside [-rank, rank) is invalid input: docs/design.md §Errors requires
// a kvlab::Error naming it. (Currently std::vector::at throws std::out_of_range instead.)
TEST(TensorShape, DimWithBadAxisIsAKvlabError) {
  const Tensor x(DType::f32, {2, 3});
  EXPECT_THAT(error_message([&] { (void)x.dim(2); }, ErrorKind::invalid_argument), HasSubstr("2"));
  EXPECT_THAT(error_message([&] { (void)x.dim(-3); }, ErrorKind::invalid_argument), HasSubstr("-3"));
}

// ---- values in and out -------------------------------------------------------------------

// Values that exercise every storage path: ordinary, -0, f16-subnormal, f16-overflow,
// bf16 ties, inf, NaN, plus seeded random values over a wide range.
std::vector<float> interesting_values(testing::SeededRng& rng, std::size_t n) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 1e-6f, 70000.0f, 1.0f + std::ldexp(1.0f, -8),
                          1.0f + std::ldexp(1.0f, -11), INFINITY, -INFINITY, NAN, 3.4e38f};
  while (v.size() < n) v.push_back(static_cast<float>(rng.normal() * std::exp2(rng.uniform(-20.0, 20.0))));
  return v;
}

TEST(TensorValues, FromValuesToF32RoundTripsPerDType) {
  KVLAB_SEEDED_RNG(rng, 7001);
  const std::vector<float> vals = interesting_values(rng, 4 * 6);
  for (DType t : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = Tensor::from_values(t, {4, 6}, vals);
    EXPECT_EQ(x.shape(), (Shape{4, 6}));
    const xt::xarray<float> back = x.to_f32();
    ASSERT_EQ(back.dimension(), 2u);
    EXPECT_EQ(back.shape()[0], 4u);
    EXPECT_EQ(back.shape()[1], 6u);
    for (std::size_t i = 0; i < vals.size(); ++i) {
      const float want = stored_value(vals[i], t);
      const float got = back(i / 6, i % 6);
      EXPECT_TRUE(same_float(got, want)) << "element " << i << ": " << got << " vs " << want;
      // the storage really holds the narrowed pattern, in row-major order
      const std::uint32_t bits = t == DType::f32 ? std::bit_cast<std::uint32_t>(x.storage<float>().data()[i])
                                                 : x.storage<std::uint16_t>().data()[i];
      if (!std::isnan(vals[i])) {
        EXPECT_EQ(bits, stored_bits(vals[i], t)) << "element " << i;
      }
    }
    // from_f32 is the xtensor spelling of the same thing
    xt::xarray<float> xs = xt::zeros<float>({std::size_t{4}, std::size_t{6}});
    std::copy(vals.begin(), vals.end(), xs.begin());
    EXPECT_TRUE(testing::bit_equal(Tensor::from_f32(xs, t), x));
  }
}

TEST(TensorValues, FromValuesWithWrongCountIsAnErrorNamingBoth) {
  const std::vector<float> five(5, 1.0f);
  const std::string msg = error_message([&] { Tensor::from_values(DType::f32, {2, 3}, five); },
                                        ErrorKind::shape_mismatch);
  EXPECT_THAT(msg, HasSubstr("5"));
  EXPECT_THAT(msg, HasSubstr("(2, 3)"));
  const std::vector<std::int64_t> seven(7, 1);
  EXPECT_THAT(error_message([&] { Tensor::from_ints(DType::u8, {2, 3}, seven); }, ErrorKind::shape_mismatch),
              HasSubstr("7"));
}

// Float entry points reject integer tensors and vice versa, naming the dtype.
TEST(TensorValues, FloatAndIntegerAccessorsRejectTheOtherKind) {
  const std::vector<float> one{1.0f};
  EXPECT_THAT(error_message([&] { Tensor::from_values(DType::u32, {1}, one); }, ErrorKind::dtype_mismatch),
              HasSubstr("u32"));
  EXPECT_THAT(error_message([&] { Tensor::from_f32(xt::xarray<float>{1.0f}, DType::i32); }, ErrorKind::dtype_mismatch),
              HasSubstr("i32"));
  Tensor ints(DType::u8, {2});
  Tensor floats(DType::bf16, {2});
  EXPECT_THAT(error_message([&] { (void)ints.to_f32(); }, ErrorKind::dtype_mismatch), HasSubstr("u8"));
  EXPECT_THAT(error_message([&] { (void)floats.to_ints(); }, ErrorKind::dtype_mismatch), HasSubstr("bf16"));
  EXPECT_THAT(error_message([&] { (void)ints.view().load(0); }, ErrorKind::dtype_mismatch), HasSubstr("u8"));
  EXPECT_THAT(error_message([&] { ints.view().store(0, 1.0f); }, ErrorKind::dtype_mismatch), HasSubstr("u8"));
  EXPECT_THAT(error_message([&] { (void)floats.view().load_int(0); }, ErrorKind::dtype_mismatch), HasSubstr("bf16"));
  EXPECT_THAT(error_message([&] { floats.view().store_int(0, 1); }, ErrorKind::dtype_mismatch), HasSubstr("bf16"));
}

TEST(TensorInts, FromIntsToIntsRoundTripsAtTheTypeLimits) {
  const std::vector<std::int64_t> u32{0, 1, 0x7fffffff, 0x80000000LL, 0xffffffffLL, 123456789};
  const std::vector<std::int64_t> i32{std::numeric_limits<std::int32_t>::min(), -1, 0, 1,
                                      std::numeric_limits<std::int32_t>::max(), -123456789};
  const std::vector<std::int64_t> u8{0, 1, 127, 128, 254, 255};
  const std::pair<DType, const std::vector<std::int64_t>*> cases[] = {
      {DType::u32, &u32}, {DType::i32, &i32}, {DType::u8, &u8}};
  for (const auto& [t, vals] : cases) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = Tensor::from_ints(t, {2, 3}, *vals);
    EXPECT_EQ(x.nbytes(), 6 * dtype_size(t));
    EXPECT_EQ(x.to_ints(), *vals);
    for (std::size_t i = 0; i < 6; ++i) {  // typed storage holds the same values
      const std::int64_t s = t == DType::u32   ? std::int64_t{x.storage<std::uint32_t>().data()[i]}
                             : t == DType::i32 ? std::int64_t{x.storage<std::int32_t>().data()[i]}
                                               : std::int64_t{x.storage<std::uint8_t>().data()[i]};
      EXPECT_EQ(s, (*vals)[i]) << "element " << i;
    }
  }
}

// docs/design.md §Errors: never a silent clamp of user input. from_ints takes int64 values; one
// that does not fit the target dtype must be rejected, not wrapped (300 -> 44 in u8,
// -1 -> 4294967295 in u32).
TEST(TensorInts, FromIntsOutOfRangeIsAnErrorNamingTheValue) {
  const std::pair<DType, std::int64_t> cases[] = {{DType::u8, 300},
                                                  {DType::u8, -1},
                                                  {DType::u32, -1},
                                                  {DType::u32, std::int64_t{1} << 32},
                                                  {DType::i32, std::int64_t{1} << 31},
                                                  {DType::i32, -(std::int64_t{1} << 31) - 1}};
  for (const auto& [t, v] : cases) {
    SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(v));
    const std::vector<std::int64_t> vals{0, v};
    EXPECT_THAT(error_message([&, t = t] { Tensor::from_ints(t, {2}, vals); }, ErrorKind::invalid_argument),
                HasSubstr(std::to_string(v)));
  }
}

// ---- views -------------------------------------------------------------------------------

TEST(TensorView, StoreRoundsToNearestEvenAndLoadIsExact) {
  const float one = 1.0f;
  struct Case {
    DType t;
    float in, want;  // want derived by hand from the format's ulp at `in`
  };
  const Case cases[] = {
      {DType::f16, one + std::ldexp(1.0f, -11), one},                            // tie -> even (down)
      {DType::f16, one + std::ldexp(3.0f, -11), one + std::ldexp(1.0f, -9)},      // tie -> even (up)
      {DType::f16, one + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), one + std::ldexp(1.0f, -10)},
      {DType::f16, 65520.0f, INFINITY},                                          // overflow tie -> inf
      {DType::f16, std::ldexp(1.0f, -25), 0.0f},                                 // subnormal tie -> 0
      {DType::f16, -std::ldexp(3.0f, -25), -std::ldexp(1.0f, -23)},
      {DType::bf16, one + std::ldexp(1.0f, -8), one},
      {DType::bf16, one + std::ldexp(3.0f, -8), one + std::ldexp(1.0f, -6)},
      {DType::bf16, 3.4e38f, INFINITY},
      {DType::bf16, -3.0e38f, -std::ldexp(226.0f, 120)},  // 3e38/2^127 = 1.7632 -> 225.69/128 -> 226/128
      {DType::f32, std::ldexp(1.0f, -149), std::ldexp(1.0f, -149)},
  };
  for (const Case& c : cases) {
    Tensor x(c.t, {1});
    x.view().store(0, c.in);
    EXPECT_TRUE(same_float(x.view().load(0), c.want)) << dtype_name(c.t) << " store(" << c.in << ") loaded "
                                                      << x.view().load(0) << ", want " << c.want;
  }
  // f32 storage keeps every bit, NaN payload and sign included
  Tensor f(DType::f32, {1});
  const float payload_nan = std::bit_cast<float>(0xffa12345u);
  f.view().store(0, payload_nan);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(f.view().load(0)), 0xffa12345u);
}

TEST(TensorView, ViewsAliasTheTensorStorage) {
  Tensor x(DType::i32, {2, 4});
  const TensorView v = x.view();
  const ConstTensorView c = v;  // the implicit conversion keeps data, dtype, shape
  EXPECT_EQ(v.data, x.data());
  EXPECT_EQ(c.data, x.data());
  EXPECT_EQ(c.dtype, DType::i32);
  EXPECT_EQ(c.shape, (Shape{2, 4}));
  EXPECT_EQ(c.numel(), 8);
  EXPECT_EQ(c.nbytes(), 32u);
  EXPECT_EQ(c.rank(), 2);
  EXPECT_EQ(c.dim(-1), 4);
  // a const view only hands out pointers to const (as<int32_t>() does not compile on it)
  EXPECT_EQ(static_cast<const void*>(c.as<const std::int32_t>()), static_cast<const void*>(x.data()));
  EXPECT_EQ(static_cast<void*>(v.as<std::int32_t>()), static_cast<void*>(x.data()));
  v.store_int(5, -42);
  EXPECT_EQ(c.load_int(5), -42);
  EXPECT_EQ(x.to_ints()[5], -42);
  EXPECT_EQ(x.storage<std::int32_t>()(1, 1), -42);  // flat 5 = (1, 1) in a 2x4 row-major
}

// ---- slice -------------------------------------------------------------------------------

// A tensor whose every element is distinct and exact in the dtype (integers < 256 are
// exact in bf16), so a misplaced copy cannot go unnoticed.
Tensor iota(DType t, const Shape& s) {
  Tensor x(t, s);
  const TensorView v = x.view();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (is_float(t)) {
      v.store(i, static_cast<float>(i + 1));
    } else {
      v.store_int(i, i + 1);
    }
  }
  return x;
}

double element(const ConstTensorView& v, std::int64_t i) {
  return is_float(v.dtype) ? static_cast<double>(v.load(i)) : static_cast<double>(v.load_int(i));
}

// An empty range is valid and gives a tensor with a zero extent. Slicing copies rows with
// memcpy into the new tensor, whose data() is null when it holds no elements; memcpy with
// a null pointer is UB even for 0 bytes (UBSan's nonnull-attribute check aborts here).
TEST(TensorSlice, EmptyRangeGivesAZeroExtent) {
  const Tensor x = Tensor::from_values(DType::f32, {3, 4}, std::vector<float>(12, 1.0f));
  EXPECT_EQ(x.slice(1, 2, 2).shape(), (Shape{3, 0}));
  EXPECT_EQ(x.slice(0, 3, 3).shape(), (Shape{0, 4}));
  EXPECT_EQ(x.slice(-1, 0, 0).numel(), 0);
  EXPECT_EQ(Tensor(DType::u8, {0, 4}).slice(1, 1, 3).shape(), (Shape{0, 2}));
}

// For every axis (named positively and negatively) and every 0 <= b < e <= extent, the
// slice equals the elements extracted by hand: out[i0..] = in[i0.., axis index + b, ..].
// (Empty ranges are the test above, so that one defect fails one test.)
TEST(TensorSlice, EqualsManualExtractionAlongEveryAxis) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::u8, DType::i32}) {
    for (const Shape& shape : {Shape{3, 4, 5}, Shape{7}, Shape{2, 1, 3, 2}}) {
      const Tensor x = iota(t, shape);
      const int rank = x.rank();
      for (int axis = 0; axis < rank; ++axis) {
        const auto ax = static_cast<std::size_t>(axis);
        for (std::int64_t b = 0; b <= shape[ax]; ++b) {
          for (std::int64_t e = b + 1; e <= shape[ax]; ++e) {
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << shape_str(shape) << " axis " << axis << " ["
                                              << b << ", " << e << ")");
            const Tensor s = x.slice(axis, b, e);
            Shape want_shape = shape;
            want_shape[ax] = e - b;
            ASSERT_EQ(s.shape(), want_shape);
            ASSERT_EQ(s.dtype(), t);
            EXPECT_TRUE(testing::bit_equal(x.slice(axis - rank, b, e), s)) << "negative axis differs";
            // walk every output element by its multi-index
            for (std::int64_t o = 0; o < s.numel(); ++o) {
              std::int64_t rest = o, src = 0, stride = 1;
              for (std::size_t d = shape.size(); d-- > 0;) {
                const std::int64_t coord = rest % want_shape[d] + (d == ax ? b : 0);
                rest /= want_shape[d];
                src += coord * stride;
                stride *= shape[d];
              }
              ASSERT_EQ(element(s.view(), o), element(x.view(), src)) << "output element " << o;
            }
          }
        }
      }
    }
  }
}

TEST(TensorSlice, BadRangeOrAxisIsAnErrorNamingIt) {
  const Tensor x(DType::f16, {3, 4});
  const auto msg = [&](int axis, std::int64_t b, std::int64_t e) {
    return error_message([&] { (void)x.slice(axis, b, e); }, ErrorKind::invalid_argument);
  };
  EXPECT_THAT(msg(1, 2, 5), HasSubstr("[2, 5)"));  // end past the extent
  EXPECT_THAT(msg(1, 2, 5), HasSubstr("4"));       // ...and the extent it exceeds
  EXPECT_THAT(msg(0, -1, 2), HasSubstr("[-1, 2)"));
  EXPECT_THAT(msg(0, 2, 1), HasSubstr("[2, 1)"));  // reversed
  EXPECT_THAT(msg(-1, 0, 9), HasSubstr("[0, 9)"));
  EXPECT_THAT(msg(2, 0, 1), MatchesRegex(".*axis 2\\b.*"));
  EXPECT_THAT(msg(-3, 0, 1), MatchesRegex(".*axis -3\\b.*"));
  EXPECT_THAT(error_message([] { (void)Tensor(DType::f32, {}).slice(0, 0, 1); }, ErrorKind::invalid_argument),
              HasSubstr("rank 0"));
}

// ---- deferred tensors ----------------------------------------------------------------------

// Bytes held elsewhere, counting what is read (a deferred tensor reads nothing until asked).
class CountingBytes final : public TensorBytes {
 public:
  explicit CountingBytes(const Tensor& source) : source_(source) {}
  void read(std::uint64_t offset, void* dst, std::size_t size) const override {
    ASSERT_LE(offset + size, source_.nbytes());
    std::memcpy(dst, source_.data() + offset, size);
    read_ += size;
  }
  std::uint64_t read_total() const { return read_; }

 private:
  Tensor source_;
  mutable std::uint64_t read_ = 0;
};

// A slice of a deferred tensor is deferred, reads nothing, and holds the same bytes as
// the slice of the tensor in memory, along every axis and range (the mlx-lm reader keeps
// live rows this way: a slice of axis 2 of (B, H, L, W)).
TEST(TensorDeferred, SlicesAreDeferredAndReadTheSameBytes) {
  for (DType t : {DType::f32, DType::f16, DType::u8}) {
    for (const Shape& shape : {Shape{3, 4, 5}, Shape{2, 1, 3, 2}, Shape{7}}) {
      const Tensor x = iota(t, shape);
      const auto bytes = std::make_shared<CountingBytes>(x);
      const Tensor d = Tensor::deferred(t, shape, bytes);
      EXPECT_TRUE(testing::bit_equal(d.materialize(), x));
      for (int axis = 0; axis < x.rank(); ++axis) {
        const std::int64_t extent = shape[static_cast<std::size_t>(axis)];
        for (std::int64_t b = 0; b < extent; ++b) {
          for (std::int64_t e = b + 1; e <= extent; ++e) {
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << shape_str(shape) << " axis " << axis << " [" << b
                                              << ", " << e << ")");
            const std::uint64_t before = bytes->read_total();
            const Tensor s = d.slice(axis, b, e);
            ASSERT_TRUE(s.is_deferred());
            EXPECT_EQ(bytes->read_total(), before);
            EXPECT_TRUE(testing::bit_equal(s.materialize(), x.slice(axis, b, e)));
            // A range starting inside the slice crosses its runs correctly.
            if (s.nbytes() > 3) {
              std::vector<std::byte> part(s.nbytes() - 3), want(s.nbytes() - 3);
              s.read_bytes(3, part.data(), part.size());
              std::memcpy(want.data(), x.slice(axis, b, e).data() + 3, want.size());
              EXPECT_EQ(part, want);
            }
          }
        }
      }
    }
  }
}

// Its bytes are not in memory: every raw access is Error{misuse}, copies still work.
TEST(TensorDeferred, RawAccessIsMisuseAndCopiesRead) {
  const Tensor x = iota(DType::i32, {2, 3});
  const Tensor d = Tensor::deferred(DType::i32, {2, 3}, std::make_shared<CountingBytes>(x));
  EXPECT_THAT(error_message([&] { (void)d.data(); }, ErrorKind::misuse), HasSubstr("deferred"));
  EXPECT_THAT(error_message([&] { (void)d.view(); }, ErrorKind::misuse), HasSubstr("(2, 3)"));
  EXPECT_THAT(error_message([&] { (void)d.storage<std::int32_t>(); }, ErrorKind::misuse), HasSubstr("deferred"));
  EXPECT_EQ(d.to_ints(), x.to_ints());
  std::byte one[4];
  EXPECT_THAT(error_message([&] { d.read_bytes(21, one, 4); }, ErrorKind::invalid_argument), HasSubstr("24-byte"));
  EXPECT_THAT(error_message([] { (void)Tensor::deferred(DType::f32, {1}, nullptr); }, ErrorKind::invalid_argument),
              HasSubstr("source"));
}

// ---- require_* ---------------------------------------------------------------------------

TEST(TensorRequire, ShapeMessageNamesWhatAndBothShapes) {
  const Tensor x(DType::f32, {2, 3});
  EXPECT_NO_THROW(require_shape(x.view(), {2, 3}, "keys"));
  const std::string m = error_message([&] { require_shape(x.view(), {3, 2}, "keys"); }, ErrorKind::shape_mismatch);
  EXPECT_THAT(m, HasSubstr("keys"));
  EXPECT_THAT(m, HasSubstr("(2, 3)"));
  EXPECT_THAT(m, HasSubstr("(3, 2)"));
}

TEST(TensorRequire, DTypeMessageNamesWhatAndBothDTypes) {
  const Tensor x(DType::bf16, {2});
  EXPECT_NO_THROW(require_dtype(x.view(), DType::bf16, "scales"));
  const std::string m =
      error_message([&] { require_dtype(x.view(), DType::u32, "scales"); }, ErrorKind::dtype_mismatch);
  EXPECT_THAT(m, HasSubstr("scales"));
  EXPECT_THAT(m, HasSubstr("bf16"));
  EXPECT_THAT(m, HasSubstr("u32"));
}

TEST(TensorRequire, RankAndFloatMessagesNameTheValues) {
  const Tensor x(DType::u8, {7});
  EXPECT_NO_THROW(require_rank(x.view(), 1, "mask"));
  const std::string m = error_message([&] { require_rank(x.view(), 3, "mask"); }, ErrorKind::shape_mismatch);
  EXPECT_THAT(m, HasSubstr("mask"));
  EXPECT_THAT(m, MatchesRegex(".*\\b1\\b.*"));  // actual rank (shape (7,) has no 1 or 3 in it)
  EXPECT_THAT(m, MatchesRegex(".*\\b3\\b.*"));  // expected rank
  for (DType t : kFloatDTypes) EXPECT_NO_THROW(require_float(Tensor(t, {1}).view(), "q"));
  EXPECT_THAT(error_message([&] { require_float(x.view(), "q"); }, ErrorKind::dtype_mismatch), HasSubstr("u8"));
}

}  // namespace
}  // namespace test_core_tensor
}  // namespace kvlab
