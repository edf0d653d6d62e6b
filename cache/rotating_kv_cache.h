// RotatingKVCache(max_size, keep) (spec §4.3): a sliding-window / bounded cache.
// API pinned here because BatchRotatingKVCache builds on it; see the .cc for details.
#pragma once

#include <memory>

#include "cache/cache.h"

namespace kvlab {

class RotatingKVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;

  RotatingKVCache(Backend& backend, std::int64_t max_size, std::int64_t keep = 0);
  // Adopts temporally ordered keys (1, H, L, Dk) / values (1, H, L, Dv), L <= max_size,
  // as the newest L of `offset` tokens (keep = 0): what BatchRotatingKVCache::extract
  // returns.
  RotatingKVCache(Backend& backend, std::int64_t max_size, DTensor keys, DTensor values, std::int64_t offset);

  std::string_view class_name() const override { return "RotatingKVCache"; }
  FetchedKV update(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override;  // min(offset, max_size): mlx-lm size()
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }
  CacheMask make_mask(std::int64_t n, int window) const override;
  bool is_trimmable() const override { return offset_ < max_size_; }
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !keys_; }
  std::size_t nbytes() const override;
  CacheState state() const override;
  static std::unique_ptr<RotatingKVCache> from_state(Backend& backend, const CacheState& state);

  std::int64_t offset() const { return offset_; }
  std::int64_t max_size() const { return max_size_; }
  std::int64_t keep() const { return keep_; }
  std::int64_t cursor() const { return idx_; }  // mlx-lm _idx
  // The stored tokens in temporal order (oldest first), as fresh tensors.
  FetchedKV temporal() const;
  const DTensor& key_buffer() const { return keys_; }
  const DTensor& value_buffer() const { return values_; }

 private:
  std::int64_t max_size_, keep_;
  DTensor keys_, values_;  // physical ring (B, H, capacity, D)
  std::int64_t offset_ = 0, idx_ = 0;
};

}  // namespace kvlab
