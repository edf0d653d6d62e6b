// Helpers shared by the batch-cache properties (batch_properties.cc,
// batch_rotating_prefix.cc): deterministic (B, H, S, D) blocks whose row b, column s
// holds content(row id, token index) or a padding value, and chunk splitting.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "property_tests/prop_model.h"

namespace kvlab::prop::batch {

constexpr float kPadValue = 7.5f;  // finite and far from content's [-1, 1): visible if ever attended

// (B, heads, S, D) f32: row b, column j holds content(s, rowid[b], tok(b, j), h, d), or
// kPadValue where tok(b, j) < 0 (padding).
template <class F>
Tensor block(Stream s, const std::vector<std::int64_t>& rowid, std::int64_t cols, std::int64_t heads,
             std::int64_t dim, F tok) {
  const auto rows = static_cast<std::int64_t>(rowid.size());
  Tensor t(DType::f32, {rows, heads, cols, dim});
  const TensorView v = t.view();
  for (std::int64_t b = 0; b < rows; ++b)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t p = tok(b, j);
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < dim; ++d)
          v.store(((b * heads + h) * cols + j) * dim + d,
                  p < 0 ? kPadValue : content(s, rowid[static_cast<std::size_t>(b)], p, h, d));
    }
  return t;
}

// Tokens [p0, p0 + n) of one row: (1, heads, n, dim).
inline Tensor row_block(Stream s, std::int64_t rowid, std::int64_t p0, std::int64_t n, std::int64_t heads,
                        std::int64_t dim) {
  return block(s, {rowid}, n, heads, dim, [p0](std::int64_t, std::int64_t j) { return p0 + j; });
}

inline void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::string d = first_difference(a, b);
  if (!d.empty()) RC_FAIL(what + ": " + d);
}

// Chunk lengths (1..8) summing to exactly `total`.
inline std::vector<std::int64_t> gen_split(std::int64_t total) {
  std::vector<std::int64_t> out;
  while (total > 0) {
    const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(total, 8) + 1);
    out.push_back(n);
    total -= n;
  }
  return out;
}

}  // namespace kvlab::prop::batch
