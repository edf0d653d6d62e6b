// The batch hooks (fault-injection points of the zoo) and two batch properties:
//   B4 BatchRotatingKVCache: extract(i) == the newest min(offset_i, max_size) real tokens
//      of row i in temporal order (docs/semantics.md §Batch rotating cache,
//      docs/upstream-bugs.md row 7; vllm-mlx#256, mlx-lm#1114)
//   B5 PrefixCache: a hit has exactly the per-layer format (class, quantization spec)
//      of the request (docs/semantics.md §Prefix cache; SharpAI/SwiftLM PR 73 review)
// and the property list the zoo runs after all_properties().
#include <algorithm>
#include <memory>
#include <string>

#include "cache/cache_script.h"
#include "cache/catalogue.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "cache/seq_ops.h"
#include "property_tests/batch_util.h"
#include "property_tests/properties.h"
#include "property_tests/repro_line.h"

namespace kvlab::prop {

using batch::block;
using batch::expect_same_tensor;
using batch::gen_split;
using batch::held_rows;
using batch::row_block;
using batch::verbs;

BatchHooks production_batch_hooks() {
  BatchHooks h;
  h.wrap = [](std::unique_ptr<Cache> c) { return c; };
  h.restore = cache_from_state;
  h.merge = merge_batch;
  h.prefix_fetch = [](PrefixCache& pc, const std::string& model, const CacheFormat& format,
                      const std::vector<std::int32_t>& tokens) { return pc.fetch(model, format, tokens); };
  h.prefix_insert = [](PrefixCache& pc, const std::string& model, const CacheFormat& format,
                       const std::vector<std::int32_t>& tokens, const LayerCaches& caches) {
    return pc.insert(model, format, tokens, caches);
  };
  return h;
}

std::unique_ptr<Cache> merge_batch(Backend& be, std::span<const Cache* const> rows) {
  KVLAB_REQUIRE(!rows.empty() && rows[0] != nullptr, invalid_argument, "merge of no caches");
  const CacheKindInfo* row = kind_of(*rows[0]);
  const CacheKind k = row == nullptr ? CacheKind::device_batch_kv : row->kind;
  KVLAB_REQUIRE(k == CacheKind::kv || k == CacheKind::quantized || k == CacheKind::rotating, misuse, "merge of ",
                rows[0]->class_name(), " rows: only KVCache, QuantizedKVCache and RotatingKVCache rows merge");
  const CacheKind batch = k == CacheKind::kv          ? CacheKind::batch_kv
                          : k == CacheKind::quantized ? CacheKind::batch_quantized
                                                      : CacheKind::batch_rotating;
  return merge_caches(be, batch, rows);  // the catalogue's merge checks every row's class
}

// Left-padded prompts only: after a right-padded prefill one fewer token is legitimate
// (the unit test's exception), which would blunt the exact check.
void batch_rotating_extract_newest(const Hooks&, const BatchHooks& bh) {
  const auto heads = *rc::gen::inRange<std::int64_t>(1, 3);
  constexpr std::int64_t dim = 16;
  const auto max_size = *rc::gen::inRange<std::int64_t>(2, 11);
  const auto count = *rc::gen::inRange<std::int64_t>(1, 7);
  std::vector<std::int64_t> ids, counts;
  for (std::int64_t b = 0; b < count; ++b) {
    counts.push_back(*rc::gen::inRange<std::int64_t>(1, 15));
    ids.push_back(b);
  }
  const std::int64_t longest = *std::max_element(counts.begin(), counts.end());
  std::vector<std::int32_t> pad;
  for (const std::int64_t l : counts) pad.push_back(static_cast<std::int32_t>(longest - l));

  ReferenceBackend be;
  const std::unique_ptr<Cache> cache = bh.wrap(std::make_unique<BatchRotatingKVCache>(be, max_size, pad));
  const std::string ring_parameters = RotatingKVCache(be, max_size).parameters();
  // The case as a `cache kind=batch_rotating` line of the command language, printed when
  // it fails: every step is an update (`uN`) or a filter (`kI_J_…`).
  BatchCase line_case;
  line_case.kind = Kind::batch_rotating;
  line_case.batch = count, line_case.heads = heads, line_case.dim = dim, line_case.max_size = max_size;
  line_case.lpad = longest - *std::min_element(counts.begin(), counts.end());
  ReproScript line;
  const ReproOnFailure log_line(line_case, line);
  std::vector<std::int64_t> filled(counts.size(), 0);  // expected offset per row (−padding still ahead)
  const auto check = [&](const std::string& when) {
    RC_ASSERT(verbs(*cache).batch_size() == static_cast<std::int64_t>(ids.size()));
    const std::vector<std::int32_t> off = cache->offsets();
    for (std::size_t b = 0; b < ids.size(); ++b) {
      const std::string at = "row " + std::to_string(b) + " after " + when;
      if (off[b] != filled[b])
        RC_FAIL(at + ": offset " + std::to_string(off[b]) + " vs log " + std::to_string(filled[b]));
      const std::int64_t real = std::max<std::int64_t>(0, filled[b]);
      if (real == 0) continue;  // nothing real yet: extract is empty
      const std::int64_t n = std::min(real, max_size);
      // The ring extract(i) hands out: its rows, its offset and its max_size.
      const std::unique_ptr<Cache> single = verbs(*cache).extract_sequence(static_cast<std::int64_t>(b));
      const FetchedKV f = held_rows(*single);
      if (f.length() != n)
        RC_FAIL(at + ": extract holds " + std::to_string(f.length()) + " tokens, expected " + std::to_string(n) +
                " (offset " + std::to_string(real) + ", max_size " + std::to_string(max_size) + ")");
      expect_same_tensor(be.download(f.keys), row_block(Stream::key, ids[b], real - n, n, heads, dim),
                         at + " extract keys");
      expect_same_tensor(be.download(f.values), row_block(Stream::value, ids[b], real - n, n, heads, dim),
                         at + " extract values");
      RC_ASSERT(single->offsets().at(0) == real);
      RC_ASSERT(single->parameters() == ring_parameters);
    }
  };
  CaseSize& size = last_failure_size();
  size = {0, 0};
  std::int64_t c0 = 0;
  for (const std::int64_t n : gen_split(longest)) {
    const auto tok = [&pad, c0](std::int64_t b, std::int64_t j) {
      const std::int64_t t = c0 + j - pad[static_cast<std::size_t>(b)];
      return t >= 0 ? t : std::int64_t{-1};
    };
    cache->update(be.upload(block(Stream::key, ids, n, heads, dim, tok)),
                  be.upload(block(Stream::value, ids, n, heads, dim, tok)));
    c0 += n;
    line.tokens.push_back("u" + std::to_string(n));
    for (std::size_t b = 0; b < ids.size(); ++b) filled[b] = c0 - pad[b];
    ++size.steps;
    size.tokens += n;
    check("prefill chunk");
  }
  // Then commands of the cache language (cache/cache_script.h): decodes and short chunks
  // as updates (u1, u2..u6), and filters, whose rows are drawn when they run (they depend
  // on the rows left).
  namespace cs = kvlab::cache_script;
  const auto update = [](std::int64_t n) { return cs::Command{cs::Verb::update, n, 0, {}}; };
  const auto script = *rc::gen::container<cs::Script>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 13)),
      rc::gen::weightedElement<cs::Command>({{4, update(1)}, {1, update(0)}, {1, cs::Command{cs::Verb::filter, 0, 0, {}}}}));
  for (cs::Command c : script) {
    ++size.steps;
    if (c.verb == cs::Verb::filter) {
      const auto keep = *rc::gen::container<std::vector<bool>>(ids.size(), rc::gen::arbitrary<bool>());
      for (std::size_t b = 0; b < ids.size(); ++b)
        if (keep[b]) c.keep.push_back(static_cast<std::int32_t>(b));
      if (c.keep.empty()) c.keep.push_back(0);
      line.tokens.push_back(cs::script_str({c}));
      const std::vector<std::int32_t>& idx = c.keep;
      verbs(*cache).filter(idx);
      std::vector<std::int64_t> ids2, filled2;
      for (const std::int32_t i : idx) {
        ids2.push_back(ids[static_cast<std::size_t>(i)]);
        filled2.push_back(filled[static_cast<std::size_t>(i)]);
      }
      ids = ids2;
      filled = filled2;
      check("filter");
      continue;
    }
    // update(0) stands for a chunk of 2..6 tokens, drawn here as the old generator did.
    const std::int64_t n = c.n == 1 ? 1 : *rc::gen::inRange<std::int64_t>(2, 7);
    line.tokens.push_back("u" + std::to_string(n));
    const auto tok = [&filled](std::int64_t b, std::int64_t j) { return filled[static_cast<std::size_t>(b)] + j; };
    cache->update(be.upload(block(Stream::key, ids, n, heads, dim, tok)),
                  be.upload(block(Stream::value, ids, n, heads, dim, tok)));
    for (std::int64_t& f : filled) f += n;
    size.tokens += n;
    check(n == 1 ? "decode" : "chunk");
  }
}

namespace {

// Layer formats of the prefix property: 0 plain, 1 affine 4/64, 2 affine 8/32.
QuantSpec spec_of(int f) {
  return f == 1 ? QuantSpec::make(QuantMode::affine, 4, 64) : QuantSpec::make(QuantMode::affine, 8, 32);
}
CacheFormat format_of(int f, std::size_t layers) {
  return CacheFormat::uniform(layers, f == 0 ? CacheFormat::kv() : CacheFormat::quantized(spec_of(f), Rounding::mlx_cpu));
}
LayerCaches layers_of(Backend& be, int f, std::size_t layers, std::int64_t id, std::int64_t n) {
  constexpr std::int64_t heads = 1, dim = 64;
  LayerCaches out;
  for (std::size_t l = 0; l < layers; ++l) {
    const DTensor k = be.upload(row_block(Stream::key, id + static_cast<std::int64_t>(l) * 1000, 0, n, heads, dim));
    const DTensor v = be.upload(row_block(Stream::value, id + static_cast<std::int64_t>(l) * 1000, 0, n, heads, dim));
    if (f == 0) {
      auto c = std::make_unique<KVCache>(be);
      c->update(k, v);
      out.push_back(std::move(c));
    } else {
      auto c = std::make_unique<QuantizedKVCache>(be, spec_of(f), Rounding::mlx_cpu);
      c->update_quantized(k, v);
      out.push_back(std::move(c));
    }
  }
  return out;
}
// Token sequences that share prefixes: 1, 2, …, len − 1, then one of three last tokens.
std::vector<std::int32_t> gen_tokens() {
  const int len = *rc::gen::inRange(1, 10);
  const int last = *rc::gen::inRange(0, 3);
  std::vector<std::int32_t> t;
  for (int i = 1; i < len; ++i) t.push_back(i);
  t.push_back(len + 100 * last);
  return t;
}

}  // namespace

void prefix_fetch_matches_format(const Hooks&, const BatchHooks& bh) {
  ReferenceBackend be;
  PrefixCache pc;
  const std::string model = "m";
  const auto layers = static_cast<std::size_t>(*rc::gen::inRange(1, 3));
  const auto inserts = *rc::gen::inRange(1, 6);
  std::vector<std::pair<int, std::vector<std::int32_t>>> stored;
  CaseSize& size = last_failure_size();
  size = {0, 0};
  for (int i = 0; i < inserts; ++i) {
    const int f = *rc::gen::inRange(0, 3);
    const auto tokens = gen_tokens();
    pc.insert(model, format_of(f, layers), tokens,
              layers_of(be, f, layers, static_cast<std::int64_t>(f), static_cast<std::int64_t>(tokens.size())));
    stored.emplace_back(f, tokens);
    ++size.steps;
    size.tokens += static_cast<std::int64_t>(tokens.size());
  }
  const auto fetches = *rc::gen::inRange(1, 7);
  for (int i = 0; i < fetches; ++i) {
    const int f = *rc::gen::inRange(0, 3);
    const auto tokens = gen_tokens();
    const CacheFormat want = format_of(f, layers);
    const PrefixFetch got = bh.prefix_fetch(pc, model, want, tokens);
    ++size.steps;
    // An entry stored under exactly this key is always found (possibly as a trimmed
    // supersequence once a longer entry superseded it, which leaves one token to
    // process: so a one-token request may miss).
    const bool stored_exact =
        std::find(stored.begin(), stored.end(), std::make_pair(f, tokens)) != stored.end();
    if (stored_exact && tokens.size() >= 2 && got.kind == MatchKind::miss)
      RC_FAIL("fetch " + want.describe() + " missed an entry stored under that format");
    if (got.kind == MatchKind::miss) continue;
    RC_ASSERT(got.caches.size() == layers);
    for (std::size_t l = 0; l < layers; ++l) {
      const std::string have = CacheFormat::layer(*got.caches[l]);
      if (have != want.layers()[l])
        RC_FAIL("fetch " + want.describe() + " (" + std::string(match_kind_name(got.kind)) + ") returned layer " +
                std::to_string(l) + " as " + have);
      RC_ASSERT(got.caches[l]->offsets().at(0) == static_cast<std::int32_t>(got.reused));
    }
  }
}

// The zoo tries these in this order on every batch mutant and stops at the first kill,
// so the cheap lifecycle properties (which kill most batch mutants within a few dozen
// cases) come first and the costly row-log properties B1/B2 later (their measured CPU
// times: docs/ci.md §Test costs).
const std::vector<NamedBatchProperty>& batch_properties() {
  static const std::vector<NamedBatchProperty> props{
      {"L1.BatchRotatingLifecycle", batch_rotating_lifecycle},
      {"L2.BatchAttendSurvivesFilterExtend", batch_attend_survives_filter_extend},
      {"L3.PrefixReuseContinues", prefix_reuse_continues},
      {"B4.BatchRotatingExtractNewest", batch_rotating_extract_newest},
      {"B5.PrefixFetchMatchesFormat", prefix_fetch_matches_format},
      {"B1.BatchKVCacheRowsMatchLogs", batch_kv_rows_match_logs},
      {"B2.BatchQuantizedRowsMatchLogs", batch_quantized_rows_match_logs},
      {"B3.BatchAttendEqualsPerRow", batch_attend_equals_per_row},
  };
  return props;
}

}  // namespace kvlab::prop
