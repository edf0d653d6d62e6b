// The attention step through a cache, in the order every model must follow
// (docs/lifecycle.md §Attention step, docs/lifecycle.md §Offset snapshot): snapshot the positions →
// RoPE on Q and K at those positions → build the mask from the pre-update state → update the cache
// through the path its kind requires → attention over what the update returned.
//
// Guards, by construction, against: queries roped at post-update offsets (the offset
// aliasing of mlx-lm#1097 / #1384 / vlm#966); update() reached on a quantized cache
// (mlx-swift-lm#71: attend picks update_quantized for quantized caches); a mask built
// after the update (docs/lifecycle.md §Mask before the update).
#pragma once

#include <optional>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

struct AttendOptions {
  RopeParams rope;             // applied to Q and K; dims 0 = no RoPE
  AttentionParams attention;   // scale, softcap, fully-masked policy; its mask is ignored (the cache's is used)
  int window = 0;              // sliding window for the cache's mask (0 = none)
  std::optional<DTensor> sinks;  // (Hq,) float logits
};

struct AttendResult {
  DTensor out;  // (B, Hq, L, Dv) in q's dtype
  // Positions of token t of row b are positions[b] + t, for Q and K alike: the offsets
  // snapshotted before the update (Cache::snapshot_positions), as the i32 (B,) tensor the
  // RoPE read on the cache's backend, and its host copy for observers.
  DTensor position_offsets;
  std::vector<std::int32_t> positions;
  CacheMask mask;  // the mask used, built from the pre-update state
  // What the update returned; KV-sharing layers read it (docs/lifecycle.md §Offset snapshot).
  std::optional<FetchedKV> kv;
  std::optional<FetchedQuantizedKV> quantized_kv;
};

// q (B, Hq, L, Dk), k (B, Hkv, L, Dk), v (B, Hkv, L, Dv), all pre-RoPE, one float dtype.
AttendResult attend(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& options);

// A KV-shared layer (Gemma-3n / Gemma-4 style): no cache of its own; its queries are
// roped at the producer layer's pre-update positions (its position_offsets tensor) and
// attend over the K/V the producer's update returned, with the producer's mask
// (mlx-lm#1384: reading the producer's offset after its update shifts every query by L).
DTensor attend_shared(Backend& backend, const AttendResult& producer, const DTensor& q, const AttendOptions& options);

}  // namespace kvlab
