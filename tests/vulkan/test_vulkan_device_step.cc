// DeviceBatchKVCache (cache/device_batch_kv_cache.h) on the Vulkan backend: offsets that
// live on the device, snapshotted there by attend() (cache/attend.h) before the append.
//  - Seeded random prefill + decode sequences on every storage/memory path, through
//    attend() and a KV-shared layer: against BatchKVCache over the reference (offsets and
//    positions exact, V bit for bit, K within one ulp: the Vulkan rope tolerance) and
//    against BatchKVCache on the same device (every output bit for bit: same kernels).
//  - Hand-derived positions: with D = 2, rope dims 2 and wavelength 1, RoPE maps (1, 0)
//    to (cos p, sin p), so every position the cached keys were roped at is checked by
//    formula.
//  - The RapidCheck property (property_tests/device_step.h) passes on Vulkan and on the
//    reference (the bug zoo shows it fails on a backend whose RoPE reads the live offsets).
//  - The Context batch: several commands, one submission, barriers in order; transfers
//    that need their own submission are refused inside it.
//  - Invalid input is a kvlab::Error naming the values, raised before the cache changes.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "cache/attend.h"
#include "cache/batch_kv_cache.h"
#include "cache/device_batch_kv_cache.h"
#include "kernels/vulkan/context.h"
#include "property_tests/device_step.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
namespace {

Tensor random_tensor(testing::SeededRng& rng, DType dtype, Shape shape) {
  return testing::random_normal(rng, dtype, std::move(shape), 1.0);
}

// Chunks: a prefill of 1..12 tokens, decodes of 1, one short chunk of 2..4.
std::vector<std::int64_t> random_chunks(testing::SeededRng& rng) {
  std::vector<std::int64_t> chunks{rng.integer(1, 12)};
  const std::int64_t decodes = rng.integer(3, 5);
  for (std::int64_t i = 0; i < decodes; ++i) chunks.push_back(1);
  chunks.insert(chunks.begin() + rng.integer(1, decodes), rng.integer(2, 4));
  return chunks;
}

// Position of element i in the dtype's total order of encodings (sign-magnitude →
// offset binary), so |key(a) − key(b)| counts the representable values between a and b.
std::int64_t order_key(const ConstTensorView& v, std::int64_t i) {
  if (v.dtype == DType::f32) {
    const auto u = std::bit_cast<std::uint32_t>(v.load(i));
    return (u & 0x80000000u) ? -static_cast<std::int64_t>(u & 0x7FFFFFFFu) : static_cast<std::int64_t>(u);
  }
  const std::uint16_t h = v.as<const std::uint16_t>()[i];
  return (h & 0x8000u) ? -static_cast<std::int64_t>(h & 0x7FFFu) : static_cast<std::int64_t>(h);
}

// The largest distance in representable values between got and want (-1: dtype or shape
// differ).
std::int64_t max_ulps(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) return -1;
  std::int64_t worst = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    worst = std::max(worst, std::abs(order_key(got.view(), i) - order_key(want.view(), i)));
  }
  return worst;
}

TEST(VulkanDeviceStep, MatchesBatchKVCacheOnEveryPath) {
  KVLAB_SEEDED_RNG(rng, 5101);
  struct Head {
    std::int64_t dim;
    int rope_dims;
  };
  // D 64 and 128 (128 with half of it rotated: a copied tail), and an odd D whose 16-bit
  // rows straddle words (the u32-word path's masked stores).
  const std::vector<Head> heads_shapes = {{64, 64}, {128, 64}, {9, 8}};
  std::int64_t steps = 0, k_off_by_one_ulp = 0;
  ReferenceBackend ref;
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    for (const DType dtype : {DType::f16, DType::bf16, DType::f32})
      for (const Head& head : heads_shapes) {
        const std::int64_t batch = rng.integer(1, 4), heads = rng.integer(1, 4), q_heads = heads * rng.integer(1, 2);
        std::vector<std::int32_t> pads;
        for (std::int64_t b = 0; b < batch; ++b) {
          pads.push_back(static_cast<std::int32_t>(batch == 1 ? 0 : rng.integer(0, 5)));
        }
        const std::vector<std::int64_t> chunks = random_chunks(rng);
        AttendOptions options;
        options.rope.dims = head.rope_dims;
        options.rope.traditional = rng.integer(0, 1) == 1;
        options.attention.scale = 1.0f / std::sqrt(static_cast<float>(head.dim));
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " B " << batch << " H " << heads << " Hq " << q_heads
                                          << " D " << head.dim << " dims " << head.rope_dims);
        DeviceBatchKVCache device(be, pads);
        BatchKVCache same_device(be, pads), oracle(ref, pads);
        for (const std::int64_t s : chunks) {
          SCOPED_TRACE(::testing::Message() << "chunk of " << s << " at column " << device.idx());
          const Tensor q = random_tensor(rng, dtype, {batch, q_heads, s, head.dim});
          const Tensor k = random_tensor(rng, dtype, {batch, heads, s, head.dim});
          const Tensor v = random_tensor(rng, dtype, {batch, heads, s, head.dim});
          const AttendResult got = attend(device, be.upload(q), be.upload(k), be.upload(v), options);
          const AttendResult host = attend(same_device, be.upload(q), be.upload(k), be.upload(v), options);
          const AttendResult want = attend(oracle, ref.upload(q), ref.upload(k), ref.upload(v), options);
          ASSERT_EQ(device.offsets(), oracle.offsets());
          ASSERT_EQ(got.positions, want.positions);
          EXPECT_TRUE(testing::bit_equal(be.download(got.kv->values), ref.download(want.kv->values)));
          const std::int64_t dk = max_ulps(be.download(got.kv->keys), ref.download(want.kv->keys));
          EXPECT_TRUE(dk == 0 || dk == 1) << "cached K: " << dk << " ulp from the reference";
          k_off_by_one_ulp += dk;
          EXPECT_TRUE(testing::bit_equal(be.download(got.kv->keys), be.download(host.kv->keys)));
          EXPECT_TRUE(testing::bit_equal(be.download(got.out), be.download(host.out)));
          const DTensor q2 = be.upload(q);
          EXPECT_TRUE(testing::bit_equal(be.download(attend_shared(be, got, q2, options)),
                                         be.download(attend_shared(be, host, q2, options))));
          ++steps;
        }
      }
  });
  std::cout << "[ step     ] " << steps << " steps compared; " << k_off_by_one_ulp
            << " had a cached K element 1 ulp from the reference\n";
}

// D = 2, rope dims 2, wavelength 1: θ = position, and (1, 0) ropes to (cos p, sin p).
RopeParams unit_circle() {
  RopeParams rope;
  rope.dims = 2;
  rope.freqs = {1.0f};
  return rope;
}

Tensor ones_then_zeros(std::int64_t batch, std::int64_t seq) {
  Tensor t(DType::f32, {batch, 1, seq, 2});
  for (std::int64_t i = 0; i < batch * seq; ++i) t.view().store(2 * i, 1.0f);
  return t;
}

// Checks (cos p, sin p) at every (b, t) of a (B, 1, S, 2) tensor, p = first[b] + t.
void expect_positions(const Tensor& x, const std::vector<std::int64_t>& first, const char* what) {
  const std::int64_t seq = x.shape()[2];
  for (std::size_t b = 0; b < first.size(); ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      const auto p = static_cast<double>(first[b] + t);
      const std::int64_t at = (static_cast<std::int64_t>(b) * seq + t) * 2;
      // Correctly rounded f32 of cos/sin (rope.comp): within 2^-24 of the exact value.
      EXPECT_NEAR(x.view().load(at), std::cos(p), 0x1p-24) << what << " row " << b << " token " << t;
      EXPECT_NEAR(x.view().load(at + 1), std::sin(p), 0x1p-24) << what << " row " << b << " token " << t;
    }
}

TEST(VulkanDeviceStep, KeysAreRopedAtThePreAppendOffsets) {
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    DeviceBatchKVCache cache(be, {0, 3});
    AttendOptions options;
    options.rope = unit_circle();
    auto step = [&](std::int64_t s) {
      const DTensor x = be.upload(ones_then_zeros(2, s));
      return attend(cache, x, x, x, options);
    };
    EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{0, -3}));
    // Prefill of 4 (row 1: three padding tokens at positions -3..-1, then position 0).
    const AttendResult prefill = step(4);
    EXPECT_EQ(prefill.positions, (std::vector<std::int32_t>{0, -3}));
    expect_positions(be.download(prefill.kv->keys), {0, -3}, "prefill K");
    EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{4, 1}));
    // A decode step: positions 4 and 1; the snapshot it was roped at stays 4 and 1.
    const AttendResult decode = step(1);
    EXPECT_EQ(decode.positions, (std::vector<std::int32_t>{4, 1}));
    EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{5, 2}));
    EXPECT_EQ(be.download(decode.position_offsets).to_ints(), (std::vector<std::int64_t>{4, 1}));
    // Column c of row b holds K roped at c − pad[b]: rows as (B, 1, 5, 2), first −pad[b].
    expect_positions(be.download(decode.kv->keys), {0, -3}, "cached K");
    EXPECT_TRUE(testing::bit_equal(be.download(decode.kv->values), ones_then_zeros(2, 5)));
  });
}

// ---- the RapidCheck property ---------------------------------------------------------

// Runs the property with a fixed seed; returns the failure description, empty on success.
std::string run_property(Backend& be, int cases) {
  rc::detail::TestParams params;
  params.seed = 5102;
  params.maxSuccess = cases;
  std::cout << "[ seed     ] " << params.seed << " (RapidCheck), " << cases << " cases\n";
  rc::detail::TestMetadata meta;
  meta.id = meta.description = "device step on " + be.name();
  const rc::detail::TestResult result =
      rc::detail::checkTestable([&] { prop::device_step_matches_batch_cache(be, be); }, meta, params);
  rc::detail::FailureResult failure;
  if (result.match(failure)) return failure.description.empty() ? "failed" : failure.description;
  rc::detail::Error error;
  if (result.match(error)) return "error: " + error.description;
  return {};
}

TEST(VulkanDeviceStepProperty, MatchesBatchKVCache) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  const std::string failure = run_property(*be, 100);
  EXPECT_TRUE(failure.empty()) << failure;
}

// The cache is written once over Backend&: the same property over the oracle itself.
TEST(DeviceBatchKVCacheProperty, MatchesBatchKVCacheOnTheReferenceBackend) {
  ReferenceBackend be;
  const std::string failure = run_property(be, 50);
  EXPECT_TRUE(failure.empty()) << failure;
}

// ---- the Context batch ---------------------------------------------------------------

TEST(VulkanContextBatch, CommandsRunInOrderInOneSubmission) {
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    const Tensor a = Tensor::from_ints(DType::i32, {5}, std::vector<std::int64_t>{3, -1, 4, 1, -5});
    const DTensor da = be.upload(a), db = be.allocate(DType::i32, {5}), dc = be.allocate(DType::i32, {5});
    be.fill(db, 0);
    be.fill(dc, 0);
    VulkanBackend::Context& c = be.context();
    const std::uint64_t before = c.submissions();
    {
      VulkanBackend::Context::Batch batch(c);
      c.copy(da, db);
      c.copy(db, dc);  // reads what the first copy wrote: the barrier between them orders it
      EXPECT_EQ(c.submissions(), before) << "recorded, not yet submitted";
      batch.submit();
    }
    EXPECT_EQ(c.submissions() - before, 1u);
    EXPECT_TRUE(testing::bit_equal(be.download(dc), a));
  });
}

TEST(VulkanContextBatch, TransfersNeedingTheirOwnSubmissionAreRefusedInside) {
  VulkanOptions o;
  o.force_staging = true;  // upload/download go through staging submissions
  KVLAB_VULKAN_OR_SKIP(be, o);
  VulkanBackend::Context& c = be->context();
  const DTensor t = be->allocate(DType::i32, {4});
  const std::vector<std::int32_t> data{1, 2, 3, 4};
  {
    VulkanBackend::Context::Batch batch(c);
    EXPECT_KVLAB_ERROR(be->upload(t, data.data()), internal, "batch");
    EXPECT_KVLAB_ERROR(c.begin_batch(), misuse, "do not nest");
  }  // abandoned: nothing was submitted
  EXPECT_FALSE(c.batching());
  be->upload(t, data.data());  // the stream is usable again
  EXPECT_EQ(be->download(t).to_ints(), (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_KVLAB_ERROR(c.end_batch(), misuse, "without begin_batch");
  EXPECT_KVLAB_ERROR(c.copy(t, be->allocate(DType::i32, {3})), shape_mismatch, "16 bytes");
  EXPECT_KVLAB_ERROR(c.copy(DTensor{t.buffer, 0, DType::i32, {2}}, DTensor{t.buffer, 4, DType::i32, {2}}),
                     invalid_argument, "overlaps");
}

// ---- invalid input -------------------------------------------------------------------

TEST(VulkanDeviceStep, InvalidInputIsAnErrorNamingTheValues) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  EXPECT_KVLAB_ERROR(DeviceBatchKVCache(*be, {}), invalid_argument, "left_padding is empty");
  EXPECT_KVLAB_ERROR(DeviceBatchKVCache(*be, {0, -2}), invalid_argument, "left_padding[1] = -2");

  DeviceBatchKVCache cache(*be, {0, 1});
  AttendOptions options;
  options.rope.dims = 8;
  auto f16 = [&](Shape s) { return be->allocate(DType::f16, std::move(s)); };
  const DTensor q = f16({2, 4, 3, 8}), k = f16({2, 2, 3, 8}), v = f16({2, 2, 3, 8});
  for (const DTensor& t : {q, k, v}) be->fill(t, 0);
  EXPECT_KVLAB_ERROR(attend(cache, q, f16({2, 3, 3, 8}), v, options), shape_mismatch, "(2, 3, 3, 8)");
  EXPECT_KVLAB_ERROR(attend(cache, q, k, f16({2, 2, 2, 8}), options), shape_mismatch, "(2, 2, 2, 8)");
  EXPECT_KVLAB_ERROR(attend(cache, f16({2, 4, 1, 8}), k, v, options), shape_mismatch, "q has 1 tokens");
  EXPECT_KVLAB_ERROR(attend(cache, f16({1, 4, 3, 8}), k, v, options), shape_mismatch, "q (1, 4, 3, 8)");
  EXPECT_KVLAB_ERROR(attend(cache, f16({2, 4, 3, 9}), k, v, options), shape_mismatch, "q (2, 4, 3, 9)");
  EXPECT_KVLAB_ERROR(attend(cache, q, be->allocate(DType::f32, {2, 2, 3, 8}), v, options), dtype_mismatch, "f32");
  const DTensor k1 = f16({1, 2, 3, 8}), v1 = f16({1, 2, 3, 8});
  EXPECT_KVLAB_ERROR(attend(cache, f16({1, 4, 3, 8}), k1, v1, options), shape_mismatch,
                     "holds 2 sequences but the step has 1 rows");
  AttendOptions too_wide = options;
  too_wide.rope.dims = 10;
  EXPECT_KVLAB_ERROR(attend(cache, q, k, v, too_wide), invalid_argument, "10");
  ReferenceBackend ref;
  EXPECT_KVLAB_ERROR(attend(cache, q, ref.allocate(DType::f16, {2, 2, 3, 8}), v, options), misuse,
                     "not allocated by this Vulkan");
  // Nothing above changed the cache.
  EXPECT_TRUE(cache.empty());
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{0, -1}));
  (void)attend(cache, q, k, v, options);
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{3, 2}));

  // The kernel's own check reads the offsets on the device: a column range past the
  // capacity is refused before anything is written.
  const DTensor offsets = be->upload(Tensor::from_ints(DType::i32, {2}, std::vector<std::int64_t>{14, 0}));
  const std::vector<std::int32_t> pads{1, 0};
  const ConstTensorView pad_view{reinterpret_cast<const std::byte*>(pads.data()), DType::i32, {2}};
  const DTensor kc = f16({2, 2, 16, 8}), vc = f16({2, 2, 16, 8});
  EXPECT_KVLAB_ERROR(be->kv_append_advance({k, v, pad_view, offsets, kc, vc}), invalid_argument,
                     "row 0 appends S = 3 tokens at column 15");
  EXPECT_EQ(be->download(offsets).to_ints(), (std::vector<std::int64_t>{14, 0}));
}

}  // namespace
}  // namespace kvlab
