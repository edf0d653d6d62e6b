// RotatingKVCache(max_size, keep) (docs/semantics.md §Rotating cache): a sliding-window / bounded
// cache. API pinned here because BatchRotatingKVCache builds on it; see the .cc for details.
//
// Physical layout (what key_buffer()/value_buffer() hold, B rows of equal length):
//  * linear: rows [0, stored) in temporal order, rows [stored, capacity) NaN poison,
//    cursor == stored (while filling, after a concat, after an adoption);
//  * ring: capacity == max_size, every row live, sinks in [0, keep), the oldest
//    non-sink at the cursor: temporal order = [0, keep) ++ [cursor, max) ++ [keep, cursor).
// `stored` (live rows) is tracked explicitly instead of being inferred from offset as
// mlx-lm does, because offset and stored part ways after an adoption or a restore
// (offset > stored), which is where mlx-lm computes a negative growth (mlx-lm#950).
#pragma once

#include <memory>

#include "cache/cache.h"

namespace kvlab {

class RotatingKVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;

  // Throws invalid_argument unless 1 <= max_size <= INT32_MAX and 0 <= keep < max_size.
  RotatingKVCache(Backend& backend, std::int64_t max_size, std::int64_t keep = 0);
  // Adopts temporally ordered keys (1, H, L, Dk) / values (1, H, L, Dv), L <= max_size,
  // as the newest L of `offset` tokens (keep = 0): what BatchRotatingKVCache::extract
  // returns. Takes the tensors over without copying (as KVCache's adopting constructor).
  RotatingKVCache(Backend& backend, std::int64_t max_size, DTensor keys, DTensor values, std::int64_t offset);

  std::string_view class_name() const override { return "RotatingKVCache"; }
  // S == 1: in-place ring write, returns the live rows in physical order. S > 1:
  // re-linearise, trim to max_size-1 old rows, append; returns all rows in temporal order.
  FetchedKV update(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override;  // min(stored, max_size): mlx-lm size() on its paths
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }
  // Structured causal for chunks; none / a boolean (1, 1, 1, L) vector in physical ring
  // order for one token. Its key count is always next_key_count(n).
  CacheMask make_mask(std::int64_t n, int window) const override;
  bool is_trimmable() const override { return offset_ < max_size_; }
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !keys_; }
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  CacheState state() const override;
  std::string parameters() const override;  // "max_size:M keep:K"
  static std::unique_ptr<RotatingKVCache> from_state(Backend& backend, const CacheState& state);

  std::int64_t offset() const { return offset_; }
  std::int64_t max_size() const { return max_size_; }
  std::int64_t keep() const { return keep_; }
  std::int64_t cursor() const { return idx_; }  // mlx-lm _idx
  // Live rows held (== min(offset, max_size) except after a chunk, which may leave up to
  // max_size-1+S rows, or after an adoption, which may hold fewer than offset).
  std::int64_t stored() const { return stored_; }
  // How many keys the next update of n tokens will return (the mask's key count).
  std::int64_t next_key_count(std::int64_t n) const;
  // The stored tokens in temporal order (oldest first), as fresh tensors.
  FetchedKV temporal() const;
  const DTensor& key_buffer() const { return keys_; }
  const DTensor& value_buffer() const { return values_; }

 private:
  // What the next single-token update does to the layout (mlx-lm's _update_in_place;
  // docs/semantics.md §Rotating cache).
  struct InPlacePlan {
    std::int64_t alloc = 0;      // > 0: first allocation of this many rows
    std::int64_t grow_to = 0;    // > 0: regrow the (full, linear) buffer to this capacity
    bool trim = false;           // buffer longer than max_size after a chunk: cut to max_size
    std::int64_t slot = 0;       // physical row written
    std::int64_t live_after = 0, idx_after = 0;
  };
  InPlacePlan plan_in_place() const;
  FetchedKV update_in_place(const DTensor& k, const DTensor& v);
  FetchedKV update_concat(const DTensor& k, const DTensor& v);

  std::int64_t max_size_, keep_;
  DTensor keys_, values_;  // physical ring (B, H, capacity, D)
  std::int64_t offset_ = 0, idx_ = 0;
  std::int64_t stored_ = 0;  // live rows; rows of the buffer past them are poison
};

}  // namespace kvlab
