// BatchLayout: the bookkeeping shared by BatchKVCache and BatchQuantizedKVCache
// (docs/semantics.md §Batch cache, docs/semantics.md §Batch quantized cache), written once over a
// list of component blocks.
//
// A batch cache is B rows right-aligned at one cursor `_idx`:
//   row b = [left_padding[b] invalid columns][offset[b] real tokens], offset = _idx − lp.
// Plain and quantized caches differ only in what a column is made of: plain stores
// {keys, values}; quantized stores {k codes, k scales, k biases, v codes, v scales,
// v biases}. Every component is a (B, H, C, W_c) block, row-aligned in token order, so
// growth, roll, gather, shift, extend, extract and merge move each component the same
// way (mlx-vlm's finalize applies dynamic_roll "to each of the three arrays" for exactly
// this reason). Everything here is therefore independent of the data format.
//
// Deviations from mlx-lm, on purpose (each guards against a listed upstream bug):
// - offset is not stored: it is derived as _idx − left_padding, so the invariant of
//   docs/semantics.md §Batch cache cannot break, and offsets() is a fresh vector
//   (docs/lifecycle.md §Offset snapshot, mlx-lm#1097/#1848).
// - filter also filters the pending right padding (docs/upstream-bugs.md §U7; mlx-vlm does).
// - extract while a right padding is pending is rejected (mlx-lm PR #1746).
// - the state carries the pending right padding (docs/upstream-bugs.md §U6).
// - unused / padding columns are NaN poison (codes all ones), not zeros; masks hide
//   them (reference/sdpa.h: hidden keys are never read).
// Every mutator validates first, builds new buffers, then commits: a kvlab::Error
// leaves the layout exactly as it was.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

class BatchLayout {
 public:
  static constexpr std::int64_t kStep = 256;  // mlx-lm's growth step (docs/semantics.md §Common rules)

  // One row handed to merge: `length` tokens in rows [0, length) of each buffer
  // (1, H_c, >= length, W_c); no buffers when length == 0.
  struct MergeRow {
    std::vector<DTensor> buffers;
    std::int64_t length = 0;
  };

  // `owner` names the cache class in messages; `names` names the components (and their
  // state tensors). left_padding: one entry >= 0 per row, B >= 1.
  BatchLayout(Backend& backend, std::string_view owner, std::vector<std::string> names,
              std::vector<std::int32_t> left_padding);

  std::int64_t batch_size() const { return static_cast<std::int64_t>(left_padding_.size()); }
  std::int64_t idx() const { return idx_; }
  std::int64_t capacity() const { return empty() ? 0 : components_[0].shape[2]; }
  bool empty() const { return components_.empty(); }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<DTensor>& components() const { return components_; }
  std::vector<std::int32_t> left_padding() const { return left_padding_; }
  std::vector<std::int32_t> offsets() const;  // _idx − left_padding, a fresh vector
  std::optional<std::vector<std::int32_t>> right_padding() const { return right_padding_; }
  std::size_t nbytes() const;

  // Writes chunks (B, H_c, S, W_c), one per component, at _idx after growing like
  // KVCache (steps of 256, cut to the cursor off a step boundary); _idx += S.
  void append(const std::vector<DTensor>& chunks);
  // Columns [0, _idx) of every component as fresh tensors; empty when nothing is stored.
  std::vector<DTensor> fetch() const;

  void prepare(const std::optional<std::vector<std::int32_t>>& left_padding,
               const std::optional<std::vector<std::int32_t>>& right_padding);
  void finalize();
  CacheMask make_mask(std::int64_t n, int window) const;
  void filter(const std::vector<std::int32_t>& batch_indices);
  // Throws unless other has the same components (H, W, dtype per component) and backend.
  void require_compatible(const BatchLayout& other) const;
  void extend(const BatchLayout& other);
  // Row i's real tokens [max(0, lp[i]), _idx) as (1, H_c, len, W_c) blocks; an empty
  // vector when the row holds none.
  std::vector<DTensor> extract_row(std::int64_t i) const;
  static BatchLayout merge(Backend& backend, std::string_view owner, std::vector<std::string> names,
                           const std::vector<MergeRow>& rows);
  std::int64_t trim(std::int64_t n);

  // Adds components (sliced to [0, _idx)), left_padding, offset, right_padding (when
  // pending) and meta "idx" to s.
  void save(CacheState& s) const;
  // The inverse; every inconsistency is a kvlab::Error of kind corrupt naming the field.
  static BatchLayout load(Backend& backend, std::string_view owner, std::vector<std::string> names,
                          const CacheState& s);

 private:
  void require_row_vector(const std::vector<std::int32_t>& v, const char* what) const;

  Backend* backend_;
  std::string owner_;
  std::vector<std::string> names_;
  std::vector<DTensor> components_;  // each (B, H_c, capacity, W_c); empty until the first update
  std::int64_t idx_ = 0;
  std::vector<std::int32_t> left_padding_;
  std::optional<std::vector<std::int32_t>> right_padding_;  // set while a right pad is pending
};

// The mask of a batch whose rows share one column cursor (BatchKVCache and its
// device-offset sibling): see BatchLayout::make_mask. `owner` names the cache in errors.
CacheMask batch_causal_mask(std::string_view owner, std::int64_t n, int window,
                            const std::vector<std::int32_t>& left_padding);

}  // namespace kvlab
