#include "harness/value_families.h"

#include <cmath>
#include <limits>

#include "harness/rng.h"
#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

double largest_finite(DType t) {
  switch (t) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 0x1.fep127;
    default: return std::numeric_limits<float>::max();
  }
}

double smallest_normal(DType t) {
  switch (t) {
    case DType::f16: return 0x1p-14;
    default: return 0x1p-126;  // f32 and bf16 share f32's exponent range
  }
}

}  // namespace

const std::vector<std::string>& value_family_names() {
  static const std::vector<std::string> names{"normal", "grid",  "uniform",  "huge",  "tiny",
                                              "constant", "negative", "positive", "zeros", "nonfinite"};
  return names;
}

Tensor value_family_fill(const Problem& p, std::string_view name, DType dtype, Shape shape, std::string_view family,
                         double stddev) {
  KVLAB_REQUIRE(is_float(dtype), invalid_argument, "value family '", family, "' needs a float dtype, not ",
                dtype_name(dtype));
  Tensor x(dtype, std::move(shape));
  const CounterRng rng(p.line(), name);
  const TensorView v = x.view();
  for (std::int64_t i = 0, elements = x.numel(); i < elements; ++i) {
    const auto u = static_cast<std::uint64_t>(i);
    const double n = rng.normal(u);
    double value = 0;
    if (family == "normal") value = n * stddev;
    else if (family == "grid") value = static_cast<double>(static_cast<std::int64_t>(rng.bits(u) % 33) - 16) / 4.0;
    else if (family == "uniform") value = 2.0 * rng.uniform(u) - 1.0;
    else if (family == "huge") value = n * largest_finite(dtype) / 16.0;
    else if (family == "tiny") value = n * 4.0 * smallest_normal(dtype);
    else if (family == "constant") value = 0.3;
    else if (family == "negative") value = -std::abs(n);
    else if (family == "positive") value = std::abs(n) + 0.1;
    else if (family == "zeros") value = rng.uniform(u) < 0.7 ? 0.0 : n;
    else if (family == "nonfinite") {
      value = i % 37 == 5 ? INFINITY : i % 41 == 7 ? -INFINITY : i % 43 == 11 ? NAN : n;
    } else {
      fail(ErrorKind::invalid_argument, cat("unknown value family '", family, "'"));
    }
    // huge·N(0,1) can pass max(T) in the tails: clamp to stay finite (the family's point).
    if (family == "huge") value = std::clamp(value, -largest_finite(dtype), largest_finite(dtype));
    v.store(i, static_cast<float>(value));
  }
  return x;
}

}  // namespace kvlab::harness
