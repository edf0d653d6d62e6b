// Batch-cache properties (docs/semantics.md §Batch cache, including its invariants,
// docs/semantics.md §Batch quantized cache, docs/lifecycle.md §Batch lifecycle,
// docs/lifecycle.md §Offset snapshot, docs/traces.md §T3).
//   B1 BatchKVCache rows == token logs == single KVCaches through decode, chunks of
//      1..300 tokens, right-padded prompts over several chunks, trim, filter (bad
//      indices rejected), extend (empty, merged, restored, itself), merge, to_quantized,
//      state round trips (in memory or through a file, also while a right pad is pending)
//   B2 the same for BatchQuantizedKVCache (several bit widths): bits equal QuantizedKVCache
//   B3 attend on a BatchKVCache (B >= 2, unequal prompts) == attend on each row's KVCache
// Row r's token t carries content(stream, row id, t, ·) (prop_model.h), so a row's data
// is a pure function of its id and token count: the model is batch_util.h's RowLog.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>

#include "cache/batch_kv_cache.h"
#include "cache/batch_quantized_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/state_file.h"
#include "property_tests/batch_util.h"
#include "property_tests/repro_line.h"
#include "property_tests/properties.h"

namespace kvlab::prop {

namespace {

using batch::block;
using batch::draw_name;
using batch::Draw;
using batch::kBadFilter;
using batch::kChunk;
using batch::kDecode;
using batch::kExtend;
using batch::kFilter;
using batch::kMerge;
using batch::kPrompt;
using batch::kState;
using batch::kToQuantized;
using batch::kTrim;
using batch::word;
namespace cs = kvlab::cache_script;
using batch::expect_rejected;
using batch::expect_same_tensor;
using batch::gen_bad_keep;
using batch::gen_keep;
using batch::gen_split;
using batch::gen_chunk;
using batch::list_str;
using batch::next_block;
using batch::Pending;
using batch::pick;
using batch::row_block;
using batch::RowLog;
using batch::RowMemo;
using batch::rows_str;
using batch::verbs;

// ---- the two batch kinds behind one interface ---------------------------------------
// Every batch cache is held as a Cache that went through BatchHooks::wrap (properties.h)
// and reached through Cache::batch(), so a mutant wrapper sits under every operation;
// restores and merges go through their hooks.

struct BatchOps {
  const BatchHooks* hooks = nullptr;
  std::shared_ptr<RowMemo> memo;
  void filter(Cache& c, const std::vector<std::int32_t>& idx) const { verbs(c).filter(idx); }
  void extend(Cache& c, const Cache& other) const { verbs(c).extend(other); }
  std::unique_ptr<Cache> extract(const Cache& c, std::int64_t i) const { return verbs(c).extract_sequence(i); }
  std::unique_ptr<Cache> restore(Backend& be, const CacheState& s) const { return hooks->wrap(hooks->restore(be, s)); }
};

struct PlainOps : BatchOps {
  static constexpr const char* kName = "BatchKVCache";
  std::int64_t heads = 1, dim = 32;

  std::unique_ptr<Cache> make(Backend& be, std::vector<std::int32_t> lp) const {
    return hooks->wrap(std::make_unique<BatchKVCache>(be, std::move(lp)));
  }
  void update(Cache& c, Backend& be, const Tensor& k, const Tensor& v) const { c.update(be.upload(k), be.upload(v)); }
  // `got` (an extracted row) holds exactly tokens [0, n) of row `id` (none for n <= 0):
  // its state is what a KVCache fed those tokens saves, keys and values [0, n).
  void check_row(Backend&, const Cache& got, std::int64_t id, std::int64_t n, const std::string& at) const {
    n = std::max<std::int64_t>(n, 0);
    if (got.offsets().at(0) != n)
      RC_FAIL(at + ": extract offset " + std::to_string(got.offsets().at(0)) + " vs log " + std::to_string(n));
    const CacheState st = got.state();
    RC_ASSERT(st.class_name == "KVCache");
    RC_ASSERT(st.tensors.size() == (n > 0 ? 2u : 0u));
    if (n == 0) return;
    expect_same_tensor(st.tensors.at("keys"), memo->get(Stream::key, id, n), at + " keys");
    expect_same_tensor(st.tensors.at("values"), memo->get(Stream::value, id, n), at + " values");
  }
  // The batch through to_quantized: mlx-lm has none for batch caches, so each row's
  // KVCache.to_quantized, then a quantized merge (docs/semantics.md §Quantized cache,
  // docs/semantics.md §Batch quantized cache, docs/upstream-bugs.md row 34). Every row
  // must hold the bits of quantizing its own tokens.
  void check_to_quantized(Backend& be, const Cache& cache, const std::vector<RowLog>& rows) const {
    const QuantSpec spec = QuantSpec::make(QuantMode::affine, *rc::gen::element(3, 4, 8), 32);
    std::vector<std::unique_ptr<Cache>> quantized;
    std::vector<const Cache*> ptrs;
    for (std::size_t b = 0; b < rows.size(); ++b) {
      quantized.push_back(extract(cache, static_cast<std::int64_t>(b))->quantized_form(spec, Rounding::mlx_cpu));
      RC_ASSERT(quantized.back() != nullptr);  // a KVCache row has a quantized form
      ptrs.push_back(quantized.back().get());
    }
    const std::unique_ptr<Cache> merged = hooks->wrap(hooks->merge(be, ptrs));
    if (merged->class_name() != cache_kind_info(CacheKind::batch_quantized).class_name)
      RC_FAIL("merge of quantized rows returned a " + std::string(merged->class_name()));
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const std::int64_t n = std::max<std::int64_t>(rows[b].count, 0);
      QuantizedKVCache alone(be, spec, Rounding::mlx_cpu);
      if (n > 0)
        alone.update_quantized(be.upload(memo->get(Stream::key, rows[b].id, n)),
                               be.upload(memo->get(Stream::value, rows[b].id, n)));
      check_same_state(extract(*merged, static_cast<std::int64_t>(b))->state(), alone.state());
    }
  }
  std::unique_ptr<Cache> merge(Backend& be, std::span<const Cache* const> rows) const {
    return hooks->wrap(hooks->merge(be, rows));
  }
};

// How a quantized state packs its bits: "mode bits/group_size rounding".
std::string packing(const CacheState& s) {
  const auto field = [&s](const char* name) {
    const auto it = s.meta.find(name);
    return it == s.meta.end() ? std::string("?") : it->second;
  };
  return field("mode") + " " + field("bits") + "/" + field("group_size") + " " + field("rounding");
}

struct QuantOps : BatchOps {
  static constexpr const char* kName = "BatchQuantizedKVCache";
  std::int64_t heads = 1, dim = 64;
  QuantSpec spec{};
  Rounding rounding = Rounding::mlx_cpu;

  std::unique_ptr<Cache> make(Backend& be, std::vector<std::int32_t> lp) const {
    return hooks->wrap(std::make_unique<BatchQuantizedKVCache>(be, std::move(lp), spec, rounding));
  }
  void update(Cache& c, Backend& be, const Tensor& k, const Tensor& v) const {
    c.update_quantized(be.upload(k), be.upload(v));
  }
  // The state of a QuantizedKVCache fed tokens [0, cap) of a row (per row id); a prefix
  // of it is the state of one fed tokens [0, n), since quantization is per token row.
  std::shared_ptr<std::map<std::int64_t, CacheState>> fed = std::make_shared<std::map<std::int64_t, CacheState>>();
  CacheState expected_state(Backend& be, std::int64_t id, std::int64_t n) const {
    CacheState& full = (*fed)[id];
    const std::int64_t have = full.tensors.empty() ? 0 : full.tensors.begin()->second.dim(2);
    if (full.class_name.empty() || have < n) {
      const std::int64_t cap = std::max({n, 2 * have, std::int64_t{16}});
      QuantizedKVCache c(be, spec, rounding);
      c.update_quantized(be.upload(memo->get(Stream::key, id, cap)), be.upload(memo->get(Stream::value, id, cap)));
      full = c.state();
    }
    CacheState out = full;
    out.meta["offset"] = std::to_string(n);
    if (n == 0) out.tensors.clear();
    for (auto& [name, t] : out.tensors) t = t.slice(2, 0, n);
    return out;
  }
  // Quantization is per token row, so the row's bits equal quantizing its tokens alone.
  void check_row(Backend& be, const Cache& got, std::int64_t id, std::int64_t n, const std::string& at) const {
    n = std::max<std::int64_t>(n, 0);
    if (got.offsets().at(0) != n)
      RC_FAIL(at + ": extract offset " + std::to_string(got.offsets().at(0)) + " vs log " + std::to_string(n));
    RC_ASSERT(got.parameters() == QuantizedKVCache(be, spec, rounding).parameters());
    check_same_state(got.state(), expected_state(be, id, n));
  }
  void check_to_quantized(Backend&, const Cache&, const std::vector<RowLog>&) const {}  // already quantized
  // mlx-lm has no quantized merge at all (docs/upstream-bugs.md row 34); one that silently
  // dequantizes, or changes the QuantSpec, is as wrong as one that misplaces packed rows.
  std::unique_ptr<Cache> merge(Backend& be, std::span<const Cache* const> rows) const {
    std::unique_ptr<Cache> merged = hooks->wrap(hooks->merge(be, rows));
    if (merged->class_name() != cache_kind_info(CacheKind::batch_quantized).class_name)
      RC_FAIL("merge of quantized caches returned a " + std::string(merged->class_name()));
    const std::string want = packing(BatchQuantizedKVCache(be, {0}, spec, rounding).state());
    if (const std::string got = packing(merged->state()); got != want)
      RC_FAIL("merge of " + want + " caches returned a " + got + " cache");
    return merged;
  }
};

// Writes the rows' next n columns (advancing the logs).
template <class Ops>
void write_chunk(const Ops& ops, Backend& be, Cache& cache, std::vector<RowLog>& rows, std::int64_t n,
                 bool pending) {
  ops.update(cache, be, next_block(Stream::key, rows, n, ops.heads, ops.dim, pending),
             next_block(Stream::value, rows, n, ops.heads, ops.dim, pending));
  for (RowLog& r : rows) advance(r, n, pending);
}

// Starts a right-padded prompt on every row: real lengths 0..12, then right pads to a
// common length (at least one pad somewhere, so the pad is really pending).
std::int64_t start_prompt(Cache& cache, std::vector<RowLog>& rows) {
  std::vector<std::int64_t> lens;
  for (std::size_t b = 0; b < rows.size(); ++b) lens.push_back(*rc::gen::inRange<std::int64_t>(0, 13));
  std::int64_t total = std::max<std::int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  total += *rc::gen::inRange<std::int64_t>(0, 3);
  if (std::all_of(lens.begin(), lens.end(), [&](std::int64_t l) { return l == total; })) ++total;
  std::vector<std::int32_t> rp;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    rows[b].real_left = lens[b];
    rows[b].pad_left = total - lens[b];
    rows[b].pads = 0;
    rp.push_back(static_cast<std::int32_t>(total - lens[b]));
  }
  verbs(cache).prepare({}, {}, rp);
  return total;
}

// A fresh batch of 1..max_b prompts (lengths 1..12): left-padded in random chunks,
// right-padded over several chunks with prepare/finalize (docs/traces.md §T5), or (1 in 8) empty:
// only left padding, nothing stored yet (mlx-lm#1141: extend with an empty side).
template <class Ops>
std::unique_ptr<Cache> fresh_batch(const Ops& ops, Backend& be, std::int64_t max_b, std::int64_t& next_id,
                                                 std::vector<RowLog>& rows) {
  const std::int64_t count = *rc::gen::inRange<std::int64_t>(1, max_b + 1);
  const int kind = *rc::gen::weightedElement<int>({{4, 0}, {3, 1}, {1, 2}});
  std::vector<RowLog> mine;
  std::vector<std::int32_t> lp;
  if (kind == 1) {
    for (std::int64_t b = 0; b < count; ++b) mine.push_back({next_id++, 0});
    auto cache = ops.make(be, std::vector<std::int32_t>(static_cast<std::size_t>(count), 0));
    for (std::int64_t left = start_prompt(*cache, mine); left > 0;) {
      const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(left, 8) + 1);
      write_chunk(ops, be, *cache, mine, n, true);
      left -= n;
    }
    verbs(*cache).finalize();
    for (RowLog& r : mine) r.pads = 0;
    rows.insert(rows.end(), mine.begin(), mine.end());
    return cache;
  }
  std::int64_t longest = 0;
  for (std::int64_t b = 0; b < count; ++b) {
    const std::int64_t len = kind == 2 ? 0 : *rc::gen::inRange<std::int64_t>(1, 13);
    longest = std::max(longest, len);
    mine.push_back({next_id++, len});
  }
  for (RowLog& r : mine) {
    const std::int64_t pad = kind == 2 ? *rc::gen::inRange<std::int64_t>(0, 4) : longest - r.count;
    lp.push_back(static_cast<std::int32_t>(pad));
    r.count = -pad;  // the prefill below brings it back to its length
  }
  auto cache = ops.make(be, lp);
  if (kind == 0)
    for (const std::int64_t n : gen_split(longest)) write_chunk(ops, be, *cache, mine, n, false);
  rows.insert(rows.end(), mine.begin(), mine.end());
  return cache;
}

// Offsets always; each row's extract == its log (while a prompt is pending: or rejected).
template <class Ops>
void check_rows(const Ops& ops, Backend& be, const Cache& cache, const std::vector<RowLog>& rows,
                bool pending, const std::string& when) {
  RC_ASSERT(verbs(cache).batch_size() == static_cast<std::int64_t>(rows.size()));
  const std::vector<std::int32_t> off = cache.offsets();
  for (std::size_t b = 0; b < rows.size(); ++b) {
    const std::string at = std::string(Ops::kName) + " row " + std::to_string(b) + " after " + when;
    if (off[b] != rows[b].offset())
      RC_FAIL(at + ": offset " + std::to_string(off[b]) + " vs log " + std::to_string(rows[b].offset()));
    if (!pending) {
      ops.check_row(be, *ops.extract(cache, static_cast<std::int64_t>(b)), rows[b].id, rows[b].count, at);
      continue;
    }
    // While a right pad is pending: rejected, or exactly the real tokens so far (mlx-lm
    // PR #1746: the pads came along, with an offset counting them).
    std::unique_ptr<Cache> got;
    try {
      got = ops.extract(cache, static_cast<std::int64_t>(b));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::misuse) RC_FAIL(at + ": extract while a right pad is pending: " + e.what());
    }
    if (got) ops.check_row(be, *got, rows[b].id, rows[b].count, at + " (extract while a right pad is pending)");
  }
}

// A state round trip: in memory, or (1 in 6) through a state file (cache/state_file.h).
CacheState round_trip(const CacheState& s) {
  if (*rc::gen::inRange(0, 6) != 0) return s;
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvlab_bprop_" + std::to_string(static_cast<long long>(::getpid())) + ".safetensors");
  save_cache_states(path, {s}, {});
  LoadedStates loaded = load_cache_states(path);
  std::filesystem::remove(path);
  return loaded.layers.at(0);
}

template <class Ops>
std::unique_ptr<Cache> merged_copy(const Ops& ops, Backend& be, const Cache& cache, std::size_t rows) {
  std::vector<std::unique_ptr<Cache>> singles;
  std::vector<const Cache*> ptrs;
  for (std::size_t b = 0; b < rows; ++b) {
    singles.push_back(ops.extract(cache, static_cast<std::int64_t>(b)));
    ptrs.push_back(singles.back().get());
  }
  return ops.merge(be, ptrs);
}

template <class Ops>
void rows_match_logs(const Ops& ops) {
  ReferenceBackend be;
  std::int64_t next_id = 0;
  std::vector<RowLog> rows;
  CaseSize& size = last_failure_size();
  size = {1, 0};
  auto cache = fresh_batch(ops, be, 8, next_id, rows);
  Pending pending;
  RC_LOG() << "fresh rows " << rows_str(rows) << "\n";
  // The case as a `cache` line (repro_line.h), logged if a check below fails.
  BatchCase line_case;
  line_case.batch = static_cast<std::int64_t>(rows.size());
  line_case.heads = ops.heads;
  line_case.dim = ops.dim;
  if constexpr (requires { ops.spec; }) {
    line_case.kind = Kind::batch_quantized;
    line_case.spec = ops.spec;
    line_case.rounding = ops.rounding;
  }
  ReproScript line;
  const ReproOnFailure log_line(line_case, line);
  {
    std::int64_t hi = 0, lo = 0;
    for (const RowLog& r : rows) hi = std::max(hi, r.count), lo = std::min(lo, r.count);
    line_case.lpad = -lo;
    if (hi - lo > 0) line.tokens.push_back(word({cs::Verb::update, hi - lo, 0, {}}));
    line.note("the property's K/V go through update(), not attend()");
  }
  check_rows(ops, be, *cache, rows, false, "prefill");
  // The steps: commands of the cache language, drawn as batch_util.h's Draw says.
  const auto script = *rc::gen::container<std::vector<Draw>>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 13)),
      rc::gen::weightedElement<Draw>({{3, kDecode}, {3, kChunk}, {2, kPrompt}, {1, kTrim}, {1, kFilter},
                                      {1, kBadFilter}, {2, kExtend}, {1, kMerge}, {2, kState},
                                      {1, kToQuantized}}));
  const auto finish_prompt = [&] {
    verbs(*cache).finalize();
    for (RowLog& r : rows) r.pads = 0;
    pending = {};
  };
  for (Draw d : script) {
    ++size.steps;
    if (d == kPrompt && pending) d = kChunk;
    if (d == kPrompt && std::any_of(rows.begin(), rows.end(), [](const RowLog& r) { return r.count < 0; }))
      d = kDecode;  // a prompt needs every row's left padding consumed (finalize rolls into it)
    if (((d == kMerge || d == kToQuantized) && pending) || (d == kExtend && rows.size() >= 8)) d = kState;
    const cs::Verb verb = d.verb;
    if (verb == cs::Verb::merge) {  // merge of the extracted rows, then extract, is the identity
      line.tokens.push_back(word(d));
      cache = merged_copy(ops, be, *cache, rows.size());
      for (RowLog& r : rows) r.count = std::max<std::int64_t>(r.count, 0);
    } else if (verb == cs::Verb::update) {
      if (pending && pending.left == 0) {
        finish_prompt();
        line.tokens.push_back(word({cs::Verb::finalize, 1, 0, {}}));
      } else {
        const std::int64_t n = d.n == 1 ? 1 : gen_chunk(pending ? pending.left : 300);
        if (!pending) line.tokens.push_back(word({cs::Verb::update, n, 0, {}}));
        write_chunk(ops, be, *cache, rows, n, pending.on);
        if (pending) pending.left -= n;
        size.tokens += n;
      }
    } else if (verb == cs::Verb::right_chunk) {
      pending = {true, start_prompt(*cache, rows)};
      // The whole right-padded prompt is one rN here; the property writes it in pieces.
      line.tokens.push_back(word({cs::Verb::right_chunk, pending.left, 0, {}}));
      for (const RowLog& r : rows) line_case.rpad = std::max(line_case.rpad, r.pad_left);
    } else if (verb == cs::Verb::trim) {
      std::int64_t most = 0;
      for (const RowLog& r : rows) most = std::max(most, r.count);
      const std::int64_t n = *rc::gen::inRange<std::int64_t>(0, most + 1);
      if (pending) {
        expect_rejected([&] { cache->trim(n); }, ErrorKind::misuse, "trim while a right pad is pending");
      } else {
        if (n > 0) line.tokens.push_back(word({cs::Verb::trim, n, 0, {}}));
        const std::int64_t removed = cache->trim(n);
        if (removed != n) RC_FAIL("trim(" + std::to_string(n) + ") removed " + std::to_string(removed));
        for (RowLog& r : rows) r.count -= n;
      }
    } else if (verb == cs::Verb::filter && d.keep.empty()) {
      const std::vector<std::int32_t> idx = gen_keep(rows.size());
      line.tokens.push_back(word({cs::Verb::filter, 0, 0, idx}));
      ops.filter(*cache, idx);
      rows = pick(rows, idx);
    } else if (verb == cs::Verb::filter) {
      const std::vector<std::int32_t> idx = gen_bad_keep(rows.size());
      line.note("a rejected filter");
      expect_rejected([&] { ops.filter(*cache, idx); }, ErrorKind::invalid_argument,
                      "filter(" + list_str(idx) + ") of " + std::to_string(rows.size()) + " rows");
    } else if (verb == cs::Verb::extend) {
      std::vector<RowLog> joined;
      const int kind = *rc::gen::inRange(0, 4);
      if (kind == 3 && rows.size() * 2 <= 8) {  // with itself
        joined = rows;
        line.note("extend by itself");
        ops.extend(*cache, *cache);
      } else {
        auto other = fresh_batch(ops, be, 8 - static_cast<std::int64_t>(rows.size()), next_id, joined);
        // Other capacities: a merge or a restore holds exactly its columns, a fresh batch 256.
        if (kind == 1 && std::all_of(joined.begin(), joined.end(), [](const RowLog& r) { return r.count >= 0; }))
          other = merged_copy(ops, be, *other, joined.size());
        if (kind == 2) other = ops.restore(be, other->state());
        std::int64_t longest = 1;
        for (const RowLog& r : joined) longest = std::max(longest, r.count);
        line.tokens.push_back(word({cs::Verb::extend, longest, static_cast<std::int64_t>(joined.size()), {}}));
        ops.extend(*cache, *other);
        for (RowLog& r : joined)
          if (pending) r.real_left = pending.left, r.pad_left = 0, r.pads = 0;  // real tokens to the prompt's end
      }
      rows.insert(rows.end(), joined.begin(), joined.end());
    } else if (verb == cs::Verb::quantize) {
      line.note("to_quantized of a batch (the language's q is kind kv only)");
      ops.check_to_quantized(be, *cache, rows);
    } else {
      line.tokens.push_back(word({cs::Verb::reload, 1, 0, {}}));
      cache = ops.restore(be, round_trip(cache->state()));
    }
    RC_LOG() << draw_name(d) << " -> rows " << rows_str(rows)
             << (pending ? " pending " + std::to_string(pending.left) : "") << "\n";
    check_rows(ops, be, *cache, rows, pending.on, draw_name(d));
  }
  if (pending) {  // the rest of a pending prompt, then finalize
    if (pending.left > 0) write_chunk(ops, be, *cache, rows, pending.left, true);
    finish_prompt();
    line.tokens.push_back(word({cs::Verb::finalize, 1, 0, {}}));
    check_rows(ops, be, *cache, rows, false, "finalize");
  }
}

// ---- B3: batched attention == per-row attention (docs/lifecycle.md §Offset snapshot) -------

}  // namespace

void batch_kv_rows_match_logs(const Hooks&, const BatchHooks& bh) {
  PlainOps ops;
  ops.hooks = &bh;
  ops.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  ops.memo = std::make_shared<RowMemo>(ops.heads, ops.dim);
  rows_match_logs(ops);
}

void batch_quantized_rows_match_logs(const Hooks&, const BatchHooks& bh) {
  QuantOps ops;
  ops.hooks = &bh;
  ops.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  ops.memo = std::make_shared<RowMemo>(ops.heads, ops.dim);
  const int bits = *rc::gen::element(2, 3, 4, 5, 6, 8);
  const int group = *rc::gen::element(32, 64);
  ops.spec = QuantSpec::make(QuantMode::affine, bits, group);
  ops.rounding = *rc::gen::element(Rounding::mlx_cpu, Rounding::mlx_gpu);
  RC_TAG(bits);
  rows_match_logs(ops);
}

// Each row of the batch sees exactly its own real keys, in the same order and with the
// same RoPE positions (offset = −left_padding at the start, so column c of row b is
// token c − lp_b), as the row's own KVCache. The reference SDPA never reads a hidden key
// and reduces each (row, head, query) over the visible keys in key order, so the two
// computations perform the same floating-point operations: the comparison is bit-exact
// (tolerance 0), not a derived bound. Padding queries are unspecified
// (docs/kernels.md §Fully masked rows) and are not compared.
void batch_attend_equals_per_row(const Hooks&, const BatchHooks& bh) {
  Config cfg;
  cfg.kind = Kind::kv;
  cfg.kv_heads = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.q_ratio = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.dk = cfg.dv = 32;
  cfg.rope_dims = *rc::gen::element(0, 16, 32);
  const AttendOptions opts = attend_options(cfg);
  const auto count = *rc::gen::inRange<std::int64_t>(2, 5);
  std::vector<std::int64_t> lens, ids;
  for (std::int64_t b = 0; b < count; ++b) {
    lens.push_back(*rc::gen::inRange<std::int64_t>(1, 13));
    ids.push_back(b);
  }
  if (lens[0] == lens[1]) lens[1] = lens[0] % 12 + 1;  // unequal prompt lengths
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<std::int32_t> pad;
  for (const std::int64_t l : lens) pad.push_back(static_cast<std::int32_t>(longest - l));

  ReferenceBackend be;
  const std::unique_ptr<Cache> cache = bh.wrap(std::make_unique<BatchKVCache>(be, pad));
  std::vector<std::unique_ptr<KVCache>> singles;
  for (std::int64_t b = 0; b < count; ++b) singles.push_back(std::make_unique<KVCache>(be));
  std::vector<std::int64_t> chunks = gen_split(longest);
  const auto decodes = *rc::gen::container<std::vector<std::int64_t>>(
      static_cast<std::size_t>(*rc::gen::inRange(0, 6)), rc::gen::weightedOneOf<std::int64_t>({{3, rc::gen::just<std::int64_t>(1)},
                                                                     {1, rc::gen::inRange<std::int64_t>(2, 6)}}));
  const std::size_t prefill_chunks = chunks.size();
  chunks.insert(chunks.end(), decodes.begin(), decodes.end());
  CaseSize& size = last_failure_size();
  size = {static_cast<std::int64_t>(chunks.size()), 0};

  std::int64_t c0 = 0;  // columns written so far
  for (std::size_t step = 0; step < chunks.size(); ++step) {
    const std::int64_t n = chunks[step];
    size.tokens += n;
    // Token index of row b at column c0 + j: c − lp_b (negative = padding).
    const auto tok = [&pad, c0](std::int64_t b, std::int64_t j) {
      const std::int64_t t = c0 + j - pad[static_cast<std::size_t>(b)];
      return t >= 0 ? t : std::int64_t{-1};
    };
    const AttendResult r = attend(*cache, be.upload(block(Stream::query, ids, n, cfg.q_heads(), cfg.dk, tok)),
                                  be.upload(block(Stream::key, ids, n, cfg.kv_heads, cfg.dk, tok)),
                                  be.upload(block(Stream::value, ids, n, cfg.kv_heads, cfg.dv, tok)), opts);
    const Tensor out = be.download(r.out);
    for (std::int64_t b = 0; b < count; ++b) {
      std::int64_t j0 = 0;
      while (j0 < n && tok(b, j0) < 0) ++j0;
      if (j0 == n) continue;  // the row has no real token in this chunk yet
      const std::int64_t p0 = tok(b, j0), m = n - j0;
      const AttendResult rs = attend(*singles[static_cast<std::size_t>(b)],
                                     be.upload(row_block(Stream::query, b, p0, m, cfg.q_heads(), cfg.dk)),
                                     be.upload(row_block(Stream::key, b, p0, m, cfg.kv_heads, cfg.dk)),
                                     be.upload(row_block(Stream::value, b, p0, m, cfg.kv_heads, cfg.dv)), opts);
      expect_same_tensor(batch::slice_row(out, b, j0, m), be.download(rs.out),
                         "row " + std::to_string(b) + (step < prefill_chunks ? " prefill" : " decode") + " chunk " +
                             std::to_string(step) + " (batched vs alone)");
    }
    c0 += n;
  }
}

}  // namespace kvlab::prop
