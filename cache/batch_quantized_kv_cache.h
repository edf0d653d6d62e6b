// BatchQuantizedKVCache(left_padding, spec, rounding): BatchKVCache's semantics over
// packed data (docs/semantics.md §Batch quantized cache, mlx-vlm's class; mlx-lm has none: PRs
// #941, #1322, #1584 closed, so quantized prompt caches could never be batched,
// docs/upstream-bugs.md row 34).
//
// The bookkeeping is BatchLayout's (cache/batch_layout.h), shared with BatchKVCache;
// only the components differ: keys.{wq, scales, biases} and values.{wq, scales, biases}
// (no biases for the fp modes), each (B, H, C, W_c) and row-aligned in token order.
// Each incoming chunk is quantized on its own through the Backend, per token row, so a
// row's stored bits equal quantizing that row's tokens alone, in any chunking.
//
// Differences from mlx-vlm, on purpose:
// - Allocation width is QuantSpec::packed_words (D·bits/32), not dim // (32 // bits),
//   which breaks the first update for 3/5/6 bits (docs/upstream-bugs.md §U1).
// - extend rejects caches of another spec or rounding (mlx-vlm would concatenate codes
//   of different widths or meanings); merge exists (QuantizedKVCache → batch).
// - is_trimmable() is true and trim works, where mlx-vlm returns False / 0. Quantization
//   is per token row, so dropping the newest columns leaves every other stored bit as it
//   was (the same reason QuantizedKVCache is trimmable in mlx-lm,
//   docs/semantics.md §Quantized cache). mlx-vlm's False makes trim_prompt_cache skip the layer
//   silently and desynchronise it from the plain layers it leaves unquantized (the last layer:
//   docs/lifecycle.md §Quantization policy).
// - Padding / unused columns are poison (codes all ones, NaN scales and biases), not the
//   zeros that decode to 0; masks hide them.
// - The rest as in batch_layout.h (right padding filtered and saved, extract rejected
//   while a right pad is pending, offsets by value).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/batch_cache.h"
#include "cache/batch_layout.h"
#include "cache/quantized_kv_cache.h"

namespace kvlab {

class BatchQuantizedKVCache final : public Cache, public BatchCache {
 public:
  static constexpr std::int64_t kStep = BatchLayout::kStep;

  // left_padding: one entry >= 0 per sequence (B >= 1). spec: any valid QuantSpec
  // (affine as in mlx-vlm, or an fp mode as QuantizedKVCache allows).
  BatchQuantizedKVCache(Backend& backend, std::vector<std::int32_t> left_padding, QuantSpec spec, Rounding rounding);

  std::string_view class_name() const override { return "BatchQuantizedKVCache"; }
  bool is_quantized() const override { return true; }
  // update() stays Cache's misuse Error (mlx-swift-lm#71).
  FetchedQuantizedKV update_quantized(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override { return layout_.idx(); }
  std::vector<std::int32_t> offsets() const override { return layout_.offsets(); }
  // create_causal_mask(n, _idx, window, left_padding) in structured form (mlx-vlm#1208
  // fixed a version that used the negative per-row offset).
  CacheMask make_mask(std::int64_t n, int window) const override { return layout_.make_mask(n, window); }
  bool is_trimmable() const override { return true; }
  std::int64_t trim(std::int64_t n) override { return layout_.trim(n); }
  bool empty() const override { return layout_.empty(); }
  std::size_t nbytes() const override { return layout_.nbytes(); }
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  // Components sliced to [0, _idx), left_padding, offset, right_padding (pending only),
  // meta idx, bits, group_size, mode, rounding.
  CacheState state() const override;
  static std::unique_ptr<BatchQuantizedKVCache> from_state(Backend& backend, const CacheState& state);

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
  void extend(const BatchQuantizedKVCache& other);
  void extend(const Cache& other) override { extend(extend_operand(*this, other)); }
  // Row i as a QuantizedKVCache holding its real tokens [max(0, lp[i]), _idx).
  std::unique_ptr<QuantizedKVCache> extract(std::int64_t i) const;
  std::unique_ptr<Cache> extract_sequence(std::int64_t i) const override { return extract(i); }
  BatchCache* batch() override { return this; }
  const BatchCache* batch() const override { return this; }
  // Single-sequence quantized caches (B = 1, one spec and rounding, same backend) right-
  // aligned into one batch; the QuantSpec comes from caches[0].
  static std::unique_ptr<BatchQuantizedKVCache> merge(Backend& backend,
                                                      std::span<const QuantizedKVCache* const> caches);

  const QuantSpec& spec() const { return spec_; }
  Rounding rounding() const { return rounding_; }
  std::int64_t batch_size() const override { return layout_.batch_size(); }
  std::int64_t idx() const { return layout_.idx(); }
  std::int64_t capacity() const { return layout_.capacity(); }
  std::vector<std::int32_t> left_padding() const { return layout_.left_padding(); }
  std::optional<std::vector<std::int32_t>> right_padding() const { return layout_.right_padding(); }
  // Columns [0, _idx) as fresh packed tensors (what the last update returned).
  FetchedQuantizedKV fetch() const;
  // The physical packed buffers (B, H, capacity, ·), for tests of layout and poison.
  QuantizedDTensor key_buffer() const;
  QuantizedDTensor value_buffer() const;

 private:
  BatchQuantizedKVCache(Backend& backend, BatchLayout layout, QuantSpec spec, Rounding rounding);
  QuantizedDTensor quantize(const DTensor& x) const;
  // Components (k parts then v parts) <-> the two packed tensors.
  static std::vector<DTensor> components_of(const QuantizedDTensor& k, const QuantizedDTensor& v);
  FetchedQuantizedKV packed(const std::vector<DTensor>& components) const;

  QuantSpec spec_;
  Rounding rounding_;
  BatchLayout layout_;
};

}  // namespace kvlab
