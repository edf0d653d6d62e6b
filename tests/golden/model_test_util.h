// Shared by the model unit tests and the mlx-lm comparison runner: prompts as
// golden/README.md defines them, greedy decoding, and mlx-lm's generate_step call pattern.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "golden/model/model.h"
#include "golden/files/scenario.h"

namespace kvlab::golden::test {

// Row b of (B, V) logits.
inline std::vector<float> logits_row(const Tensor& logits, std::int64_t b) {
  const auto* p = reinterpret_cast<const float*>(logits.data()) + b * logits.dim(1);
  return {p, p + logits.dim(1)};
}

// Greedy: the first index of the maximum.
inline std::int32_t argmax(const std::vector<float>& v) {
  return static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Top-1 minus top-2 logit.
inline float margin(std::vector<float> v) {
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return v[0] - v[1];
}

// One request's calls: prompt[:-1], then prompt[-1] (→ token 0), then one call per
// generated token. records[0] is the prefill call's (last position), records[s + 1]
// produced tokens[s].
struct Trace {
  std::vector<std::int32_t> tokens;
  std::vector<ForwardRecord> records;
};

inline Trace run_greedy(const Model& model, Backend& backend, const std::vector<std::int32_t>& prompt, int steps) {
  auto caches = make_caches(model, backend);
  const auto ptrs = cache_pointers(caches);
  Trace t;
  const std::vector<std::int32_t> head(prompt.begin(), prompt.end() - 1);
  t.records.push_back(model.forward(head, 1, static_cast<std::int64_t>(head.size()), ptrs));
  std::int32_t next = prompt.back();
  for (int s = 0; s < steps; ++s) {
    t.records.push_back(model.forward(std::span(&next, 1), 1, 1, ptrs));
    next = argmax(logits_row(t.records.back().logits, 0));
    t.tokens.push_back(next);
  }
  return t;
}

}  // namespace kvlab::golden::test
