#include "tests/vulkan/device_step_property.h"

#include <rapidcheck.h>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>

#include "cache/device_batch_kv_cache.h"
#include "tests/vulkan/device_step_oracle.h"

namespace kvlab::testing {

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
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "{") << v[i];
  os << "}";
  return os.str();
}

// RC_FAIL unless the two tensors are within `ulps` of each other (0: bit for bit).
void require_within(const Tensor& got, const Tensor& want, std::int64_t ulps, const char* what, std::size_t chunk) {
  const UlpDistance d = ulp_distance(got, want);
  if (d.worst < 0) {
    RC_FAIL(std::string(what) + " after chunk " + std::to_string(chunk) + ": shape " + shape_str(got.shape()) +
            " vs the oracle's " + shape_str(want.shape()));
  }
  if (d.worst > ulps) {
    RC_FAIL(std::string(what) + " after chunk " + std::to_string(chunk) + ": " + std::to_string(d.worst) +
            " ulp from the oracle at flat index " + std::to_string(d.worst_at) + " (" +
            std::to_string(got.view().load(d.worst_at)) + " vs " + std::to_string(want.view().load(d.worst_at)) +
            "), allowed " + std::to_string(ulps));
  }
}

void run_case(Backend& be, const std::vector<std::int32_t>& pads,
              std::int64_t heads, std::int64_t q_heads, const HeadShape& head, DType dtype, const RopeParams& rope,
              const std::vector<std::int64_t>& chunks, std::uint64_t seed) {
  const auto batch = static_cast<std::int64_t>(pads.size());
  DeviceBatchKVCache device(be, pads);
  ReferenceDecodeStep oracle(pads, rope);
  std::mt19937_64 rng(seed);
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const std::int64_t s = chunks[c];
    const Tensor q = normal_tensor(rng, dtype, {batch, q_heads, s, head.dim});
    const Tensor k = normal_tensor(rng, dtype, {batch, heads, s, head.dim});
    const Tensor v = normal_tensor(rng, dtype, {batch, heads, s, head.dim});
    const Tensor q_want = oracle.step(q, k, v);
    const DeviceBatchKVCache::AttentionInputs step = device.rope_and_update(be.upload(q), be.upload(k), be.upload(v), rope);
    const Tensor q_got = be.download(step.queries);
    const std::vector<std::int32_t> got = device.offsets(), want = oracle.offsets();
    RC_ASSERT(device.idx() == std::accumulate(chunks.begin(), chunks.begin() + static_cast<std::ptrdiff_t>(c + 1),
                                              std::int64_t{0}));
    if (got != want) {
      RC_FAIL("offsets after chunk " + std::to_string(c) + ": " + str(got) + ", the oracle's " + str(want));
    }
    require_within(be.download(step.kv.values), oracle.values(), 0, "cached V", c);
    require_within(be.download(step.kv.keys), oracle.keys(), 1, "cached K (roped)", c);
    require_within(q_got, q_want, 1, "roped Q", c);
  }
}

}  // namespace

void device_step_matches_reference(Backend& be, const DeviceStepPropertyOptions& options) {
  const auto batch = *rc::gen::inRange<std::int64_t>(1, 4);
  const auto pads = *rc::gen::container<std::vector<std::int32_t>>(static_cast<std::size_t>(batch),
                                                                   rc::gen::inRange<std::int32_t>(0, 4));
  const auto heads = *rc::gen::inRange<std::int64_t>(1, 3);
  const auto group = *rc::gen::inRange<std::int64_t>(1, 3);
  const auto head = *rc::gen::element(HeadShape{8, 8}, HeadShape{9, 8}, HeadShape{18, 16}, HeadShape{64, 64});
  const auto element = *rc::gen::element(ElementType{DType::f32}, ElementType{DType::f16}, ElementType{DType::bf16});
  RopeParams rope;
  rope.dims = head.rope_dims;
  rope.traditional = *rc::gen::arbitrary<bool>();
  rope.base = *rc::gen::element(10000.0f, 500000.0f);
  const auto chunks = *rc::gen::resize(
      5, rc::gen::nonEmpty(rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 7))));
  const auto seed = *rc::gen::arbitrary<std::uint32_t>();
  try {
    run_case(be, pads, heads, heads * group, head, element.dtype, rope, chunks, seed);
  } catch (...) {
    if (options.on_failure) options.on_failure(chunks);
    throw;
  }
}

}  // namespace kvlab::testing
