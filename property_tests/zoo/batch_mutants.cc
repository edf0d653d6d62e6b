// Batch-cache mutants (test-only code; production has no hooks): the seed bugs, the
// batched-attention mutants (wrappers of batch caches, BatchHooks::wrap) and the
// prefix-cache mutants (BatchHooks prefix_insert / prefix_fetch); their single-cache
// Hooks are the production ones. batch_mutants() also lists the lifecycle mutants of
// batch_lifecycle_mutants.cc.
//
// batch-rotating-extract-negative-padding (vllm-mlx PR 256 / mlx-lm#1114):
//   extract slices the temporal order from left_padding[i] unclamped. Evictions drive
//   left_padding negative (docs/traces.md §T4); Python's keys[..., lp:] with lp < 0 counts from
//   the end, so the row loses its oldest real tokens. Rebuilt here from the cache's
//   public state (physical buffers, cursor, rotated, left_padding).
// prefix-cache-mixes-kv-bits (SharpAI/SwiftLM PR 73 review):
//   the lookup key ignores the quantization spec: every fetch uses the plain format key,
//   so a quantized request gets an unquantized state (and a stored quantized entry is
//   never found by its own format).
// 44 / 45 (vlm#1542 / #1543; mlx-lm#1906): batched attention on a cache that believes
//   nothing is left-padded (positions and mask), or whose mask ignores the padding.
// 42 (vlm#1715 → #1748): prefix reuse slices a stored ring raw (keys[..., :prefix]),
//   also a ring that wrapped, instead of skipping it (only trim() may cut a ring).
// 48 (vllm-mlx#642): a stored prefix entry aliases the live cache's buffers, so the
//   live cache's later in-place writes and trims show up in the entry.
#include "property_tests/zoo/batch_mutants.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cache/registry.h"
#include "cache/seq_ops.h"
#include "property_tests/zoo/mutants.h"

namespace kvlab::prop::zoo {

namespace {

using Tokens = std::vector<std::int32_t>;

// The rows extract(i) adopts, sliced as the buggy extract did.
FetchedKV extract_negative_padding(const BatchRotatingKVCache& c, std::int64_t i) {
  Backend& be = c.backend();
  if (c.empty()) return {};
  const std::int64_t cap = c.capacity();
  const std::int64_t temporal = c.rotated() ? cap : c.cursor();
  const std::int64_t shift = c.rotated() ? c.cursor() : 0;
  const std::int64_t lp = c.left_padding().at(static_cast<std::size_t>(i));
  // The bug: Python slice semantics for a negative start.
  const std::int64_t start = lp >= 0 ? lp : std::max<std::int64_t>(0, temporal + lp);
  std::int64_t first = start, n = temporal - start;
  if (n > c.max_size()) first += n - c.max_size(), n = c.max_size();
  if (n <= 0) return {};
  const auto take = [&](const DTensor& buf) {
    const Tensor src = be.download(buf);
    const std::int64_t heads = src.dim(1), dim = src.dim(3);
    Tensor out(src.dtype(), {1, heads, n, dim});
    const ConstTensorView s = src.view();
    const TensorView d = out.view();
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t phys = (first + t + shift) % cap;
        for (std::int64_t x = 0; x < dim; ++x)
          d.store((h * n + t) * dim + x, s.load(((i * heads + h) * cap + phys) * dim + x));
      }
    return be.upload(out);
  };
  return {take(c.key_buffer()), take(c.value_buffer())};
}

// extract(i) adopts those rows, with row i's offset, as the real extract does.
class ExtractNegativePadding final : public BatchForwardingCache<BatchRotatingKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  std::unique_ptr<Cache> extract_sequence(std::int64_t i) const override {
    FetchedKV rows = extract_negative_padding(*inner_, i);
    if (!rows.keys) return std::make_unique<RotatingKVCache>(backend(), inner_->max_size());
    return std::make_unique<RotatingKVCache>(backend(), inner_->max_size(), std::move(rows.keys),
                                             std::move(rows.values), inner_->offsets().at(static_cast<std::size_t>(i)));
  }
};

// ---- 44 / 45: batched attention without the left-padding metadata ------------------------

// 45 (mlx-lm#1906, MiniCPM3): the model drops the cache's left-padding mask; the causal
// mask alone lets real queries see the padding columns.
class MaskIgnoresPadding : public BatchForwardingCache<Cache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  CacheMask make_mask(std::int64_t n, int window) const override {
    CacheMask m = inner_->make_mask(n, window);
    if (m.spec.kind == MaskKind::causal) m.spec.left_padding.clear();
    return m;
  }
};

// 44 (vlm#1542 / #1543): the tokenizer left-padded the prompts but the cache was built
// with left_padding = 0: every row's positions start at the first (padding) column and
// nothing is masked.
class SeesNoPadding final : public MaskIgnoresPadding {
 public:
  using MaskIgnoresPadding::MaskIgnoresPadding;
  std::vector<std::int32_t> offsets() const override {
    if (dynamic_cast<const BatchKVCache*>(inner_.get()) == nullptr) return inner_->offsets();
    return std::vector<std::int32_t>(inner_->offsets().size(), static_cast<std::int32_t>(inner_->kv_length()));
  }
};

// ---- 42 / 48: prefix-cache mutants --------------------------------------------------------
// Both keep a record of what was inserted beside the real PrefixCache (which they still
// call), per PrefixCache instance: a fresh instance (no insert yet) starts a new record.

std::size_t common_prefix(const Tokens& a, const Tokens& b) {
  return static_cast<std::size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

struct Inserted {
  std::string model;
  std::vector<std::string> format;
  Tokens tokens;
  LayerCaches copies;  // 42: deep copies
  // 48: per layer, the insert-time state without tensors, and for each state tensor the
  // live buffer it was read from and its length.
  std::vector<CacheState> meta;
  std::vector<std::map<std::string, std::pair<DTensor, std::int64_t>>> aliases;
};

struct Record {
  const PrefixCache* pc = nullptr;
  std::vector<Inserted> entries;
  std::vector<Inserted>& of(const PrefixCache& cache) {
    if (pc != &cache || cache.stats().inserts == 0) {
      pc = &cache;
      entries.clear();
    }
    return entries;
  }
};

// The live buffers behind a cache's state tensors (the handles an aliasing store keeps).
std::map<std::string, DTensor> live_buffers(const Cache& c) {
  if (const auto* kv = dynamic_cast<const KVCache*>(&c))
    return {{"keys", kv->key_buffer()}, {"values", kv->value_buffer()}};
  if (const auto* r = dynamic_cast<const RotatingKVCache*>(&c))
    return {{"keys", r->key_buffer()}, {"values", r->value_buffer()}};
  const auto& q = dynamic_cast<const QuantizedKVCache&>(c);
  std::map<std::string, DTensor> out;
  for (const auto& [side, t] : {std::pair{"keys", &q.key_buffer()}, std::pair{"values", &q.value_buffer()}}) {
    out.emplace(std::string(side) + ".wq", t->wq);
    out.emplace(std::string(side) + ".scales", t->scales);
    if (t->biases) out.emplace(std::string(side) + ".biases", t->biases);
  }
  return out;
}

BatchHooks prefix_mutant(bool aliases) {
  auto record = std::make_shared<Record>();
  BatchHooks h = production_batch_hooks();
  h.prefix_insert = [record, aliases](PrefixCache& pc, const std::string& model, const CacheFormat& format,
                                      const Tokens& tokens, const LayerCaches& caches) {
    std::vector<Inserted>& entries = record->of(pc);
    const bool stored = pc.insert(model, format, tokens, caches);
    Inserted e{model, format.layers(), tokens, {}, {}, {}};
    for (const auto& c : caches) {
      if (!aliases) {
        e.copies.push_back(clone_cache(*c));
        continue;
      }
      CacheState s = c->state();
      std::map<std::string, std::pair<DTensor, std::int64_t>> alias;
      const std::map<std::string, DTensor> live = live_buffers(*c);
      for (const auto& [name, t] : s.tensors) alias.emplace(name, std::pair{live.at(name), t.dim(2)});
      s.tensors.clear();
      e.meta.push_back(std::move(s));
      e.aliases.push_back(std::move(alias));
    }
    entries.push_back(std::move(e));
    return stored;
  };
  h.prefix_fetch = [record, aliases](PrefixCache& pc, const std::string& model, const CacheFormat& format,
                                     const Tokens& tokens) {
    PrefixFetch got = pc.fetch(model, format, tokens);
    std::vector<Inserted>& entries = record->of(pc);
    const auto live = [&](const Inserted& e) {
      return e.model == model && e.format == format.layers() && pc.contains(model, format, e.tokens);
    };
    if (aliases) {
      // 48: the hit is rebuilt from the live buffers the entry aliases.
      if (got.kind == MatchKind::miss) return got;
      const Inserted* hit = nullptr;
      const Tokens reused(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(got.reused));
      for (const Inserted& e : entries) {  // the latest insert of the matched key
        const bool match = got.kind == MatchKind::exact    ? e.tokens == tokens
                           : got.kind == MatchKind::prefix ? e.tokens == reused
                                                           : e.tokens.size() == got.reused + got.trimmed &&
                                                                 common_prefix(e.tokens, tokens) >= got.reused;
        if (match && live(e)) hit = &e;
      }
      if (hit == nullptr) return got;
      Backend& be = got.caches.at(0)->backend();
      for (std::size_t l = 0; l < got.caches.size(); ++l) {
        CacheState s = hit->meta[l];
        for (const auto& [name, handle] : hit->aliases[l])
          s.tensors.emplace(name, be.download(seq::slice(be, handle.first, 0, handle.second)));
        got.caches[l] = cache_from_state(be, s);
        if (got.trimmed > 0) got.caches[l]->trim(static_cast<std::int64_t>(got.trimmed));
      }
      return got;
    }
    // 42: a stored entry that extends or diverges from the request is reused whatever its
    // rings hold, each ring cut by a raw slice of its buffer (the real cache skips an
    // entry whose ring wrapped, and trims the others).
    const Inserted* best = nullptr;
    std::size_t best_reused = got.reused;
    for (const Inserted& e : entries) {
      const std::size_t l = common_prefix(e.tokens, tokens);
      if (!live(e) || l == e.tokens.size()) continue;
      const std::size_t r = std::min(l, tokens.size() - 1);
      if (r > best_reused) best = &e, best_reused = r;
    }
    if (best == nullptr) return got;
    PrefixFetch out;
    out.kind = common_prefix(best->tokens, tokens) == tokens.size() ? MatchKind::supersequence : MatchKind::lcp;
    out.reused = best_reused;
    out.trimmed = best->tokens.size() - best_reused;
    out.remaining.assign(tokens.begin() + static_cast<std::ptrdiff_t>(best_reused), tokens.end());
    const auto r = static_cast<std::int64_t>(best_reused);
    for (const auto& c : best->copies) {
      Backend& be = c->backend();
      if (const auto* ring = dynamic_cast<const RotatingKVCache*>(c.get())) {
        const std::int64_t m = std::min(r, ring->stored());
        DTensor k = seq::slice(be, ring->key_buffer(), 0, m), v = seq::slice(be, ring->value_buffer(), 0, m);
        out.caches.push_back(std::make_unique<RotatingKVCache>(be, ring->max_size(), std::move(k), std::move(v), r));
      } else {
        out.caches.push_back(clone_cache(*c));
        out.caches.back()->trim(static_cast<std::int64_t>(out.trimmed));
      }
    }
    return out;
  };
  return h;
}

}  // namespace

std::vector<BatchMutant> batch_mutants() {
  std::vector<BatchMutant> out;
  out.push_back({"batch-rotating-extract-negative-padding", "vllm-mlx PR 256 / mlx-lm#1114", production_batch_hooks()});
  out.back().batch.wrap = wrap_in<ExtractNegativePadding>;
  out.push_back({"prefix-cache-mixes-kv-bits", "SharpAI/SwiftLM PR 73 review", production_batch_hooks()});
  out.back().batch.prefix_fetch = [](PrefixCache& pc, const std::string& model, const CacheFormat& format,
                                     const std::vector<std::int32_t>& tokens) {
    return pc.fetch(model, CacheFormat::uniform(format.size(), CacheFormat::kv()), tokens);
  };
  out.push_back({"42.prefix-reuses-wrapped-ring-by-slice", "vlm#1715 / #1748", prefix_mutant(false)});
  out.push_back({"44.batch-cache-sees-no-padding", "vlm#1542 / #1543", production_batch_hooks()});
  out.back().batch.wrap = wrap_in<SeesNoPadding>;
  out.push_back({"45.attend-ignores-padding-mask", "mlx-lm#1906", production_batch_hooks()});
  out.back().batch.wrap = wrap_in<MaskIgnoresPadding>;
  out.push_back({"48.prefix-entry-aliases-live-cache", "vllm-mlx#642", prefix_mutant(true)});
  for (BatchMutant& m : batch_lifecycle_mutants()) out.push_back(std::move(m));
  return out;
}

}  // namespace kvlab::prop::zoo
