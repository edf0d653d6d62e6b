// Helpers shared by the unit tests: seeded random tensors whose seed is printed, and
// comparisons that report where two tensors differ.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "kvlab/tensor.h"

namespace kvlab::testing {

// True in a build with AddressSanitizer (the asan preset). GCC defines
// __SANITIZE_ADDRESS__; clang 14 only answers __has_feature (docs/toolchain.md §Sanitizers). Tests
// whose whole matrix runs in the optimized ci build use it to run a smaller sample, or a
// diagonal of the matrix that still visits every value of every axis, under ASan.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// A seeded generator. The seed is printed on construction and attached to every
// failure of the enclosing scope, so any random test can be replayed.
// Usage: KVLAB_SEEDED_RNG(rng, 1234);
class SeededRng {
 public:
  explicit SeededRng(std::uint64_t seed) : seed_(seed), engine_(seed) {
    std::cout << "[ seed     ] " << seed << "\n";
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
  }
  std::uint64_t seed() const { return seed_; }
  std::mt19937_64& engine() { return engine_; }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(engine_); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
  }

 private:
  std::uint64_t seed_;
  std::mt19937_64 engine_;
};

#define KVLAB_SEEDED_RNG(name, seed)        \
  ::kvlab::testing::SeededRng name(seed);   \
  SCOPED_TRACE(::testing::Message() << "seed " << (seed))

inline Tensor random_normal(SeededRng& rng, DType dtype, Shape shape, double stddev = 1.0) {
  Tensor t(dtype, std::move(shape));
  const TensorView v = t.view();
  for (std::int64_t i = 0; i < t.numel(); ++i) v.store(i, static_cast<float>(stddev * rng.normal()));
  return t;
}

inline Tensor random_uniform(SeededRng& rng, DType dtype, Shape shape, double lo, double hi) {
  Tensor t(dtype, std::move(shape));
  const TensorView v = t.view();
  for (std::int64_t i = 0; i < t.numel(); ++i) v.store(i, static_cast<float>(rng.uniform(lo, hi)));
  return t;
}

struct Difference {
  double max_abs = 0;
  std::int64_t worst_index = -1;
  double a = 0, b = 0;  // values at the worst index
};

// Element-wise comparison of two float tensors of equal shape. NaN anywhere counts as
// an infinite difference.
inline Difference compare(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  Difference d;
  if (a.shape() != b.shape()) return d;
  const ConstTensorView va = a.view(), vb = b.view();
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = va.load(i), y = vb.load(i);
    const double diff = (std::isnan(x) || std::isnan(y)) ? INFINITY : std::abs(x - y);
    if (diff > d.max_abs || d.worst_index < 0) d = {diff, i, x, y};
  }
  return d;
}

inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double atol) {
  const Difference d = compare(a, b);
  if (d.max_abs <= atol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a-b| = " << d.max_abs << " > " << atol << " at flat index "
                                       << d.worst_index << " (a = " << d.a << ", b = " << d.b << ")";
}

inline ::testing::AssertionResult bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return ::testing::AssertionFailure() << "dtype/shape differ: " << dtype_name(a.dtype()) << shape_str(a.shape())
                                         << " vs " << dtype_name(b.dtype()) << shape_str(b.shape());
  }
  const auto* pa = a.data();
  const auto* pb = b.data();
  for (std::size_t i = 0; i < a.nbytes(); ++i) {
    if (pa[i] != pb[i]) return ::testing::AssertionFailure() << "first differing byte at " << i;
  }
  return ::testing::AssertionSuccess();
}

// Runs `call`, expecting a kvlab::Error of `kind`; returns its message (empty, with a
// test failure, when nothing or something else was thrown).
inline std::string error_message(const std::function<void()>& call, ErrorKind kind) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-kvlab exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no kvlab::Error was thrown";
  return {};
}

// As error_message(), and the message must contain every needle (the bad value).
inline void expect_error(const std::function<void()>& call, ErrorKind kind, const std::vector<std::string>& needles) {
  const std::string message = error_message(call, kind);
  for (const auto& n : needles) {
    EXPECT_NE(message.find(n), std::string::npos) << "message '" << message << "' does not name '" << n << "'";
  }
}

}  // namespace kvlab::testing

// Statement form: EXPECT_KVLAB_ERROR(call(bad), invalid_argument, "bad value").
#define EXPECT_KVLAB_ERROR(statement, error_kind, needle) \
  ::kvlab::testing::expect_error([&] { statement; }, ::kvlab::ErrorKind::error_kind, {needle})
