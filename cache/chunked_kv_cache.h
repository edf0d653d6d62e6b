// ChunkedKVCache(chunk_size) (docs/semantics.md §Chunked cache): the cache of llama4's chunked
// local-attention layers. It holds the tokens [start_position, offset): buffer row r is absolute
// token start_position + r. The model calls maybe_trim_front() before each layer update; it
// drops the oldest tokens so that at most chunk_size of them stay, and the chunk mask
// (make_mask) hides whatever attention must not see from the rows that remain.
//
// Differences from mlx-lm, on purpose:
// - maybe_trim_front() uses the fixed rule of mlx-lm#1673 (trim on the valid count
//   offset − start_position, not on the step-padded buffer length, which dropped live
//   tokens whenever chunk_size < 256).
// - state() holds exactly the valid rows [0, offset − start_position) and the meta
//   holds offset as well as chunk_size and start_position. mlx-lm slices [:offset] and
//   reloads with offset = buffer rows, so a reload could give offset < start_position
//   (docs/upstream-bugs.md §U4: 300 → 260 with start 295).
// - make_mask() exists (mlx-lm has none; llama4 builds the mask itself) and returns the
//   same boolean chunk mask, so every cache hands attention its mask the same way.
// - Unused rows are NaN poison, k/v must already have the cache's dtype, and a shape
//   change is an Error (as KVCache, cache/kv_cache.h).
#pragma once

#include <memory>

#include "cache/cache.h"

namespace kvlab {

class ChunkedKVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;

  // chunk_size > 0, else Error{invalid_argument} naming it.
  ChunkedKVCache(Backend& backend, std::int64_t chunk_size);

  std::string_view class_name() const override { return "ChunkedKVCache"; }

  // With valid = offset − start_position: if valid > chunk_size, drops the oldest
  // valid − chunk_size rows and advances start_position by as many (mlx-lm#1673).
  // Always true: the chunked cache is the kind with a front to trim.
  bool maybe_trim_front() override;

  // Like KVCache::update relative to start_position: writes rows
  // [offset − start, offset − start + S) (growing in steps of 256, cutting to the cursor
  // first when it is off a step boundary) and returns rows [0, offset − start), i.e.
  // absolute tokens [start_position, offset).
  FetchedKV update(const DTensor& k, const DTensor& v) override;

  std::int64_t kv_length() const override { return offset_ - start_position_; }
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }

  // The llama4 chunk mask for an update of n tokens, from the pre-update state (after
  // maybe_trim_front): a boolean u8 array (1, 1, n, L) with L = offset − start + n. Key
  // column j is absolute position k = start + j, query row i is q = offset + i; they
  // attend iff ⌊k/chunk⌋ == ⌊q/chunk⌋ and k <= q, and, when window > 0, q − k < window
  // (the window of docs/kernels.md §Masks applied on top; llama4 itself passes none). Always an
  // array, even for n == 1: the rows kept in front may belong to the previous chunk.
  CacheMask make_mask(std::int64_t n, int window) const override;

  bool is_trimmable() const override { return true; }
  // Removes up to n newest tokens (never below start_position); returns the count.
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !keys_; }
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;

  // tensors "keys"/"values": the valid rows (absent while empty); meta "chunk_size",
  // "start_position", "offset" as decimals.
  CacheState state() const override;
  // Validates everything (class, integers, start <= offset, rows == offset − start,
  // tensor ranks/dtypes/shapes) and throws Error{corrupt} naming the bad field.
  static std::unique_ptr<ChunkedKVCache> from_state(Backend& backend, const CacheState& state);

  std::int64_t chunk_size() const { return chunk_size_; }
  std::int64_t offset() const { return offset_; }
  std::int64_t start_position() const { return start_position_; }
  std::int64_t capacity() const { return keys_ ? keys_.shape[2] : 0; }
  // The valid rows (absolute tokens [start_position, offset)) as fresh tensors.
  FetchedKV fetch() const;
  const DTensor& key_buffer() const { return keys_; }
  const DTensor& value_buffer() const { return values_; }

 private:
  std::int64_t chunk_size_;
  DTensor keys_, values_;  // (B, H, capacity, Dk|Dv); rows >= offset − start are poison
  std::int64_t offset_ = 0, start_position_ = 0;
};

}  // namespace kvlab
