// Sequence-axis building blocks shared by the cache types. Every tensor is a cache
// block (B, H, L, W) in backend memory; all data movement goes through the backend's
// kv_* kernels, so these work unchanged on every backend.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab::seq {

// A new (B, H, L, W) block whose every element holds the dtype's poison (NaN for float
// dtypes, all ones for integer codes), so a read of a slot never written fails loudly.
DTensor alloc_poisoned(Backend& be, DType dtype, const Shape& shape);

// Rows [begin, end) of every batch row: (B, H, end-begin, W).
DTensor slice(Backend& be, const DTensor& src, std::int64_t begin, std::int64_t end);

// A poisoned block of `capacity` rows whose rows [0, keep) are src's rows [0, keep).
DTensor regrow(Backend& be, const DTensor& src, std::int64_t keep, std::int64_t capacity);

// Concatenation along the sequence axis of a then b (equal B, H, W, dtype).
DTensor concat(Backend& be, const DTensor& a, const DTensor& b);

// Writes src (B, H, S, W) into dst rows [at, at+S) of every batch row.
void write_rows(Backend& be, const DTensor& src, const DTensor& dst, std::int64_t at);

// Per-row right roll: out[b, :, i] = src[b, :, (i - shifts[b]) mod L]
// (docs/kernels.md §Cache data movement).
DTensor roll(Backend& be, const DTensor& src, const std::vector<std::int32_t>& shifts);

// Batch rows of src picked by index: (index.size(), H, L, W).
DTensor gather(Backend& be, const DTensor& src, const std::vector<std::int32_t>& index);

// mlx-lm's growth rule for step-allocated caches (docs/semantics.md §Common rules): when `s` new
// rows do not fit after `prev`, a buffer whose cursor is off a step boundary is first cut to
// the cursor, then ceil(s/step)·step rows are appended. Returns the new capacity
// (`capacity` = 0 means no buffer yet). Every cache that grows uses this one rule, so
// nbytes() matches mlx-lm's allocation everywhere.
std::int64_t grown_capacity(std::int64_t prev, std::int64_t capacity, std::int64_t s, std::int64_t step = 256);

// Shape helpers.
inline std::int64_t batch(const DTensor& t) { return t.shape.at(0); }
inline std::int64_t heads(const DTensor& t) { return t.shape.at(1); }
inline std::int64_t length(const DTensor& t) { return t.shape.at(2); }
inline std::int64_t width(const DTensor& t) { return t.shape.at(3); }

// Throws shape_mismatch unless t is a rank-4 cache block; `what` names it.
void require_block(const DTensor& t, const char* what);

}  // namespace kvlab::seq

namespace kvlab::seq {
// Overwrites rows [begin, end) of every batch row with poison (trimmed/evicted slots).
void poison_rows(Backend& be, const DTensor& dst, std::int64_t begin, std::int64_t end);
}  // namespace kvlab::seq
