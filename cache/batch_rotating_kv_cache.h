// BatchRotatingKVCache(max_size, left_padding) (docs/semantics.md §Batch rotating cache): a batch
// of sliding-window caches sharing one ring buffer (B, H, C, D), as mlx-lm's BatchGenerator uses
// it.
//
// Bookkeeping (host side, all by value):
//   left_padding[b]  invalid columns at the front of row b's temporal order. Every
//                    eviction lowers it, so it legitimately goes negative (docs/traces.md §T4);
//                    anything that slices with it clamps at 0 (vllm-mlx#256, mlx-lm#1114).
//   offset[b]        true token count of row b (keeps growing past the window).
//   idx              physical write cursor (mlx-lm _idx).
//   columns          columns ever written for the batch (mlx-lm _offset).
//   rotated          the ring has wrapped; physical order is not temporal order.
//   pending lengths  absolute target offsets while a right-padded prefill is pending.
//
// The update paths, make_mask and the prepare/finalize/filter/extend/extract/merge rules
// follow mlx-lm, with these deliberate differences (each cited where it is implemented):
//  * S == 1 while a right pad is pending goes through the concat path (mlx-vlm 75f50e84)
//    instead of raising; make_mask anticipates that path, and the right-pad roll.
//  * make_mask anticipates the concat trim from the temporal length, also when the ring
//    has wrapped (mlx-lm uses the cursor and hides one real key in that case).
//  * rolling consumed right padding to the front sets left_padding = max(0, lp) + roll
//    (mlx-lm adds to a negative lp, so extract later returns pads as tokens).
//  * filter also filters the pending lengths (mlx-vlm 570afed3, docs/upstream-bugs.md §U7), and
//    rejects duplicate rows; trim is rejected while a right pad is pending (as in
//    BatchLayout, batch_layout.h).
//  * extract rejects a pending right pad (mlx-lm PR #1746) and returns at most max_size
//    tokens (the last ones, docs/upstream-bugs.md row 7).
//  * merge skips empty rows (mlx-vlm#1916) and rejects keep > 0 (docs/upstream-bugs.md §U10).
//  * state()/from_state keep `rotated` as "true"/"false" (docs/upstream-bugs.md §U5: mlx-lm's
//    bool("False") is True) and the pending lengths (B.6); corrupt states throw.
//  * extend rejects different max_size, and either side with a pending right pad; it
//    does not reorder `other` (mlx-lm linearises both caches in place).
//  * unused and padding columns the cache creates hold NaN poison instead of zeros.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>

#include "cache/batch_cache.h"
#include "cache/cache.h"
#include "cache/rotating_kv_cache.h"

namespace kvlab {

class BatchRotatingKVCache final : public Cache, public BatchCache {
 public:
  static constexpr std::int64_t kStep = 256;

  // One row per entry of left_padding (each >= 0); max_size >= 1.
  BatchRotatingKVCache(Backend& backend, std::int64_t max_size, std::vector<std::int32_t> left_padding);

  std::string_view class_name() const override { return "BatchRotatingKVCache"; }
  // S == 1 (and no right pad pending): write in place in the ring and return the
  // physical buffer. Otherwise: linearise, trim to max_size − 1 and append; returns
  // min(stored, max_size − 1) + S columns in temporal order.
  FetchedKV update(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override { return std::min(columns_, max_size_); }  // mlx-lm size()
  std::vector<std::int32_t> offsets() const override;
  // Boolean (B, 1, n, L) array, L = min(max_size − 1, columns) + n: the key count the
  // next update of n tokens returns, in the order it returns them.
  CacheMask make_mask(std::int64_t n, int window) const override;
  // mlx-lm: _offset < max_size. Also false while a row holds fewer columns than its
  // offset (a merge of a ring that kept max_size − 1 columns: its older tokens are gone,
  // so a trim could not leave the right window).
  bool is_trimmable() const override;
  // Removes up to n newest columns of every row. Throws misuse while a right pad is
  // pending, and on a cache that is not trimmable (a wrapped ring cannot give back
  // evicted columns) unless n == 0.
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !keys_; }
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  CacheState state() const override;
  static std::unique_ptr<BatchRotatingKVCache> from_state(Backend& backend, const CacheState& state);

  // mlx-lm prepare(left_padding=, lengths=, right_padding=); an empty vector means "not
  // given". left_padding only while empty. A positive right padding stores the pending
  // target offsets lengths + offset until finalize().
  void prepare(const std::vector<std::int32_t>& left_padding, const std::vector<std::int32_t>& lengths,
               const std::vector<std::int32_t>& right_padding) override;
  // Rolls the consumed right padding of each row to its front
  // (docs/semantics.md §Batch rotating cache finalize).
  void finalize() override;
  // Keeps the given rows, in that order (no left shift, as in mlx-lm); each index once.
  void filter(const std::vector<std::int32_t>& indices) override;
  // Appends other's rows after this cache's rows. other is not modified.
  void extend(const BatchRotatingKVCache& other);
  void extend(const Cache& other) override { extend(extend_operand(*this, other)); }
  // Row i as a single RotatingKVCache(max_size): its last min(offset_i, max_size) real
  // tokens in temporal order, with offset offset_i.
  std::unique_ptr<RotatingKVCache> extract(std::int64_t i) const;
  std::unique_ptr<Cache> extract_sequence(std::int64_t i) const override { return extract(i); }
  BatchCache* batch() override { return this; }
  const BatchCache* batch() const override { return this; }
  // What extract(i) adopts: (1, H, L, D) keys and values in temporal order, L <= max_size.
  FetchedKV extract_rows(std::int64_t i) const;
  // One row per cache, right-aligned; all max_size equal, keep == 0
  // (docs/semantics.md §Batch rotating cache merge).
  static std::unique_ptr<BatchRotatingKVCache> merge(Backend& backend,
                                                     const std::vector<const RotatingKVCache*>& caches);

  std::int64_t batch_size() const override { return static_cast<std::int64_t>(left_padding_.size()); }
  std::int64_t max_size() const { return max_size_; }
  std::vector<std::int64_t> left_padding() const { return left_padding_; }
  std::int64_t cursor() const { return idx_; }          // mlx-lm _idx
  std::int64_t columns_written() const { return columns_; }  // mlx-lm _offset
  bool rotated() const { return rotated_; }
  std::optional<std::vector<std::int64_t>> pending_lengths() const { return lengths_; }
  std::int64_t capacity() const { return keys_ ? keys_.shape[2] : 0; }
  const DTensor& key_buffer() const { return keys_; }
  const DTensor& value_buffer() const { return values_; }

 private:
  BatchRotatingKVCache(Backend& backend, std::int64_t max_size, std::vector<std::int64_t> left_padding,
                       std::vector<std::int64_t> offset);
  FetchedKV update_concat(const DTensor& k, const DTensor& v);
  FetchedKV update_in_place(const DTensor& k, const DTensor& v);
  // Columns holding data, in temporal order: C when rotated, else the cursor.
  std::int64_t temporal_length() const { return rotated_ ? capacity() : idx_; }
  // Temporal column t lives in physical column (t + temporal_shift()) mod C.
  std::int64_t temporal_shift() const { return rotated_ ? idx_ : 0; }
  // (keys, values) of all rows in temporal order, temporal_length() columns.
  FetchedKV linearised() const;
  std::vector<std::int64_t> pending_roll() const;  // max(0, offset − lengths) per row
  void check_row(std::int64_t i, const char* what) const;

  std::int64_t max_size_;
  DTensor keys_, values_;                   // (B, H, C, Dk|Dv), or none while empty
  std::vector<std::int64_t> left_padding_;  // (B,)
  std::vector<std::int64_t> offset_;        // (B,)
  std::int64_t idx_ = 0, columns_ = 0;
  bool rotated_ = false;
  std::optional<std::vector<std::int64_t>> lengths_;
};

}  // namespace kvlab
