// QuantizedKVCache (docs/semantics.md §Quantized cache), the conversion KVCache →
// QuantizedKVCache (mlx-lm's to_quantized, same section) and the per-layer quantization
// policy (mlx-lm's maybe_quantize_kv_cache; docs/lifecycle.md §Quantization policy).
//
// The cache stores keys and values as packed tensors (codes u32 (B, H, capacity, words),
// scales and — affine only — biases (B, H, capacity, groups)). Every incoming chunk is
// quantized on its own through the Backend; quantization is per token row, so chunking
// never changes the stored bits. Growth follows KVCache (steps of 256, cut to the cursor
// off a step boundary), so capacity and nbytes() match mlx-lm's allocation.
//
// Differences from mlx-lm, on purpose:
// - The allocation width is QuantSpec::packed_words (D·bits/32). mlx-lm's first
//   allocation uses dim // (32 // bits), which is wrong for 3, 5 and 6 bits and breaks
//   the first update at D = 128 (bits 5, 6) and D = 256 (bits 3) (docs/upstream-bugs.md §U1).
// - Unused and trimmed rows are poison (NaN scales/biases, all-ones codes), not zeros.
// - A dtype or shape change between updates is an Error; mlx-lm casts silently into
//   the dtype of the first keys.
// - fp modes (mxfp4, mxfp8, nvfp4) are accepted too (u8 scales, no biases); mlx-lm's
//   QuantizedKVCache is affine only.
// - The state carries mode and rounding besides (offset, group_size, bits), and the
//   offset must agree with the stored rows (maclocal-api#46).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/kv_cache.h"

namespace kvlab {

// Quantizes every row of a cache block x (B, H, S, D) with `spec` through the backend:
// codes (B, H, S, D·bits/32) — D·bits/32 words, not mlx-lm's dim // (32 // bits)
// (docs/upstream-bugs.md §U1) — and scales (+ biases for affine) (B, H, S, D/group). Shared by
// every quantized cache type.
QuantizedDTensor quantize_rows(Backend& backend, const DTensor& x, const QuantSpec& spec, Rounding rounding);

class QuantizedKVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;

  // mlx-lm's QuantizedKVCache defaults to 8 bits, group 64 (KVCache.to_quantized to 4
  // bits: docs/upstream-bugs.md §U9); here the QuantSpec is always explicit. Throws
  // invalid_argument for a spec outside MLX's table (docs/quantization.md §Format table).
  QuantizedKVCache(Backend& backend, QuantSpec spec, Rounding rounding);
  // Adopts packed keys and values as `offset` stored tokens, without re-quantizing (the
  // counterpart of KVCache's adopting constructor; BatchQuantizedKVCache::extract hands
  // a row over this way instead of a round trip through a state). Each side is codes u32
  // (B, H, L, D·bits/32), scales (B, H, L, D/group) — float for affine, u8 for the fp
  // modes — and, for affine only, biases shaped and typed like the scales; both sides
  // carry `spec` and share B, H, L and the scale dtype. 1 <= offset <= L: the offset is
  // given, never inferred from the packed shapes (maclocal-api#46); L is the capacity,
  // and rows [offset, L) become poison. The tensors are taken over without copying.
  // Every violation throws (naming the part) before anything is adopted.
  QuantizedKVCache(Backend& backend, QuantSpec spec, Rounding rounding, QuantizedDTensor keys,
                   QuantizedDTensor values, std::int64_t offset);

  std::string_view class_name() const override { return "QuantizedKVCache"; }
  bool is_quantized() const override { return true; }
  // update() stays Cache's misuse Error (mlx-swift-lm#71, SwiftLM#71): a model calling
  // the plain path on a quantized cache gets a named, recoverable error.
  FetchedQuantizedKV update_quantized(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override { return offset_; }
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }
  CacheMask make_mask(std::int64_t n, int window) const override;
  bool is_trimmable() const override { return true; }
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !keys_.wq; }
  // Codes + scales + biases of the whole allocated capacity; nothing else is held (no
  // float shadow copy: docs/quantization.md §P15).
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  // Tensors keys.{wq,scales,biases}, values.{wq,scales,biases} sliced to [:offset]
  // (biases only for affine; none when offset is 0) and meta offset, bits, group_size,
  // mode, rounding.
  CacheState state() const override;
  std::string parameters() const override;  // its QuantSpec and rounding
  // Validates everything (class, fields, shapes against the QuantSpec) and throws corrupt
  // naming the field; the offset comes from meta and must equal the stored rows.
  static std::unique_ptr<QuantizedKVCache> from_state(Backend& backend, const CacheState& state);

  const QuantSpec& spec() const { return spec_; }
  Rounding rounding() const { return rounding_; }
  std::int64_t offset() const { return offset_; }
  std::int64_t capacity() const { return keys_.wq ? keys_.wq.shape[2] : 0; }
  // The stored tokens [0, offset) as fresh tensors (what the last update returned).
  FetchedQuantizedKV fetch() const;
  // The physical packed buffers (B, H, capacity, ·), read-only: tests check poison.
  const QuantizedDTensor& key_buffer() const { return keys_; }
  const QuantizedDTensor& value_buffer() const { return values_; }

 private:
  friend std::unique_ptr<QuantizedKVCache> to_quantized(const KVCache&, const QuantSpec&, Rounding);

  void check_update(const DTensor& k, const DTensor& v) const;
  // Makes room for rows [offset_, offset_ + s); `min_capacity` lets to_quantized keep
  // the float cache's capacity.
  void reserve(const QuantizedDTensor& qk, const QuantizedDTensor& qv, std::int64_t s, std::int64_t min_capacity);
  void store(const QuantizedDTensor& qk, const QuantizedDTensor& qv);

  QuantSpec spec_;
  Rounding rounding_;
  QuantizedDTensor keys_, values_;  // rows >= offset_ are poison
  std::int64_t offset_ = 0;
};

// KVCache.to_quantized: a QuantizedKVCache with the same offset and capacity whose rows
// [0, offset) are the quantized live rows. mlx-lm quantizes the whole buffer including
// the zero rows past the offset; here those rows are poison instead, which no reader
// may see anyway. An empty source (or one trimmed to 0) gives an empty quantized cache.
std::unique_ptr<QuantizedKVCache> to_quantized(const KVCache& cache, const QuantSpec& spec, Rounding rounding);

// One line of maybe_quantize_kv_caches' report. action is one of:
//   "quantized"          a KVCache with offset >= start, replaced by to_quantized
//   "below-start"        a KVCache whose offset has not reached the start yet
//   "already-quantized"  left as it is
//   "kept-unquantized"   a RotatingKVCache (mlx-lm#1573: its to_quantized raises)
//   "skipped"            any other kind (no quantized form) or an empty slot
struct QuantizeDecision {
  std::size_t layer;
  std::string action;
  std::string reason;
};

// mlx-lm maybe_quantize_kv_cache, decided per layer (mlx-lm#495 / #477: the old code
// looked only at layer 0 and used `>`; the threshold here is offset >= start). Ring
// caches stay plain and are reported instead of raising mid-generation (mlx-lm#1573,
// #1583). Validates the QuantSpec and start first and converts into a side list, so an
// Error (bad spec, a head dim that is not a multiple of the group) replaces no layer.
std::vector<QuantizeDecision> maybe_quantize_kv_caches(std::vector<std::unique_ptr<Cache>>& layers,
                                                       const QuantSpec& spec, Rounding rounding,
                                                       std::int64_t quantized_kv_start);

}  // namespace kvlab
