#include "cache/chunked_kv_cache.h"

#include <algorithm>
#include <limits>

#include "cache/kv_cache.h"
#include "cache/seq_ops.h"

namespace kvlab {
namespace {

// Floor division for the chunk index; positions are never negative here, but the mask
// rule is stated with ⌊·⌋ and this keeps it exact if that ever changes.
std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// A non-negative decimal meta field; anything else (sign, spaces, junk) is corrupt.
void require_state_block(const Tensor& t, const char* name) {
  KVLAB_REQUIRE(t.rank() == 4, corrupt, "ChunkedKVCache state ", name, " has shape ", shape_str(t.shape()),
                ", expected (B, H, L, D)");
  KVLAB_REQUIRE(is_float(t.dtype()), corrupt, "ChunkedKVCache state ", name, " has dtype ", dtype_name(t.dtype()),
                ", expected a float dtype");
}

}  // namespace

ChunkedKVCache::ChunkedKVCache(Backend& backend, std::int64_t chunk_size) : Cache(backend), chunk_size_(chunk_size) {
  KVLAB_REQUIRE(chunk_size > 0, invalid_argument, "ChunkedKVCache chunk_size ", chunk_size, " must be positive");
}

bool ChunkedKVCache::maybe_trim_front() {
  const std::int64_t valid = offset_ - start_position_;
  // mlx-lm#1673: the old rule compared keys.shape[2] (the step-padded capacity) with
  // chunk_size, so with chunk_size < 256 it cut into rows that were still live.
  if (valid <= chunk_size_) return true;
  const std::int64_t drop = valid - chunk_size_;
  // The kept rows become a buffer of exactly chunk_size rows, as mlx-lm's keys[trim:valid];
  // the next update regrows it by the step rule (so nbytes follows mlx-lm).
  DTensor keys = seq::slice(backend(), keys_, drop, valid);
  DTensor values = seq::slice(backend(), values_, drop, valid);
  keys_ = std::move(keys);
  values_ = std::move(values);
  start_position_ += drop;
  return true;
}

FetchedKV ChunkedKVCache::update(const DTensor& k, const DTensor& v) {
  validate_kv_update(k, v, "ChunkedKVCache");  // shapes first: the overflow check reads S
  KVLAB_REQUIRE(offset_ + k.shape[2] <= std::numeric_limits<std::int32_t>::max(), invalid_argument,
                "ChunkedKVCache offset ", offset_, " + ", k.shape[2], " tokens overflows the int32 offsets()");
  // KVCache's append, relative to start_position.
  append_kv_rows(backend(), "ChunkedKVCache", keys_, values_, offset_ - start_position_, k, v, kStep);
  offset_ += k.shape[2];
  return fetch();
}

std::vector<SequenceContent> ChunkedKVCache::content(ContentForm) const {
  return {newest_content(offset_, offset_ - start_position_, plain_parts(fetch()))};
}

std::vector<BackingBuffer> ChunkedKVCache::buffers() const {
  if (!keys_) return {};
  return {{"keys", keys_, offset_ - start_position_}, {"values", values_, offset_ - start_position_}};
}

FetchedKV ChunkedKVCache::fetch() const {
  if (!keys_) return {};
  const std::int64_t valid = offset_ - start_position_;
  return {seq::slice(backend(), keys_, 0, valid), seq::slice(backend(), values_, 0, valid)};
}

CacheMask ChunkedKVCache::make_mask(std::int64_t n, int window) const {
  KVLAB_REQUIRE(n >= 1, invalid_argument, "make_mask for N = ", n, " tokens");
  KVLAB_REQUIRE(window >= 0, invalid_argument, "make_mask window ", window, " is negative");
  const std::int64_t keys = offset_ - start_position_ + n;
  Tensor mask(DType::u8, {1, 1, n, keys});  // zero = hidden
  const TensorView view = mask.view();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t q = offset_ + i;
    for (std::int64_t j = 0; j < keys; ++j) {
      const std::int64_t k = start_position_ + j;
      const bool same_chunk = floor_div(k, chunk_size_) == floor_div(q, chunk_size_);
      const bool keep = same_chunk && k <= q && (window == 0 || q - k < window);
      if (keep) view.store_int(i * keys + j, 1);
    }
  }
  CacheMask out;
  out.spec.kind = MaskKind::boolean;
  out.array = std::move(mask);
  return out;
}

std::int64_t ChunkedKVCache::trim(std::int64_t n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, "trim by ", n, " tokens");
  const std::int64_t valid = offset_ - start_position_;
  const std::int64_t removed = std::min(valid, n);
  if (removed > 0) {
    seq::poison_rows(backend(), keys_, valid - removed, valid);
    seq::poison_rows(backend(), values_, valid - removed, valid);
  }
  offset_ -= removed;
  return removed;
}

std::size_t ChunkedKVCache::nbytes() const { return keys_ ? keys_.nbytes() + values_.nbytes() : 0; }

CacheState ChunkedKVCache::state() const {
  CacheState s{std::string(class_name()),
               {},
               {{"chunk_size", std::to_string(chunk_size_)},
                {"start_position", std::to_string(start_position_)},
                {"offset", std::to_string(offset_)}}};
  if (keys_) {
    // Only the valid rows: mlx-lm slices [:offset], which is the whole (poisoned here)
    // buffer once start_position > 0 (docs/upstream-bugs.md §U4).
    const FetchedKV kv = fetch();
    s.tensors.emplace("keys", backend().download(kv.keys));
    s.tensors.emplace("values", backend().download(kv.values));
  }
  return s;
}

std::unique_ptr<ChunkedKVCache> ChunkedKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == "ChunkedKVCache", corrupt, "state of class '", state.class_name,
                "' cannot be loaded as a ChunkedKVCache");
  const std::int64_t chunk = meta_integer(state, "ChunkedKVCache", "chunk_size");
  const std::int64_t start = meta_integer(state, "ChunkedKVCache", "start_position");
  const std::int64_t offset = meta_integer(state, "ChunkedKVCache", "offset");
  KVLAB_REQUIRE(chunk > 0, corrupt, "ChunkedKVCache state chunk_size ", chunk, " must be positive");
  // The offset comes from the metadata, never from the buffer shape (docs/upstream-bugs.md §U4,
  // maclocal-api#46), and must be consistent with what is stored.
  KVLAB_REQUIRE(start <= offset && offset <= std::numeric_limits<std::int32_t>::max(), corrupt,
                "ChunkedKVCache state start_position ", start, " and offset ", offset,
                " need 0 <= start_position <= offset < 2^31");
  for (const auto& [name, tensor] : state.tensors)
    KVLAB_REQUIRE(name == "keys" || name == "values", corrupt, "ChunkedKVCache state has unknown tensor '", name, "'");
  const bool has_keys = state.tensors.count("keys") != 0, has_values = state.tensors.count("values") != 0;
  KVLAB_REQUIRE(has_keys == has_values, corrupt, "ChunkedKVCache state has keys but no values or the reverse");

  auto cache = std::make_unique<ChunkedKVCache>(backend, chunk);
  if (!has_keys) {
    KVLAB_REQUIRE(offset == 0 && start == 0, corrupt, "ChunkedKVCache state has offset ", offset,
                  " and start_position ", start, " but no keys/values");
    return cache;
  }
  const Tensor& k = state.tensors.at("keys");
  const Tensor& v = state.tensors.at("values");
  require_state_block(k, "keys");
  require_state_block(v, "values");
  KVLAB_REQUIRE(k.dtype() == v.dtype() && k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1) && k.dim(2) == v.dim(2),
                corrupt, "ChunkedKVCache state keys ", dtype_name(k.dtype()), shape_str(k.shape()), " and values ",
                dtype_name(v.dtype()), shape_str(v.shape()), " disagree on dtype or (B, H, L)");
  KVLAB_REQUIRE(k.dim(2) == offset - start, corrupt, "ChunkedKVCache state holds ", k.dim(2),
                " rows but offset ", offset, " - start_position ", start, " = ", offset - start);
  cache->keys_ = backend.upload(k);
  cache->values_ = backend.upload(v);
  cache->offset_ = offset;
  cache->start_position_ = start;
  return cache;
}

}  // namespace kvlab
