// Named families of input values for the quantization ops: the grid over which kvlab's
// flavours are compared bit for bit with a real engine (each family aims at one branch
// of a quantizer: a group's range, its sign, its scale's exponent, its ties).
//   normal    N(0, stddev²)
//   grid      k/4, k in [-16, 16]: group extremes and codes on exact half-step ties
//   uniform   U(-1, 1)
//   huge      N(0, 1) · max(T)/16: scales near the top of T's range, still finite
//   tiny      N(0, 1) · 4·min_normal(T): subnormal values and scales
//   constant  one value per tensor (0.3): zero-range groups
//   negative  −|N(0, 1)| and positive |N(0, 1)| + 0.1: one-signed groups
//   zeros     N(0, 1) with ~70 % exact zeros
//   nonfinite N(0, 1) with +inf, −inf and NaN sprinkled (every 37th, 41st, 43rd element)
// Values are generated in f64 and rounded once to T, keyed by the problem line and the
// tensor name like every harness fill.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "harness/problem.h"
#include "kvlab/tensor.h"

namespace kvlab::harness {

const std::vector<std::string>& value_family_names();  // "normal" first
Tensor value_family_fill(const Problem& p, std::string_view name, DType dtype, Shape shape, std::string_view family,
                         double stddev = 1.0);

}  // namespace kvlab::harness
