// Helpers for cache tests: token-id tensors whose values reveal where each row came
// from, and readers that turn fetched K/V back into token ids.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "kvlab/backend.h"
#include "kvlab/tensor.h"
#include "tests/unit/test_util.h"

namespace kvlab::testing {

// A (B, H, S, D) f32 tensor in which row (b, h, s) holds token id tokens[b][s] in every
// feature d, offset by h/1000 + d/1e6 so heads and features stay distinguishable.
inline DTensor token_block(Backend& be, const std::vector<std::vector<float>>& tokens, std::int64_t heads,
                           std::int64_t dim, DType dtype = DType::f32) {
  const auto b_count = static_cast<std::int64_t>(tokens.size());
  const auto s_count = static_cast<std::int64_t>(tokens.at(0).size());
  Tensor t(dtype, {b_count, heads, s_count, dim});
  const TensorView v = t.view();
  for (std::int64_t b = 0; b < b_count; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < s_count; ++s)
        for (std::int64_t d = 0; d < dim; ++d)
          v.store(((b * heads + h) * s_count + s) * dim + d,
                  tokens[static_cast<std::size_t>(b)][static_cast<std::size_t>(s)] +
                      (dtype == DType::f32 ? static_cast<float>(h) / 1000.0f + static_cast<float>(d) / 1e6f : 0.0f));
  return be.upload(t);
}

// The ids first, first + 1, ..., first + n - 1: a run of tokens for token_block.
inline std::vector<float> range_ids(float first, std::int64_t n) {
  std::vector<float> ids;
  for (std::int64_t i = 0; i < n; ++i) ids.push_back(first + static_cast<float>(i));
  return ids;
}

// Token ids of batch row b, head 0, feature 0 of a fetched (B, H, L, D) block.
inline std::vector<float> token_ids(Backend& be, const DTensor& block, std::int64_t b = 0) {
  const Tensor t = be.download(block);
  const std::int64_t heads = t.dim(1), len = t.dim(2), dim = t.dim(3);
  std::vector<float> ids;
  for (std::int64_t s = 0; s < len; ++s) ids.push_back(t.view().load(((b * heads) * len + s) * dim));
  return ids;
}

// Two cache states are the same: class, meta, and every tensor bit for bit.
inline void expect_same_state(const CacheState& a, const CacheState& b, const std::string& what = "state") {
  EXPECT_EQ(a.class_name, b.class_name) << what;
  EXPECT_EQ(a.meta, b.meta) << what;
  EXPECT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (const auto& [name, t] : a.tensors) {
    const auto it = b.tensors.find(name);
    if (it == b.tensors.end()) {
      ADD_FAILURE() << what << ": no tensor '" << name << "'";
      continue;
    }
    EXPECT_TRUE(bit_equal(t, it->second)) << what << ": tensor '" << name << "'";
  }
}

}  // namespace kvlab::testing
