#include "cache/device_batch_kv_cache.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "cache/batch_layout.h"
#include "cache/seq_ops.h"
#include "kvlab/error.h"

namespace kvlab {

namespace {

constexpr const char* kOwner = "DeviceBatchKVCache";

std::vector<std::int32_t> i32_vector(const CacheState& s, const std::string& field) {
  const auto it = s.tensors.find(field);
  KVLAB_REQUIRE(it != s.tensors.end(), corrupt, kOwner, " state has no '", field, "'");
  const Tensor& t = it->second;
  KVLAB_REQUIRE(t.dtype() == DType::i32 && t.rank() == 1 && t.dim(0) >= 1, corrupt, kOwner, " state '", field,
                "' is ", dtype_name(t.dtype()), shape_str(t.shape()), ", expected int32 (B,) with B >= 1");
  std::vector<std::int32_t> out;
  for (const std::int64_t v : t.to_ints()) out.push_back(static_cast<std::int32_t>(v));
  return out;
}

}  // namespace

DeviceBatchKVCache::DeviceBatchKVCache(Backend& backend, std::vector<std::int32_t> left_padding)
    : Cache(backend), left_padding_(std::move(left_padding)) {
  KVLAB_REQUIRE(!left_padding_.empty(), invalid_argument, kOwner, " needs at least one sequence (left_padding is empty)");
  std::vector<std::int32_t> start;
  for (std::size_t b = 0; b < left_padding_.size(); ++b) {
    KVLAB_REQUIRE(left_padding_[b] >= 0, invalid_argument, kOwner, ": left_padding[", b, "] = ", left_padding_[b],
                  " is negative");
    start.push_back(-left_padding_[b]);
  }
  live_ = backend.allocate(DType::i32, {batch_size()});
  backend.upload(live_, start.data());
}

void DeviceBatchKVCache::check_chunk(const DTensor& k, const DTensor& v) const {
  seq::require_block(k, "k");
  seq::require_block(v, "v");
  KVLAB_REQUIRE(is_float(k.dtype) && k.dtype == v.dtype, dtype_mismatch, kOwner, ": k is ", dtype_name(k.dtype),
                " and v is ", dtype_name(v.dtype), ", expected one float dtype");
  KVLAB_REQUIRE(seq::batch(k) == batch_size() && seq::batch(v) == batch_size(), shape_mismatch, kOwner, " holds ",
                batch_size(), " sequences but the update has k ", shape_str(k.shape), " and v ", shape_str(v.shape));
  KVLAB_REQUIRE(seq::heads(k) == seq::heads(v) && seq::length(k) == seq::length(v), shape_mismatch, kOwner,
                ": k ", shape_str(k.shape), " and v ", shape_str(v.shape), " differ in heads or tokens");
  if (!empty()) {
    KVLAB_REQUIRE(k.dtype == keys_.dtype, dtype_mismatch, kOwner, " holds ", dtype_name(keys_.dtype),
                  " but the update is ", dtype_name(k.dtype));
    KVLAB_REQUIRE(seq::heads(k) == seq::heads(keys_) && seq::width(k) == seq::width(keys_) &&
                      seq::width(v) == seq::width(values_),
                  shape_mismatch, kOwner, " holds keys ", shape_str(keys_.shape), " and values ",
                  shape_str(values_.shape), " but the update has k ", shape_str(k.shape), " and v ",
                  shape_str(v.shape));
  }
  KVLAB_REQUIRE(seq::length(k) <= std::numeric_limits<std::int32_t>::max() - idx_, invalid_argument, kOwner,
                " update of ", seq::length(k), " tokens at column ", idx_, " overflows the int32 offsets");
}

FetchedKV DeviceBatchKVCache::update(const DTensor& k, const DTensor& v) {
  check_chunk(k, v);
  Backend& be = backend();
  const std::int64_t s = seq::length(k);
  if (empty() || idx_ + s > capacity()) {
    const std::int64_t grown = seq::grown_capacity(idx_, capacity(), s, kStep);
    if (empty()) {
      keys_ = seq::alloc_poisoned(be, k.dtype, {batch_size(), seq::heads(k), grown, seq::width(k)});
      values_ = seq::alloc_poisoned(be, v.dtype, {batch_size(), seq::heads(v), grown, seq::width(v)});
    } else {
      keys_ = seq::regrow(be, keys_, idx_, grown);
      values_ = seq::regrow(be, values_, idx_, grown);
    }
  }
  const ConstTensorView pads{reinterpret_cast<const std::byte*>(left_padding_.data()), DType::i32, {batch_size()}};
  be.kv_append_advance({k, v, pads, live_, keys_, values_});
  idx_ += s;
  return fetch();
}

DTensor DeviceBatchKVCache::snapshot_positions(std::int64_t batch) const {
  KVLAB_REQUIRE(batch == batch_size(), shape_mismatch, kOwner, " holds ", batch_size(),
                " sequences but the step has ", batch, " rows");
  DTensor out = backend().allocate(DType::i32, {batch});
  backend().kv_snapshot({live_, out});
  return out;
}

std::vector<std::int32_t> DeviceBatchKVCache::offsets() const {
  std::vector<std::int32_t> out(left_padding_.size());
  backend().download(live_, out.data());
  return out;
}

CacheMask DeviceBatchKVCache::make_mask(std::int64_t n, int window) const {
  // BatchKVCache's mask: causal over the shared cursor, padded columns hidden per row.
  return batch_causal_mask(kOwner, n, window, left_padding_);
}

std::size_t DeviceBatchKVCache::nbytes() const {
  std::size_t n = live_.nbytes();
  if (!empty()) n += keys_.nbytes() + values_.nbytes();
  return n;
}

FetchedKV DeviceBatchKVCache::fetch() const {
  if (empty()) return {};
  return {seq::slice(backend(), keys_, 0, idx_), seq::slice(backend(), values_, 0, idx_)};
}

std::vector<SequenceContent> DeviceBatchKVCache::content(ContentForm) const {
  // Row b's real tokens are its columns [left_padding[b], idx); positions end at the
  // device offset, so a wrong advance shows in the positions.
  std::vector<SequenceContent> out;
  const std::vector<std::int32_t> offs = offsets();
  for (std::int64_t b = 0; b < batch_size(); ++b) {
    const std::int64_t first = std::min<std::int64_t>(left_padding_[static_cast<std::size_t>(b)], idx_);
    std::vector<ContentPart> parts{{"keys", {}}, {"values", {}}};
    if (!empty() && first < idx_) {
      const std::vector<std::int32_t> row{static_cast<std::int32_t>(b)};
      parts[0].rows = seq::slice(backend(), seq::gather(backend(), keys_, row), first, idx_);
      parts[1].rows = seq::slice(backend(), seq::gather(backend(), values_, row), first, idx_);
    }
    out.push_back(newest_content(offs[static_cast<std::size_t>(b)], idx_ - first, std::move(parts)));
  }
  return out;
}

std::vector<BackingBuffer> DeviceBatchKVCache::buffers() const {
  if (empty()) return {};
  return {{"keys", keys_, idx_}, {"values", values_, idx_}};
}

CacheState DeviceBatchKVCache::state() const {
  CacheState s{std::string(class_name()), {}, {}};
  if (!empty()) {
    const FetchedKV kv = fetch();
    s.tensors.emplace("keys", backend().download(kv.keys));
    s.tensors.emplace("values", backend().download(kv.values));
  }
  s.tensors.emplace("left_padding", i32_tensor(left_padding_));
  s.tensors.emplace("offset", i32_tensor(offsets()));
  s.meta["idx"] = std::to_string(idx_);
  return s;
}

std::unique_ptr<DeviceBatchKVCache> DeviceBatchKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == kOwner, corrupt, "state of class '", state.class_name, "' cannot be loaded as a ",
                kOwner);
  const std::int64_t idx = meta_integer(state, kOwner, "idx", 0, std::numeric_limits<std::int32_t>::max());
  const std::vector<std::int32_t> pads = i32_vector(state, "left_padding"), offs = i32_vector(state, "offset");
  KVLAB_REQUIRE(offs.size() == pads.size(), corrupt, kOwner, " state has ", offs.size(), " offsets for ", pads.size(),
                " rows");
  for (std::size_t b = 0; b < pads.size(); ++b) {
    KVLAB_REQUIRE(pads[b] >= 0 && offs[b] == idx - pads[b], corrupt, kOwner, " state row ", b, ": offset ", offs[b],
                  " is not idx ", idx, " − left_padding ", pads[b]);
  }
  auto cache = std::make_unique<DeviceBatchKVCache>(backend, pads);
  const auto k_it = state.tensors.find("keys"), v_it = state.tensors.find("values");
  KVLAB_REQUIRE((k_it == state.tensors.end()) == (v_it == state.tensors.end()) &&
                    (idx == 0 || k_it != state.tensors.end()),
                corrupt, kOwner, " state holds ", idx, " columns but not both 'keys' and 'values'");
  if (k_it != state.tensors.end()) {
    const Tensor &k = k_it->second, &v = v_it->second;
    const auto B = static_cast<std::int64_t>(pads.size());
    KVLAB_REQUIRE(k.rank() == 4 && v.rank() == 4 && is_float(k.dtype()) && k.dtype() == v.dtype() && k.dim(0) == B &&
                      v.dim(0) == B && k.dim(1) == v.dim(1) && k.dim(2) == idx && v.dim(2) == idx,
                  corrupt, kOwner, " state 'keys' ", dtype_name(k.dtype()), shape_str(k.shape()), " and 'values' ",
                  dtype_name(v.dtype()), shape_str(v.shape()), " must be one float dtype, (", B, ", H, ", idx, ", D)");
    if (idx > 0) (void)cache->update(backend.upload(k), backend.upload(v));
  }
  return cache;
}

}  // namespace kvlab
