// KVCache (docs/semantics.md §KV cache): growth, fetch, trim, masks, state, misuse.
#include <gtest/gtest.h>

#include <cmath>

#include "cache/kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_kv_cache {
namespace {

using testing::token_block;
using testing::range_ids;
using testing::token_ids;

TEST(KVCache, ChunksConcatenateInTemporalOrder) {
  ReferenceBackend be;
  KVCache cache(be);
  EXPECT_TRUE(cache.empty());
  cache.update(token_block(be, {range_ids(1, 3)}, 2, 4), token_block(be, {range_ids(101, 3)}, 2, 6));
  const FetchedKV kv = cache.update(token_block(be, {range_ids(4, 2)}, 2, 4), token_block(be, {range_ids(104, 2)}, 2, 6));
  EXPECT_EQ(token_ids(be, kv.keys), range_ids(1, 5));
  EXPECT_EQ(token_ids(be, kv.values), range_ids(101, 5));
  EXPECT_EQ(kv.keys.shape, (Shape{1, 2, 5, 4}));
  EXPECT_EQ(kv.values.shape, (Shape{1, 2, 5, 6}));
  EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{5});
  EXPECT_EQ(cache.kv_length(), 5);
}

// mlx-lm grows by ceil(S/256)·256 rows; off a step boundary it first cuts to the cursor,
// so capacity becomes prev + steps·256 (docs/semantics.md §Common rules).
TEST(KVCache, CapacityFollowsMlxStepGrowth) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(0, 3)}, 1, 2), token_block(be, {range_ids(0, 3)}, 1, 2));
  EXPECT_EQ(cache.capacity(), 256);
  cache.update(token_block(be, {range_ids(3, 300)}, 1, 2), token_block(be, {range_ids(3, 300)}, 1, 2));
  EXPECT_EQ(cache.capacity(), 3 + 512);
  EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(2 * 515 * 2 * 4));
  const FetchedKV kv = cache.fetch();
  EXPECT_EQ(token_ids(be, kv.keys), range_ids(0, 303));
}

TEST(KVCache, TrimRemovesNewestAndPoisonsThem) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(1, 6)}, 1, 2), token_block(be, {range_ids(1, 6)}, 1, 2));
  EXPECT_EQ(cache.trim(2), 2);
  EXPECT_EQ(cache.trim(100), 4);  // clamps to what is stored (docs/semantics.md §Common rules)
  EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{0});
  const FetchedKV kv = cache.update(token_block(be, {range_ids(7, 1)}, 1, 2), token_block(be, {range_ids(7, 1)}, 1, 2));
  EXPECT_EQ(token_ids(be, kv.keys), range_ids(7, 1));
}

TEST(KVCache, MaskIsCausalForChunksAndWindowsOnly) {
  ReferenceBackend be;
  KVCache cache(be);
  EXPECT_EQ(cache.make_mask(1, 0).spec.kind, MaskKind::none);
  EXPECT_EQ(cache.make_mask(4, 0).spec.kind, MaskKind::causal);
  const CacheMask w = cache.make_mask(1, 8);  // mlx-lm#843: windows need a mask at N == 1
  EXPECT_EQ(w.spec.kind, MaskKind::causal);
  EXPECT_EQ(w.spec.window, 8);
}

TEST(KVCache, StateRoundTripsAndContinuesIdentically) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(1, 5)}, 2, 4), token_block(be, {range_ids(1, 5)}, 2, 4));
  auto restored = KVCache::from_state(be, cache.state());
  const FetchedKV a = cache.update(token_block(be, {range_ids(6, 2)}, 2, 4), token_block(be, {range_ids(6, 2)}, 2, 4));
  const FetchedKV b =
      restored->update(token_block(be, {range_ids(6, 2)}, 2, 4), token_block(be, {range_ids(6, 2)}, 2, 4));
  EXPECT_EQ(token_ids(be, a.keys), token_ids(be, b.keys));
  EXPECT_EQ(restored->offsets(), cache.offsets());
}

// Issue 19 (deep property run: Decode, Trim(1), SaveLoad): a cache trimmed to empty saves
// like a fresh one, and the zero-row blocks that older kvlab states hold for it load as
// an empty cache whose dtype and shapes still bind the next update.
TEST(KVCache, TrimmedToEmptySavesNoTensorsAndZeroRowStatesLoad) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(1, 1)}, 2, 4), token_block(be, {range_ids(1, 1)}, 2, 4));
  ASSERT_EQ(cache.trim(1), 1);
  const CacheState s = cache.state();
  EXPECT_TRUE(s.tensors.empty());
  EXPECT_EQ(s.meta.at("offset"), "0");

  CacheState legacy = s;
  legacy.tensors.emplace("keys", Tensor(DType::f32, {1, 2, 0, 4}));
  legacy.tensors.emplace("values", Tensor(DType::f32, {1, 2, 0, 4}));
  auto restored = KVCache::from_state(be, legacy);
  EXPECT_EQ(restored->offset(), 0);
  EXPECT_TRUE(restored->state().tensors.empty());
  EXPECT_KVLAB_ERROR(restored->update(token_block(be, {range_ids(1, 1)}, 2, 4, DType::f16),
                                      token_block(be, {range_ids(1, 1)}, 2, 4, DType::f16)),
                     dtype_mismatch, "f16");
  EXPECT_KVLAB_ERROR(restored->update(token_block(be, {range_ids(1, 1)}, 3, 4), token_block(be, {range_ids(1, 1)}, 3, 4)),
                     shape_mismatch, "KVCache");
  const FetchedKV a = cache.update(token_block(be, {range_ids(6, 2)}, 2, 4), token_block(be, {range_ids(6, 2)}, 2, 4));
  const FetchedKV b =
      restored->update(token_block(be, {range_ids(6, 2)}, 2, 4), token_block(be, {range_ids(6, 2)}, 2, 4));
  EXPECT_EQ(token_ids(be, b.keys), range_ids(6, 2));
  EXPECT_EQ(token_ids(be, a.keys), token_ids(be, b.keys));
  EXPECT_EQ(restored->offsets(), cache.offsets());

  legacy.meta["offset"] = "1";  // zero rows never stand for a non-zero offset
  EXPECT_KVLAB_ERROR(KVCache::from_state(be, legacy), corrupt, "offset");
}

TEST(KVCache, StateWithWrongOffsetIsRejected) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(1, 5)}, 1, 4), token_block(be, {range_ids(1, 5)}, 1, 4));
  CacheState s = cache.state();
  s.meta["offset"] = "7";
  EXPECT_THROW(KVCache::from_state(be, s), Error);
}

TEST(KVCache, MisuseIsANamedErrorAndChangesNothing) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(1, 3)}, 2, 4), token_block(be, {range_ids(1, 3)}, 2, 4));
  EXPECT_THROW(cache.update_quantized(token_block(be, {range_ids(4, 1)}, 2, 4), token_block(be, {range_ids(4, 1)}, 2, 4)),
               Error);
  try {
    cache.update(token_block(be, {range_ids(4, 1)}, 3, 4), token_block(be, {range_ids(4, 1)}, 3, 4));
    FAIL() << "a head-count change must be rejected";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("(1, 3, 1, 4)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{3});
  EXPECT_EQ(token_ids(be, cache.fetch().keys), range_ids(1, 3));
}

// Rows never written and rows trimmed away hold NaN, so an off-by-one read by a later
// kernel fails loudly instead of returning stale data.
TEST(KVCache, UnusedAndTrimmedSlotsArePoison) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {range_ids(1, 3)}, 1, 2), token_block(be, {range_ids(1, 3)}, 1, 2));
  cache.trim(1);
  const Tensor keys = be.download(cache.key_buffer());
  const Tensor values = be.download(cache.value_buffer());
  for (std::int64_t row = 0; row < cache.capacity(); ++row) {
    const bool live = row < 2;
    EXPECT_EQ(std::isnan(keys.view().load(row * 2)), !live) << "key row " << row;
    EXPECT_EQ(std::isnan(values.view().load(row * 2 + 1)), !live) << "value row " << row;
  }
}

}  // namespace
}  // namespace test_kv_cache
}  // namespace kvlab
