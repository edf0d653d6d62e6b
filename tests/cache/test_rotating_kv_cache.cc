// RotatingKVCache (docs/semantics.md §Rotating cache): the traces docs/traces.md §T1, §T2,
// random-sequence properties against a list-of-tokens model, masks, state round trips, trim,
// poison, misuse. Token ids are 1-based positions (token p has id p), values carry id + 1000.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "cache/rotating_kv_cache.h"
#include "cache/seq_ops.h"
#include "reference/mask.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_rotating_kv_cache {
namespace {

using testing::token_block;
using testing::token_ids;
using Ids = std::vector<float>;

constexpr std::int64_t kHeads = 2, kDk = 4, kDv = 3;

Ids range_ids(std::int64_t first, std::int64_t n) {
  Ids ids;
  for (std::int64_t i = 0; i < n; ++i) ids.push_back(static_cast<float>(first + i));
  return ids;
}

Ids plus(Ids ids, float d) {
  for (float& x : ids) x += d;
  return ids;
}

// One update of the given token ids (keys = ids, values = ids + 1000, Dk != Dv).
FetchedKV feed(Backend& be, RotatingKVCache& c, const Ids& ids) {
  return c.update(token_block(be, {ids}, kHeads, kDk), token_block(be, {plus(ids, 1000)}, kHeads, kDv));
}

// Token ids of row 0 / head 0 / feature 0 of a host tensor (state tensors).
Ids host_ids(const Tensor& t) {
  Ids ids;
  const std::int64_t len = t.dim(2), dim = t.dim(3);
  for (std::int64_t s = 0; s < len; ++s) ids.push_back(t.view().load(s * dim));
  return ids;
}

Ids sorted(Ids v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Expected temporal content: all tokens, or the sinks plus the newest (len - keep).
Ids expected_temporal(std::int64_t offset, std::int64_t len, std::int64_t keep) {
  if (len >= offset) return range_ids(1, offset);
  Ids ids = range_ids(1, keep);
  const Ids tail = range_ids(offset - (len - keep) + 1, len - keep);
  ids.insert(ids.end(), tail.begin(), tail.end());
  return ids;
}

// Visibility of key column j for query i under a CacheMask over (n, lk).
bool visible(const CacheMask& m, std::int64_t i, std::int64_t j, std::int64_t n, std::int64_t lk) {
  switch (m.spec.kind) {
    case MaskKind::none: return true;
    case MaskKind::causal: return ref::causal_visible(m.spec, 0, i, j, n, lk);
    case MaskKind::boolean: return m.array->view().load_int(i * lk + j) != 0;
    default: ADD_FAILURE() << "unexpected mask kind"; return false;
  }
}

void expect_error(const std::function<void()>& f, ErrorKind kind, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- the traces of docs/traces.md -------------------------------------------------------------

TEST(RotatingKVCache, TraceA1MaxSize4Keep0) {
  ReferenceBackend be;
  RotatingKVCache c(be, 4);
  auto check = [&](const FetchedKV& kv, const Ids& returned, const Ids& buf, std::int64_t off, std::int64_t idx) {
    EXPECT_EQ(token_ids(be, kv.keys), returned);
    EXPECT_EQ(token_ids(be, kv.values), plus(returned, 1000));
    EXPECT_EQ(token_ids(be, c.key_buffer()), buf);
    EXPECT_EQ(token_ids(be, c.value_buffer()), plus(buf, 1000));
    EXPECT_EQ(c.offset(), off);
    EXPECT_EQ(c.cursor(), idx);
  };
  check(feed(be, c, {1, 2, 3}), {1, 2, 3}, {1, 2, 3}, 3, 3);
  EXPECT_EQ(c.make_mask(1, 0).spec.kind, MaskKind::none);
  check(feed(be, c, {4}), {1, 2, 3, 4}, {1, 2, 3, 4}, 4, 4);
  check(feed(be, c, {5}), {5, 2, 3, 4}, {5, 2, 3, 4}, 5, 1);  // physical order
  check(feed(be, c, {6}), {5, 6, 3, 4}, {5, 6, 3, 4}, 6, 2);
  check(feed(be, c, {7}), {5, 6, 7, 4}, {5, 6, 7, 4}, 7, 3);

  // N = 3 mask, built before the chunk: o = min(3, 7) = 3, W = 4, shape (3, 6).
  const CacheMask m = c.make_mask(3, 0);
  EXPECT_EQ(m.spec.kind, MaskKind::causal);
  EXPECT_EQ(m.spec.window, 4);
  EXPECT_EQ(c.next_key_count(3), 6);
  const int expected[3][6] = {{1, 1, 1, 1, 0, 0}, {0, 1, 1, 1, 1, 0}, {0, 0, 1, 1, 1, 1}};
  const Tensor ref_mask = ref::create_causal_mask(3, 3, 4, {}, {}, ref::MaskForm::boolean);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 6; ++j) {
      EXPECT_EQ(visible(m, i, j, 3, 6), expected[i][j] == 1) << "query " << i << " key " << j;
      EXPECT_EQ(ref_mask.view().load_int(i * 6 + j), expected[i][j]) << "query " << i << " key " << j;
    }

  check(feed(be, c, {8, 9, 10}), {5, 6, 7, 8, 9, 10}, {5, 6, 7, 8, 9, 10}, 10, 6);
  check(feed(be, c, {11}), {11, 8, 9, 10}, {11, 8, 9, 10}, 11, 1);

  const CacheState s = c.state();
  EXPECT_EQ(s.class_name, "RotatingKVCache");
  EXPECT_EQ(host_ids(s.tensors.at("keys")), (Ids{11, 8, 9, 10}));
  EXPECT_EQ(host_ids(s.tensors.at("values")), (Ids{1011, 1008, 1009, 1010}));
  const std::map<std::string, std::string> meta{{"keep", "0"}, {"max_size", "4"}, {"offset", "11"}, {"idx", "1"}};
  EXPECT_EQ(s.meta, meta);
  EXPECT_EQ(token_ids(be, c.temporal().keys), (Ids{8, 9, 10, 11}));
}

TEST(RotatingKVCache, TraceA2SinksStayPinned) {
  ReferenceBackend be;
  RotatingKVCache c(be, 6, 2);
  for (int t = 1; t <= 6; ++t) feed(be, c, {static_cast<float>(t)});
  EXPECT_EQ(c.cursor(), 6);
  feed(be, c, {7});
  EXPECT_EQ(token_ids(be, c.key_buffer()), (Ids{1, 2, 7, 4, 5, 6}));
  EXPECT_EQ(token_ids(be, c.temporal().keys), (Ids{1, 2, 4, 5, 6, 7}));
  EXPECT_EQ(token_ids(be, c.temporal().values), (Ids{1001, 1002, 1004, 1005, 1006, 1007}));
  feed(be, c, {8});
  const FetchedKV kv = feed(be, c, {9});
  EXPECT_EQ(token_ids(be, kv.keys), (Ids{1, 2, 7, 8, 9, 6}));
  EXPECT_EQ(token_ids(be, c.key_buffer()), (Ids{1, 2, 7, 8, 9, 6}));
  EXPECT_EQ(token_ids(be, c.temporal().keys), (Ids{1, 2, 6, 7, 8, 9}));
  EXPECT_EQ(c.cursor(), 5);
  EXPECT_EQ(c.kv_length(), 6);
}

// The first chunk is stored untrimmed even when S > max_size; the next single token
// cuts the buffer back to max_size before rotating.
TEST(RotatingKVCache, FirstChunkLongerThanMaxSizeIsKeptThenTrimmedByDecode) {
  ReferenceBackend be;
  RotatingKVCache c(be, 4);
  EXPECT_EQ(token_ids(be, feed(be, c, range_ids(1, 10)).keys), range_ids(1, 10));
  EXPECT_EQ(c.stored(), 10);
  EXPECT_EQ(c.next_key_count(1), 4);
  EXPECT_EQ(token_ids(be, feed(be, c, {11}).keys), (Ids{11, 8, 9, 10}));
  EXPECT_EQ(c.nbytes(), static_cast<std::size_t>(4 * kHeads * (kDk + kDv) * 4));
}

// ---- properties over random command sequences --------------------------------------

struct Trial {
  std::int64_t max_size, keep;
  std::vector<std::int64_t> chunks;  // token counts; 1 = decode
  std::vector<int> windows;          // mask window per step (0 = none)
};

Trial random_trial(testing::SeededRng& rng, bool decode_only) {
  Trial t;
  t.max_size = rng.integer(1, 12);
  t.keep = rng.integer(0, 1) == 0 ? 0 : rng.integer(0, t.max_size - 1);
  const auto steps = rng.integer(1, 30);
  for (std::int64_t i = 0; i < steps; ++i) {
    t.chunks.push_back(decode_only || rng.integer(0, 2) > 0 ? 1 : rng.integer(1, 20));
    t.windows.push_back(rng.integer(0, 1) == 0 ? 0 : static_cast<int>(rng.integer(1, t.max_size + 2)));
  }
  return t;
}

// Checks one step's observables against the token model; returns the fetched K/V.
FetchedKV checked_step(Backend& be, RotatingKVCache& c, std::int64_t s, int window) {
  const std::int64_t off = c.offset(), stored_before = c.stored(), keep = c.keep(), max = c.max_size();
  const CacheMask mask = c.make_mask(s, window);
  const std::int64_t lk = c.next_key_count(s);
  if (mask.array) {
    EXPECT_EQ(mask.array->shape(), (Shape{1, 1, s, lk}));
  }
  const FetchedKV kv = feed(be, c, range_ids(off + 1, s));
  const Ids got = token_ids(be, kv.keys), temporal = token_ids(be, c.temporal().keys);
  EXPECT_EQ(kv.length(), lk) << "mask key count vs returned keys";
  EXPECT_EQ(token_ids(be, kv.values), plus(got, 1000));
  EXPECT_EQ(c.offset(), off + s);
  if (s == 1) {
    EXPECT_EQ(sorted(got), sorted(temporal));  // same set, physical order
    EXPECT_EQ(c.stored(), std::min(c.offset(), max));
  } else {
    EXPECT_EQ(got, temporal);
    EXPECT_EQ(kv.length(), std::min(stored_before, max - 1) + s);
  }
  EXPECT_EQ(temporal, expected_temporal(c.offset(), c.stored(), keep));
  // Mask semantics: temporal rank of every returned key, then who may see it.
  std::vector<std::int64_t> rank(static_cast<std::size_t>(lk));
  for (std::int64_t j = 0; j < lk; ++j)
    rank[static_cast<std::size_t>(j)] =
        std::find(temporal.begin(), temporal.end(), got[static_cast<std::size_t>(j)]) - temporal.begin();
  const std::int64_t w = window > 0 ? window : (s > 1 ? max : lk);
  for (std::int64_t i = 0; i < s; ++i) {
    const float p = static_cast<float>(off + 1 + i);
    for (std::int64_t j = 0; j < lk; ++j) {
      const float tok = got[static_cast<std::size_t>(j)];
      // keep == 0: exactly the last W positions up to the query. keep > 0: by temporal
      // rank, the last W keys; but a chunk under the ring's own window that reaches past
      // it sees the sinks and the newest max − keep keys, as one token at a time would
      // (docs/semantics.md §Rotating cache; mlx-lm's plain window is §U10).
      const std::int64_t r = rank[static_cast<std::size_t>(j)], qrank = lk - s + i;  // new tokens are newest
      const bool sinks = keep > 0 && s > 1 && (window == 0 || window == max) && lk > max;
      const bool want = keep == 0 ? (tok <= p && tok > p - static_cast<float>(w))
                        : sinks   ? (r <= qrank && (r < keep || qrank - r < max - keep))
                                  : (r <= qrank && r > qrank - w);
      EXPECT_EQ(visible(mask, i, j, s, lk), want) << "query " << p << " key " << tok << " window " << window;
    }
  }
  // Live rows are data, every other row of the buffer is poison.
  const Ids buf = token_ids(be, c.key_buffer());
  for (std::size_t r = 0; r < buf.size(); ++r)
    EXPECT_EQ(std::isnan(buf[r]), static_cast<std::int64_t>(r) >= c.stored()) << "row " << r;
  return kv;
}

void run_trials(std::uint64_t seed, bool decode_only) {
  KVLAB_SEEDED_RNG(rng, seed);
  ReferenceBackend be;
  for (int trial = 0; trial < 150 && !::testing::Test::HasFailure(); ++trial) {
    const Trial t = random_trial(rng, decode_only);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " max_size " << t.max_size << " keep " << t.keep);
    RotatingKVCache c(be, t.max_size, t.keep);
    for (std::size_t i = 0; i < t.chunks.size() && !::testing::Test::HasFailure(); ++i) {
      SCOPED_TRACE(::testing::Message() << "step " << i << " S " << t.chunks[i]);
      checked_step(be, c, t.chunks[i], t.windows[i]);
    }
  }
}

TEST(RotatingKVCache, RandomChunksAndDecodesMatchTheTokenModel) { run_trials(20240611, false); }
TEST(RotatingKVCache, RandomDecodeOnlyKeepsSinks) { run_trials(77, true); }

// state -> from_state -> continue equals continue (DESIGN observable 5).
TEST(RotatingKVCache, StateRoundTripContinuesIdentically) {
  KVLAB_SEEDED_RNG(rng, 4242);
  ReferenceBackend be;
  for (int trial = 0; trial < 100 && !::testing::Test::HasFailure(); ++trial) {
    const Trial t = random_trial(rng, false);
    const auto cut = static_cast<std::size_t>(rng.integer(0, static_cast<std::int64_t>(t.chunks.size())));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " max_size " << t.max_size << " keep " << t.keep
                                      << " cut " << cut);
    RotatingKVCache a(be, t.max_size, t.keep);
    for (std::size_t i = 0; i < cut; ++i) feed(be, a, range_ids(a.offset() + 1, t.chunks[i]));
    auto b = RotatingKVCache::from_state(be, a.state());
    EXPECT_EQ(b->offset(), a.offset());
    EXPECT_EQ(b->cursor(), a.cursor());
    EXPECT_EQ(b->stored(), a.stored());
    for (std::size_t i = cut; i < t.chunks.size(); ++i) {
      const Ids ids = range_ids(a.offset() + 1, t.chunks[i]);
      const FetchedKV ka = feed(be, a, ids), kb = feed(be, *b, ids);
      EXPECT_EQ(token_ids(be, ka.keys), token_ids(be, kb.keys)) << "step " << i;
      EXPECT_EQ(token_ids(be, ka.values), token_ids(be, kb.values)) << "step " << i;
    }
    const CacheState sa = a.state(), sb = b->state();
    EXPECT_EQ(sa.meta, sb.meta);
    ASSERT_EQ(sa.tensors.size(), sb.tensors.size());
    for (const auto& [name, tensor] : sa.tensors) EXPECT_TRUE(testing::bit_equal(tensor, sb.tensors.at(name))) << name;
  }
}

TEST(RotatingKVCache, CorruptStatesAreRejectedNamingTheField) {
  ReferenceBackend be;
  RotatingKVCache c(be, 4);
  for (int t = 1; t <= 5; ++t) feed(be, c, {static_cast<float>(t)});  // ring, idx 1
  const CacheState good = c.state();
  ASSERT_NO_THROW(RotatingKVCache::from_state(be, good));
  struct Case {
    const char* what;
    std::function<void(CacheState&)> mutate;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"class", [](CacheState& s) { s.class_name = "KVCache"; }, "KVCache"},
      {"no offset", [](CacheState& s) { s.meta.erase("offset"); }, "'offset'"},
      {"no idx", [](CacheState& s) { s.meta.erase("idx"); }, "'idx'"},
      {"no keep", [](CacheState& s) { s.meta.erase("keep"); }, "'keep'"},
      {"no max_size", [](CacheState& s) { s.meta.erase("max_size"); }, "'max_size'"},
      {"text offset", [](CacheState& s) { s.meta["offset"] = "5x"; }, "'offset' = '5x'"},
      {"empty idx", [](CacheState& s) { s.meta["idx"] = ""; }, "'idx'"},
      {"max_size 0", [](CacheState& s) { s.meta["max_size"] = "0"; }, "'max_size'"},
      {"keep = max", [](CacheState& s) { s.meta["keep"] = "4"; }, "'keep' = 4"},
      {"offset < stored", [](CacheState& s) { s.meta["offset"] = "3"; }, "'offset' = 3"},
      {"idx > stored", [](CacheState& s) { s.meta["idx"] = "5"; }, "'idx' = 5"},
      {"negative idx", [](CacheState& s) { s.meta["idx"] = "-1"; }, "'idx' = -1"},
      {"ring idx < keep", [](CacheState& s) { s.meta["keep"] = "2"; }, "'idx' = 1"},
      {"no values", [](CacheState& s) { s.tensors.erase("values"); }, "no values"},
      {"extra tensor", [](CacheState& s) { s.tensors.emplace("scales", s.tensors.at("keys")); }, "'scales'"},
      {"short values",
       [](CacheState& s) { s.tensors["values"] = s.tensors.at("values").slice(2, 0, 3); },
       "disagree on (B, H, S)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    CacheState s = good;
    k.mutate(s);
    expect_error([&] { RotatingKVCache::from_state(be, s); }, ErrorKind::corrupt, k.needle);
  }
  // A linear (still filling) state with a cursor inside its rows is no layout either.
  RotatingKVCache filling(be, 8);
  feed(be, filling, range_ids(1, 3));
  CacheState s = filling.state();
  s.meta["idx"] = "2";
  expect_error([&] { RotatingKVCache::from_state(be, s); }, ErrorKind::corrupt, "'idx' = 2");
}

// ---- trim, poison, growth ------------------------------------------------------------

TEST(RotatingKVCache, TrimLowersOffsetAndCursorAndPoisonsRows) {
  ReferenceBackend be;
  RotatingKVCache c(be, 8);
  feed(be, c, range_ids(1, 5));
  feed(be, c, {6});  // grows 5 -> 8 rows
  EXPECT_EQ(seq::length(c.key_buffer()), 8);
  EXPECT_TRUE(c.is_trimmable());
  EXPECT_EQ(c.trim(2), 2);
  EXPECT_EQ(c.offset(), 4);
  EXPECT_EQ(c.cursor(), 4);
  const Ids buf = token_ids(be, c.key_buffer());
  for (std::size_t r = 0; r < buf.size(); ++r) EXPECT_EQ(std::isnan(buf[r]), r >= 4) << "row " << r;
  EXPECT_EQ(token_ids(be, feed(be, c, {5}).keys), range_ids(1, 5));  // the trimmed slot is reused
  // clamps to offset (docs/semantics.md §Common rules)
  EXPECT_EQ(c.trim(100), 5);
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(token_ids(be, feed(be, c, {1, 2}).keys), range_ids(1, 2));
  expect_error([&] { c.trim(-3); }, ErrorKind::invalid_argument, "n = -3");
  EXPECT_EQ(c.offset(), 2);
}

// A ring that wrapped cannot be trimmed: the rows a trim would expose are gone
// (mlx-vlm#1715: prefix reuse cut a ring with a raw slice and left _idx stale).
TEST(RotatingKVCache, WrappedRingIsNotTrimmable) {
  ReferenceBackend be;
  RotatingKVCache c(be, 4);
  for (int t = 1; t <= 6; ++t) feed(be, c, {static_cast<float>(t)});
  EXPECT_FALSE(c.is_trimmable());
  EXPECT_EQ(c.trim(2), 0);
  EXPECT_EQ(c.offset(), 6);
  EXPECT_EQ(c.cursor(), 2);
  EXPECT_EQ(token_ids(be, c.temporal().keys), range_ids(3, 4));
}

TEST(RotatingKVCache, GrowthIsStepBoundedAndUnusedRowsArePoison) {
  ReferenceBackend be;
  RotatingKVCache c(be, 300);
  feed(be, c, {1});
  EXPECT_EQ(seq::length(c.key_buffer()), 256);  // min(step, max_size)
  const Tensor keys = be.download(c.key_buffer()), values = be.download(c.value_buffer());
  for (std::int64_t r = 0; r < 256; ++r) {
    EXPECT_EQ(std::isnan(keys.view().load(r * kDk)), r >= 1) << "key row " << r;
    EXPECT_EQ(std::isnan(values.view().load(r * kDv + 2)), r >= 1) << "value row " << r;
  }
  EXPECT_EQ(c.nbytes(), static_cast<std::size_t>(kHeads * 256 * (kDk + kDv) * 4));
  for (int t = 2; t <= 257; ++t) feed(be, c, {static_cast<float>(t)});
  EXPECT_EQ(seq::length(c.key_buffer()), 300);  // 256 + min(step, 300 - 256)
  EXPECT_EQ(c.nbytes(), static_cast<std::size_t>(kHeads * 300 * (kDk + kDv) * 4));
}

// ---- adoption and mlx-lm#950 ---------------------------------------------------------

// An adopted row holds fewer tokens than offset and than max_size: mlx-lm would grow by
// min(step, max_size - offset) < 0 (mlx-lm#950). Here it grows to max_size and keeps the
// newest tokens, the returned keys never include poison.
TEST(RotatingKVCache, AdoptedShortBufferPastMaxSizeGrowsCorrectly) {
  ReferenceBackend be;
  RotatingKVCache c(be, 8, token_block(be, {range_ids(18, 3)}, kHeads, kDk),
                    token_block(be, {plus(range_ids(18, 3), 1000)}, kHeads, kDv), 20);
  EXPECT_EQ(c.kv_length(), 3);
  EXPECT_FALSE(c.is_trimmable());
  for (std::int64_t t = 21; t <= 40; ++t) {
    SCOPED_TRACE(t);
    const std::int64_t lk = c.next_key_count(1);
    const CacheMask m = c.make_mask(1, 4);
    const FetchedKV kv = feed(be, c, {static_cast<float>(t)});
    EXPECT_EQ(kv.length(), lk);
    const Ids got = token_ids(be, kv.keys);
    EXPECT_EQ(sorted(got), range_ids(t - lk + 1, lk));
    for (std::int64_t j = 0; j < lk; ++j)
      EXPECT_EQ(visible(m, 0, j, 1, lk), got[static_cast<std::size_t>(j)] > static_cast<float>(t - 4)) << j;
  }
  EXPECT_EQ(seq::length(c.key_buffer()), 8);
  // A chunk after adoption: o counts what is stored, so the mask matches the keys.
  RotatingKVCache d(be, 8, token_block(be, {range_ids(18, 3)}, kHeads, kDk),
                    token_block(be, {plus(range_ids(18, 3), 1000)}, kHeads, kDv), 20);
  EXPECT_EQ(d.next_key_count(4), 7);
  EXPECT_EQ(token_ids(be, feed(be, d, range_ids(21, 4)).keys), range_ids(18, 7));
}

TEST(RotatingKVCache, RestoredEmptyCacheWithOffsetPastMaxSize) {
  ReferenceBackend be;
  CacheState s{"RotatingKVCache", {}, {{"keep", "0"}, {"max_size", "4"}, {"offset", "10"}, {"idx", "0"}}};
  auto c = RotatingKVCache::from_state(be, s);
  EXPECT_TRUE(c->empty());
  EXPECT_EQ(token_ids(be, feed(be, *c, {11}).keys), (Ids{11}));
  EXPECT_EQ(seq::length(c->key_buffer()), 4);
  EXPECT_EQ(c->offsets(), std::vector<std::int32_t>{11});
}

// ---- masks -----------------------------------------------------------------------------

// mlx-lm rolls arange(L) >= L - W by _idx+1 into ring order (docs/semantics.md §Rotating cache,
// keep == 0).
TEST(RotatingKVCache, SingleTokenWindowMaskIsInRingOrder) {
  ReferenceBackend be;
  RotatingKVCache c(be, 4);
  feed(be, c, range_ids(1, 4));
  feed(be, c, {5});  // buf [5,2,3,4], idx 1; next write goes to slot 1
  const CacheMask m = c.make_mask(1, 2);
  ASSERT_EQ(m.spec.kind, MaskKind::boolean);
  ASSERT_EQ(m.array->shape(), (Shape{1, 1, 1, 4}));
  EXPECT_EQ(m.array->to_ints(), (std::vector<std::int64_t>{1, 1, 0, 0}));  // tokens 5, 6
  EXPECT_EQ(c.make_mask(1, 4).spec.kind, MaskKind::none);                   // max_size <= W
  RotatingKVCache small(be, 4);
  feed(be, small, {1});
  EXPECT_EQ(small.make_mask(1, 2).spec.kind, MaskKind::none);  // offset < W
  EXPECT_EQ(small.make_mask(2, 0).spec.kind, MaskKind::causal);
  EXPECT_EQ(small.make_mask(2, 0).spec.window, 0);  // o + N <= W: plain "causal"
}

// With sinks the ring is not a rotation of the temporal order, so the window is placed
// by temporal rank (mlx-lm's roll by _idx+1 would mark the wrong slots).
TEST(RotatingKVCache, SingleTokenWindowMaskWithSinks) {
  ReferenceBackend be;
  RotatingKVCache c(be, 6, 2);
  for (int t = 1; t <= 7; ++t) feed(be, c, {static_cast<float>(t)});  // [1,2,7,4,5,6], idx 3
  const CacheMask m = c.make_mask(1, 3);
  feed(be, c, {8});  // [1,2,7,8,5,6]: the last three are 6, 7, 8 in slots 5, 2, 3
  ASSERT_EQ(m.spec.kind, MaskKind::boolean);
  EXPECT_EQ(m.array->to_ints(), (std::vector<std::int64_t>{0, 0, 1, 1, 0, 1}));
}

// ---- misuse ----------------------------------------------------------------------------

TEST(RotatingKVCache, ConstructorMisuseNamesTheValue) {
  ReferenceBackend be;
  expect_error([&] { (void)RotatingKVCache(be, 0); }, ErrorKind::invalid_argument, "max_size = 0");
  expect_error([&] { (void)RotatingKVCache(be, -3); }, ErrorKind::invalid_argument, "max_size = -3");
  expect_error([&] { (void)RotatingKVCache(be, 4, -1); }, ErrorKind::invalid_argument, "keep = -1");
  expect_error([&] { (void)RotatingKVCache(be, 4, 4); }, ErrorKind::invalid_argument, "keep = 4");
  auto k = [&](std::int64_t len) { return token_block(be, {range_ids(1, len)}, kHeads, kDk); };
  auto v = [&](std::int64_t len) { return token_block(be, {range_ids(1, len)}, kHeads, kDv); };
  expect_error([&] { (void)RotatingKVCache(be, 4, k(5), v(5), 5); }, ErrorKind::invalid_argument, "L = 5");
  expect_error([&] { (void)RotatingKVCache(be, 4, k(3), v(3), 2); }, ErrorKind::invalid_argument, "offset = 2");
  const DTensor k2 = token_block(be, {range_ids(1, 2), range_ids(1, 2)}, kHeads, kDk);
  const DTensor v2 = token_block(be, {range_ids(1, 2), range_ids(1, 2)}, kHeads, kDv);
  expect_error([&] { (void)RotatingKVCache(be, 4, k2, v2, 2); }, ErrorKind::shape_mismatch, "(2, 2, 2, 4)");
}

TEST(RotatingKVCache, UpdateMisuseNamesTheValueAndChangesNothing) {
  ReferenceBackend be;
  RotatingKVCache c(be, 4);
  for (int t = 1; t <= 5; ++t) feed(be, c, {static_cast<float>(t)});
  const Ids before = token_ids(be, c.key_buffer());
  expect_error([&] { c.update(token_block(be, {{6}}, 3, kDk), token_block(be, {{6}}, 3, kDv)); },
               ErrorKind::shape_mismatch, "(1, 3, 1, 4)");
  expect_error([&] { c.update(token_block(be, {{6}}, kHeads, kDk), token_block(be, {{6}}, kHeads, 5)); },
               ErrorKind::shape_mismatch, "(1, 2, 1, 5)");
  expect_error(
      [&] {
        c.update(token_block(be, {{6, 7}}, kHeads, kDk, DType::f16), token_block(be, {{6, 7}}, kHeads, kDv, DType::f16));
      },
      ErrorKind::dtype_mismatch, "f16");
  expect_error([&] { c.make_mask(0, 0); }, ErrorKind::invalid_argument, "N = 0");
  expect_error([&] { c.make_mask(1, -2); }, ErrorKind::invalid_argument, "window -2");
  EXPECT_EQ(c.offset(), 5);
  EXPECT_EQ(c.cursor(), 1);
  EXPECT_EQ(token_ids(be, c.key_buffer()), before);
  EXPECT_EQ(token_ids(be, c.temporal().keys), range_ids(2, 4));
}

// Several equal-length rows move together (B = 2), each keeping its own tokens.
TEST(RotatingKVCache, BatchRowsMoveTogether) {
  ReferenceBackend be;
  RotatingKVCache c(be, 3);
  auto step = [&](const Ids& a) {
    return c.update(token_block(be, {a, plus(a, 500)}, kHeads, kDk), token_block(be, {a, plus(a, 500)}, kHeads, kDv));
  };
  step({1, 2});
  step({3});
  step({4});
  const FetchedKV kv = step({5, 6});
  EXPECT_EQ(token_ids(be, kv.keys, 0), (Ids{3, 4, 5, 6}));
  EXPECT_EQ(token_ids(be, kv.keys, 1), (Ids{503, 504, 505, 506}));
  EXPECT_EQ(token_ids(be, c.temporal().values, 1), (Ids{503, 504, 505, 506}));
}

}  // namespace
}  // namespace test_rotating_kv_cache
}  // namespace kvlab
