// The oracle of the device-offset cache tests (DeviceBatchKVCache): BatchKVCache over the reference backend with
// host RoPE at the offsets read BEFORE the update (docs/lifecycle.md §Offset snapshot), and the ulp
// distance the Vulkan rope tests hold rope outputs to (tests/vulkan/test_vulkan_rope.cc: every
// output is the oracle's or its neighbour in the dtype).
#pragma once

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "cache/batch_kv_cache.h"
#include "reference/reference_backend.h"

namespace kvlab::testing {

class ReferenceDecodeStep {
 public:
  ReferenceDecodeStep(std::vector<std::int32_t> left_padding, RopeParams rope)
      : cache_(be_, std::move(left_padding)), rope_(std::move(rope)) {}

  // Returns Q roped at the pre-update offsets; K is roped at the same offsets, then cached.
  Tensor step(const Tensor& q, const Tensor& k, const Tensor& v) {
    const std::vector<std::int32_t> positions = cache_.offsets();  // before update()
    const DTensor offsets = be_.allocate(DType::i32, {static_cast<std::int64_t>(positions.size())});
    be_.upload(offsets, positions.data());
    const DTensor k_rot = be_.allocate(k.dtype(), k.shape()), q_rot = be_.allocate(q.dtype(), q.shape());
    be_.rope({be_.upload(k), rope_, Offsets{0, offsets}, k_rot});
    cache_.update(k_rot, be_.upload(v));
    be_.rope({be_.upload(q), rope_, Offsets{0, offsets}, q_rot});
    return be_.download(q_rot);
  }
  std::vector<std::int32_t> offsets() const { return cache_.offsets(); }
  Tensor keys() { return be_.download(cache_.fetch().keys); }
  Tensor values() { return be_.download(cache_.fetch().values); }

 private:
  ReferenceBackend be_;
  BatchKVCache cache_;
  RopeParams rope_;
};

// Position of element i in the dtype's total order of encodings (sign-magnitude →
// offset binary), so |key(a) − key(b)| counts the representable values between a and b.
inline std::int64_t order_key(const ConstTensorView& v, std::int64_t i) {
  if (v.dtype == DType::f32) {
    const auto u = std::bit_cast<std::uint32_t>(v.load(i));
    return (u & 0x80000000u) ? -static_cast<std::int64_t>(u & 0x7FFFFFFFu) : static_cast<std::int64_t>(u);
  }
  const std::uint16_t h = v.as<const std::uint16_t>()[i];
  return (h & 0x8000u) ? -static_cast<std::int64_t>(h & 0x7FFFu) : static_cast<std::int64_t>(h);
}

struct UlpDistance {
  std::int64_t worst = 0;       // -1: dtype or shape differ
  std::int64_t worst_at = -1;   // flat index of the worst element
};

inline UlpDistance ulp_distance(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) return {-1, -1};
  UlpDistance d;
  const ConstTensorView g = got.view(), w = want.view();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const std::int64_t dist = std::abs(order_key(g, i) - order_key(w, i));
    if (dist > d.worst) d = {dist, i};
  }
  return d;
}

// Normal(0, stddev) values in `dtype` from a seeded engine.
inline Tensor normal_tensor(std::mt19937_64& rng, DType dtype, Shape shape, double stddev = 1.0) {
  Tensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal(0.0, stddev);
  const TensorView view = t.view();
  for (std::int64_t i = 0; i < t.numel(); ++i) view.store(i, static_cast<float>(normal(rng)));
  return t;
}

}  // namespace kvlab::testing
