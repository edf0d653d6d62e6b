// The attention step through a cache (cache/attend.h): positions are the pre-update
// offsets, and incremental decode equals one-shot prefill.
#include <gtest/gtest.h>

#include "cache/attend.h"
#include "cache/kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_attend {
namespace {

using testing::SeededRng;

struct Qkv {
  Tensor q, k, v;  // (1, Hq, T, D), (1, Hkv, T, D), (1, Hkv, T, Dv)
};

Qkv random_qkv(SeededRng& rng, std::int64_t tokens) {
  return {testing::random_normal(rng, DType::f32, {1, 4, tokens, 16}),
          testing::random_normal(rng, DType::f32, {1, 2, tokens, 16}),
          testing::random_normal(rng, DType::f32, {1, 2, tokens, 8})};
}

AttendOptions options() {
  AttendOptions o;
  o.rope.dims = 16;
  o.attention.scale = 0.25f;
  return o;
}

// Tokens [begin, end) of a (1, H, T, D) tensor, uploaded.
DTensor chunk(Backend& be, const Tensor& t, std::int64_t begin, std::int64_t end) {
  return be.upload(t.slice(2, begin, end));
}

// Incremental decode must give exactly the rows of a one-shot prefill: same roped keys
// (positions offset + t), same visible keys per query, same accumulation order.
TEST(Attend, IncrementalDecodeEqualsOneShotPrefill) {
  KVLAB_SEEDED_RNG(rng, 4101);
  ReferenceBackend be;
  const std::int64_t total = 12, prefill = 5;
  const Qkv x = random_qkv(rng, total);

  KVCache one_shot(be);
  const Tensor full = be.download(
      attend(one_shot, chunk(be, x.q, 0, total), chunk(be, x.k, 0, total), chunk(be, x.v, 0, total), options()).out);

  KVCache incremental(be);
  const Tensor head = be.download(attend(incremental, chunk(be, x.q, 0, prefill), chunk(be, x.k, 0, prefill),
                                         chunk(be, x.v, 0, prefill), options()).out);
  EXPECT_TRUE(testing::bit_equal(head, full.slice(2, 0, prefill)));
  for (std::int64_t t = prefill; t < total; ++t) {
    const AttendResult r =
        attend(incremental, chunk(be, x.q, t, t + 1), chunk(be, x.k, t, t + 1), chunk(be, x.v, t, t + 1), options());
    EXPECT_EQ(r.positions, std::vector<std::int32_t>{static_cast<std::int32_t>(t)});
    EXPECT_TRUE(testing::bit_equal(be.download(r.out), full.slice(2, t, t + 1))) << "decode step " << t;
  }
}

// Q and K of a chunk are roped at the offset read before the update
// (docs/lifecycle.md §Attention step); a query roped at the post-update offset (the mlx-lm#1097
// alias) gives a different result.
TEST(Attend, QueriesAreRopedAtThePreUpdateOffset) {
  KVLAB_SEEDED_RNG(rng, 4102);
  ReferenceBackend be;
  const Qkv x = random_qkv(rng, 6);
  KVCache cache(be);
  attend(cache, chunk(be, x.q, 0, 4), chunk(be, x.k, 0, 4), chunk(be, x.v, 0, 4), options());
  const AttendResult r = attend(cache, chunk(be, x.q, 4, 6), chunk(be, x.k, 4, 6), chunk(be, x.v, 4, 6), options());
  EXPECT_EQ(r.positions, std::vector<std::int32_t>{4});
  EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{6});

  // Recompute by hand at positions 4, 5 over the fetched keys, and at the aliased 6, 7.
  const AttendOptions o = options();
  auto by_hand = [&](std::int32_t base) {
    DTensor offsets = be.upload(Tensor::from_ints(DType::i32, {1}, std::vector<std::int64_t>{base}));
    DTensor q_rot = be.allocate(DType::f32, {1, 4, 2, 16});
    be.rope({chunk(be, x.q, 4, 6), o.rope, Offsets{0, offsets}, q_rot});
    AttentionParams p = o.attention;
    p.mask = r.mask.spec;
    DTensor out = be.allocate(DType::f32, {1, 4, 2, 8});
    be.sdpa({q_rot, r.kv->keys, r.kv->values, p, nullptr, nullptr, out});
    return be.download(out);
  };
  EXPECT_TRUE(testing::bit_equal(be.download(r.out), by_hand(4)));
  EXPECT_FALSE(testing::all_close(be.download(r.out), by_hand(6), 1e-3));
}

// A KV-shared layer reads the producer's K/V and pre-update positions; its output equals
// attending with a fresh cache holding the same keys at the same positions.
TEST(Attend, SharedLayerUsesTheProducersPreUpdatePositions) {
  KVLAB_SEEDED_RNG(rng, 4103);
  ReferenceBackend be;
  const Qkv x = random_qkv(rng, 7);
  const Tensor q_shared = testing::random_normal(rng, DType::f32, {1, 4, 7, 16});
  KVCache producer_cache(be);
  attend(producer_cache, chunk(be, x.q, 0, 5), chunk(be, x.k, 0, 5), chunk(be, x.v, 0, 5), options());
  const AttendResult producer =
      attend(producer_cache, chunk(be, x.q, 5, 7), chunk(be, x.k, 5, 7), chunk(be, x.v, 5, 7), options());
  const Tensor shared = be.download(attend_shared(be, producer, chunk(be, q_shared, 5, 7), options()));

  KVCache twin(be);
  attend(twin, chunk(be, x.q, 0, 5), chunk(be, x.k, 0, 5), chunk(be, x.v, 0, 5), options());
  const Tensor expected =
      be.download(attend(twin, chunk(be, q_shared, 5, 7), chunk(be, x.k, 5, 7), chunk(be, x.v, 5, 7), options()).out);
  EXPECT_TRUE(testing::bit_equal(shared, expected));
}

TEST(Attend, MismatchedTokenCountsAreRejected) {
  KVLAB_SEEDED_RNG(rng, 4104);
  ReferenceBackend be;
  const Qkv x = random_qkv(rng, 4);
  KVCache cache(be);
  EXPECT_THROW(attend(cache, chunk(be, x.q, 0, 3), chunk(be, x.k, 0, 4), chunk(be, x.v, 0, 4), options()), Error);
  EXPECT_TRUE(cache.empty());
}

// A ring with sinks, wrapped: a chunk's queries see what the same tokens decoded one at a
// time would see, the keep sinks and the newest max_size − keep keys up to each query
// (docs/semantics.md §Rotating cache). Found as a kvlab bug by replaying through mlx-vlm,
// which keeps the sinks, where kvlab had copied mlx-lm's plain window (§U10): the later
// queries of the chunk then lost the sinks and saw evicted tokens instead.
TEST(Attend, ARingWithSinksGivesAChunkWhatItGivesOneTokenAtATime) {
  KVLAB_SEEDED_RNG(rng, 4107);
  ReferenceBackend be;
  const std::int64_t max_size = 6, keep = 2, before = 9, chunk_len = 5;
  const Qkv x = random_qkv(rng, before + chunk_len);
  const auto fed = [&] {
    auto c = std::make_unique<RotatingKVCache>(be, max_size, keep);
    for (std::int64_t t = 0; t < before; ++t)
      attend(*c, chunk(be, x.q, t, t + 1), chunk(be, x.k, t, t + 1), chunk(be, x.v, t, t + 1), options());
    return c;
  };
  const auto as_chunk = fed();
  const Tensor together = be.download(attend(*as_chunk, chunk(be, x.q, before, before + chunk_len),
                                             chunk(be, x.k, before, before + chunk_len),
                                             chunk(be, x.v, before, before + chunk_len), options()).out);
  const auto one_by_one = fed();
  for (std::int64_t t = before; t < before + chunk_len; ++t) {
    const Tensor alone = be.download(
        attend(*one_by_one, chunk(be, x.q, t, t + 1), chunk(be, x.k, t, t + 1), chunk(be, x.v, t, t + 1), options())
            .out);
    const Tensor same = together.slice(2, t - before, t - before + 1);
    const xt::xarray<float> a = alone.to_f32(), b = same.to_f32();
    EXPECT_LT(xt::amax(xt::abs(a - b))(), 1e-5f) << "query " << t - before << " of the chunk";
  }
}

}  // namespace
}  // namespace test_attend
}  // namespace kvlab
