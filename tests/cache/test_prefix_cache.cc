// PrefixCache (docs/semantics.md §Prefix cache: mlx-lm LRUPromptCache, vllm-mlx
// MemoryAwarePrefixCache; docs/upstream-bugs.md rows 42, 48, 49, 54). Every layer is fed token-id
// K/V (cache_test_util.h), so a fetched cache is checked against a cache built from scratch on the
// matched tokens: same class, same offsets, bit-equal K/V (temporal order for rings, packed codes
// for quantized layers), and continuing it with the remaining tokens equals scratch on all.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>

#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {

// Readable failures for EXPECT_EQ on match kinds (found by ADL in kvlab).
void PrintTo(MatchKind kind, std::ostream* os) { *os << match_kind_name(kind); }

// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_prefix_cache {
namespace {

using testing::bit_equal;
using testing::token_block;
using testing::token_ids;
using Tokens = std::vector<std::int32_t>;
using Maker = std::function<std::unique_ptr<Cache>(Backend&, std::size_t layer)>;

constexpr std::int64_t kHeads = 2, kDim = 64;  // D = 64: one affine group of 64
constexpr std::size_t kLayers = 2;
const std::string kModel = "tiny-llama";

QuantSpec affine(int bits) { return QuantSpec::make(QuantMode::affine, bits, 64); }

Maker plain() {
  return [](Backend& be, std::size_t) { return std::make_unique<KVCache>(be); };
}
Maker quant(QuantSpec spec, Rounding r = Rounding::mlx_gpu) {
  return [=](Backend& be, std::size_t) { return std::make_unique<QuantizedKVCache>(be, spec, r); };
}
Maker rotating(std::int64_t max_size, std::int64_t keep = 0) {
  return [=](Backend& be, std::size_t) { return std::make_unique<RotatingKVCache>(be, max_size, keep); };
}
// Layer 0 full attention, layer 1 a sliding window (gemma-style hybrid).
Maker hybrid(std::int64_t window) {
  return [=](Backend& be, std::size_t layer) -> std::unique_ptr<Cache> {
    if (layer == 0) return std::make_unique<KVCache>(be);
    return std::make_unique<RotatingKVCache>(be, window, 0);
  };
}

// Feeds `tokens` to every layer in chunks of `chunk`: keys carry the token id (+1000 per
// layer), values the id + 500, so content is readable back.
void feed(Backend& be, LayerCaches& caches, const Tokens& tokens, std::size_t chunk = 3) {
  for (std::size_t at = 0; at < tokens.size(); at += chunk) {
    const std::size_t n = std::min(chunk, tokens.size() - at);
    for (std::size_t l = 0; l < caches.size(); ++l) {
      std::vector<float> k, v;
      for (std::size_t i = at; i < at + n; ++i) {
        k.push_back(static_cast<float>(tokens[i]) + 1000.0f * static_cast<float>(l));
        v.push_back(static_cast<float>(tokens[i]) + 500.0f + 1000.0f * static_cast<float>(l));
      }
      const DTensor kt = token_block(be, {k}, kHeads, kDim), vt = token_block(be, {v}, kHeads, kDim);
      if (caches[l]->is_quantized()) {
        caches[l]->update_quantized(kt, vt);
      } else {
        caches[l]->update(kt, vt);
      }
    }
  }
}

LayerCaches build(Backend& be, const Maker& make, const Tokens& tokens, std::size_t chunk = 3) {
  LayerCaches caches;
  for (std::size_t l = 0; l < kLayers; ++l) caches.push_back(make(be, l));
  feed(be, caches, tokens, chunk);
  return caches;
}

Tokens head(const Tokens& t, std::size_t n) { return Tokens(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)); }
Tokens tail(const Tokens& t, std::size_t n) { return Tokens(t.begin() + static_cast<std::ptrdiff_t>(n), t.end()); }
Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

::testing::AssertionResult same_tensor(Backend& be, const DTensor& a, const DTensor& b, const char* what) {
  if (!a && !b) return ::testing::AssertionSuccess();
  if (!a || !b) return ::testing::AssertionFailure() << what << ": one side is empty";
  auto r = bit_equal(be.download(a), be.download(b));
  if (!r) r << " (" << what << ")";
  return r;
}

// Same class, offsets and logical content (docs/design.md §Observables, item 2) per layer.
void expect_same_content(Backend& be, const LayerCaches& got, const LayerCaches& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t l = 0; l < got.size(); ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l);
    ASSERT_EQ(got[l]->class_name(), want[l]->class_name());
    EXPECT_EQ(got[l]->offsets(), want[l]->offsets());
    EXPECT_EQ(got[l]->kv_length(), want[l]->kv_length());
    if (const auto* g = dynamic_cast<const KVCache*>(got[l].get())) {
      const auto* w = dynamic_cast<const KVCache*>(want[l].get());
      EXPECT_TRUE(same_tensor(be, g->fetch().keys, w->fetch().keys, "keys"));
      EXPECT_TRUE(same_tensor(be, g->fetch().values, w->fetch().values, "values"));
    } else if (const auto* gr = dynamic_cast<const RotatingKVCache*>(got[l].get())) {
      const auto* wr = dynamic_cast<const RotatingKVCache*>(want[l].get());
      EXPECT_TRUE(same_tensor(be, gr->temporal().keys, wr->temporal().keys, "ring keys"));
      EXPECT_TRUE(same_tensor(be, gr->temporal().values, wr->temporal().values, "ring values"));
    } else {
      const auto* gq = dynamic_cast<const QuantizedKVCache*>(got[l].get());
      const auto* wq = dynamic_cast<const QuantizedKVCache*>(want[l].get());
      ASSERT_TRUE(gq && wq);
      const FetchedQuantizedKV a = gq->fetch(), b = wq->fetch();
      EXPECT_TRUE(same_tensor(be, a.keys.wq, b.keys.wq, "key codes"));
      EXPECT_TRUE(same_tensor(be, a.keys.scales, b.keys.scales, "key scales"));
      EXPECT_TRUE(same_tensor(be, a.keys.biases, b.keys.biases, "key biases"));
      EXPECT_TRUE(same_tensor(be, a.values.wq, b.values.wq, "value codes"));
      EXPECT_TRUE(same_tensor(be, a.values.scales, b.values.scales, "value scales"));
    }
  }
}

// The fetched caches equal scratch on the reused tokens, and after processing the
// remaining tokens they equal scratch on the whole request.
void expect_reuse_is_exact(Backend& be, const Maker& make, PrefixFetch& hit, const Tokens& request,
                           std::size_t chunk = 3) {
  ASSERT_EQ(hit.reused + hit.remaining.size(), request.size());
  EXPECT_EQ(hit.remaining, tail(request, hit.reused));
  expect_same_content(be, hit.caches, build(be, make, head(request, hit.reused), chunk));
  feed(be, hit.caches, hit.remaining, chunk);
  expect_same_content(be, hit.caches, build(be, make, request, chunk));
}

PrefixCache::Config no_drop() {
  PrefixCache::Config c;
  c.drop_trimmable_prefixes = false;
  return c;
}

std::size_t stored_bytes(const LayerCaches& caches) {
  std::size_t n = 0;
  for (const auto& c : caches) n += clone_cache(*c)->nbytes();
  return n;
}

const CacheFormat kPlain = CacheFormat::uniform(kLayers, CacheFormat::kv());

TEST(PrefixCache, FormatKeysNameClassAndQuantization) {
  ReferenceBackend be;
  EXPECT_EQ(CacheFormat::of(build(be, quant(affine(4)), {1, 2})).layers()[0], "QuantizedKVCache affine:b4:g64 mlx_gpu");
  EXPECT_EQ(CacheFormat::of(build(be, plain(), {1, 2})), kPlain);
  EXPECT_EQ(CacheFormat::of(build(be, hybrid(8), {1})).describe(), "[KVCache, RotatingKVCache max_size:8 keep:0]");
}

// mlx-lm (docs/semantics.md §Prefix cache): an exact hit is a deep copy with [] left to process.
TEST(PrefixCache, ExactHitReturnsEverythingAndNoRemainingTokens) {
  ReferenceBackend be;
  PrefixCache pc;
  const Tokens t{5, 6, 7, 8, 9, 10, 11};
  ASSERT_TRUE(pc.insert(kModel, kPlain, t, build(be, plain(), t)));
  PrefixFetch hit = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(hit.kind, MatchKind::exact);
  EXPECT_EQ(hit.reused, t.size());
  EXPECT_TRUE(hit.remaining.empty());
  EXPECT_EQ(hit.trimmed, 0u);
  expect_reuse_is_exact(be, plain(), hit, t);
  EXPECT_EQ(pc.stats().exact_hits, 1u);
}

// The model needs at least one token to produce logits; the option gives one back
// through trim() (only where every layer is trimmable).
TEST(PrefixCache, ExactHitCanKeepTheLastTokenToProcess) {
  ReferenceBackend be;
  PrefixCache::Config cfg;
  cfg.exact_keeps_last_token = true;
  PrefixCache pc(cfg);
  const Tokens t{5, 6, 7, 8, 9};
  pc.insert(kModel, kPlain, t, build(be, plain(), t));
  PrefixFetch hit = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(hit.kind, MatchKind::exact);
  EXPECT_EQ(hit.remaining, Tokens{9});
  EXPECT_EQ(hit.trimmed, 1u);
  expect_reuse_is_exact(be, plain(), hit, t);
  EXPECT_EQ(pc.fetch(kModel, kPlain, {5}).kind, MatchKind::miss);  // would reuse 0 tokens
}

// A longer stored sequence is trimmed through trim(), leaving one prompt token (mlx-lm);
// the trimmed rows are gone from the copy (vllm-mlx#384: no leak through state).
TEST(PrefixCache, LongerStoredSequenceIsTrimmedLeavingOneToken) {
  ReferenceBackend be;
  PrefixCache pc;
  const Tokens t{1, 2, 3, 4, 5, 6};
  pc.insert(kModel, kPlain, concat(t, {70, 71, 72}), build(be, plain(), concat(t, {70, 71, 72})));
  PrefixFetch hit = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(hit.kind, MatchKind::supersequence);
  EXPECT_EQ(hit.remaining, Tokens{6});
  EXPECT_EQ(hit.trimmed, 4u);
  const auto* kv = dynamic_cast<const KVCache*>(hit.caches[0].get());
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(token_ids(be, kv->fetch().keys), (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_EQ(token_ids(be, dynamic_cast<const KVCache&>(*hit.caches[1]).fetch().values),
            (std::vector<float>{1501, 1502, 1503, 1504, 1505}));
  expect_reuse_is_exact(be, plain(), hit, t);
  EXPECT_EQ(pc.stats().supersequence_hits, 1u);
}

TEST(PrefixCache, LongestStoredPrefixIsReusedWithoutTrim) {
  ReferenceBackend be;
  PrefixCache pc(no_drop());
  const Tokens t{1, 2, 3, 4, 5, 6, 7, 8};
  pc.insert(kModel, kPlain, head(t, 2), build(be, plain(), head(t, 2)));
  pc.insert(kModel, kPlain, head(t, 5), build(be, plain(), head(t, 5)));
  PrefixFetch hit = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(hit.kind, MatchKind::prefix);
  EXPECT_EQ(hit.reused, 5u);
  EXPECT_EQ(hit.trimmed, 0u);
  EXPECT_EQ(hit.remaining, (Tokens{6, 7, 8}));
  expect_reuse_is_exact(be, plain(), hit, t);
}

TEST(PrefixCache, LcpNeighbourIsTrimmedToTheCommonPrefix) {
  ReferenceBackend be;
  PrefixCache pc;
  const Tokens stored{1, 2, 3, 4, 90, 91, 92}, t{1, 2, 3, 4, 5, 6};
  pc.insert(kModel, kPlain, stored, build(be, plain(), stored));
  PrefixFetch hit = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(hit.kind, MatchKind::lcp);
  EXPECT_EQ(hit.reused, 4u);
  EXPECT_EQ(hit.trimmed, 3u);  // len(entry) − lcp (vllm-mlx)
  EXPECT_EQ(hit.remaining, (Tokens{5, 6}));
  expect_reuse_is_exact(be, plain(), hit, t);
  EXPECT_EQ(pc.fetch(kModel, kPlain, {2, 3}).kind, MatchKind::miss);  // no common prefix
}

// mlx-lm: the candidate reusing most tokens wins; equal reuse prefers no trim.
TEST(PrefixCache, MostReusedTokensWinThenLeastTrim) {
  ReferenceBackend be;
  PrefixCache pc(no_drop());
  for (const Tokens& s : {Tokens{1}, Tokens{1, 2, 3, 9}, Tokens{4, 5, 6}, Tokens{4, 5, 6, 7, 8}})
    pc.insert(kModel, kPlain, s, build(be, plain(), s));
  PrefixFetch a = pc.fetch(kModel, kPlain, {1, 2, 3, 4});
  EXPECT_EQ(a.kind, MatchKind::lcp);  // reuses 3, the stored prefix only 1
  EXPECT_EQ(a.reused, 3u);
  PrefixFetch b = pc.fetch(kModel, kPlain, {4, 5, 6, 7});
  EXPECT_EQ(b.kind, MatchKind::prefix);  // reuses 3 untrimmed; the longer one also 3, trimmed by 2
  EXPECT_EQ(b.reused, 3u);
  expect_reuse_is_exact(be, plain(), b, {4, 5, 6, 7});
}

// mlx-lm (docs/semantics.md §Prefix cache): a trimmable insert drops its stored prefixes (served
// through trim); an untrimmable one (wrapped ring) keeps them.
TEST(PrefixCache, TrimmableInsertDropsStoredPrefixes) {
  ReferenceBackend be;
  PrefixCache pc;
  pc.insert(kModel, kPlain, {1, 2}, build(be, plain(), {1, 2}));
  pc.insert(kModel, kPlain, {5, 9}, build(be, plain(), {5, 9}));
  pc.insert(kModel, kPlain, {1, 2, 3, 4}, build(be, plain(), {1, 2, 3, 4}));
  EXPECT_FALSE(pc.contains(kModel, kPlain, {1, 2}));
  EXPECT_TRUE(pc.contains(kModel, kPlain, {5, 9}));
  EXPECT_EQ(pc.stats().prefixes_dropped, 1u);
  EXPECT_EQ(pc.size(), 2u);
  EXPECT_EQ(pc.nbytes(), stored_bytes(build(be, plain(), {5, 9})) + stored_bytes(build(be, plain(), {1, 2, 3, 4})));
  PrefixFetch hit = pc.fetch(kModel, kPlain, {1, 2});
  EXPECT_EQ(hit.kind, MatchKind::supersequence);
  EXPECT_EQ(hit.reused, 1u);

  const Maker ring = hybrid(4);
  const CacheFormat f = CacheFormat::of(build(be, ring, {1}));
  const Tokens t{1, 2, 3, 4, 5, 6};
  pc.insert(kModel, f, head(t, 3), build(be, ring, head(t, 3), 1));
  pc.insert(kModel, f, t, build(be, ring, t, 1));  // layer 1 has wrapped
  EXPECT_TRUE(pc.contains(kModel, f, head(t, 3)));
}

// vllm-mlx#642 (docs/upstream-bugs.md row 48): stored snapshots are deep copies.
TEST(PrefixCache, StoredEntryIsIndependentOfFetchedAndOriginalCaches) {
  ReferenceBackend be;
  PrefixCache pc;
  const Tokens t{1, 2, 3, 4, 5};
  LayerCaches original = build(be, plain(), t);
  pc.insert(kModel, kPlain, t, original);
  // KVCache writes into its buffer in place: trimming and re-filling the original
  // overwrites exactly the rows an aliasing snapshot would share.
  for (auto& c : original) c->trim(3);
  feed(be, original, {60, 61, 62, 63});
  PrefixFetch first = pc.fetch(kModel, kPlain, t);
  for (auto& c : first.caches) c->trim(2);
  feed(be, first.caches, {80, 81, 82});
  PrefixFetch second = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(second.kind, MatchKind::exact);
  expect_same_content(be, second.caches, build(be, plain(), t));
  EXPECT_EQ(pc.nbytes(), stored_bytes(second.caches));
  // A trimming match trims the copy, never the stored entry.
  EXPECT_EQ(pc.fetch(kModel, kPlain, {1, 2, 3}).trimmed, 3u);
  EXPECT_EQ(pc.fetch(kModel, kPlain, {1, 2, 7}).trimmed, 3u);
  expect_same_content(be, pc.fetch(kModel, kPlain, t).caches, build(be, plain(), t));
}

// The key includes the quantization spec (SwiftLM PR 73 review; seed bug "a prefix
// cache mixing kv_bits"): the same tokens under another format are a miss.
TEST(PrefixCache, QuantizedAndUnquantizedStatesNeverMix) {
  ReferenceBackend be;
  PrefixCache pc;
  const Tokens t{3, 4, 5, 6, 7};
  const CacheFormat q4 = CacheFormat::uniform(kLayers, CacheFormat::quantized(affine(4), Rounding::mlx_gpu));
  const CacheFormat q8 = CacheFormat::uniform(kLayers, CacheFormat::quantized(affine(8), Rounding::mlx_gpu));
  const CacheFormat q4cpu = CacheFormat::uniform(kLayers, CacheFormat::quantized(affine(4), Rounding::mlx_cpu));
  pc.insert(kModel, kPlain, t, build(be, plain(), t));
  EXPECT_EQ(pc.fetch(kModel, q4, t).kind, MatchKind::miss);
  EXPECT_EQ(pc.fetch(kModel, q4, concat(t, {8})).kind, MatchKind::miss);

  pc.insert(kModel, q4, t, build(be, quant(affine(4)), t));
  EXPECT_EQ(pc.fetch(kModel, q8, t).kind, MatchKind::miss);     // another kv_bits
  EXPECT_EQ(pc.fetch(kModel, q4cpu, t).kind, MatchKind::miss);  // another rounding
  PrefixFetch as_plain = pc.fetch(kModel, kPlain, t);
  ASSERT_EQ(as_plain.kind, MatchKind::exact);
  EXPECT_FALSE(as_plain.caches[0]->is_quantized());
  PrefixFetch as_q4 = pc.fetch(kModel, q4, t);
  ASSERT_EQ(as_q4.kind, MatchKind::exact);
  EXPECT_EQ(CacheFormat::of(as_q4.caches), q4);
  EXPECT_EQ(pc.fetch("other-model", kPlain, t).kind, MatchKind::miss);
  // Storing a plain state under a quantized key is refused, naming both formats.
  EXPECT_KVLAB_ERROR(pc.insert(kModel, q8, t, build(be, plain(), t)), invalid_argument,
                     "layer 0 is 'KVCache' but the format key says 'QuantizedKVCache affine:b8:g64 mlx_gpu'");
  EXPECT_EQ(pc.size(), 2u);
}

// A quantized entry is restored from state + meta (maclocal-api#46) and trimmed by its
// own trim(): the packed rows equal a quantized cache built on the matched tokens.
TEST(PrefixCache, QuantizedEntryTrimsAndContinuesBitExactly) {
  ReferenceBackend be;
  PrefixCache pc;
  const Maker q = quant(affine(4), Rounding::mlx_cpu);
  const CacheFormat f = CacheFormat::of(build(be, q, {1}));
  const Tokens stored{11, 12, 13, 14, 15, 16, 17}, t{11, 12, 13, 14, 40, 41};
  pc.insert(kModel, f, stored, build(be, q, stored));
  PrefixFetch hit = pc.fetch(kModel, f, t);
  EXPECT_EQ(hit.kind, MatchKind::lcp);
  EXPECT_EQ(hit.reused, 4u);
  expect_reuse_is_exact(be, q, hit, t);
}

// mlx-vlm#1715 / #1748 (docs/upstream-bugs.md row 42): a wrapped ring cannot be trimmed, so entries
// with one are reused only as exact or stored-prefix matches; an unwrapped ring is
// trimmed through its own trim().
TEST(PrefixCache, WrappedRotatingLayersAreNotTrimmedForReuse) {
  ReferenceBackend be;
  const Maker m = hybrid(4);
  const CacheFormat f = CacheFormat::of(build(be, m, {1}));
  const Tokens t{1, 2, 3, 4, 5, 6};
  PrefixCache pc;
  LayerCaches wrapped = build(be, m, t, 1);
  ASSERT_FALSE(wrapped[1]->is_trimmable());
  pc.insert(kModel, f, t, wrapped);
  EXPECT_EQ(pc.fetch(kModel, f, head(t, 5)).kind, MatchKind::miss);              // supersequence
  EXPECT_EQ(pc.fetch(kModel, f, concat(head(t, 4), {50, 51})).kind, MatchKind::miss);  // lcp
  PrefixFetch more = pc.fetch(kModel, f, concat(t, {7, 8}));
  EXPECT_EQ(more.kind, MatchKind::prefix);
  expect_reuse_is_exact(be, m, more, concat(t, {7, 8}), 1);
  PrefixFetch exact = pc.fetch(kModel, f, t);
  EXPECT_EQ(exact.kind, MatchKind::exact);
  expect_same_content(be, exact.caches, build(be, m, t, 1));
  PrefixCache::Config keep;
  keep.exact_keeps_last_token = true;
  PrefixCache pk(keep);
  pk.insert(kModel, f, t, wrapped);
  EXPECT_EQ(pk.fetch(kModel, f, t).kind, MatchKind::miss);  // cannot give the last token back

  PrefixCache unwrapped;
  const Maker wide = hybrid(16);
  const CacheFormat fw = CacheFormat::of(build(be, wide, {1}));
  unwrapped.insert(kModel, fw, concat(t, {30, 31}), build(be, wide, concat(t, {30, 31}), 1));
  PrefixFetch hit = unwrapped.fetch(kModel, fw, concat(head(t, 4), {9, 10}));
  EXPECT_EQ(hit.kind, MatchKind::lcp);
  expect_reuse_is_exact(be, wide, hit, concat(head(t, 4), {9, 10}), 1);
}

// The window and sinks are part of the key; an unwrapped ring with sinks is trimmed
// through its own trim() and continues into the wrap like one built from scratch.
TEST(PrefixCache, UnwrappedRingWithSinksIsReusedOnlyUnderItsOwnWindow) {
  ReferenceBackend be;
  const Maker sinks = rotating(8, 2);
  const CacheFormat f = CacheFormat::of(build(be, sinks, {1}));
  const CacheFormat no_sinks = CacheFormat::uniform(kLayers, CacheFormat::rotating(8, 0));
  PrefixCache pc;
  const Tokens stored{1, 2, 3, 4, 5, 6, 7}, t{1, 2, 3, 4, 5, 20, 21, 22, 23, 24, 25};
  pc.insert(kModel, f, stored, build(be, sinks, stored, 1));
  EXPECT_EQ(pc.fetch(kModel, no_sinks, t).kind, MatchKind::miss);
  PrefixFetch hit = pc.fetch(kModel, f, t);
  EXPECT_EQ(hit.kind, MatchKind::lcp);
  EXPECT_EQ(hit.reused, 5u);
  expect_reuse_is_exact(be, sinks, hit, t, 1);
}

TEST(PrefixCache, LruEvictsByCountLeastRecentlyUsedFirst) {
  ReferenceBackend be;
  PrefixCache::Config cfg;
  cfg.max_entries = 2;
  PrefixCache pc(cfg);
  pc.insert(kModel, kPlain, {1, 1}, build(be, plain(), {1, 1}));
  pc.insert(kModel, kPlain, {2, 2}, build(be, plain(), {2, 2}));
  EXPECT_EQ(pc.fetch(kModel, kPlain, {1, 1}).kind, MatchKind::exact);  // {2,2} is now LRU
  pc.insert(kModel, kPlain, {3, 3}, build(be, plain(), {3, 3}));
  EXPECT_TRUE(pc.contains(kModel, kPlain, {1, 1}));
  EXPECT_FALSE(pc.contains(kModel, kPlain, {2, 2}));
  EXPECT_TRUE(pc.contains(kModel, kPlain, {3, 3}));
  pc.insert("m2", kPlain, {4, 4}, build(be, plain(), {4, 4}));  // one LRU across models
  EXPECT_FALSE(pc.contains(kModel, kPlain, {1, 1}));
  EXPECT_EQ(pc.stats().evicted_for_count, 2u);
  EXPECT_EQ(pc.stats().entries, 2u);
}

TEST(PrefixCache, LruEvictsByExactStoredBytes) {
  ReferenceBackend be;
  const std::size_t e = stored_bytes(build(be, plain(), {1, 1}));
  PrefixCache::Config cfg;
  cfg.max_bytes = 2 * e + e / 2;
  PrefixCache pc(cfg);
  for (std::int32_t i = 1; i <= 3; ++i) pc.insert(kModel, kPlain, {i, i}, build(be, plain(), {i, i}));
  EXPECT_FALSE(pc.contains(kModel, kPlain, {1, 1}));
  EXPECT_TRUE(pc.contains(kModel, kPlain, {2, 2}));
  EXPECT_EQ(pc.nbytes(), 2 * e);
  EXPECT_EQ(pc.stats().evicted_for_bytes, 1u);
  // Replacing a key re-counts its bytes instead of adding them.
  pc.insert(kModel, kPlain, {3, 3}, build(be, plain(), {3, 3}));
  EXPECT_EQ(pc.nbytes(), 2 * e);
  EXPECT_EQ(pc.stats().replaced, 1u);
  // An entry over the whole budget is not stored and evicts nothing.
  const Tokens big(700, 5);
  EXPECT_FALSE(pc.insert(kModel, kPlain, big, build(be, plain(), big, 256)));
  EXPECT_EQ(pc.size(), 2u);
  EXPECT_EQ(pc.stats().rejected_too_large, 1u);
}

// A stand-in for a class the registry cannot copy (SSM state).
class FakeArraysCache final : public Cache {
 public:
  using Cache::Cache;
  std::string_view class_name() const override { return "ArraysCache"; }
  std::int64_t kv_length() const override { return 0; }
  std::vector<std::int32_t> offsets() const override { return {2}; }
  CacheMask make_mask(std::int64_t, int) const override { return {}; }
  bool is_trimmable() const override { return false; }
  std::int64_t trim(std::int64_t) override { return 0; }
  bool empty() const override { return true; }
  std::size_t nbytes() const override { return 0; }
  CacheState state() const override { return {"ArraysCache", {}, {}}; }
  std::vector<SequenceContent> content(ContentForm) const override { return {SequenceContent{}}; }  // no K/V
  std::vector<BackingBuffer> buffers() const override { return {}; }
};

TEST(PrefixCache, MisuseErrorsNameTheValueAndLoseNothing) {
  ReferenceBackend be;
  PrefixCache pc;
  const Tokens t{1, 2};
  pc.insert(kModel, kPlain, t, build(be, plain(), t));
  EXPECT_KVLAB_ERROR(pc.insert(kModel, kPlain, {}, build(be, plain(), t)), invalid_argument, "empty token sequence");
  EXPECT_KVLAB_ERROR(pc.fetch(kModel, kPlain, {}), invalid_argument, "for model 'tiny-llama'");
  EXPECT_KVLAB_ERROR(pc.fetch("", kPlain, t), invalid_argument, "model id is empty");
  LayerCaches with_null = build(be, plain(), t);
  with_null[1].reset();
  EXPECT_KVLAB_ERROR(pc.insert(kModel, kPlain, t, with_null), invalid_argument, "layer 1 of 2 is null");
  LayerCaches three = build(be, plain(), t);
  three.push_back(std::make_unique<KVCache>(be));
  EXPECT_KVLAB_ERROR(pc.insert(kModel, kPlain, t, three), invalid_argument,
                     "3 layer caches for a format of 2 layers [KVCache, KVCache]");
  EXPECT_KVLAB_ERROR(pc.insert(kModel, kPlain, {1, 2, 3}, build(be, plain(), t)), invalid_argument,
                     "layer 0 has offset 2 (1 rows) but the key has 3 tokens [1, 2, 3]");
  LayerCaches odd;
  odd.push_back(std::make_unique<KVCache>(be));
  odd.push_back(std::make_unique<FakeArraysCache>(be));
  EXPECT_KVLAB_ERROR(CacheFormat::of(odd), unsupported, "'ArraysCache'");
  EXPECT_KVLAB_ERROR(CacheFormat({"KVCache", ""}), invalid_argument, "layer 1");
  PrefixCache::Config zero;
  zero.max_entries = 0;
  EXPECT_KVLAB_ERROR(PrefixCache{zero}, invalid_argument, "max_entries = 0");
  EXPECT_EQ(pc.size(), 1u);
  EXPECT_EQ(pc.stats().inserts, 1u);
  PrefixFetch hit = pc.fetch(kModel, kPlain, t);
  EXPECT_EQ(hit.kind, MatchKind::exact);
  expect_same_content(be, hit.caches, build(be, plain(), t));
}

TEST(PrefixCache, StatsCountHitsByKindAndDescribeThemselves) {
  ReferenceBackend be;
  PrefixCache pc(no_drop());
  pc.insert(kModel, kPlain, {1, 2, 3}, build(be, plain(), {1, 2, 3}));
  pc.fetch(kModel, kPlain, {1, 2, 3});
  pc.fetch(kModel, kPlain, {1, 2});
  pc.fetch(kModel, kPlain, {1, 2, 3, 4});
  pc.fetch(kModel, kPlain, {1, 5});
  pc.fetch(kModel, kPlain, {9});
  const PrefixCacheStats& s = pc.stats();
  EXPECT_EQ(s.exact_hits + s.supersequence_hits + s.prefix_hits + s.lcp_hits, 4u);
  EXPECT_EQ(s.hits(), 4u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.reused_tokens, 3u + 1u + 3u + 1u);
  EXPECT_NE(s.describe().find("hits 4 (exact 1, supersequence 1, prefix 1, lcp 1), misses 1"), std::string::npos)
      << s.describe();
}

}  // namespace
}  // namespace test_prefix_cache
}  // namespace kvlab
