// KVCache (docs/semantics.md §KV cache): a growing per-layer cache for one batch of equal-length
// rows.
//
// Capacity grows in steps of 256 exactly as mlx-lm does (when the cursor is not on a
// step boundary the buffer is first cut to the cursor, then a block of ceil(S/256)·256
// rows is appended), so nbytes() matches mlx-lm's allocation. Differences from mlx-lm,
// on purpose: unused rows are NaN poison instead of zeros; k and v must already have
// the cache's dtype (mlx-lm casts silently); a shape change between updates is an
// Error instead of a broadcast failure; an empty cache has a state (no tensors).
#pragma once

#include <memory>

#include "cache/cache.h"

namespace kvlab {

class KVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;

  explicit KVCache(Backend& backend) : Cache(backend) {}
  // Adopts keys (B, H, L, Dk) and values (B, H, L, Dv) as L stored tokens (capacity L),
  // e.g. a row extracted from a batch cache.
  KVCache(Backend& backend, DTensor keys, DTensor values);

  std::string_view class_name() const override { return "KVCache"; }
  FetchedKV update(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override { return offset_; }
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }
  CacheMask make_mask(std::int64_t n, int window) const override;
  bool is_trimmable() const override { return true; }
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !keys_; }
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  CacheState state() const override;
  // to_quantized(*this, spec, rounding) (cache/quantized_kv_cache.h).
  std::unique_ptr<Cache> quantized_form(const QuantSpec& spec, Rounding rounding) const override;
  static std::unique_ptr<KVCache> from_state(Backend& backend, const CacheState& state);

  std::int64_t offset() const { return offset_; }
  std::int64_t capacity() const { return keys_ ? keys_.shape[2] : 0; }
  // The stored tokens [0, offset) as fresh tensors (what the last update returned).
  FetchedKV fetch() const;
  // The physical buffers (B, H, capacity, D), read-only: batch merge copies from them
  // and tests check their poison.
  const DTensor& key_buffer() const { return keys_; }
  const DTensor& value_buffer() const { return values_; }

 private:
  DTensor keys_, values_;  // (B, H, capacity, Dk|Dv); rows >= offset_ are poison
  std::int64_t offset_ = 0;
};

// Checks that k (B, H, S, Dk) and v (B, H, S, Dv) form a valid update: rank 4, float,
// equal dtypes, equal B/H/S, S >= 1. Shared by every cache type.
void validate_kv_update(const DTensor& k, const DTensor& v, const char* cache_name);

// The append of a step-grown plain cache (KVCache, and ChunkedKVCache relative to its
// start): checks k/v against the held buffers (dtype, B, H, Dk, Dv), grows them by the
// mlx-lm step rule when rows [at, at+S) do not fit, and writes k/v there. Validates
// everything before changing anything.
void append_kv_rows(Backend& backend, const char* cache_name, DTensor& keys, DTensor& values, std::int64_t at,
                    const DTensor& k, const DTensor& v, std::int64_t step);

}  // namespace kvlab
