// Unit tests of the reference mask builders (reference/mask.h, docs/kernels.md §Masks and
// docs/kernels.md §Attention).
//
// Expected masks are either written out by hand or derived from counting arguments
// (a windowed query sees exactly min(W, pos+1) keys), never from the builder itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/mask.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_mask {
namespace {

using ref::MaskForm;
using Pads = std::vector<std::int32_t>;

Tensor boolean_mask(std::int64_t n, std::int64_t offset, int window = 0, const Pads& left = {},
                    const Pads& right = {}) {
  return ref::create_causal_mask(n, offset, window, left, right, MaskForm::boolean);
}

// Element (b, i, j) of a mask of shape (N, Lk) or (B, 1, N, Lk), as 0/1 for boolean
// masks or the raw value for additive ones.
double at(const Tensor& m, std::int64_t b, std::int64_t i, std::int64_t j) {
  const std::int64_t n = m.dim(-2), lk = m.dim(-1);
  const std::int64_t flat = (b * n + i) * lk + j;
  return m.dtype() == DType::u8 ? static_cast<double>(m.view().load_int(flat)) : m.view().load(flat);
}

// A (rows × cols) 0/1 picture written as strings, e.g. {"110", "111"}.
void expect_rows(const Tensor& m, std::int64_t b, const std::vector<std::string>& rows) {
  ASSERT_EQ(m.dim(-2), static_cast<std::int64_t>(rows.size()));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(m.dim(-1), static_cast<std::int64_t>(rows[i].size()));
    std::string got;
    for (std::int64_t j = 0; j < m.dim(-1); ++j) got += at(m, b, static_cast<std::int64_t>(i), j) != 0 ? '1' : '0';
    EXPECT_EQ(got, rows[i]) << "batch " << b << " query row " << i;
  }
}

using testing::expect_error;

MaskSpec causal_spec(int window = 0, Pads left = {}, Pads right = {}) {
  MaskSpec s;
  s.kind = MaskKind::causal;
  s.window = window;
  s.left_padding = std::move(left);
  s.right_padding = std::move(right);
  return s;
}

// ---- shapes and hand-written masks -----------------------------------------------

TEST(CausalMask, ShapesAndDtypes) {
  const Tensor plain = boolean_mask(3, 5);
  EXPECT_EQ(plain.shape(), (Shape{3, 8}));
  EXPECT_EQ(plain.dtype(), DType::u8);
  EXPECT_EQ(boolean_mask(4, 0, 0, {1, 0, 2}).shape(), (Shape{3, 1, 4, 4}));
  EXPECT_EQ(boolean_mask(2, 6, 0, {}, {0, 1}).shape(), (Shape{2, 1, 2, 8}));
  EXPECT_EQ(boolean_mask(1, 9, 3, {2}, {1}).shape(), (Shape{1, 1, 1, 10}));
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor add = ref::create_causal_mask(2, 3, 0, Pads{}, Pads{}, MaskForm::additive, t);
    EXPECT_EQ(add.dtype(), t);
    EXPECT_EQ(add.shape(), (Shape{2, 5}));
  }
}

TEST(CausalMask, HandWrittenWithoutOffset) {
  expect_rows(boolean_mask(1, 0), 0, {"1"});
  expect_rows(boolean_mask(3, 0), 0, {"100", "110", "111"});
}

// Queries sit at positions offset..offset+N−1, so with offset 2 the first query
// already sees keys 0..2.
TEST(CausalMask, HandWrittenWithOffset) {
  expect_rows(boolean_mask(3, 2), 0, {"11100", "11110", "11111"});
  expect_rows(boolean_mask(1, 4), 0, {"11111"});  // decode: one query sees everything
}

TEST(CausalMask, HandWrittenWindow) {
  // W = 2: each query sees itself and the key before it.
  expect_rows(boolean_mask(3, 2, 2), 0, {"01100", "00110", "00011"});
  // W = 1: only itself. W larger than the history: plain causal.
  expect_rows(boolean_mask(3, 0, 1), 0, {"100", "010", "001"});
  expect_rows(boolean_mask(3, 1, 9), 0, {"1100", "1110", "1111"});
}

TEST(CausalMask, HandWrittenPadding) {
  // N = 2, offset 1: keys 0..2. Row 0 has one left-padding key; row 1 two right-padding keys.
  const Tensor m = boolean_mask(2, 1, 0, {1, 0}, {0, 2});
  expect_rows(m, 0, {"010", "011"});
  expect_rows(m, 1, {"100", "100"});
  // Left padding together with a window: W = 2 at positions 3, 4 over keys 0..4, left 3.
  const Tensor w = boolean_mask(2, 3, 2, {3});
  expect_rows(w, 0, {"00010", "00011"});
}

// ---- sweeps -------------------------------------------------------------------------

// A windowed query at position p sees exactly min(W, p+1) keys, and they are the
// contiguous run ending at p; W = 0 means unbounded (p+1 keys).
TEST(CausalMask, WindowCountsSweep) {
  for (std::int64_t n = 1; n <= 6; ++n) {
    for (std::int64_t offset = 0; offset <= 7; ++offset) {
      for (int w = 0; w <= 9; ++w) {
        const Tensor m = boolean_mask(n, offset, w);
        ASSERT_EQ(m.shape(), (Shape{n, offset + n}));
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t pos = offset + i;
          const std::int64_t want = w == 0 ? pos + 1 : std::min<std::int64_t>(w, pos + 1);
          std::int64_t count = 0;
          for (std::int64_t j = 0; j < offset + n; ++j) {
            const bool in_run = j <= pos && j > pos - want;
            EXPECT_EQ(at(m, 0, i, j) != 0, in_run) << "N " << n << " offset " << offset << " W " << w << " i " << i
                                                   << " j " << j;
            count += at(m, 0, i, j) != 0 ? 1 : 0;
          }
          EXPECT_EQ(count, want) << "N " << n << " offset " << offset << " W " << w << " i " << i;
        }
      }
    }
  }
}

// Padding only removes keys: the padded mask of row b is the unpadded mask with the
// keys j < left[b] (left padding) or j >= offset+N−right[b] (right padding) cleared.
TEST(CausalMask, PaddingHidesExactlyThePaddedKeys) {
  KVLAB_SEEDED_RNG(rng, 31);
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t n = rng.integer(1, 6), offset = rng.integer(0, 6), lk = offset + n;
    const int w = static_cast<int>(rng.integer(0, 4));
    const auto batch = static_cast<std::size_t>(rng.integer(1, 4));
    Pads left(batch), right(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      left[b] = static_cast<std::int32_t>(rng.integer(0, lk + 1));  // may exceed Lk: row fully hidden
      right[b] = static_cast<std::int32_t>(rng.integer(0, lk + 1));
    }
    const Tensor base = boolean_mask(n, offset, w);
    const Tensor with_left = boolean_mask(n, offset, w, left);
    const Tensor with_right = boolean_mask(n, offset, w, {}, right);
    const Tensor with_both = boolean_mask(n, offset, w, left, right);
    const Shape shape{static_cast<std::int64_t>(batch), 1, n, lk};
    ASSERT_EQ(with_left.shape(), shape);
    ASSERT_EQ(with_right.shape(), shape);
    ASSERT_EQ(with_both.shape(), shape);
    for (std::size_t b = 0; b < batch; ++b) {
      const auto bi = static_cast<std::int64_t>(b);
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < lk; ++j) {
          const bool causal = at(base, 0, i, j) != 0;
          const bool left_ok = j >= left[b], right_ok = j < lk - right[b];
          SCOPED_TRACE(::testing::Message() << "trial " << trial << " b " << b << " i " << i << " j " << j);
          EXPECT_EQ(at(with_left, bi, i, j) != 0, causal && left_ok);
          EXPECT_EQ(at(with_right, bi, i, j) != 0, causal && right_ok);
          EXPECT_EQ(at(with_both, bi, i, j) != 0, causal && left_ok && right_ok);
        }
      }
    }
  }
}

// The additive form is 0 where the boolean form keeps and −inf where it hides, stored
// in the requested dtype (both values are exact in f32, f16 and bf16).
TEST(CausalMask, AdditiveFormMatchesBooleanForm) {
  const struct {
    std::int64_t n, offset;
    int window;
    Pads left, right;
  } cases[] = {{4, 0, 0, {}, {}}, {3, 5, 3, {}, {}}, {2, 4, 0, {1, 0, 3}, {}}, {3, 2, 2, {0, 2}, {1, 0}}};
  for (const auto& c : cases) {
    const Tensor keep = boolean_mask(c.n, c.offset, c.window, c.left, c.right);
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      const Tensor add = ref::create_causal_mask(c.n, c.offset, c.window, c.left, c.right, MaskForm::additive, t);
      ASSERT_EQ(add.shape(), keep.shape());
      ASSERT_EQ(add.dtype(), t);
      for (std::int64_t k = 0; k < keep.numel(); ++k) {
        const float v = add.view().load(k);
        if (keep.view().load_int(k) != 0) {
          EXPECT_EQ(v, 0.0f) << dtype_name(t) << " element " << k;
        } else {
          EXPECT_TRUE(std::isinf(v) && v < 0) << dtype_name(t) << " element " << k << " = " << v;
        }
      }
    }
  }
}

// SDPA's structured causal mask (lower-right aligned, offset = Lk − Lq) and the
// array builder must agree on every (b, i, j).
TEST(CausalVisible, AgreesWithCreateCausalMask) {
  KVLAB_SEEDED_RNG(rng, 47);
  for (std::int64_t lq = 1; lq <= 5; ++lq) {
    for (std::int64_t lk = lq; lk <= lq + 6; ++lk) {
      for (int w : {0, 1, 2, 5}) {
        for (int padding_kind = 0; padding_kind < 4; ++padding_kind) {  // none, left, right, both
          const std::size_t batch = padding_kind == 0 ? 1 : 3;
          Pads left, right;
          for (std::size_t b = 0; b < batch && padding_kind != 0; ++b) {
            if (padding_kind & 1) left.push_back(static_cast<std::int32_t>(rng.integer(0, lk)));
            if (padding_kind & 2) right.push_back(static_cast<std::int32_t>(rng.integer(0, lk)));
          }
          const MaskSpec spec = causal_spec(w, left, right);
          ASSERT_NO_THROW(ref::validate_mask_spec(spec, static_cast<std::int64_t>(batch)));
          const Tensor m = boolean_mask(lq, lk - lq, w, left, right);
          for (std::size_t b = 0; b < batch; ++b) {
            const auto bi = static_cast<std::int64_t>(b);
            for (std::int64_t i = 0; i < lq; ++i) {
              for (std::int64_t j = 0; j < lk; ++j) {
                EXPECT_EQ(ref::causal_visible(spec, bi, i, j, lq, lk), at(m, bi, i, j) != 0)
                    << "Lq " << lq << " Lk " << lk << " W " << w << " pads " << padding_kind << " b " << b << " i "
                    << i << " j " << j;
              }
            }
          }
        }
      }
    }
  }
}

// Lower-right alignment is also defined for Lq > Lk (more queries than keys): the
// first Lq − Lk queries see no key at all, per j <= i + (Lk − Lq).
TEST(CausalVisible, LowerRightAlignmentWithMoreQueriesThanKeys) {
  const MaskSpec spec = causal_spec();
  for (std::int64_t i = 0; i < 5; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(ref::causal_visible(spec, 0, i, j, 5, 3), j <= i - 2) << "i " << i << " j " << j;
    }
  }
}

// ---- validation -------------------------------------------------------------------

TEST(CausalMaskInvalid, CreateRejectsBadArgumentsNamingTheValue) {
  using K = ErrorKind;
  expect_error([] { (void)boolean_mask(0, 0); }, K::invalid_argument, {"N = 0"});
  expect_error([] { (void)boolean_mask(-7, 0); }, K::invalid_argument, {"-7"});
  expect_error([] { (void)boolean_mask(2, -5); }, K::invalid_argument, {"offset -5"});
  expect_error([] { (void)boolean_mask(2, -1); }, K::invalid_argument, {"offset -1"});
  expect_error([] { (void)boolean_mask(2, 0, -9); }, K::invalid_argument, {"window -9"});
  expect_error([] { (void)boolean_mask(2, 0, -1); }, K::invalid_argument, {"window -1"});
  expect_error([] { (void)boolean_mask(2, 0, 0, {-1}); }, K::invalid_argument, {"left_padding[0] = -1 is negative"});
  expect_error([] { (void)boolean_mask(2, 0, 0, {0, -4}); }, K::invalid_argument, {"left_padding[1] = -4"});
  expect_error([] { (void)boolean_mask(2, 0, 0, {}, {-6}); }, K::invalid_argument, {"right_padding[0] = -6 is negative"});
  expect_error([] { (void)boolean_mask(2, 3, 0, {1, 0}, {0, 1, 2}); }, K::shape_mismatch, {"2", "3"});
  expect_error([] { (void)ref::create_causal_mask(2, 0, 0, Pads{}, Pads{}, MaskForm::additive, DType::u8); },
               K::dtype_mismatch, {"u8"});
  expect_error([] { (void)ref::create_causal_mask(2, 0, 0, Pads{}, Pads{}, MaskForm::additive, DType::i32); },
               K::dtype_mismatch, {"i32"});
  // The additive dtype only matters for the additive form.
  EXPECT_NO_THROW((void)ref::create_causal_mask(2, 0, 0, Pads{}, Pads{}, MaskForm::boolean, DType::u8));
}

TEST(CausalMaskInvalid, ValidateMaskSpecRejectsBadSpecsNamingTheValue) {
  using K = ErrorKind;
  expect_error([] { ref::validate_mask_spec(causal_spec(-3), 1); }, K::invalid_argument, {"-3"});
  expect_error([] { ref::validate_mask_spec(causal_spec(0, {2, -8}), 2); }, K::invalid_argument,
               {"left_padding[1] = -8"});
  expect_error([] { ref::validate_mask_spec(causal_spec(0, {}, {-1, 0}), 2); }, K::invalid_argument,
               {"right_padding[0] = -1"});
  expect_error([] { ref::validate_mask_spec(causal_spec(0, {0, 1, 2}), 2); }, K::shape_mismatch,
               {"left_padding", "3", "2"});
  expect_error([] { ref::validate_mask_spec(causal_spec(0, {}, {0}), 4); }, K::shape_mismatch,
               {"right_padding", "1", "4"});
  // Left and right of different lengths: at least one differs from the batch.
  expect_error([] { ref::validate_mask_spec(causal_spec(0, {0, 0}, {0, 0, 0}), 2); }, K::shape_mismatch,
               {"right_padding", "3", "2"});
  for (MaskKind kind : {MaskKind::none, MaskKind::boolean, MaskKind::additive}) {
    MaskSpec windowed;
    windowed.kind = kind;
    windowed.window = 12;
    expect_error([&] { ref::validate_mask_spec(windowed, 1); }, K::invalid_argument, {"12"});
    MaskSpec padded;
    padded.kind = kind;
    padded.left_padding = {1};
    expect_error([&] { ref::validate_mask_spec(padded, 1); }, K::invalid_argument, {"1 left padding"});
    padded.left_padding.clear();
    padded.right_padding = {0, 2};
    expect_error([&] { ref::validate_mask_spec(padded, 2); }, K::invalid_argument, {"2 right padding"});
  }
}

TEST(CausalMaskInvalid, ValidateMaskSpecAcceptsGoodSpecs) {
  EXPECT_NO_THROW(ref::validate_mask_spec(MaskSpec{}, 3));
  EXPECT_NO_THROW(ref::validate_mask_spec(causal_spec(), 3));
  EXPECT_NO_THROW(ref::validate_mask_spec(causal_spec(4, {0, 1, 2}, {2, 0, 0}), 3));
  EXPECT_NO_THROW(ref::validate_mask_spec(causal_spec(0, {}, {5}), 1));
}

}  // namespace
}  // namespace test_mask
}  // namespace kvlab
