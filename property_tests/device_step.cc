#include "property_tests/device_step.h"

#include <rapidcheck.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>

#include "cache/attend.h"
#include "cache/batch_kv_cache.h"
#include "cache/device_batch_kv_cache.h"

namespace kvlab::prop {

namespace {

struct HeadShape {
  std::int64_t dim;
  int rope_dims;
};
void showValue(const HeadShape& h, std::ostream& os) { os << "D " << h.dim << ", rope dims " << h.rope_dims; }

struct ElementType {
  DType dtype;
};
void showValue(const ElementType& e, std::ostream& os) { os << dtype_name(e.dtype); }

std::string str(const std::vector<std::int32_t>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

// Normal(0, 1) values in `dtype` from a seeded engine.
Tensor normal_tensor(std::mt19937_64& rng, DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal(0.0, 1.0);
  const TensorView view = t.view();
  for (std::int64_t i = 0; i < t.numel(); ++i) view.store(i, static_cast<float>(normal(rng)));
  return t;
}

// RC_FAIL unless the two tensors are the same bytes; names the first differing element.
void require_same(const Tensor& got, const Tensor& want, const std::string& what, std::size_t chunk) {
  const std::string where = what + " after chunk " + std::to_string(chunk);
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    RC_FAIL(where + ": " + std::string(dtype_name(got.dtype())) + shape_str(got.shape()) + " vs BatchKVCache's " +
            std::string(dtype_name(want.dtype())) + shape_str(want.shape()));
  }
  if (got.nbytes() == 0 || std::memcmp(got.data(), want.data(), got.nbytes()) == 0) return;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const float a = got.view().load(i), b = want.view().load(i);
    if (std::memcmp(&a, &b, sizeof a) != 0) {
      RC_FAIL(where + ": element " + std::to_string(i) + " of " + shape_str(got.shape()) + " is " + std::to_string(a) +
              ", BatchKVCache's " + std::to_string(b));
    }
  }
}

struct Case {
  std::vector<std::int32_t> pads;
  std::int64_t heads = 1, q_heads = 1;
  HeadShape head{8, 8};
  DType dtype = DType::f32;
  AttendOptions options;
  std::vector<std::int64_t> chunks;
  std::uint64_t seed = 0;
};

void run_case(Backend& under_test, Backend& oracle, const Case& c) {
  const auto batch = static_cast<std::int64_t>(c.pads.size());
  DeviceBatchKVCache device(under_test, c.pads);
  BatchKVCache host(oracle, c.pads);
  std::mt19937_64 rng(c.seed);
  for (std::size_t i = 0; i < c.chunks.size(); ++i) {
    const std::int64_t s = c.chunks[i];
    const Tensor q = normal_tensor(rng, c.dtype, {batch, c.q_heads, s, c.head.dim});
    const Tensor k = normal_tensor(rng, c.dtype, {batch, c.heads, s, c.head.dim});
    const Tensor v = normal_tensor(rng, c.dtype, {batch, c.heads, s, c.head.dim});
    const Tensor q_shared = normal_tensor(rng, c.dtype, {batch, c.q_heads, s, c.head.dim});
    const AttendResult got = attend(device, under_test.upload(q), under_test.upload(k), under_test.upload(v), c.options);
    const AttendResult want = attend(host, oracle.upload(q), oracle.upload(k), oracle.upload(v), c.options);
    if (got.positions != want.positions) {
      RC_FAIL("positions of chunk " + std::to_string(i) + ": " + str(got.positions) + ", BatchKVCache's " +
              str(want.positions));
    }
    const std::vector<std::int32_t> got_offsets = device.offsets(), want_offsets = host.offsets();
    if (got_offsets != want_offsets) {
      RC_FAIL("offsets after chunk " + std::to_string(i) + ": " + str(got_offsets) + ", BatchKVCache's " +
              str(want_offsets));
    }
    require_same(under_test.download(got.kv->keys), oracle.download(want.kv->keys), "cached K (roped)", i);
    require_same(under_test.download(got.kv->values), oracle.download(want.kv->values), "cached V", i);
    require_same(under_test.download(got.out), oracle.download(want.out), "attention output", i);
    // The shared layer ropes its queries at the producer's snapshot after the producer's
    // append advanced the live offsets (mlx-lm#1384 in its device form).
    require_same(under_test.download(attend_shared(under_test, got, under_test.upload(q_shared), c.options)),
                 oracle.download(attend_shared(oracle, want, oracle.upload(q_shared), c.options)),
                 "KV-shared layer output", i);
  }
}

}  // namespace

void device_step_matches_batch_cache(Backend& under_test, Backend& oracle, const DeviceStepOptions& options) {
  Case c;
  const auto batch = *rc::gen::inRange<std::int64_t>(1, 4);
  c.pads = *rc::gen::container<std::vector<std::int32_t>>(static_cast<std::size_t>(batch),
                                                          rc::gen::inRange<std::int32_t>(0, 4));
  c.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  c.q_heads = c.heads * *rc::gen::inRange<std::int64_t>(1, 3);
  c.head = *rc::gen::element(HeadShape{8, 8}, HeadShape{9, 8}, HeadShape{18, 16}, HeadShape{64, 64});
  c.dtype = (*rc::gen::element(ElementType{DType::f32}, ElementType{DType::f16}, ElementType{DType::bf16})).dtype;
  c.options.rope.dims = c.head.rope_dims;
  c.options.rope.traditional = *rc::gen::arbitrary<bool>();
  c.options.rope.base = *rc::gen::element(10000.0f, 500000.0f);
  c.options.attention.scale = 1.0f / std::sqrt(static_cast<float>(c.head.dim));
  c.chunks = *rc::gen::resize(
      5, rc::gen::nonEmpty(rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 7))));
  c.seed = *rc::gen::arbitrary<std::uint32_t>();
  try {
    run_case(under_test, oracle, c);
  } catch (...) {
    if (options.on_failure) options.on_failure(c.chunks);
    throw;
  }
}

}  // namespace kvlab::prop
