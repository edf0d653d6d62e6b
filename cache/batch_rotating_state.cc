// BatchRotatingKVCache's serialized state (save / load) and its observables (content,
// buffers): what the cache is, as opposed to how its updates and batch surgery move
// columns (batch_rotating_kv_cache.cc).

#include "cache/batch_rotating_kv_cache.h"
#include "cache/seq_ops.h"

namespace kvlab {

namespace {

using I64 = std::int64_t;
using Rows = std::vector<I64>;

}  // namespace

// ---- state ---------------------------------------------------------------------------------

CacheState BatchRotatingKVCache::state() const {
  CacheState s{std::string(class_name()), {}, {}};
  s.meta = {{"max_size", std::to_string(max_size_)},
            {"_offset", std::to_string(columns_)},
            {"_idx", std::to_string(idx_)},
            // docs/upstream-bugs.md §U5: mlx-lm writes str(rotated) and reads bool("False") ==
            // True.
            {"rotated", rotated_ ? "true" : "false"}};
  const auto ints = [](const Rows& v) { return Tensor::from_ints(DType::i32, {static_cast<I64>(v.size())}, v); };
  s.tensors.emplace("offset", ints(offset_));
  s.tensors.emplace("left_padding", ints(left_padding_));
  if (lengths_) s.tensors.emplace("lengths", ints(*lengths_));  // docs/upstream-bugs.md §U6: mlx-lm drops it
  // A cache trimmed back to no columns saves none, like an empty one (from_state rejects
  // zero-length blocks; found by the lifecycle property: decode, trim(1), save → load).
  if (keys_ && temporal_length() > 0) {
    // The data columns in physical order, like mlx-lm; _idx and rotated restore the ring.
    s.tensors.emplace("keys", backend().download(seq::slice(backend(), keys_, 0, temporal_length())));
    s.tensors.emplace("values", backend().download(seq::slice(backend(), values_, 0, temporal_length())));
  }
  return s;
}

namespace {

Rows state_rows(const CacheState& s, const char* field) {
  const Tensor& t = s.tensors.at(field);
  KVLAB_REQUIRE(t.dtype() == DType::i32 && t.rank() == 1, corrupt, "BatchRotatingKVCache state field '", field,
                "' is ", dtype_name(t.dtype()), shape_str(t.shape()), ", expected i32 (B,)");
  return t.to_ints();
}

}  // namespace

std::unique_ptr<BatchRotatingKVCache> BatchRotatingKVCache::from_state(Backend& backend, const CacheState& s) {
  KVLAB_REQUIRE(s.class_name == "BatchRotatingKVCache", corrupt, "state of class '", s.class_name,
                "' cannot be loaded as a BatchRotatingKVCache");
  const char* const who = "BatchRotatingKVCache";
  const I64 max_size = meta_integer(s, who, "max_size"), columns = meta_integer(s, who, "_offset");
  const I64 idx = meta_integer(s, who, "_idx");
  KVLAB_REQUIRE(max_size >= 1, corrupt, "BatchRotatingKVCache state field 'max_size' is ", max_size);
  const auto rot = s.meta.find("rotated");
  KVLAB_REQUIRE(rot != s.meta.end(), corrupt, "BatchRotatingKVCache state has no 'rotated'");
  // Exact spellings only; mlx-lm's bool("False") turned every saved flag into True.
  const std::string& r = rot->second;
  KVLAB_REQUIRE(r == "true" || r == "false" || r == "True" || r == "False", corrupt,
                "BatchRotatingKVCache state field 'rotated' is '", r, "', expected true or false");
  const bool rotated = r == "true" || r == "True";
  for (const char* f : {"offset", "left_padding"})
    KVLAB_REQUIRE(s.tensors.count(f) != 0, corrupt, "BatchRotatingKVCache state has no '", f, "'");
  Rows off = state_rows(s, "offset"), lp = state_rows(s, "left_padding");
  const auto batch = static_cast<I64>(off.size());
  KVLAB_REQUIRE(batch >= 1 && static_cast<I64>(lp.size()) == batch, corrupt, "BatchRotatingKVCache state field "
                "'left_padding' has ", lp.size(), " rows, 'offset' has ", batch);
  std::optional<Rows> lengths;
  if (s.tensors.count("lengths") != 0) {
    lengths = state_rows(s, "lengths");
    KVLAB_REQUIRE(static_cast<I64>(lengths->size()) == batch, corrupt, "BatchRotatingKVCache state field 'lengths'"
                  " has ", lengths->size(), " rows, 'offset' has ", batch);
  }
  const bool has_k = s.tensors.count("keys") != 0, has_v = s.tensors.count("values") != 0;
  KVLAB_REQUIRE(has_k == has_v, corrupt, "BatchRotatingKVCache state has ", has_k ? "keys but no values"
                                                                               : "values but no keys");
  std::unique_ptr<BatchRotatingKVCache> c(new BatchRotatingKVCache(backend, max_size, std::move(lp), std::move(off)));
  if (!has_k) {
    KVLAB_REQUIRE(idx == 0 && columns == 0 && !rotated, corrupt, "BatchRotatingKVCache state without keys has "
                  "'_idx' ", idx, ", '_offset' ", columns, ", 'rotated' ", r);
  } else {
    const Tensor &k = s.tensors.at("keys"), &v = s.tensors.at("values");
    KVLAB_REQUIRE(k.rank() == 4 && v.rank() == 4 && is_float(k.dtype()) && k.dtype() == v.dtype() &&
                      k.dim(0) == batch && v.dim(0) == batch && k.dim(1) == v.dim(1) && k.dim(2) == v.dim(2) &&
                      k.dim(2) >= 1,
                  corrupt, "BatchRotatingKVCache state fields 'keys' ", dtype_name(k.dtype()), shape_str(k.shape()),
                  " and 'values' ", dtype_name(v.dtype()), shape_str(v.shape()), " do not form (", batch,
                  ", H, L, D) float blocks");
    const I64 len = k.dim(2);
    // The ring invariants the update paths rely on: a wrapped ring is exactly max_size
    // columns with the cursor inside it; otherwise the cursor is the stored length, and
    // below max_size every column ever written is still stored.
    KVLAB_REQUIRE(rotated ? (len == max_size && idx >= 1 && idx <= max_size && columns >= max_size)
                          : (idx == len && columns >= len && (len >= max_size || columns == len)),
                  corrupt, "BatchRotatingKVCache state fields '_idx' ", idx, ", '_offset' ", columns, ", 'rotated' ",
                  r, " do not fit ", len, " stored columns with max_size ", max_size);
    c->keys_ = backend.upload(k);
    c->values_ = backend.upload(v);
  }
  c->idx_ = idx;
  c->columns_ = columns;
  c->rotated_ = rotated;
  c->lengths_ = std::move(lengths);
  return c;
}

std::vector<SequenceContent> BatchRotatingKVCache::content(ContentForm) const {
  std::vector<SequenceContent> out;
  for (I64 i = 0; i < batch_size(); ++i) {
    FetchedKV rows = extract_rows(i);
    out.push_back(newest_content(offset_[static_cast<std::size_t>(i)], rows.length(), plain_parts(rows)));
  }
  return out;
}

std::vector<BackingBuffer> BatchRotatingKVCache::buffers() const {
  if (!keys_) return {};
  return {{"keys", keys_, temporal_length()}, {"values", values_, temporal_length()}};
}

}  // namespace kvlab
