#include "cache/kv_cache.h"

#include <algorithm>

#include "cache/seq_ops.h"

namespace kvlab {

namespace {

// validate_kv_update without the S >= 1 rule: also the check of a state's stored blocks,
// which hold no rows when the cache was trimmed to empty.
void validate_kv_blocks(const DTensor& k, const DTensor& v, const char* cache_name) {
  seq::require_block(k, "update keys");
  seq::require_block(v, "update values");
  KVLAB_REQUIRE(is_float(k.dtype) && k.dtype == v.dtype, dtype_mismatch, cache_name, " update: keys ",
                dtype_name(k.dtype), " and values ", dtype_name(v.dtype), " must share one float dtype");
  KVLAB_REQUIRE(k.shape[0] == v.shape[0] && k.shape[1] == v.shape[1] && k.shape[2] == v.shape[2], shape_mismatch,
                cache_name, " update: keys ", shape_str(k.shape), " and values ", shape_str(v.shape),
                " disagree on (B, H, S)");
}

}  // namespace

void validate_kv_update(const DTensor& k, const DTensor& v, const char* cache_name) {
  validate_kv_blocks(k, v, cache_name);
  KVLAB_REQUIRE(k.shape[2] >= 1, invalid_argument, cache_name, " update with S = ", k.shape[2], " tokens");
}

KVCache::KVCache(Backend& backend, DTensor keys, DTensor values) : Cache(backend) {
  validate_kv_update(keys, values, "KVCache");
  offset_ = seq::length(keys);
  keys_ = std::move(keys);
  values_ = std::move(values);
}

void append_kv_rows(Backend& be, const char* cache_name, DTensor& keys, DTensor& values, std::int64_t at,
                    const DTensor& k, const DTensor& v, std::int64_t step) {
  validate_kv_update(k, v, cache_name);
  if (keys) {
    KVLAB_REQUIRE(k.dtype == keys.dtype, dtype_mismatch, cache_name, " holds ", dtype_name(keys.dtype),
                  " but the update is ", dtype_name(k.dtype));
    KVLAB_REQUIRE(k.shape[0] == keys.shape[0] && k.shape[1] == keys.shape[1] && k.shape[3] == keys.shape[3] &&
                      v.shape[3] == values.shape[3],
                  shape_mismatch, cache_name, " holds (B, H, Dk, Dv) = (", keys.shape[0], ", ", keys.shape[1], ", ",
                  keys.shape[3], ", ", values.shape[3], ") but the update has keys ", shape_str(k.shape),
                  " and values ", shape_str(v.shape));
  }
  const std::int64_t s = k.shape[2];
  const std::int64_t capacity = keys ? seq::length(keys) : 0;
  if (!keys || at + s > capacity) {
    const std::int64_t grown = seq::grown_capacity(at, capacity, s, step);
    if (keys) {
      keys = seq::regrow(be, keys, at, grown);
      values = seq::regrow(be, values, at, grown);
    } else {
      keys = seq::alloc_poisoned(be, k.dtype, {k.shape[0], k.shape[1], grown, k.shape[3]});
      values = seq::alloc_poisoned(be, v.dtype, {v.shape[0], v.shape[1], grown, v.shape[3]});
    }
  }
  seq::write_rows(be, k, keys, at);
  seq::write_rows(be, v, values, at);
}

FetchedKV KVCache::update(const DTensor& k, const DTensor& v) {
  append_kv_rows(backend(), "KVCache", keys_, values_, offset_, k, v, kStep);
  offset_ += k.shape[2];
  return fetch();
}

std::vector<SequenceContent> KVCache::content(ContentForm) const {
  return {newest_content(offset_, offset_, plain_parts(fetch()))};
}

std::vector<BackingBuffer> KVCache::buffers() const {
  if (!keys_) return {};
  return {{"keys", keys_, offset_}, {"values", values_, offset_}};
}

FetchedKV KVCache::fetch() const {
  if (!keys_) return {};
  return {seq::slice(backend(), keys_, 0, offset_), seq::slice(backend(), values_, 0, offset_)};
}

CacheMask KVCache::make_mask(std::int64_t n, int window) const {
  KVLAB_REQUIRE(n >= 1, invalid_argument, "make_mask for N = ", n, " tokens");
  KVLAB_REQUIRE(window >= 0, invalid_argument, "make_mask window ", window, " is negative");
  CacheMask mask;
  // mlx-lm's create_attention_mask (docs/kernels.md §Masks): a window always needs a mask, even for
  // N == 1 (mlx-lm#843); otherwise one token sees everything and needs none.
  if (n > 1 || window > 0) {
    mask.spec.kind = MaskKind::causal;
    mask.spec.window = window;
  }
  return mask;
}

std::int64_t KVCache::trim(std::int64_t n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, "trim by ", n, " tokens");
  const std::int64_t removed = std::min(offset_, n);
  if (removed > 0) {
    seq::poison_rows(backend(), keys_, offset_ - removed, offset_);
    seq::poison_rows(backend(), values_, offset_ - removed, offset_);
  }
  offset_ -= removed;
  return removed;
}

std::size_t KVCache::nbytes() const { return keys_ ? keys_.nbytes() + values_.nbytes() : 0; }

CacheState KVCache::state() const {
  CacheState s{std::string(class_name()), {}, {{"offset", std::to_string(offset_)}}};
  // A cache trimmed back to no tokens saves like one never filled, without tensors (its
  // zero-row blocks used to fail from_state with "update with S = 0 tokens": issue 19,
  // found by the deep property run as Decode, Trim(1), SaveLoad).
  if (keys_ && offset_ > 0) {
    const FetchedKV kv = fetch();
    s.tensors.emplace("keys", backend().download(kv.keys));
    s.tensors.emplace("values", backend().download(kv.values));
  }
  return s;
}

std::unique_ptr<KVCache> KVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == "KVCache", corrupt, "state of class '", state.class_name,
                "' cannot be loaded as a KVCache");
  const auto it = state.meta.find("offset");
  KVLAB_REQUIRE(it != state.meta.end(), corrupt, "KVCache state has no 'offset'");
  auto cache = std::make_unique<KVCache>(backend);
  const bool has_keys = state.tensors.count("keys") != 0, has_values = state.tensors.count("values") != 0;
  KVLAB_REQUIRE(has_keys == has_values, corrupt, "KVCache state has keys but no values or the reverse");
  std::int64_t stored = 0;
  if (has_keys) {
    DTensor k = backend.upload(state.tensors.at("keys"));
    DTensor v = backend.upload(state.tensors.at("values"));
    validate_kv_blocks(k, v, "KVCache");
    if (seq::length(k) == 0) {
      // Zero-row blocks: the state of a cache trimmed to empty as kvlab wrote it before
      // issue 19 (and mlx-lm's keys[..., :0, :]). Adopted as an empty buffer, so their
      // dtype and (B, H, D) still bind the next update as they bound the saved cache's.
      cache->keys_ = std::move(k);
      cache->values_ = std::move(v);
    } else {
      cache = std::make_unique<KVCache>(backend, std::move(k), std::move(v));
    }
    stored = cache->offset_;
  }
  // The offset comes from the metadata and must agree with the stored rows; it is never
  // inferred from shapes alone (maclocal-api#46).
  KVLAB_REQUIRE(it->second == std::to_string(stored), corrupt, "KVCache state offset '", it->second,
                "' disagrees with its ", stored, " stored rows");
  return cache;
}

}  // namespace kvlab
