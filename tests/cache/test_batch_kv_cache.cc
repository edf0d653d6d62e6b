// BatchKVCache (docs/semantics.md §Batch cache): the docs/traces.md §T3 trace, padding flows,
// filter / extend / extract / merge, snapshots of offsets, state, and misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cache/batch_kv_cache.h"
#include "cache/device_batch_kv_cache.h"
#include "reference/mask.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_batch_kv_cache {
namespace {

using testing::token_block;
using testing::token_ids;
using Ids = std::vector<float>;
using Rows = std::vector<std::vector<float>>;
using I32 = std::vector<std::int32_t>;
constexpr float kPad = -1.0f;

constexpr std::int64_t kHeads = 2, kDk = 4, kDv = 6;

// Keys carry the token id, values id + 1000, so a swap of the two is visible.
FetchedKV put(BatchKVCache& cache, const Rows& rows) {
  Backend& be = cache.backend();
  Rows values = rows;
  for (auto& r : values)
    for (float& x : r) x += 1000.0f;
  return cache.update(token_block(be, rows, kHeads, kDk), token_block(be, values, kHeads, kDv));
}

std::unique_ptr<KVCache> single(Backend& be, const Ids& ids) {
  auto c = std::make_unique<KVCache>(be);
  if (!ids.empty()) {
    Ids values = ids;
    for (float& x : values) x += 1000.0f;
    c->update(token_block(be, {ids}, kHeads, kDk), token_block(be, {values}, kHeads, kDv));
  }
  return c;
}

Ids plus(Ids ids, float d) {
  for (float& x : ids) x += d;
  return ids;
}

// The tokens a KVCache holds (keys), checking its values agree.
Ids held(const KVCache& c) {
  if (c.empty() || c.offset() == 0) return {};
  const FetchedKV kv = c.fetch();
  const Ids keys = token_ids(c.backend(), kv.keys);
  EXPECT_EQ(token_ids(c.backend(), kv.values), plus(keys, 1000.0f));
  return keys;
}

// The real tokens of row b: extract(b)'s content, which must also be its offset.
Ids row(const BatchKVCache& cache, std::int64_t b) {
  const auto c = cache.extract(b);
  EXPECT_EQ(c->offset(), std::max(0, cache.offsets()[static_cast<std::size_t>(b)])) << "row " << b;
  return held(*c);
}

// The structured mask, materialized per row with causal_visible (what SDPA does), and
// checked against create_causal_mask(n, _idx, window, left_padding) element by element.
std::vector<std::vector<int>> mask_rows(const BatchKVCache& cache, std::int64_t n, int window, std::int64_t b) {
  const CacheMask m = cache.make_mask(n, window);
  EXPECT_EQ(m.spec.kind, MaskKind::causal);
  EXPECT_FALSE(m.array.has_value());
  const std::int64_t lk = cache.idx() + n;
  const I32 lp = cache.left_padding();
  const Tensor ref = ref::create_causal_mask(n, cache.idx(), window, lp, {}, ref::MaskForm::boolean);
  EXPECT_EQ(ref.shape(), (Shape{cache.batch_size(), 1, n, lk}));
  std::vector<std::vector<int>> out;
  for (std::int64_t bb = 0; bb < cache.batch_size(); ++bb) {
    for (std::int64_t i = 0; i < n; ++i) {
      std::vector<int> r;
      for (std::int64_t j = 0; j < lk; ++j) {
        const int v = ref::causal_visible(m.spec, bb, i, j, n, lk) ? 1 : 0;
        EXPECT_EQ(v, ref.view().load_int((bb * n + i) * lk + j)) << "b " << bb << " i " << i << " j " << j;
        r.push_back(v);
      }
      if (bb == b) out.push_back(r);
    }
  }
  return out;
}

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a kvlab::Error";
  return Error(ErrorKind::internal, "none");
}

bool mentions(const Error& e, const std::string& s) { return std::string(e.what()).find(s) != std::string::npos; }

// ---- docs/traces.md §T3 -------------------------------------------------------------------------

TEST(BatchKVCache, AppendixA3Prefill) {
  ReferenceBackend be;
  BatchKVCache cache(be, {1, 3, 0});
  EXPECT_EQ(cache.offsets(), (I32{-1, -3, 0}));  // offset starts at −left_padding
  // The prefill mask is built before the update: row 1 sees only its one real token.
  EXPECT_EQ(mask_rows(cache, 4, 0, 1),
            (std::vector<std::vector<int>>{{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 1}}));
  const FetchedKV kv = put(cache, {{0, 1, 3, 5}, {0, 0, 0, 7}, {2, 6, 8, 9}});
  EXPECT_EQ(cache.offsets(), (I32{3, 1, 4}));
  EXPECT_EQ(cache.idx(), 4);
  EXPECT_EQ(cache.kv_length(), 4);
  EXPECT_EQ(kv.keys.shape, (Shape{3, kHeads, 4, kDk}));
  EXPECT_EQ(kv.values.shape, (Shape{3, kHeads, 4, kDv}));
  EXPECT_EQ(token_ids(be, kv.keys, 1), (Ids{0, 0, 0, 7}));
  EXPECT_EQ(token_ids(be, kv.values, 2), (Ids{1002, 1006, 1008, 1009}));
  EXPECT_EQ(row(cache, 0), (Ids{1, 3, 5}));
  EXPECT_EQ(row(cache, 1), (Ids{7}));
  EXPECT_EQ(row(cache, 2), (Ids{2, 6, 8, 9}));
}

TEST(BatchKVCache, AppendixA3DecodeMaskAndFilter) {
  ReferenceBackend be;
  BatchKVCache cache(be, {1, 3, 0});
  put(cache, {{0, 1, 3, 5}, {0, 0, 0, 7}, {2, 6, 8, 9}});
  // make_mask(1) is a mask even for one token (padding must stay hidden).
  std::vector<std::vector<int>> decode;
  for (std::int64_t b = 0; b < 3; ++b) decode.push_back(mask_rows(cache, 1, 0, b)[0]);
  EXPECT_EQ(decode, (std::vector<std::vector<int>>{{0, 1, 1, 1, 1}, {0, 0, 0, 1, 1}, {1, 1, 1, 1, 1}}));

  cache.filter({1});  // shifts left by min(left_padding) = 3
  EXPECT_EQ(token_ids(be, cache.fetch().keys), (Ids{7}));
  EXPECT_EQ(cache.left_padding(), (I32{0}));
  EXPECT_EQ(cache.idx(), 1);
  EXPECT_EQ(cache.offsets(), (I32{1}));
  EXPECT_EQ(cache.capacity(), 256 - 3);  // mlx-lm slices keys[..., 3:, :]
}

TEST(BatchKVCache, AppendixA3RightPaddingFlow) {
  ReferenceBackend be;
  BatchKVCache cache(be, {0, 0});
  cache.prepare(std::nullopt, I32{2, 0});
  put(cache, {{10, 11, kPad, kPad}, {20, 21, 22, 23}});
  EXPECT_EQ(cache.offsets(), (I32{4, 4}));  // the pads still count until finalize
  EXPECT_EQ(cache.right_padding(), (I32{2, 0}));
  cache.finalize();
  EXPECT_FALSE(cache.right_padding().has_value());
  EXPECT_EQ(cache.offsets(), (I32{2, 4}));
  EXPECT_EQ(cache.left_padding(), (I32{2, 0}));
  // Row 0 rolled right by 2 over the whole capacity: mlx-lm's zeros are poison here (the
  // wrapped-around unused capacity), the pads sit past _idx.
  const Ids buf = token_ids(be, cache.key_buffer(), 0);
  EXPECT_TRUE(std::isnan(buf[0]) && std::isnan(buf[1]));
  EXPECT_EQ((Ids{buf[2], buf[3], buf[4], buf[5]}), (Ids{10, 11, kPad, kPad}));
  EXPECT_EQ(row(cache, 0), (Ids{10, 11}));
  EXPECT_EQ(row(cache, 1), (Ids{20, 21, 22, 23}));
  // Decoding continues at the right positions.
  put(cache, {{12}, {24}});
  EXPECT_EQ(row(cache, 0), (Ids{10, 11, 12}));
  EXPECT_EQ(cache.offsets(), (I32{3, 5}));
}

// A full buffer (C == _idx): the pads wrap to the front, covered by the left padding.
TEST(BatchKVCache, FinalizeOnAFullBufferWrapsPadsToTheFront) {
  ReferenceBackend be;
  auto a = single(be, {1, 2, 3}), b = single(be, {4, 5, 6});
  const KVCache* parts[] = {a.get(), b.get()};
  auto cache = BatchKVCache::merge(be, parts);  // capacity exactly 3
  cache->prepare(std::nullopt, I32{1, 0});
  EXPECT_EQ(cache->capacity(), 3);
  cache->finalize();  // row 0's token 3 was a pad
  EXPECT_EQ(token_ids(be, cache->key_buffer(), 0), (Ids{3, 1, 2}));
  EXPECT_EQ(row(*cache, 0), (Ids{1, 2}));
  EXPECT_EQ(row(*cache, 1), (Ids{4, 5, 6}));
}

// ---- growth, masks, trim ------------------------------------------------------------------

TEST(BatchKVCache, GrowsLikeKVCacheAndCountsBytesExactly) {
  ReferenceBackend be;
  BatchKVCache cache(be, {0, 2});
  put(cache, {{1, 2, 3}, {kPad, kPad, 3}});
  EXPECT_EQ(cache.capacity(), 256);
  EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(2 * kHeads * 256 * (kDk + kDv) * 4));
  Rows big(2, Ids(300, 7.0f));
  put(cache, big);
  EXPECT_EQ(cache.capacity(), 3 + 512);  // cut to the cursor, then two steps
  EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(2 * kHeads * 515 * (kDk + kDv) * 4));
  EXPECT_EQ(cache.offsets(), (I32{303, 301}));
  EXPECT_EQ(row(cache, 1).front(), 3.0f);
}

TEST(BatchKVCache, WindowedMaskMatchesCreateCausalMask) {
  ReferenceBackend be;
  BatchKVCache cache(be, {2, 0});
  put(cache, {{kPad, kPad, 1, 2, 3}, {4, 5, 6, 7, 8}});
  // A window of 3 over offset _idx = 5 with 2 queries; mask_rows checks every element.
  EXPECT_EQ(mask_rows(cache, 2, 3, 0), (std::vector<std::vector<int>>{{0, 0, 0, 1, 1, 1, 0}, {0, 0, 0, 0, 1, 1, 1}}));
  EXPECT_EQ(cache.make_mask(2, 3).spec.window, 3);
}

TEST(BatchKVCache, TrimMovesTheCursorAndPoisons) {
  ReferenceBackend be;
  BatchKVCache cache(be, {3, 0});
  put(cache, {{kPad, kPad, kPad, 1}, {5, 6, 7, 8}});
  EXPECT_TRUE(cache.is_trimmable());
  EXPECT_EQ(cache.trim(2), 2);
  EXPECT_EQ(cache.offsets(), (I32{-1, 2}));  // row 0 is back before its prefill
  EXPECT_TRUE(std::isnan(token_ids(be, cache.key_buffer(), 1)[2]));
  EXPECT_EQ(cache.trim(10), 2);
  EXPECT_EQ(cache.idx(), 0);
}

// ---- extract / merge ------------------------------------------------------------------------

TEST(BatchKVCache, MergeThenExtractIsTheIdentity) {
  ReferenceBackend be;
  auto a = single(be, {1, 2, 3}), empty = single(be, {}), c = single(be, {7, 8, 9, 10, 11});
  const KVCache* parts[] = {a.get(), empty.get(), c.get()};
  auto batch = BatchKVCache::merge(be, parts);
  EXPECT_EQ(batch->left_padding(), (I32{2, 5, 0}));
  EXPECT_EQ(batch->offsets(), (I32{3, 0, 5}));
  EXPECT_EQ(batch->idx(), 5);
  EXPECT_EQ(batch->capacity(), 5);  // mlx-lm allocates exactly the longest
  for (std::int64_t b = 0; b < 3; ++b) {
    const auto out = batch->extract(b);
    EXPECT_EQ(held(*out), held(*parts[b])) << "row " << b;
    EXPECT_EQ(out->offset(), parts[b]->offset());
  }
  EXPECT_TRUE(batch->extract(1)->empty());
  // Merging only empty caches gives an empty batch (mlx-lm returns BatchKVCache([0]*B)).
  const KVCache* none[] = {empty.get(), empty.get()};
  auto nothing = BatchKVCache::merge(be, none);
  EXPECT_TRUE(nothing->empty());
  EXPECT_EQ(nothing->offsets(), (I32{0, 0}));
}

TEST(BatchKVCache, ExtractClampsPaddingAndTrimmedRows) {
  ReferenceBackend be;
  BatchKVCache cache(be, {3, 0});
  put(cache, {{kPad, kPad, kPad, 1}, {5, 6, 7, 8}});
  cache.trim(2);  // left_padding 3 > _idx 2
  EXPECT_TRUE(cache.extract(0)->empty());
  EXPECT_EQ(row(cache, 1), (Ids{5, 6}));
  BatchKVCache fresh(be, {4});
  EXPECT_TRUE(fresh.extract(0)->empty());
}

TEST(BatchKVCache, ExtractDuringPendingRightPaddingIsRejected) {
  ReferenceBackend be;
  BatchKVCache cache(be, {0, 0});
  cache.prepare(std::nullopt, I32{2, 0});
  put(cache, {{10, 11, kPad, kPad}, {20, 21, 22, 23}});
  const Error e = error_of([&] { cache.extract(0); });
  EXPECT_EQ(e.kind(), ErrorKind::misuse);  // mlx-lm PR #1746: it returned the pads
  EXPECT_TRUE(mentions(e, "right_padding[0] = 2")) << e.what();
  EXPECT_EQ(cache.offsets(), (I32{4, 4}));
}

// ---- filter / extend --------------------------------------------------------------------------

TEST(BatchKVCache, FilterThenExtendPreservesRowsAndOffsets) {
  ReferenceBackend be;
  BatchKVCache a(be, {2, 0, 1});
  put(a, {{kPad, kPad, 1, 2}, {3, 4, 5, 6}, {kPad, 7, 8, 9}});
  put(a, {{10}, {11}, {12}});
  a.filter({2, 0});  // min padding 1 → shift
  EXPECT_EQ(a.left_padding(), (I32{0, 1}));
  EXPECT_EQ(a.offsets(), (I32{4, 3}));
  EXPECT_EQ(row(a, 0), (Ids{7, 8, 9, 12}));
  EXPECT_EQ(row(a, 1), (Ids{1, 2, 10}));

  // A longer batch with a different capacity (merge allocates exactly 7).
  auto x = single(be, {20, 21, 22, 23, 24, 25, 26}), y = single(be, {30, 31});
  const KVCache* parts[] = {x.get(), y.get()};
  auto b = BatchKVCache::merge(be, parts);
  a.extend(*b);
  EXPECT_EQ(a.batch_size(), 4);
  EXPECT_EQ(a.idx(), 7);
  EXPECT_EQ(a.capacity(), 256 - 1);  // max of the capacities
  EXPECT_EQ(a.offsets(), (I32{4, 3, 7, 2}));
  EXPECT_EQ(a.left_padding(), (I32{3, 4, 0, 5}));
  const std::vector<Ids> want = {{7, 8, 9, 12}, {1, 2, 10}, {20, 21, 22, 23, 24, 25, 26}, {30, 31}};
  for (std::int64_t r = 0; r < 4; ++r) EXPECT_EQ(row(a, r), want[static_cast<std::size_t>(r)]) << "row " << r;
  put(a, {{13}, {14}, {27}, {32}});
  EXPECT_EQ(row(a, 3), (Ids{30, 31, 32}));
  EXPECT_EQ(a.offsets(), (I32{5, 4, 8, 3}));
}

TEST(BatchKVCache, ExtendWithEmptyCaches) {
  ReferenceBackend be;
  BatchKVCache e1(be, {1}), e2(be, {2, 0});
  e1.extend(e2);  // both empty: only the metadata is concatenated
  EXPECT_TRUE(e1.empty());
  EXPECT_EQ(e1.offsets(), (I32{-1, -2, 0}));

  BatchKVCache full(be, {1, 0});
  put(full, {{kPad, 1, 2}, {3, 4, 5}});
  BatchKVCache placeholder(be, {0, 0, 0});
  full.extend(placeholder);  // mlx-lm#1141: the empty side keeps its own batch size (3)
  EXPECT_EQ(full.batch_size(), 5);
  EXPECT_EQ(full.offsets(), (I32{2, 3, 0, 0, 0}));
  EXPECT_EQ(full.left_padding(), (I32{1, 0, 3, 3, 3}));
  EXPECT_TRUE(full.extract(3)->empty());
  EXPECT_EQ(row(full, 1), (Ids{3, 4, 5}));

  BatchKVCache empty_first(be, {0});
  empty_first.extend(full);
  EXPECT_EQ(empty_first.batch_size(), 6);
  EXPECT_EQ(empty_first.offsets(), (I32{0, 2, 3, 0, 0, 0}));
  EXPECT_EQ(row(empty_first, 1), (Ids{1, 2}));
  put(empty_first, {{40}, {6}, {7}, {41}, {42}, {43}});
  EXPECT_EQ(row(empty_first, 0), (Ids{40}));
  EXPECT_EQ(row(empty_first, 2), (Ids{3, 4, 5, 7}));
}

TEST(BatchKVCache, ExtendAcrossDifferentCapacities) {
  ReferenceBackend be;
  BatchKVCache small(be, {0}), large(be, {0});
  put(small, {{1, 2, 3}});
  put(large, {Ids(300, 9.0f)});
  small.extend(large);
  EXPECT_EQ(small.capacity(), 512);
  EXPECT_EQ(small.offsets(), (I32{3, 300}));
  EXPECT_EQ(row(small, 0), (Ids{1, 2, 3}));
  EXPECT_EQ(row(small, 1), Ids(300, 9.0f));
}

// docs/upstream-bugs.md §U7: mlx-lm's filter keeps _right_padding at the old batch size.
TEST(BatchKVCache, FilterAlsoFiltersPendingRightPadding) {
  ReferenceBackend be;
  BatchKVCache cache(be, {0, 0, 0});
  cache.prepare(std::nullopt, I32{2, 0, 1});
  put(cache, {{1, 2, kPad, kPad}, {3, 4, 5, 6}, {7, 8, 9, kPad}});
  cache.filter({2, 0});
  EXPECT_EQ(cache.right_padding(), (I32{1, 2}));
  cache.finalize();
  EXPECT_EQ(row(cache, 0), (Ids{7, 8, 9}));
  EXPECT_EQ(row(cache, 1), (Ids{1, 2}));
}

// ---- end to end ---------------------------------------------------------------------------------

// docs/lifecycle.md §Offset snapshot: batched prefill + decode with unequal prompts gives, for
// every real query, the attention output of running that row alone (the mask is built before the
// update).
TEST(BatchKVCache, BatchedAttentionEqualsPerRowAttention) {
  ReferenceBackend be;
  constexpr std::int64_t kQHeads = 4;  // GQA, R = 2
  const Rows prompts = {{0.3f, -0.2f}, {0.1f, 0.4f, -0.3f, 0.2f}, {-0.1f, 0.25f, 0.5f}};
  const Rows decode = {{0.7f}, {-0.4f}, {0.15f}};
  const I32 lp = {2, 0, 1};
  const auto attend = [&](Cache& cache, const Rows& rows) {
    const auto n = static_cast<std::int64_t>(rows[0].size());
    const CacheMask mask = cache.make_mask(n, 0);
    Rows values = rows;
    for (auto& r : values)
      for (float& x : r) x += 1000.0f;
    const FetchedKV kv =
        cache.update(token_block(be, rows, kHeads, kDk), token_block(be, values, kHeads, kDv));
    AttentionParams params;
    params.mask = mask.spec;
    DTensor out = be.allocate(DType::f32, {static_cast<std::int64_t>(rows.size()), kQHeads, n, kDv});
    be.sdpa({token_block(be, rows, kQHeads, kDk), kv.keys, kv.values, params, nullptr, nullptr, out});
    return be.download(out);
  };
  BatchKVCache batch(be, lp);
  Rows padded;
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    padded.push_back(Ids(static_cast<std::size_t>(lp[b]), 9.0f));  // junk pads must not leak
    padded.back().insert(padded.back().end(), prompts[b].begin(), prompts[b].end());
  }
  const Tensor batch_prefill = attend(batch, padded);
  const Tensor batch_decode = attend(batch, decode);
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    KVCache alone(be);
    const Tensor prefill = attend(alone, {prompts[b]});
    const Tensor step = attend(alone, {decode[b]});
    const auto len = static_cast<std::int64_t>(prompts[b].size());
    const auto bb = static_cast<std::int64_t>(b);
    for (std::int64_t h = 0; h < kQHeads; ++h) {
      for (std::int64_t d = 0; d < kDv; ++d) {
        for (std::int64_t t = 0; t < len; ++t) {
          EXPECT_NEAR(batch_prefill.view().load(((bb * kQHeads + h) * 4 + lp[b] + t) * kDv + d),
                      prefill.view().load((h * len + t) * kDv + d), 1e-4)
              << "prefill b " << b << " h " << h << " t " << t;
        }
        EXPECT_NEAR(batch_decode.view().load((bb * kQHeads + h) * kDv + d), step.view().load(h * kDv + d), 1e-4)
            << "decode b " << b << " h " << h;
      }
    }
  }
}

// ---- snapshots, state, misuse -------------------------------------------------------------------

// docs/lifecycle.md §Offset snapshot (mlx-lm#1097, #1848): offsets() is a value; nothing the caller
// holds moves.
TEST(BatchKVCache, OffsetsAreValueSnapshots) {
  ReferenceBackend be;
  BatchKVCache cache(be, {1, 0});
  I32 before = cache.offsets();
  put(cache, {{kPad, 1}, {2, 3}});
  EXPECT_EQ(before, (I32{-1, 0}));
  I32 snap = cache.offsets();
  snap[0] = 99;
  EXPECT_EQ(cache.offsets(), (I32{1, 2}));
  const I32 held_snap = cache.offsets();
  put(cache, {{4}, {5}});
  cache.filter({1});
  EXPECT_EQ(held_snap, (I32{1, 2}));
}

TEST(BatchKVCache, StateRoundTripsIncludingPendingRightPadding) {
  ReferenceBackend be;
  BatchKVCache cache(be, {1, 0});
  cache.prepare(std::nullopt, I32{0, 1});
  put(cache, {{kPad, 1, 2}, {3, 4, kPad}});
  const CacheState s = cache.state();
  EXPECT_EQ(s.tensors.count("right_padding"), 1u);  // docs/upstream-bugs.md §U6
  auto restored = BatchKVCache::from_state(be, s);
  EXPECT_EQ(restored->right_padding(), (I32{0, 1}));
  for (BatchKVCache* c : {&cache, restored.get()}) {
    c->finalize();
    put(*c, {{5}, {6}});
  }
  EXPECT_EQ(restored->offsets(), cache.offsets());
  EXPECT_EQ(restored->left_padding(), cache.left_padding());
  for (std::int64_t b = 0; b < 2; ++b) EXPECT_EQ(row(*restored, b), row(cache, b));
  EXPECT_EQ(row(cache, 1), (Ids{3, 4, 6}));

  BatchKVCache empty(be, {2, 1});
  auto empty_back = BatchKVCache::from_state(be, empty.state());
  EXPECT_TRUE(empty_back->empty());
  EXPECT_EQ(empty_back->offsets(), (I32{-2, -1}));
}

// Both batch classes read 'idx' through the one strict reader (a mutation survivor: the
// device class had its own parser, which accepted " 3" and "+3", and a check of it that no
// test reached).
TEST(BatchKVCache, IdxIsReadStrictlyByEveryBatchClass) {
  ReferenceBackend be;
  const CacheState host = BatchKVCache(be, {1, 0}).state(), device = DeviceBatchKVCache(be, {1, 0}).state();
  for (const char* idx : {" 3", "+3", "3x", "-1", "", "2147483648"}) {
    SCOPED_TRACE(cat("idx = '", idx, "'"));
    CacheState h = host, d = device;
    h.meta["idx"] = d.meta["idx"] = idx;
    for (const Error& e : {error_of([&] { BatchKVCache::from_state(be, h); }),
                           error_of([&] { DeviceBatchKVCache::from_state(be, d); })}) {
      EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
      EXPECT_TRUE(mentions(e, cat("'idx' = '", idx, "'"))) << e.what();
    }
  }
  // The lower limit, 0 (an empty cache), loads in both (a mutation survivor: idx >= 1).
  EXPECT_TRUE(BatchKVCache::from_state(be, host)->empty());
  EXPECT_TRUE(DeviceBatchKVCache::from_state(be, device)->empty());
}

TEST(BatchKVCache, CorruptStateIsRejectedNamingTheField) {
  ReferenceBackend be;
  BatchKVCache cache(be, {1, 0});
  put(cache, {{kPad, 1, 2}, {3, 4, 5}});
  const CacheState good = cache.state();
  auto expect_corrupt = [&](CacheState s, const std::string& field) {
    const Error e = error_of([&] { BatchKVCache::from_state(be, s); });
    EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
    EXPECT_TRUE(mentions(e, field)) << e.what();
  };
  CacheState s = good;
  s.tensors.at("offset") = Tensor::from_ints(DType::i32, {2}, std::vector<std::int64_t>{2, 2});
  expect_corrupt(s, "'offset'[1] = 2");
  s = good;
  s.meta["idx"] = "3x";
  expect_corrupt(s, "'idx' = '3x'");
  s = good;
  s.meta.erase("idx");
  expect_corrupt(s, "'idx'");
  s = good;
  s.tensors.erase("values");
  expect_corrupt(s, "1 of the 2");
  s = good;
  s.tensors.emplace("right_padding", Tensor::from_ints(DType::i32, {2}, std::vector<std::int64_t>{0, -1}));
  expect_corrupt(s, "'right_padding'[1] = -1");
  s = good;
  s.tensors.at("left_padding") = Tensor::from_ints(DType::i32, {3}, std::vector<std::int64_t>{1, 0, 0});
  expect_corrupt(s, "'offset' has 2 entries for 3");
  s = good;
  s.tensors.emplace("keys_scales", good.tensors.at("offset"));
  expect_corrupt(s, "unexpected tensor 'keys_scales'");
  s = good;
  s.class_name = "KVCache";
  expect_corrupt(s, "KVCache");
}

TEST(BatchKVCache, MisuseIsANamedErrorAndChangesNothing) {
  ReferenceBackend be;
  EXPECT_TRUE(mentions(error_of([&] { BatchKVCache bad(be, {0, -2}); }), "left_padding[1] = -2"));
  BatchKVCache cache(be, {1, 0});
  put(cache, {{kPad, 1, 2}, {3, 4, 5}});
  const auto unchanged = [&] {
    EXPECT_EQ(cache.offsets(), (I32{2, 3}));
    EXPECT_EQ(cache.left_padding(), (I32{1, 0}));
    EXPECT_EQ(row(cache, 0), (Ids{1, 2}));
  };
  Error e = error_of([&] { cache.filter({0, 5}); });
  EXPECT_TRUE(mentions(e, "batch index 5")) << e.what();
  e = error_of([&] { cache.filter({1, 1}); });
  EXPECT_TRUE(mentions(e, "batch index 1 appears more than once")) << e.what();
  e = error_of([&] { cache.prepare(I32{1, 1}); });
  EXPECT_EQ(e.kind(), ErrorKind::misuse);
  e = error_of([&] { cache.prepare(std::nullopt, I32{1}); });
  EXPECT_TRUE(mentions(e, "1 entries for 2 sequences")) << e.what();
  e = error_of([&] { put(cache, {{6}}); });
  EXPECT_EQ(e.kind(), ErrorKind::shape_mismatch);
  e = error_of([&] {
    cache.update_quantized(token_block(be, {{6}, {7}}, kHeads, kDk), token_block(be, {{6}, {7}}, kHeads, kDk));
  });
  EXPECT_EQ(e.kind(), ErrorKind::misuse);
  e = error_of([&] { cache.extract(2); });
  EXPECT_TRUE(mentions(e, "extract(2)")) << e.what();
  e = error_of([&] { cache.make_mask(0, 0); });
  EXPECT_TRUE(mentions(e, "N = 0")) << e.what();
  e = error_of([&] { cache.trim(-1); });
  EXPECT_TRUE(mentions(e, "-1")) << e.what();
  // An incompatible cache (other head dim) is rejected and neither side changes.
  BatchKVCache other(be, {0});
  other.update(token_block(be, {{9}}, kHeads, 8), token_block(be, {{9}}, kHeads, kDv));
  e = error_of([&] { cache.extend(other); });
  EXPECT_EQ(e.kind(), ErrorKind::shape_mismatch);
  EXPECT_TRUE(mentions(e, "keys")) << e.what();
  EXPECT_EQ(other.offsets(), (I32{1}));
  BatchKVCache half(be, {0});
  half.update(token_block(be, {{9}}, kHeads, kDk, DType::f16), token_block(be, {{9}}, kHeads, kDv, DType::f16));
  EXPECT_EQ(error_of([&] { cache.extend(half); }).kind(), ErrorKind::dtype_mismatch);
  // Finalize with a pad longer than the row.
  BatchKVCache pad(be, {0});
  pad.prepare(std::nullopt, I32{3});
  pad.update(token_block(be, {{1, 2}}, kHeads, kDk), token_block(be, {{1, 2}}, kHeads, kDv));
  e = error_of([&] { pad.finalize(); });
  EXPECT_TRUE(mentions(e, "right_padding[0] = 3 exceeds the 2 tokens")) << e.what();
  EXPECT_EQ(pad.offsets(), (I32{2}));
  unchanged();
  // merge of a batch-2 KVCache is rejected, naming the cache.
  KVCache two(be);
  two.update(token_block(be, {{1}, {2}}, kHeads, kDk), token_block(be, {{1}, {2}}, kHeads, kDv));
  const KVCache* parts[] = {&two};
  e = error_of([&] { BatchKVCache::merge(be, parts); });
  EXPECT_TRUE(mentions(e, "cache 0")) << e.what();
}

// The batch verbs through Cache::batch() (cache/batch_cache.h): the same cache, no cast;
// extend with a cache of another class is a misuse naming both classes, and a cache
// without the verbs says which verb it lacks.
TEST(BatchKVCache, BatchVerbsThroughTheCacheInterface) {
  ReferenceBackend be;
  BatchKVCache cache(be, {1, 0});
  Cache& any = cache;
  ASSERT_EQ(any.batch(), static_cast<BatchCache*>(&cache));
  BatchCache& verbs = batch_verbs(any, "filter");
  put(cache, {{kPad, 1, 2}, {3, 4, 5}});
  BatchKVCache joiner(be, {0});
  put(joiner, {{6}});
  verbs.extend(joiner);
  EXPECT_EQ(verbs.batch_size(), 3);
  EXPECT_EQ(token_ids(be, verbs.extract_sequence(2)->content()[0].part("keys")), (Ids{6}));
  verbs.filter({2, 0});
  EXPECT_EQ(cache.offsets(), (I32{1, 2}));
  KVCache plain(be);
  Error e = error_of([&] { verbs.extend(plain); });
  EXPECT_EQ(e.kind(), ErrorKind::misuse);
  EXPECT_TRUE(mentions(e, "extend() of a BatchKVCache with a KVCache")) << e.what();
  EXPECT_EQ(cache.offsets(), (I32{1, 2}));
  EXPECT_EQ(plain.batch(), nullptr);
  e = error_of([&] { batch_verbs(plain, "finalize"); });
  EXPECT_EQ(e.kind(), ErrorKind::misuse);
  EXPECT_TRUE(mentions(e, "finalize() needs a batch cache")) << e.what();
  EXPECT_TRUE(mentions(e, "KVCache")) << e.what();
}

}  // namespace
}  // namespace test_batch_kv_cache
}  // namespace kvlab
