// BatchRotatingKVCache (docs/semantics.md §Batch rotating cache): the traces
// docs/traces.md §T4, §T5, a seeded model-based property test (masks, returned keys, extract,
// offsets), batch surgery, state, misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cache/batch_rotating_kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_batch_rotating_kv_cache {
namespace {

using testing::SeededRng;
using testing::token_block;
using testing::token_ids;
using Ids = std::vector<float>;
using Grid = std::vector<Ids>;  // [row][column] token ids
using MaskRows = std::vector<std::vector<std::vector<int>>>;

constexpr float kPad = -1;
constexpr float kPoison = -100;  // NaN poison as read back by Rig::keys_of
constexpr float kValueShift = 0.25f;  // values carry id + 0.25 so K/V mix-ups show

Grid shifted(const Grid& g, float by) {
  Grid out = g;
  for (auto& row : out)
    for (float& x : row) x += by;
  return out;
}

struct Rig {
  ReferenceBackend be;
  std::int64_t heads = 2, dim = 3;

  FetchedKV update(Cache& c, const Grid& tokens) {
    const FetchedKV kv = c.update(token_block(be, tokens, heads, dim), token_block(be, shifted(tokens, kValueShift), heads, dim));
    for (std::int64_t b = 0; b < kv.keys.shape[0]; ++b)
      EXPECT_EQ(shifted({keys_of(kv.keys, b)}, kValueShift)[0], values_of(kv.values, b)) << "row " << b;
    return kv;
  }
  // Token ids of one row; NaN poison (columns the cache padded itself) reads as kPoison.
  Ids keys_of(const DTensor& t, std::int64_t b = 0) {
    Ids ids = token_ids(be, t, b);
    for (float& x : ids) x = std::isnan(x) ? kPoison : x;
    return ids;
  }
  Ids values_of(const DTensor& t, std::int64_t b = 0) {  // poison reads as a shifted kPoison
    Ids ids = token_ids(be, t, b);
    for (float& x : ids) x = std::isnan(x) ? kPoison + kValueShift : x;
    return ids;
  }
  Ids buffer_row(const BatchRotatingKVCache& c, std::int64_t b) { return keys_of(c.key_buffer(), b); }
  Ids extracted(const BatchRotatingKVCache& c, std::int64_t b) {
    const FetchedKV kv = c.extract_rows(b);
    if (!kv.keys) return {};
    EXPECT_EQ(shifted({keys_of(kv.keys)}, kValueShift)[0], values_of(kv.values));
    return keys_of(kv.keys);
  }
};

MaskRows mask_rows(const CacheMask& m) {
  EXPECT_EQ(m.spec.kind, MaskKind::boolean);
  const Tensor& t = m.array.value();
  const auto ints = t.to_ints();
  MaskRows out(static_cast<std::size_t>(t.dim(0)));
  std::size_t at = 0;
  for (auto& row : out) {
    row.resize(static_cast<std::size_t>(t.dim(2)));
    for (auto& q : row)
      for (std::int64_t j = 0; j < t.dim(3); ++j) q.push_back(static_cast<int>(ints[at++]));
  }
  return out;
}

std::vector<std::int64_t> i64(std::initializer_list<std::int64_t> v) { return v; }

void expect_error(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needles.at(0);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

// ---- docs/traces.md §T4: left_padding goes negative ------------------------------------------

TEST(BatchRotatingKVCache, AppendixA4LeftPaddingGoesNegative) {
  Rig rig;
  BatchRotatingKVCache cache(rig.be, 4, {2, 0});
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{-2, 0}));
  rig.update(cache, {{kPad, kPad, 1, 2}, {5, 6, 7, 8}});
  EXPECT_EQ(cache.left_padding(), i64({2, 0}));
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{2, 4}));
  EXPECT_EQ(cache.cursor(), 4);
  EXPECT_FALSE(cache.rotated());
  const CacheState unrotated = cache.state();

  const MaskRows masks[] = {{{{1, 0, 1, 1}}, {{1, 1, 1, 1}}}, {{{1, 1, 1, 1}}, {{1, 1, 1, 1}}},
                            {{{1, 1, 1, 1}}, {{1, 1, 1, 1}}}};
  const std::vector<std::int64_t> lps[] = {{1, -1}, {0, -2}, {-1, -3}};
  const std::vector<std::int32_t> offs[] = {{3, 5}, {4, 6}, {5, 7}};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    EXPECT_EQ(mask_rows(cache.make_mask(1, 0)), masks[step]);
    const FetchedKV kv = rig.update(cache, {{100.0f + static_cast<float>(step)}, {200.0f + static_cast<float>(step)}});
    for (std::int64_t b = 0; b < 2; ++b) EXPECT_EQ(rig.keys_of(kv.keys, b), rig.buffer_row(cache, b));  // physical
    EXPECT_EQ(cache.left_padding(), lps[step]);
    EXPECT_EQ(cache.offsets(), offs[step]);
    EXPECT_EQ(cache.cursor(), step + 1);
    EXPECT_TRUE(cache.rotated());
    if (step == 0) {
      EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{100, kPad, 1, 2}));
      EXPECT_EQ(rig.buffer_row(cache, 1), (Ids{200, 6, 7, 8}));
    }
  }
  // mlx-lm#1114 / vllm-mlx#256: lp [-1, -3] must clamp to 0, not slice from the end.
  EXPECT_EQ(rig.extracted(cache, 0), (Ids{2, 100, 101, 102}));
  EXPECT_EQ(rig.extracted(cache, 1), (Ids{8, 200, 201, 202}));
  const auto e0 = cache.extract(0), e1 = cache.extract(1);
  EXPECT_EQ(rig.keys_of(e0->temporal().keys), (Ids{2, 100, 101, 102}));
  EXPECT_EQ(e0->offset(), 5);
  EXPECT_EQ(rig.keys_of(e1->temporal().values), (Ids{8.25f, 200.25f, 201.25f, 202.25f}));
  EXPECT_EQ(e1->offset(), 7);

  const CacheState s = cache.state();
  EXPECT_EQ(s.meta.at("max_size"), "4");
  EXPECT_EQ(s.meta.at("_offset"), "7");
  EXPECT_EQ(s.meta.at("_idx"), "3");
  EXPECT_EQ(s.meta.at("rotated"), "true");
  // docs/upstream-bugs.md §U5: mlx-lm's bool("False") is True. Here false stays false ...
  EXPECT_EQ(unrotated.meta.at("rotated"), "false");
  EXPECT_FALSE(BatchRotatingKVCache::from_state(rig.be, unrotated)->rotated());
  CacheState mlx_false = unrotated;
  mlx_false.meta["rotated"] = "False";
  EXPECT_FALSE(BatchRotatingKVCache::from_state(rig.be, mlx_false)->rotated());
  // ... and A.4's ('4','7','3','False') is a corrupt state: a cursor inside a full ring.
  CacheState flipped = s;
  flipped.meta["rotated"] = "False";
  expect_error([&] { BatchRotatingKVCache::from_state(rig.be, flipped); }, ErrorKind::corrupt, {"'rotated' False"});
  // Save -> load -> continue == continue.
  auto restored = BatchRotatingKVCache::from_state(rig.be, s);
  EXPECT_TRUE(restored->rotated());
  EXPECT_EQ(mask_rows(restored->make_mask(1, 0)), mask_rows(cache.make_mask(1, 0)));
  const FetchedKV a = rig.update(cache, {{103}, {203}}), b = rig.update(*restored, {{103}, {203}});
  for (std::int64_t r = 0; r < 2; ++r) EXPECT_EQ(rig.keys_of(a.keys, r), rig.keys_of(b.keys, r));
  EXPECT_EQ(restored->left_padding(), cache.left_padding());
  EXPECT_EQ(restored->offsets(), cache.offsets());
}

// ---- docs/traces.md §T5: right-padded prefill across two chunks ---------------------------------

TEST(BatchRotatingKVCache, AppendixA5RightPaddedPrefillAcrossChunks) {
  Rig rig;
  BatchRotatingKVCache cache(rig.be, 4, {0, 0});
  cache.prepare({}, {2, 5}, {3, 0});
  rig.update(cache, {{10, 11, kPad}, {20, 21, 22}});
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{3, 3}));
  EXPECT_EQ(cache.pending_lengths(), i64({2, 5}));
  // mlx-lm PR #1746: extracting now would carry the pads.
  expect_error([&] { cache.extract(0); }, ErrorKind::misuse, {"extract(0)", "finalize"});
  rig.update(cache, {{kPad, kPad}, {23, 24}});  // row 0 rolled right by 1 first
  EXPECT_EQ(cache.left_padding(), i64({1, 0}));
  EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{kPad, 10, 11, kPad, kPad}));
  EXPECT_EQ(rig.buffer_row(cache, 1), (Ids{20, 21, 22, 23, 24}));
  cache.finalize();
  EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{kPad, kPad, kPad, 10, 11}));
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{2, 5}));
  EXPECT_EQ(cache.left_padding(), i64({3, 0}));
  EXPECT_EQ(cache.cursor(), 5);
  EXPECT_FALSE(cache.pending_lengths());

  EXPECT_EQ(mask_rows(cache.make_mask(1, 0)), (MaskRows{{{1, 0, 1, 1}}, {{1, 1, 1, 1}}}));
  rig.update(cache, {{12}, {25}});  // trims 5 -> 4 (lp -= 1), rotates (lp -= 1), writes slot 0
  EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{12, kPad, 10, 11}));
  EXPECT_EQ(rig.buffer_row(cache, 1), (Ids{25, 22, 23, 24}));
  EXPECT_EQ(cache.left_padding(), i64({1, -2}));
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{3, 6}));
  const auto e0 = cache.extract(0), e1 = cache.extract(1);
  EXPECT_EQ(rig.keys_of(e0->temporal().keys), (Ids{10, 11, 12}));
  EXPECT_EQ(e0->offset(), 3);
  EXPECT_EQ(rig.keys_of(e1->temporal().keys), (Ids{22, 23, 24, 25}));
  EXPECT_EQ(e1->offset(), 6);
}

// mlx-vlm 75f50e84 (docs/upstream-bugs.md row 25): a final one-token prefill chunk while the right
// pad is pending goes through the concat path; mlx-lm raised "finalize() should be called".
TEST(BatchRotatingKVCache, SingleTokenChunkWhileRightPadPendingConcatenates) {
  Rig rig;
  BatchRotatingKVCache cache(rig.be, 4, {0, 0});
  cache.prepare({}, {1, 3}, {2, 0});
  rig.update(cache, {{10, kPad}, {20, 21}});
  const CacheMask m = cache.make_mask(1, 0);
  const FetchedKV kv = rig.update(cache, {{kPad}, {22}});
  EXPECT_EQ(m.array->dim(3), kv.length());
  EXPECT_EQ(rig.keys_of(kv.keys, 0), (Ids{kPad, 10, kPad}));  // the first pad was rolled to the front
  EXPECT_EQ(mask_rows(m)[1], (std::vector<std::vector<int>>{{1, 1, 1}}));
  cache.finalize();
  EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{kPad, kPad, 10}));
  EXPECT_EQ(cache.left_padding(), i64({2, 0}));
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{1, 3}));
}

// ---- seeded model-based property test ---------------------------------------------------
//
// The model keeps each row's real tokens. After every update it checks, per real query,
// that the mask computed before the update shows exactly the last min(W, n) real tokens
// up to the query among the returned keys (so padding and evicted columns are never
// visible and no real key is hidden), that the mask width equals the returned key count,
// and that extract(i) is the last min(offset_i, max_size) real tokens (docs/upstream-bugs.md row
// 7).

struct Model {
  Rig& rig;
  SeededRng& rng;
  std::int64_t max_size;
  int window;
  std::vector<Ids> rows;  // real tokens per row
  float next_id = 1;

  Ids fresh(std::int64_t n) {
    Ids ids;
    for (std::int64_t i = 0; i < n; ++i) ids.push_back(next_id++);
    return ids;
  }

  // One update of the chunk (pads are kPad); checks mask and fetched keys.
  void step(BatchRotatingKVCache& cache, const Grid& chunk) {
    const auto n = static_cast<std::int64_t>(chunk.at(0).size());
    const CacheMask mask = cache.make_mask(n, window);
    const FetchedKV kv = rig.update(cache, chunk);
    ASSERT_EQ(mask.array->shape(), (Shape{cache.batch_size(), 1, n, kv.length()}));
    const MaskRows m = mask_rows(mask);
    const std::int64_t w = window > 0 ? window : max_size;
    for (std::size_t b = 0; b < chunk.size(); ++b) {
      const Ids keys = rig.keys_of(kv.keys, static_cast<std::int64_t>(b));
      for (std::size_t i = 0; i < chunk[b].size(); ++i) {
        if (chunk[b][i] == kPad) continue;  // padding queries are unspecified (docs/kernels.md §Fully masked rows)
        rows[b].push_back(chunk[b][i]);
        Ids seen, expect;
        for (std::size_t j = 0; j < keys.size(); ++j)
          if (m[b][i][j]) seen.push_back(keys[j]);
        const auto count = static_cast<std::int64_t>(rows[b].size());
        expect.assign(rows[b].end() - std::min(w, count), rows[b].end());
        std::sort(seen.begin(), seen.end());
        ASSERT_EQ(seen, expect) << "row " << b << " query " << i << " of " << n;
      }
    }
  }

  void check_rows(const BatchRotatingKVCache& cache) {
    ASSERT_EQ(cache.batch_size(), static_cast<std::int64_t>(rows.size()));
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const auto count = static_cast<std::int64_t>(rows[b].size());
      EXPECT_EQ(cache.offsets()[b], count) << "row " << b;
      // The newest min(offset, max_size) tokens; one fewer is legitimate after a row's
      // right padding filled the last chunk: a concat keeps max_size − 1 old columns,
      // all the next query needs (mlx-lm keeps the same).
      const Ids got = rig.extracted(cache, static_cast<std::int64_t>(b));
      const auto n = static_cast<std::int64_t>(got.size());
      ASSERT_TRUE(n == std::min(max_size, count) || (n == max_size - 1 && n < count))
          << "row " << b << " extracted " << n << " of " << count << " tokens";
      ASSERT_EQ(got, Ids(rows[b].end() - n, rows[b].end())) << "row " << b;
    }
  }

  std::vector<std::int64_t> split(std::int64_t total) {
    std::vector<std::int64_t> sizes;
    while (total > 0) sizes.push_back(std::min(total, rng.integer(1, 5))), total -= sizes.back();
    return sizes;
  }

  // A fresh batch of b_count prompts, left- or right-padded, prefilled in random chunks.
  std::unique_ptr<BatchRotatingKVCache> prefill(std::int64_t b_count) {
    std::vector<std::int64_t> len(static_cast<std::size_t>(b_count));
    for (auto& l : len) l = rng.integer(1, 8);
    const std::int64_t p = *std::max_element(len.begin(), len.end());
    const bool right = rng.integer(0, 1) == 1;
    std::vector<std::int32_t> lp, lens, rp;
    for (const auto l : len) {
      lp.push_back(static_cast<std::int32_t>(right ? 0 : p - l));
      lens.push_back(static_cast<std::int32_t>(l));
      rp.push_back(static_cast<std::int32_t>(right ? p - l : 0));
    }
    auto cache = std::make_unique<BatchRotatingKVCache>(rig.be, max_size, lp);
    if (right) cache->prepare({}, lens, rp);
    const std::size_t first = rows.size();
    rows.resize(first + len.size());
    std::vector<Ids> prompt;
    for (std::size_t b = 0; b < len.size(); ++b) {
      Ids ids = fresh(len[b]);
      ids.insert(right ? ids.end() : ids.begin(), static_cast<std::size_t>(p - len[b]), kPad);
      prompt.push_back(ids);
    }
    Model sub = *this;  // the prefill is checked on its own rows first
    sub.rows.assign(len.size(), {});
    std::int64_t at = 0;
    for (const auto s : split(p)) {
      Grid chunk;
      for (const auto& ids : prompt) chunk.emplace_back(ids.begin() + at, ids.begin() + at + s);
      sub.step(*cache, chunk);
      at += s;
    }
    cache->finalize();
    for (std::size_t b = 0; b < len.size(); ++b) rows[first + b] = sub.rows[b];
    next_id = sub.next_id;
    return cache;
  }
};

TEST(BatchRotatingKVCache, PropertyMasksFetchAndExtractMatchModel) {
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    KVLAB_SEEDED_RNG(rng, 0xB207A7ull * 1000 + seed);
    Rig rig;
    rig.heads = rng.integer(1, 2);
    rig.dim = 2;
    const std::int64_t max_size = rng.integer(1, 6);
    Model model{rig, rng, max_size, rng.integer(0, 1) ? 0 : static_cast<int>(rng.integer(1, max_size)), {}};
    std::unique_ptr<BatchRotatingKVCache> cache = model.prefill(rng.integer(1, 4));
    model.check_rows(*cache);
    for (std::int64_t t = rng.integer(3, 14); t > 0 && !::testing::Test::HasFailure(); --t) {
      const std::int64_t op = rng.integer(0, 99);
      if (op < 55 || op >= 95) {  // decode one token per row
        Grid chunk;
        for (std::size_t b = 0; b < model.rows.size(); ++b) chunk.push_back(model.fresh(1));
        model.step(*cache, chunk);
      } else if (op < 67) {  // a multi-token continuation (e.g. speculative tokens)
        const std::int64_t s = rng.integer(2, 4);
        Grid chunk;
        for (std::size_t b = 0; b < model.rows.size(); ++b) chunk.push_back(model.fresh(s));
        model.step(*cache, chunk);
      } else if (op < 75) {  // filter a random non-empty subset in random order
        std::vector<std::int32_t> keep;
        for (std::int32_t b = 0; b < cache->batch_size(); ++b)
          if (rng.integer(0, 2) > 0) keep.push_back(b);
        if (keep.empty()) keep.push_back(0);
        std::shuffle(keep.begin(), keep.end(), rng.engine());
        cache->filter(keep);
        std::vector<Ids> rows;
        for (const auto b : keep) rows.push_back(model.rows[static_cast<std::size_t>(b)]);
        model.rows = rows;
      } else if (op < 85) {  // extend with a freshly prefilled batch
        const auto other = model.prefill(rng.integer(1, 2));
        cache->extend(*other);
      } else if (op < 90) {  // save -> load -> continue
        cache = BatchRotatingKVCache::from_state(rig.be, cache->state());
      } else if (cache->is_trimmable()) {
        std::int64_t fewest = 1 << 20;
        for (const auto& r : model.rows) fewest = std::min<std::int64_t>(fewest, static_cast<std::int64_t>(r.size()));
        if (fewest == 0) continue;
        const std::int64_t n = rng.integer(1, std::min<std::int64_t>(fewest, 3));
        ASSERT_EQ(cache->trim(n), n);
        for (auto& r : model.rows) r.resize(r.size() - static_cast<std::size_t>(n));
      }
      model.check_rows(*cache);
      EXPECT_EQ(cache->kv_length(), std::min(cache->columns_written(), max_size));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// ---- batch surgery -------------------------------------------------------------------------

TEST(BatchRotatingKVCache, FilterKeepsRowsWithoutShiftAndFiltersPendingLengths) {
  Rig rig;
  BatchRotatingKVCache cache(rig.be, 8, {0, 0, 0});
  cache.prepare({}, {1, 3, 2}, {2, 0, 1});
  rig.update(cache, {{10, kPad, kPad}, {20, 21, 22}, {30, 31, kPad}});
  // mlx-vlm 570afed3 / docs/upstream-bugs.md §U7: the pending target offsets follow the rows.
  cache.filter({2, 0});
  EXPECT_EQ(cache.pending_lengths(), i64({2, 1}));
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{3, 3}));
  cache.finalize();
  EXPECT_EQ(cache.left_padding(), i64({1, 2}));  // no left shift, unlike BatchKVCache
  EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{kPad, 30, 31}));
  EXPECT_EQ(rig.extracted(cache, 1), (Ids{10}));
  expect_error([&] { cache.filter({0, 2}); }, ErrorKind::invalid_argument, {"row 2", "2 rows"});
  expect_error([&] { cache.filter({}); }, ErrorKind::invalid_argument, {"no rows"});
  EXPECT_EQ(cache.batch_size(), 2);
}

TEST(BatchRotatingKVCache, ExtendLinearisesDifferentRingPhases) {
  Rig rig;
  BatchRotatingKVCache a(rig.be, 4, {1});
  rig.update(a, {{kPad, 1, 2}});
  for (float t : {3.0f, 4.0f, 5.0f}) rig.update(a, {{t}});  // grows to 4, then wraps twice: cursor 2, lp -1
  ASSERT_TRUE(a.rotated());
  BatchRotatingKVCache b(rig.be, 4, {0, 1});
  rig.update(b, {{7, 8}, {kPad, 9}});
  a.extend(b);
  EXPECT_FALSE(a.rotated());
  EXPECT_EQ(a.cursor(), 4);
  EXPECT_EQ(a.columns_written(), 6);  // max(_offset)
  EXPECT_EQ(a.left_padding(), i64({-1, 2, 3}));
  EXPECT_EQ(a.offsets(), (std::vector<std::int32_t>{5, 2, 1}));
  EXPECT_EQ(rig.extracted(a, 0), (Ids{2, 3, 4, 5}));
  EXPECT_EQ(rig.extracted(a, 1), (Ids{7, 8}));
  EXPECT_EQ(rig.extracted(a, 2), (Ids{9}));
  // b was not reordered or changed.
  EXPECT_EQ(b.batch_size(), 2);
  EXPECT_EQ(b.cursor(), 2);
  // The next decode: every row sees exactly its own tokens.
  const MaskRows m = mask_rows(a.make_mask(1, 0));
  const FetchedKV kv = rig.update(a, {{6}, {10}, {11}});
  const Ids expect[] = {{3, 4, 5, 6}, {7, 8, 10}, {9, 11}};
  for (std::size_t r = 0; r < 3; ++r) {
    Ids seen;
    const Ids keys = rig.keys_of(kv.keys, static_cast<std::int64_t>(r));
    for (std::size_t j = 0; j < keys.size(); ++j)
      if (m[r][0][j]) seen.push_back(keys[j]);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, expect[r]) << "row " << r;
  }

  BatchRotatingKVCache other_size(rig.be, 5, {0});
  expect_error([&] { a.extend(other_size); }, ErrorKind::invalid_argument, {"max_size 4", "max_size 5"});
  BatchRotatingKVCache pending(rig.be, 4, {0});
  pending.prepare({}, {1}, {1});
  expect_error([&] { a.extend(pending); }, ErrorKind::misuse, {"finalize"});
  EXPECT_EQ(a.batch_size(), 3);
  // Empty caches extend by metadata only.
  BatchRotatingKVCache e1(rig.be, 4, {1}), e2(rig.be, 4, {2});
  e1.extend(e2);
  EXPECT_TRUE(e1.empty());
  EXPECT_EQ(e1.offsets(), (std::vector<std::int32_t>{-1, -2}));
}

// Builds a RotatingKVCache(max_size) holding `prompt` then decoding `decode`.
std::unique_ptr<RotatingKVCache> single(Rig& rig, std::int64_t max_size, const Ids& prompt, const Ids& decode) {
  auto c = std::make_unique<RotatingKVCache>(rig.be, max_size);
  if (!prompt.empty()) rig.update(*c, {prompt});
  for (float t : decode) rig.update(*c, {{t}});
  return c;
}

TEST(BatchRotatingKVCache, MergeRightAlignsWithTrueOffsetsAndExtractInverts) {
  Rig rig;
  const auto r0 = single(rig, 4, {1, 2, 3}, {4, 5});  // wrapped ring, offset 5
  const auto r1 = single(rig, 4, {10, 11}, {});
  const auto r2 = single(rig, 4, {}, {});  // empty: skipped (mlx-vlm#1916)
  const auto merged = BatchRotatingKVCache::merge(rig.be, {r0.get(), r1.get(), r2.get()});
  EXPECT_EQ(merged->left_padding(), i64({0, 2, 4}));
  EXPECT_EQ(merged->offsets(), (std::vector<std::int32_t>{5, 2, 0}));
  EXPECT_EQ(merged->cursor(), 4);
  EXPECT_EQ(merged->columns_written(), 4);
  EXPECT_EQ(rig.buffer_row(*merged, 1), (Ids{kPoison, kPoison, 10, 11}));
  for (std::size_t b = 0; b < 2; ++b) {  // merge then extract is the identity
    const auto e = merged->extract(static_cast<std::int64_t>(b));
    const RotatingKVCache& src = b == 0 ? *r0 : *r1;
    EXPECT_EQ(rig.keys_of(e->temporal().keys), rig.keys_of(src.temporal().keys));
    EXPECT_EQ(e->offset(), src.offset());
  }
  EXPECT_TRUE(merged->extract(2)->empty());
  // Continuing the batch equals continuing each single cache.
  const MaskRows m = mask_rows(merged->make_mask(1, 0));
  const FetchedKV kv = rig.update(*merged, {{6}, {12}, {20}});
  const Ids expect[] = {{3, 4, 5, 6}, {10, 11, 12}, {20}};
  for (std::size_t r = 0; r < 3; ++r) {
    Ids seen;
    const Ids keys = rig.keys_of(kv.keys, static_cast<std::int64_t>(r));
    for (std::size_t j = 0; j < keys.size(); ++j)
      if (m[r][0][j]) seen.push_back(keys[j]);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, expect[r]) << "row " << r;
  }
  const auto odd = single(rig, 5, {1, 2}, {});
  expect_error([&] { BatchRotatingKVCache::merge(rig.be, {r0.get(), odd.get()}); }, ErrorKind::invalid_argument,
               {"cache 1 has max_size 5", "cache 0 has 4"});
  RotatingKVCache sinks(rig.be, 4, 2);
  expect_error([&] { BatchRotatingKVCache::merge(rig.be, {r0.get(), &sinks}); }, ErrorKind::invalid_argument,
               {"keep 2"});
  expect_error([&] { BatchRotatingKVCache::merge(rig.be, {}); }, ErrorKind::invalid_argument, {"no caches"});
  const auto all_empty = BatchRotatingKVCache::merge(rig.be, {r2.get(), r2.get()});
  EXPECT_TRUE(all_empty->empty());
  EXPECT_EQ(all_empty->batch_size(), 2);
}

// ---- trim, size, bytes, poison --------------------------------------------------------------

TEST(BatchRotatingKVCache, TrimSizeBytesAndPoison) {
  Rig rig;
  BatchRotatingKVCache cache(rig.be, 6, {1, 0});
  EXPECT_EQ(cache.nbytes(), 0u);
  rig.update(cache, {{kPad, 1}, {5, 6}});
  rig.update(cache, {{2}, {7}});  // in place: grows the 2 stored columns to max_size 6
  EXPECT_EQ(cache.capacity(), 6);
  EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(2 * 2 * 6 * 3 * 4 * 2));  // keys + values, f32
  EXPECT_EQ(rig.buffer_row(cache, 0), (Ids{kPad, 1, 2, kPoison, kPoison, kPoison}));
  EXPECT_EQ(cache.kv_length(), 3);
  EXPECT_TRUE(cache.is_trimmable());
  EXPECT_EQ(cache.trim(2), 2);
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(rig.buffer_row(cache, 1), (Ids{5, kPoison, kPoison, kPoison, kPoison, kPoison}));
  EXPECT_EQ(cache.trim(0), 0);
  for (float t : {3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f}) rig.update(cache, {{t}, {t + 10}});
  EXPECT_FALSE(cache.is_trimmable());
  EXPECT_EQ(cache.kv_length(), 6);
  expect_error([&] { cache.trim(1); }, ErrorKind::misuse, {"trim(1)", "max_size 6"});
  // 1 and 2 were trimmed; the wrap overwrote the pad column first (lp 1 -> 0).
  EXPECT_EQ(cache.left_padding(), i64({0, -1}));
  EXPECT_EQ(rig.extracted(cache, 0), (Ids{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(rig.extracted(cache, 1), (Ids{13, 14, 15, 16, 17, 18}));
}

// ---- misuse and corrupt states ------------------------------------------------------------

TEST(BatchRotatingKVCache, MisuseIsANamedErrorAndChangesNothing) {
  Rig rig;
  expect_error([&] { BatchRotatingKVCache(rig.be, 0, {0}); }, ErrorKind::invalid_argument, {"max_size 0"});
  expect_error([&] { BatchRotatingKVCache(rig.be, 4, {0, -3}); }, ErrorKind::invalid_argument, {"left_padding[1] = -3"});
  BatchRotatingKVCache cache(rig.be, 4, {0, 1});
  rig.update(cache, {{1, 2}, {kPad, 3}});
  const CacheState before = cache.state();
  expect_error([&] { rig.update(cache, {{4}}); }, ErrorKind::shape_mismatch, {"2 rows", "(1, 2, 1, 3)"});
  expect_error([&] { cache.update_quantized(token_block(rig.be, {{4}, {4}}, 2, 3), token_block(rig.be, {{4}, {4}}, 2, 3)); },
               ErrorKind::misuse, {"update_quantized"});
  expect_error([&] { cache.prepare({1, 1}, {}, {}); }, ErrorKind::misuse, {"left_padding [1, 1]", "only while empty"});
  expect_error([&] { cache.prepare({}, {}, {1, 0}); }, ErrorKind::invalid_argument, {"right_padding [1, 0]", "lengths"});
  expect_error([&] { cache.prepare({}, {1}, {1, 0}); }, ErrorKind::shape_mismatch, {"lengths has 1 entries"});
  expect_error([&] { cache.prepare({}, {1, 2}, {1, -1}); }, ErrorKind::invalid_argument, {"right_padding[1] = -1"});
  expect_error([&] { cache.make_mask(0, 0); }, ErrorKind::invalid_argument, {"N = 0"});
  expect_error([&] { cache.make_mask(1, -2); }, ErrorKind::invalid_argument, {"window -2"});
  expect_error([&] { cache.extract(2); }, ErrorKind::invalid_argument, {"row 2"});
  expect_error([&] { cache.trim(-1); }, ErrorKind::invalid_argument, {"-1"});
  cache.prepare({}, {1, 1}, {0, 1});
  expect_error([&] { cache.prepare({}, {1, 1}, {0, 1}); }, ErrorKind::misuse, {"pending", "finalize"});
  cache.finalize();
  const CacheState after = cache.state();
  EXPECT_EQ(after.meta, before.meta);
  EXPECT_EQ(after.tensors.at("offset").to_ints(), before.tensors.at("offset").to_ints());
  EXPECT_EQ(after.tensors.at("left_padding").to_ints(), before.tensors.at("left_padding").to_ints());
  EXPECT_EQ(rig.buffer_row(cache, 1), (Ids{kPad, 3}));
}

TEST(BatchRotatingKVCache, StateKeepsPendingLengthsAndRejectsCorruption) {
  Rig rig;
  BatchRotatingKVCache cache(rig.be, 4, {0, 0});
  cache.prepare({}, {1, 3}, {2, 0});
  rig.update(cache, {{10, kPad}, {20, 21}});
  const CacheState s = cache.state();
  ASSERT_EQ(s.tensors.count("lengths"), 1u);  // docs/upstream-bugs.md §U6: mlx-lm loses _lengths
  auto restored = BatchRotatingKVCache::from_state(rig.be, s);
  EXPECT_EQ(restored->pending_lengths(), i64({1, 3}));
  rig.update(*restored, {{kPad}, {22}});
  restored->finalize();
  EXPECT_EQ(rig.extracted(*restored, 0), (Ids{10}));
  EXPECT_EQ(restored->offsets(), (std::vector<std::int32_t>{1, 3}));

  const auto corrupt = [&](const std::function<void(CacheState&)>& edit, const std::string& needle) {
    CacheState bad = s;
    edit(bad);
    expect_error([&] { BatchRotatingKVCache::from_state(rig.be, bad); }, ErrorKind::corrupt, {needle});
  };
  corrupt([](CacheState& c) { c.class_name = "BatchKVCache"; }, "BatchKVCache");
  corrupt([](CacheState& c) { c.meta.erase("_idx"); }, "'_idx'");
  corrupt([](CacheState& c) { c.meta["_offset"] = "2x"; }, "'_offset' = '2x'");
  corrupt([](CacheState& c) { c.meta["max_size"] = "0"; }, "'max_size'");
  corrupt([](CacheState& c) { c.meta["rotated"] = "yes"; }, "'rotated' is 'yes'");
  corrupt([](CacheState& c) { c.meta["_idx"] = "1"; }, "'_idx' 1");
  corrupt([](CacheState& c) { c.tensors.erase("left_padding"); }, "'left_padding'");
  corrupt([](CacheState& c) { c.tensors["lengths"] = Tensor(DType::i32, {3}); }, "'lengths' has 3 rows");
  corrupt([](CacheState& c) { c.tensors["offset"] = Tensor(DType::f32, {2}); }, "'offset' is f32");
  corrupt([](CacheState& c) { c.tensors.erase("values"); }, "keys but no values");
  corrupt([](CacheState& c) { c.tensors["keys"] = Tensor(DType::f32, {1, 2, 2, 3}); }, "'keys'");
}

}  // namespace
}  // namespace test_batch_rotating_kv_cache
}  // namespace kvlab
