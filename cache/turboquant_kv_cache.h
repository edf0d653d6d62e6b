// TurboQuantKVCache (docs/semantics.md §TurboQuant cache; widths: docs/turboquant.md §Bit widths,
// docs/turboquant.md §A6): a growing
// per-layer cache whose K and V are stored as TurboQuant MSE codes (reference/turboquant.h)
// and read back dequantized.
//
// Bits. `bits` >= 1 in steps of 0.5, at most 8 (the codec's widths are 1..8). A
// fractional width has two meanings in the wild; `meaning` picks one and describe()
// reports it:
// - split_channels (the paper; docs/turboquant.md §Bit widths): each side whose bits are fractional
//   uses a split codec: round-half-even(frac·D) "outlier" channels (clamped to [1, D−1])
//   with the largest mean |x| over the first tensor seen get ceil(bits), the rest
//   floor(bits); two codecs with their own rotation and norm, seeded side_seed (low) and
//   side_seed + 97 (high) as mlx-vlm's _SplitCodec. At D = 128 and 3.5 bits that is
//   64 channels × 4 b + 64 × 3 b = 3.5 code bits per element, plus 2·16/D for the two f16
//   norms (each channel set is normalised on its own).
// - k_floor_v_ceil (mlx-vlm resolve_kv_bits): keys default to floor(bits), values to
//   ceil(bits), each an integer codec ("3.5" = K3/V4).
// key_bits / value_bits override either side under both meanings; an override that is
// fractional gets the split codec (mlx-vlm _build_codec). Keys use `seed`, values seed+1.
//
// Storage, per side and per codec ("part"): norms (B, H, capacity, 1) f16 and indices
// (B, H, capacity, ceil(dim·bits/32)) u32, row-aligned blocks so the seq:: helpers move
// them. Growth is KVCache's (steps of 256, cut to the cursor off a step boundary);
// unused and trimmed rows hold poison (NaN norms, all-ones codes).
//
// Reading. update() stores the new tokens and returns K/V for [0, offset) *dequantized*
// (x̂ = norm · R⁻¹ codebook[idx], computed in double and rounded once to the dtype of
// the first keys): the reference path of docs/turboquant.md §Attention over TurboQuant,
// dequantize then SDPA. is_quantized()
// stays false on purpose: Cache::update_quantized() returns the affine-typed
// FetchedQuantizedKV, which cannot carry TurboQuant codes, and a caller of this cache
// reads plain tensors through update(); calling update_quantized() is a misuse Error.
//
// Codecs are built on the first update (D and, for split sides, the first tensor are
// needed) and are then the cache's only encoder: one rotation basis per cache, so a
// prefill of 17 equals a prefill of 16 plus a decode of 1 bit for bit (vlm#973 mixed a
// dense fused-L=1 basis with the RHT codec). Encoding is per token row, hence chunking
// never changes stored bits once the codecs exist.
//
// Differences from mlx-vlm, on purpose:
// - Rotation signs / Gaussians come from kvlab's splitmix64 stream, not numpy's
//   default_rng: same construction and distribution, different bits.
// - The Lloyd–Max codebook is iterated to convergence (reference/turboquant.cc).
// - The split channel lists, head dims and dtype are part of state(), so from_state()
//   rebuilds every codec exactly and a split cache reloads faithfully
//   (docs/upstream-bugs.md §U16: mlx-vlm's state drops the codecs and the outlier choice).
// - Ties in the outlier score go to the higher channel index (numpy's argsort is
//   unstable there); the count rounds half to even like Python's round().
// - A dtype or head-dim change between updates is an Error; fused decode kernels,
//   the prod (QJL) codec and batch variants are not part of this cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

enum class FractionalBits : std::uint8_t { split_channels, k_floor_v_ceil };
std::string_view fractional_bits_name(FractionalBits m);
FractionalBits fractional_bits_from_name(std::string_view name);  // throws invalid_argument naming it

// One codec of a side and its stored rows.
struct TurboQuantPart {
  TurboQuantCodec codec;   // codec.channels empty = every channel
  DTensor norms, indices;  // (B, H, capacity, 1) f16, (B, H, capacity, words) u32; empty before the first update
};

// Keys or values: the resolved bits, the seed and, after the first update, the codecs.
struct TurboQuantSide {
  double bits = 0;          // e.g. 3 or 3.5
  std::uint64_t seed = 0;   // integer codec / split low codec; the split high codec uses seed + 97
  std::int64_t dim = 0;     // head dim, 0 before the first update
  std::vector<TurboQuantPart> parts;  // 1 part (integer bits) or {low, high} (split)
};

enum class KVSide : std::uint8_t { keys, values, both };

class TurboQuantKVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;
  static constexpr std::uint64_t kValueSeedOffset = 1;  // mlx-vlm: values seeded seed + 1
  static constexpr std::uint64_t kSplitSeedOffset = 97;  // mlx-vlm _SplitCodec high codec

  // Throws invalid_argument naming a width that is < 1, > 8 or not a multiple of 0.5.
  TurboQuantKVCache(Backend& backend, double bits, std::uint64_t seed = 0, std::optional<double> key_bits = {},
                    std::optional<double> value_bits = {},
                    FractionalBits meaning = FractionalBits::split_channels);

  std::string_view class_name() const override { return "TurboQuantKVCache"; }
  FetchedKV update(const DTensor& k, const DTensor& v) override;
  std::int64_t kv_length() const override { return offset_; }
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }
  // KVCache's rule (docs/semantics.md §TurboQuant cache).
  CacheMask make_mask(std::int64_t n, int window) const override;
  bool is_trimmable() const override { return true; }
  std::int64_t trim(std::int64_t n) override;
  bool empty() const override { return !has_rows(); }
  // Norms + packed indices of the whole capacity, both sides; nothing else is held.
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  // Meta: offset, bits, key_bits, value_bits, seed, meaning and, once codecs exist,
  // key_dim, value_dim, dtype and keys.high_channels / values.high_channels for split
  // sides (comma-separated). Tensors, when offset > 0: {keys,values}.{norms,indices} for
  // integer sides, {keys,values}.{low,high}.{norms,indices} for split sides, [:offset].
  CacheState state() const override;
  // Rebuilds the codecs from the meta fields and validates everything; throws corrupt
  // naming the field.
  static std::unique_ptr<TurboQuantKVCache> from_state(Backend& backend, const CacheState& state);

  double bits() const { return bits_; }
  std::uint64_t seed() const { return seed_; }
  FractionalBits meaning() const { return meaning_; }
  double key_bits() const { return keys_.bits; }
  double value_bits() const { return values_.bits; }
  // "TurboQuantKVCache 3.5 bits, meaning k_floor_v_ceil (mlx-vlm resolve_kv_bits): keys 3 b
  // (seed 0), values 4 b (seed 1)" and the channel split once it is known.
  std::string describe() const;
  // Storage bits per cached element, norms and word padding included
  // (Σ parts (words·32 + 16) / D); code_bits_per_element counts the index bits only
  // (Σ parts dim·bits / D). Both need the head dims: misuse before the first update.
  double bits_per_element(KVSide side = KVSide::both) const;
  double code_bits_per_element(KVSide side = KVSide::both) const;

  std::int64_t offset() const { return offset_; }
  std::int64_t capacity() const;
  // The stored tokens [0, offset) dequantized (what the last update returned).
  FetchedKV fetch() const;
  const TurboQuantSide& key_side() const { return keys_; }
  const TurboQuantSide& value_side() const { return values_; }

 private:
  bool has_rows() const { return !keys_.parts.empty() && static_cast<bool>(keys_.parts[0].norms); }
  void check_update(const DTensor& k, const DTensor& v) const;
  void reserve(std::int64_t s, std::int64_t b, std::int64_t h);

  double bits_;
  std::uint64_t seed_;
  FractionalBits meaning_;
  TurboQuantSide keys_, values_;
  DType dtype_ = DType::f32;  // dtype of the first keys: the fetched K/V's dtype
  std::int64_t offset_ = 0;
};

}  // namespace kvlab
