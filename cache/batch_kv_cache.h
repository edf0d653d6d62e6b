// BatchKVCache(left_padding) (docs/semantics.md §Batch cache): B sequences of unequal length in one
// growing cache, right-aligned at a shared cursor _idx, with per-row left padding.
//
// The bookkeeping (padding, offsets, filter/extend/extract/merge/prepare/finalize/trim,
// state) is BatchLayout's (cache/batch_layout.h), shared with BatchQuantizedKVCache;
// this class only says that a column is {keys, values} and converts to / from KVCache.
// Deviations from mlx-lm are listed in batch_layout.h; in addition update() requires
// the cache's dtype (mlx-lm casts silently), as KVCache does.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/batch_cache.h"
#include "cache/batch_layout.h"
#include "cache/kv_cache.h"

namespace kvlab {

class BatchKVCache final : public Cache, public BatchCache {
 public:
  static constexpr std::int64_t kStep = BatchLayout::kStep;

  // left_padding: one entry >= 0 per sequence (B >= 1); offsets start at −left_padding.
  BatchKVCache(Backend& backend, std::vector<std::int32_t> left_padding);

  std::string_view class_name() const override { return "BatchKVCache"; }
  FetchedKV update(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override { return layout_.idx(); }  // mlx-lm size() = _idx
  std::vector<std::int32_t> offsets() const override { return layout_.offsets(); }
  // Causal over offset = _idx with per-row left padding: the structured form of
  // create_causal_mask(n, _idx, window, left_padding); never kind none, even for n == 1.
  CacheMask make_mask(std::int64_t n, int window) const override { return layout_.make_mask(n, window); }
  bool is_trimmable() const override { return true; }
  std::int64_t trim(std::int64_t n) override { return layout_.trim(n); }
  bool empty() const override { return layout_.empty(); }
  std::size_t nbytes() const override { return layout_.nbytes(); }
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  CacheState state() const override;
  static std::unique_ptr<BatchKVCache> from_state(Backend& backend, const CacheState& state);

  // left_padding only while empty; right_padding is held pending until finalize().
  void prepare(const std::optional<std::vector<std::int32_t>>& left_padding,
               const std::optional<std::vector<std::int32_t>>& right_padding = std::nullopt) {
    layout_.prepare(left_padding, right_padding);
  }
  // BatchCache::prepare: lengths are not needed (no ring).
  void prepare(const std::vector<std::int32_t>& left_padding, const std::vector<std::int32_t>& /*lengths*/,
               const std::vector<std::int32_t>& right_padding) override {
    layout_.prepare(given_rows(left_padding), given_rows(right_padding));
  }
  void finalize() override { layout_.finalize(); }
  void filter(const std::vector<std::int32_t>& batch_indices) override { layout_.filter(batch_indices); }
  void extend(const BatchKVCache& other) { layout_.extend(other.layout_); }
  void extend(const Cache& other) override { extend(extend_operand(*this, other)); }
  // Row i as a KVCache holding its real tokens [max(0, lp[i]), _idx).
  std::unique_ptr<KVCache> extract(std::int64_t i) const;
  std::unique_ptr<Cache> extract_sequence(std::int64_t i) const override { return extract(i); }
  BatchCache* batch() override { return this; }
  const BatchCache* batch() const override { return this; }
  // Single-sequence caches (B = 1 each, same backend, H, D, dtype) right-aligned into
  // one batch (mlx-lm KVCache.merge; docs/semantics.md §Batch cache).
  static std::unique_ptr<BatchKVCache> merge(Backend& backend, std::span<const KVCache* const> caches);

  std::int64_t batch_size() const override { return layout_.batch_size(); }
  std::int64_t idx() const { return layout_.idx(); }
  std::int64_t capacity() const { return layout_.capacity(); }
  std::vector<std::int32_t> left_padding() const { return layout_.left_padding(); }
  std::optional<std::vector<std::int32_t>> right_padding() const { return layout_.right_padding(); }
  // Columns [0, _idx) as fresh tensors (what the last update returned).
  FetchedKV fetch() const;
  // The physical buffers (B, H, capacity, D), read-only, for tests of layout and poison.
  DTensor key_buffer() const { return empty() ? DTensor{} : layout_.components()[0]; }
  DTensor value_buffer() const { return empty() ? DTensor{} : layout_.components()[1]; }

 private:
  BatchKVCache(Backend& backend, BatchLayout layout) : Cache(backend), layout_(std::move(layout)) {}
  BatchLayout layout_;
};

}  // namespace kvlab
