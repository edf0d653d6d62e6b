#include "cache/prefix_cache.h"

#include <algorithm>

#include "cache/catalogue.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"

namespace kvlab {

namespace {

constexpr const char* kPrefixCache = "prefix cache";

std::string tokens_str(const std::vector<std::int32_t>& tokens) {
  std::string s = "[";
  const std::size_t shown = std::min<std::size_t>(tokens.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) s += cat(i ? ", " : "", tokens[i]);
  if (shown < tokens.size()) s += cat(", … (", tokens.size(), " tokens)");
  return s + "]";
}

void check_request(const std::string& model, const std::vector<std::int32_t>& tokens, const char* op) {
  KVLAB_REQUIRE(!model.empty(), invalid_argument, kPrefixCache, " ", op, ": the model id is empty");
  KVLAB_REQUIRE(!tokens.empty(), invalid_argument, kPrefixCache, " ", op, ": empty token sequence for model '", model, "'");
}

std::size_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  (void)ib;
  return static_cast<std::size_t>(ia - a.begin());
}

bool all_trimmable(const LayerCaches& caches) {
  return std::all_of(caches.begin(), caches.end(), [](const auto& c) { return c->is_trimmable(); });
}

}  // namespace

// ---------------------------------------------------------------------------------
// CacheFormat

CacheFormat::CacheFormat(std::vector<std::string> layers) : layers_(std::move(layers)) {
  KVLAB_REQUIRE(!layers_.empty(), invalid_argument, kPrefixCache, ": a cache format needs at least one layer");
  for (std::size_t i = 0; i < layers_.size(); ++i)
    KVLAB_REQUIRE(!layers_[i].empty(), invalid_argument, kPrefixCache, ": layer ", i, " of the cache format is an empty string");
}

CacheFormat CacheFormat::uniform(std::size_t n, const std::string& layer) {
  return CacheFormat(std::vector<std::string>(n, layer));
}

std::string CacheFormat::kv() { return "KVCache"; }

// Spec and rounding both change the stored bits (docs/quantization.md §Rounding flavours: CPU and
// GPU round ties differently), so either one differing makes the states incompatible.
std::string CacheFormat::quantized(const QuantSpec& spec, Rounding r) {
  return cat("QuantizedKVCache ", to_string(spec), " ", rounding_name(r));
}

// A ring's window and sinks decide which tokens it holds: a state of another window is
// a different cache even before it wraps.
std::string CacheFormat::rotating(std::int64_t max_size, std::int64_t keep) {
  return cat("RotatingKVCache max_size:", max_size, " keep:", keep);
}

std::string CacheFormat::layer(const Cache& cache) {
  // The three deep-copyable kinds; each key is the class and its parameters(), as
  // kv(), rotating() and quantized() spell them.
  if (is_kind(cache, CacheKind::kv) || is_kind(cache, CacheKind::rotating) || is_kind(cache, CacheKind::quantized)) {
    const std::string parameters = cache.parameters();
    return parameters.empty() ? std::string(cache.class_name()) : cat(cache.class_name(), " ", parameters);
  }
  // Other classes have parameters this key does not know yet (TurboQuant bits, chunk
  // size) and no registry entry to deep-copy them: refuse rather than mix states.
  fail(ErrorKind::unsupported, cat(kPrefixCache, ": cannot store a '", cache.class_name(),
                                   "' layer (only KVCache, RotatingKVCache and QuantizedKVCache are deep-copyable)"));
}

CacheFormat CacheFormat::of(const LayerCaches& caches) {
  KVLAB_REQUIRE(!caches.empty(), invalid_argument, kPrefixCache, ": no layer caches to take a format from");
  std::vector<std::string> layers;
  for (std::size_t i = 0; i < caches.size(); ++i) {
    KVLAB_REQUIRE(caches[i] != nullptr, invalid_argument, kPrefixCache, ": layer ", i, " of ", caches.size(), " is null");
    layers.push_back(layer(*caches[i]));
  }
  return CacheFormat(std::move(layers));
}

std::string CacheFormat::describe() const {
  std::string s = "[";
  for (std::size_t i = 0; i < layers_.size(); ++i) s += cat(i ? ", " : "", layers_[i]);
  return s + "]";
}

std::string_view match_kind_name(MatchKind kind) {
  switch (kind) {
    case MatchKind::miss: return "miss";
    case MatchKind::exact: return "exact";
    case MatchKind::supersequence: return "supersequence";
    case MatchKind::prefix: return "prefix";
    case MatchKind::lcp: return "lcp";
  }
  return "?";
}

std::string PrefixCacheStats::describe() const {
  return cat("hits ", hits(), " (exact ", exact_hits, ", supersequence ", supersequence_hits, ", prefix ", prefix_hits,
             ", lcp ", lcp_hits, "), misses ", misses, ", reused tokens ", reused_tokens, ", inserts ", inserts,
             " (replaced ", replaced, "), prefixes dropped ", prefixes_dropped, ", evicted ",
             evicted_for_count + evicted_for_bytes, " (count ", evicted_for_count, ", bytes ", evicted_for_bytes,
             "), rejected too large ", rejected_too_large, ", entries ", entries, ", bytes ", bytes);
}

// ---------------------------------------------------------------------------------
// PrefixCache

PrefixCache::PrefixCache() : PrefixCache(Config{}) {}

PrefixCache::PrefixCache(Config config) : config_(config) {
  KVLAB_REQUIRE(config_.max_entries >= 1, invalid_argument, kPrefixCache, ": max_entries = ", config_.max_entries,
                " (must be >= 1)");
  KVLAB_REQUIRE(config_.max_bytes >= 1, invalid_argument, kPrefixCache, ": max_bytes = ", config_.max_bytes,
                " (must be >= 1)");
}

void PrefixCache::touch(const Slot& slot) {
  Entry& e = slot.entry->second;
  if (e.tick != 0) lru_.erase(e.tick);
  e.tick = ++clock_;
  lru_.emplace(e.tick, slot);
}

void PrefixCache::erase(Buckets::iterator bucket, Bucket::iterator entry, bool drop_empty_bucket) {
  stats_.bytes -= entry->second.nbytes;
  lru_.erase(entry->second.tick);
  bucket->second.erase(entry);
  if (drop_empty_bucket && bucket->second.empty()) buckets_.erase(bucket);
  stats_.entries = lru_.size();
}

void PrefixCache::evict_to_limits() {
  // The newest entry is never evicted here: insert() rejected it if it alone exceeds
  // max_bytes, and max_entries >= 1.
  while (lru_.size() > config_.max_entries || stats_.bytes > config_.max_bytes) {
    const bool for_count = lru_.size() > config_.max_entries;
    const Slot victim = lru_.begin()->second;
    erase(victim.bucket, victim.entry, true);
    ++(for_count ? stats_.evicted_for_count : stats_.evicted_for_bytes);
  }
}

bool PrefixCache::insert(const std::string& model, const CacheFormat& format, const std::vector<std::int32_t>& tokens,
                         const LayerCaches& caches) {
  check_request(model, tokens, "insert");
  KVLAB_REQUIRE(caches.size() == format.size(), invalid_argument, kPrefixCache, " insert: ", caches.size(),
                " layer caches for a format of ", format.size(), " layers ", format.describe());
  for (std::size_t i = 0; i < caches.size(); ++i) {
    KVLAB_REQUIRE(caches[i] != nullptr, invalid_argument, kPrefixCache, " insert: layer ", i, " of ", caches.size(),
                  " is null");
    const std::string actual = CacheFormat::layer(*caches[i]);
    KVLAB_REQUIRE(actual == format.layers()[i], invalid_argument, kPrefixCache, " insert: layer ", i, " is '", actual,
                  "' but the format key says '", format.layers()[i], "'");
    // An entry whose offset is not its token count would hand out positions that do not
    // belong to the tokens it is found under.
    const auto offsets = caches[i]->offsets();
    KVLAB_REQUIRE(offsets.size() == 1 && offsets[0] == static_cast<std::int64_t>(tokens.size()), invalid_argument,
                  kPrefixCache, " insert: layer ", i, " has offset ", offsets.empty() ? -1 : offsets[0], " (", offsets.size(),
                  " rows) but the key has ", tokens.size(), " tokens ", tokens_str(tokens));
  }

  // Deep copies first (vllm-mlx#642): if one fails, nothing stored has changed.
  LayerCaches copies;
  std::size_t bytes = 0;
  for (const auto& c : caches) {
    copies.push_back(clone_cache(*c));
    bytes += copies.back()->nbytes();
  }
  if (bytes > config_.max_bytes) {
    ++stats_.rejected_too_large;
    return false;
  }

  const bool trimmable = all_trimmable(copies);
  const auto bucket = buckets_.try_emplace(BucketKey{model, format}).first;
  const auto [entry, created] = bucket->second.try_emplace(tokens);
  if (!created) {
    stats_.bytes -= entry->second.nbytes;
    ++stats_.replaced;
  }
  entry->second.caches = std::move(copies);
  entry->second.nbytes = bytes;
  stats_.bytes += bytes;
  touch({bucket, entry});
  ++stats_.inserts;

  // mlx-lm's insertion rule (docs/semantics.md §Prefix cache): a trimmable entry serves its stored
  // prefixes through trim(), so they only cost memory. An untrimmable one (a wrapped ring) cannot,
  // so they stay.
  if (config_.drop_trimmable_prefixes && trimmable) {
    for (auto it = bucket->second.begin(); it != bucket->second.end();) {
      const auto next = std::next(it);
      if (it->first.size() < tokens.size() && common_prefix(it->first, tokens) == it->first.size()) {
        erase(bucket, it, false);
        ++stats_.prefixes_dropped;
      }
      it = next;
    }
  }
  stats_.entries = lru_.size();
  evict_to_limits();
  return true;
}

PrefixFetch PrefixCache::fetch(const std::string& model, const CacheFormat& format,
                               const std::vector<std::int32_t>& tokens) {
  check_request(model, tokens, "fetch");
  PrefixFetch out;
  out.remaining = tokens;
  const auto bucket = buckets_.find(BucketKey{model, format});
  if (bucket == buckets_.end()) {
    ++stats_.misses;
    return out;
  }

  const std::size_t n = tokens.size();
  struct Candidate {
    Bucket::iterator entry;
    MatchKind kind = MatchKind::miss;
    std::size_t reused = 0, trim = 0;
  };
  Candidate best;
  for (auto it = bucket->second.begin(); it != bucket->second.end(); ++it) {
    const std::vector<std::int32_t>& key = it->first;
    const std::size_t l = common_prefix(key, tokens);
    Candidate c{it};
    if (l == key.size() && l == n) {
      c.kind = MatchKind::exact;
      if (!config_.exact_keeps_last_token) {
        c.reused = n;  // mlx-lm: exact hit, nothing left to process
      } else {
        if (!all_trimmable(it->second.caches)) continue;  // cannot give a token back
        c.reused = n - 1;
        c.trim = 1;
      }
    } else if (l == key.size()) {
      c.kind = MatchKind::prefix;  // no trim: any layer kind continues exactly
      c.reused = l;
    } else {
      // Needs each layer's own trim(); never hand-slice a ring (mlx-vlm#1715 / #1748).
      if (!all_trimmable(it->second.caches)) continue;
      c.kind = l == n ? MatchKind::supersequence : MatchKind::lcp;
      c.reused = std::min(l, n - 1);  // at least one prompt token left (mlx-lm)
      c.trim = key.size() - c.reused;
    }
    if (c.reused == 0) continue;
    if (c.reused > best.reused || (c.reused == best.reused && c.trim < best.trim)) best = c;
  }
  if (best.kind == MatchKind::miss) {
    ++stats_.misses;
    return out;
  }

  // Copy, then trim the copy: the stored entry is never modified.
  LayerCaches copies;
  for (std::size_t i = 0; i < best.entry->second.caches.size(); ++i) {
    copies.push_back(clone_cache(*best.entry->second.caches[i]));
    if (best.trim > 0) {
      const std::int64_t removed = copies.back()->trim(static_cast<std::int64_t>(best.trim));
      KVLAB_REQUIRE(removed == static_cast<std::int64_t>(best.trim), internal, kPrefixCache, " fetch: layer ", i,
                    " trimmed ", removed, " of ", best.trim, " tokens although it reported is_trimmable()");
    }
    const auto offsets = copies.back()->offsets();
    KVLAB_REQUIRE(offsets.size() == 1 && offsets[0] == static_cast<std::int64_t>(best.reused), internal, kPrefixCache,
                  " fetch: layer ", i, " holds offset ", offsets.empty() ? -1 : offsets[0], ", expected ", best.reused);
  }
  touch({bucket, best.entry});
  out.kind = best.kind;
  out.caches = std::move(copies);
  out.reused = best.reused;
  out.trimmed = best.trim;
  out.remaining.assign(tokens.begin() + static_cast<std::ptrdiff_t>(best.reused), tokens.end());
  switch (best.kind) {
    case MatchKind::exact: ++stats_.exact_hits; break;
    case MatchKind::supersequence: ++stats_.supersequence_hits; break;
    case MatchKind::prefix: ++stats_.prefix_hits; break;
    case MatchKind::lcp: ++stats_.lcp_hits; break;
    case MatchKind::miss: break;
  }
  stats_.reused_tokens += best.reused;
  return out;
}

bool PrefixCache::contains(const std::string& model, const CacheFormat& format,
                           const std::vector<std::int32_t>& tokens) const {
  const auto bucket = buckets_.find(BucketKey{model, format});
  return bucket != buckets_.end() && bucket->second.count(tokens) != 0;
}

}  // namespace kvlab
