// PrefixCache: prompt-cache reuse across requests, after mlx-lm's LRUPromptCache and
// vllm-mlx's MemoryAwarePrefixCache (docs/semantics.md §Prefix cache).
//
// An entry is the per-layer caches after processing a token sequence, stored as deep
// copies made through the registry (clone_cache: state → from_state). So an entry never
// aliases a live buffer (vllm-mlx#642, docs/upstream-bugs.md row 48), a quantized layer is restored
// from state + meta and never infers its offset from packed shapes (maclocal-api#46,
// row 54), and everything stored has a serializable state (vllm-mlx#443/#451, row 49).
//
// Key = (model id, CacheFormat, tokens). CacheFormat lists each layer's class name and
// the parameters that make two states incompatible: the quantization spec and rounding
// of a QuantizedKVCache, the window of a RotatingKVCache. So a quantized and an
// unquantized state (or two kv_bits) never match each other even for the same tokens
// (SharpAI/SwiftLM PR 73 review; the "prefix cache mixing kv_bits" seed bug). The float
// dtype is not part of the format: it is a property of the model, so it belongs in the
// model id.
//
// Storage: per (model, format) a std::map from token sequence to entry (sorted, so
// iteration and tie-breaks are deterministic). fetch scans that bucket once, computing
// each entry's longest common prefix with the request: O(total stored tokens of the
// bucket), which the LRU bounds keep small. A trie (mlx-lm) would find the same
// candidates; the scan is simpler to audit.
//
// Matching (fetch). For every stored entry E with l = lcp(E, T):
//  * E == T (exact): reused |T|, remaining [] — mlx-lm's literal behaviour
//    (docs/semantics.md §Prefix cache). The model then has no token to produce logits from, so the
//    caller must keep them from the request that stored the entry. With
//    Config::exact_keeps_last_token the entry is instead trimmed by one token (only when every
//    layer is trimmable) and the last prompt token is returned to process; an untrimmable exact
//    entry then falls through to the other kinds.
//  * E a proper prefix of T (prefix): reused |E|, no trim; usable for every layer kind
//    (a wrapped ring continued with the rest equals the ring built from scratch).
//  * E extends T (supersequence) or diverges from T after l tokens (lcp): usable only
//    when every layer is trimmable; reused r = min(l, |T| − 1) — at least one prompt
//    token is left to process (mlx-lm) — and each layer of the copy goes through its own
//    trim(|E| − r). Entries with an untrimmable layer (a wrapped RotatingKVCache, hybrid
//    caches) are skipped, never sliced by hand (mlx-vlm#1715 / #1748, docs/upstream-bugs.md row
//    42).
//  The candidate reusing the most tokens wins (mlx-lm: "the longer cached sequence when
//  its common prefix is longer than any shorter hit"); ties go to the one trimming fewer
//  tokens, so a stored prefix beats an equally long trimmed neighbour. This is vllm-mlx's
//  order (exact, supersequence, prefix, lcp) except that vllm-mlx takes any stored
//  prefix before a longer lcp neighbour. A candidate reusing 0 tokens is a miss.
//
// Insertion: deep copies are made first, so a failing clone or a misuse Error changes
// nothing. Replacing the same key replaces its entry. When the new entry is trimmable,
// stored proper prefixes of it under the same key are dropped (mlx-lm;
// docs/semantics.md §Prefix cache): the new entry serves them through a trim. LRU eviction (global
// over models and formats) keeps entry count <= max_entries and the exact sum of the stored copies'
// nbytes() <= max_bytes. An entry larger than max_bytes on its own is not stored (insert returns
// false, counted in rejected_too_large) and evicts nothing. mlx-lm's per-type eviction
// order (assistant / user / system) is not modelled: one LRU order.
//
// Misuse (empty model id or tokens, a null layer, a layer count or layer format that
// does not match the format key, a cache whose offset is not the token count, a class
// the registry cannot copy) throws kvlab::Error naming the value; nothing stored changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

using LayerCaches = std::vector<std::unique_ptr<Cache>>;

// The per-layer format strings of a prompt cache, e.g. {"KVCache", "KVCache"} or
// {"QuantizedKVCache affine:b4:g64 mlx_gpu", "RotatingKVCache max_size:8 keep:4"}.
class CacheFormat {
 public:
  // Throws invalid_argument for no layers or an empty layer string (naming its index).
  explicit CacheFormat(std::vector<std::string> layers);
  // The format of existing caches. Throws invalid_argument for a null layer and
  // unsupported for a class the prefix cache cannot copy (naming it).
  static CacheFormat of(const LayerCaches& caches);
  // n layers of the same format.
  static CacheFormat uniform(std::size_t n, const std::string& layer);

  // Layer format strings: the only classes the registry can deep-copy today.
  static std::string kv();                                         // "KVCache"
  static std::string quantized(const QuantSpec& spec, Rounding r);  // "QuantizedKVCache affine:b4:g64 mlx_gpu"
  static std::string rotating(std::int64_t max_size, std::int64_t keep);  // "RotatingKVCache max_size:8 keep:4"
  static std::string layer(const Cache& cache);                    // one of the above

  const std::vector<std::string>& layers() const { return layers_; }
  std::size_t size() const { return layers_.size(); }
  std::string describe() const;  // "[KVCache, KVCache]"
  friend bool operator==(const CacheFormat&, const CacheFormat&) = default;
  friend auto operator<=>(const CacheFormat&, const CacheFormat&) = default;

 private:
  std::vector<std::string> layers_;
};

enum class MatchKind { miss, exact, supersequence, prefix, lcp };
std::string_view match_kind_name(MatchKind kind);

struct PrefixFetch {
  MatchKind kind = MatchKind::miss;
  LayerCaches caches;                   // deep copies; empty on a miss
  std::vector<std::int32_t> remaining;  // tokens still to process (all of them on a miss)
  std::size_t reused = 0;               // tokens the caches hold (each layer's offset)
  std::size_t trimmed = 0;              // tokens trimmed off the stored entry's copy
};

struct PrefixCacheStats {
  std::uint64_t exact_hits = 0, supersequence_hits = 0, prefix_hits = 0, lcp_hits = 0, misses = 0;
  std::uint64_t reused_tokens = 0;      // sum of PrefixFetch::reused over hits
  std::uint64_t inserts = 0, replaced = 0;
  std::uint64_t prefixes_dropped = 0;   // stored prefixes superseded by a trimmable insert
  std::uint64_t evicted_for_count = 0, evicted_for_bytes = 0;
  std::uint64_t rejected_too_large = 0;
  std::size_t entries = 0, bytes = 0;   // current; bytes = exact nbytes() of stored copies
  std::uint64_t hits() const { return exact_hits + supersequence_hits + prefix_hits + lcp_hits; }
  std::string describe() const;         // one line for reports
};

class PrefixCache {
 public:
  struct Config {
    std::size_t max_entries = 64;
    std::size_t max_bytes = std::size_t{1} << 30;
    bool exact_keeps_last_token = false;  // false: mlx-lm (exact hit returns [] remaining)
    bool drop_trimmable_prefixes = true;  // mlx-lm's insertion rule (docs/semantics.md §Prefix cache)
  };

  PrefixCache();  // default Config
  explicit PrefixCache(Config config);  // throws invalid_argument for a zero limit
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Stores deep copies of `caches` (which stay the caller's) under (model, format,
  // tokens). Returns false when the entry alone exceeds max_bytes (nothing changes).
  bool insert(const std::string& model, const CacheFormat& format, const std::vector<std::int32_t>& tokens,
              const LayerCaches& caches);

  // The best stored match for `tokens` (see the header comment); a hit moves the entry
  // to the most recently used end. The stored entry is never modified.
  PrefixFetch fetch(const std::string& model, const CacheFormat& format, const std::vector<std::int32_t>& tokens);

  // Whether exactly this key is stored; does not touch the LRU order or the stats.
  bool contains(const std::string& model, const CacheFormat& format, const std::vector<std::int32_t>& tokens) const;
  std::size_t size() const { return lru_.size(); }
  std::size_t nbytes() const { return stats_.bytes; }
  const PrefixCacheStats& stats() const { return stats_; }
  const Config& config() const { return config_; }

 private:
  using Tokens = std::vector<std::int32_t>;
  using BucketKey = std::pair<std::string, CacheFormat>;
  struct Entry {
    LayerCaches caches;
    std::size_t nbytes = 0;
    std::uint64_t tick = 0;  // last use; the key of its LRU slot
  };
  using Bucket = std::map<Tokens, Entry>;
  using Buckets = std::map<BucketKey, Bucket>;
  struct Slot {  // map iterators stay valid until their own node is erased
    Buckets::iterator bucket;
    Bucket::iterator entry;
  };

  void touch(const Slot& slot);
  void erase(Buckets::iterator bucket, Bucket::iterator entry, bool drop_empty_bucket);
  void evict_to_limits();

  Config config_;
  Buckets buckets_;
  std::map<std::uint64_t, Slot> lru_;  // by last use: begin() = least recently used
  std::uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace kvlab
