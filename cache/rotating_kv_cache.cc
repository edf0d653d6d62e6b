// RotatingKVCache (docs/semantics.md §Rotating cache), mlx-lm semantics with these deliberate
// differences:
//  * live rows are tracked as `stored_`, not inferred from offset. mlx-lm grows by
//    min(step, max_size - offset), negative when the buffer is shorter than max_size
//    while offset > max_size (adopted or restored caches, mlx-lm#950); here growth is
//    min(step, max_size - capacity) and a single-token update returns only live rows,
//    never the poison tail. On mlx-lm's own paths both rules give identical results.
//  * the single-token windowed mask is placed by each slot's temporal rank instead of
//    mlx-lm's roll by _idx+1; the two agree for keep == 0, the roll misplaces the
//    window once keep > 0 (the docs/upstream-bugs.md §U10 family).
//  * a chunk's causal window ignores keep exactly as mlx-lm does (docs/upstream-bugs.md §U10):
//    with keep > 0, later queries of a chunk can lose the sinks. Reproduced on purpose.
//  * k/v must have the cache's dtype; unused rows are NaN poison, not zeros; the state
//    carries every field and from_state validates it (no silent clamps;
//    docs/semantics.md §Common rules).
#include "cache/rotating_kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "cache/kv_cache.h"
#include "cache/seq_ops.h"

namespace kvlab {

std::string RotatingKVCache::parameters() const { return cat("max_size:", max_size_, " keep:", keep_); }

namespace {

constexpr const char* kRotating = "RotatingKVCache";

// A run of physical rows [begin, begin+length).
struct Run {
  std::int64_t begin, length;
};

// Physical runs, in temporal order, of a live region of `live` rows with cursor idx
// (mlx-lm's _temporal_order; docs/semantics.md §Rotating cache). Linear regions have idx == live; a
// ring with idx <= keep is already in temporal order.
std::vector<Run> temporal_runs(std::int64_t live, std::int64_t idx, std::int64_t keep) {
  if (idx >= live || idx <= keep) return {{0, live}};
  return {{0, keep}, {idx, live - idx}, {keep, idx - keep}};
}

// The physical runs holding temporal positions [from, to) of `runs`.
std::vector<Run> take(const std::vector<Run>& runs, std::int64_t from, std::int64_t to) {
  std::vector<Run> out;
  std::int64_t pos = 0;
  for (const Run& r : runs) {
    const std::int64_t lo = std::max(from, pos), hi = std::min(to, pos + r.length);
    if (lo < hi) out.push_back({r.begin + (lo - pos), hi - lo});
    pos += r.length;
  }
  return out;
}

// Runs with the `drop` oldest non-sink rows removed (mlx-lm _trim): sinks [0, keep)
// stay, then temporal positions [keep + drop, live).
std::vector<Run> drop_oldest(const std::vector<Run>& runs, std::int64_t live, std::int64_t keep, std::int64_t drop) {
  if (drop <= 0) return runs;
  std::vector<Run> out = take(runs, 0, keep);
  for (const Run& r : take(runs, keep + drop, live)) out.push_back(r);
  return out;
}

// A fresh (B, H, capacity, W) block whose leading rows are src's runs, in order; rows
// past them are poison. One kv_copy_blocks call moves everything.
DTensor assemble(Backend& be, const DTensor& src, const std::vector<Run>& runs, std::int64_t capacity) {
  std::vector<SeqBlock> blocks;
  std::int64_t at = 0;
  for (const Run& r : runs) {
    if (r.length == 0) continue;
    for (std::int64_t b = 0; b < seq::batch(src); ++b) blocks.push_back({b, r.begin, b, at, r.length});
    at += r.length;
  }
  const Shape shape{seq::batch(src), seq::heads(src), capacity, seq::width(src)};
  DTensor out = at == capacity ? be.allocate(src.dtype, shape) : seq::alloc_poisoned(be, src.dtype, shape);
  if (!blocks.empty()) be.kv_copy_blocks({src, blocks, out});
  return out;
}

}  // namespace

RotatingKVCache::RotatingKVCache(Backend& backend, std::int64_t max_size, std::int64_t keep)
    : Cache(backend), max_size_(max_size), keep_(keep) {
  // Offsets and mask windows are int32 downstream, so a larger ring could not be described.
  KVLAB_REQUIRE(max_size >= 1 && max_size <= std::numeric_limits<std::int32_t>::max(), invalid_argument, kRotating,
                " max_size = ", max_size, " must be in [1, 2^31)");
  KVLAB_REQUIRE(keep >= 0 && keep < max_size, invalid_argument, kRotating, " keep = ", keep,
                " must be in [0, max_size = ", max_size, ")");
}

RotatingKVCache::RotatingKVCache(Backend& backend, std::int64_t max_size, DTensor keys, DTensor values,
                                 std::int64_t offset)
    : RotatingKVCache(backend, max_size, 0) {
  validate_kv_update(keys, values, kRotating);
  const std::int64_t len = seq::length(keys);
  KVLAB_REQUIRE(seq::batch(keys) == 1, shape_mismatch, kRotating, " adopts one sequence, got keys ",
                shape_str(keys.shape));
  KVLAB_REQUIRE(len <= max_size, invalid_argument, kRotating, " cannot adopt L = ", len, " rows into max_size = ",
                max_size);
  KVLAB_REQUIRE(offset >= len && offset <= std::numeric_limits<std::int32_t>::max(), invalid_argument, kRotating,
                " adopted offset = ", offset, " must be >= its L = ", len, " rows (and fit int32)");
  keys_ = std::move(keys);
  values_ = std::move(values);
  offset_ = offset;
  idx_ = stored_ = len;  // linear, full: the next decode grows (or rotates at max_size)
}

std::int64_t RotatingKVCache::kv_length() const { return std::min(stored_, max_size_); }

FetchedKV RotatingKVCache::update(const DTensor& k, const DTensor& v) {
  validate_kv_update(k, v, kRotating);
  if (keys_) {
    KVLAB_REQUIRE(k.dtype == keys_.dtype, dtype_mismatch, kRotating, " holds ", dtype_name(keys_.dtype),
                  " but the update is ", dtype_name(k.dtype));
    KVLAB_REQUIRE(k.shape[0] == keys_.shape[0] && k.shape[1] == keys_.shape[1] && k.shape[3] == keys_.shape[3] &&
                      v.shape[3] == values_.shape[3],
                  shape_mismatch, kRotating, " holds (B, H, Dk, Dv) = (", keys_.shape[0], ", ", keys_.shape[1], ", ",
                  keys_.shape[3], ", ", values_.shape[3], ") but the update has keys ", shape_str(k.shape),
                  " and values ", shape_str(v.shape));
  }
  KVLAB_REQUIRE(offset_ + k.shape[2] <= std::numeric_limits<std::int32_t>::max(), invalid_argument, kRotating,
                " offset ", offset_, " + ", k.shape[2], " tokens overflows int32 positions");
  return k.shape[2] == 1 ? update_in_place(k, v) : update_concat(k, v);
}

RotatingKVCache::InPlacePlan RotatingKVCache::plan_in_place() const {
  InPlacePlan p;
  const std::int64_t cap = keys_ ? seq::length(keys_) : 0;
  if (!keys_) {
    // mlx-lm allocates min(step, max_size - offset): negative for a restored empty cache
    // with offset > max_size (mlx-lm#950). Capacity only depends on what is stored.
    p.alloc = std::min(kStep, max_size_);
    p.slot = 0;
  } else if (cap > max_size_) {
    // A chunk left more than max_size rows (linear, temporal): cut to max_size, the
    // cursor lands on max_size and rotates to keep (mlx-lm's single-token steps 2-3;
    // docs/semantics.md §Rotating cache).
    p.trim = true;
    p.slot = keep_;
  } else if (stored_ < cap) {
    p.slot = stored_;  // a free (poison) row right after the linear region
  } else if (cap < max_size_) {
    p.grow_to = cap + std::min(kStep, max_size_ - cap);  // never negative (mlx-lm#950)
    p.slot = cap;
  } else {
    p.slot = idx_ == max_size_ ? keep_ : idx_;  // full ring: overwrite the oldest non-sink
  }
  const bool linear = p.alloc > 0 || p.grow_to > 0 || (!p.trim && stored_ < cap);
  p.live_after = linear ? p.slot + 1 : max_size_;
  p.idx_after = p.slot + 1;
  return p;
}

FetchedKV RotatingKVCache::update_in_place(const DTensor& k, const DTensor& v) {
  Backend& be = backend();
  const InPlacePlan p = plan_in_place();
  DTensor nk = keys_, nv = values_;
  if (p.alloc > 0) {
    nk = seq::alloc_poisoned(be, k.dtype, {k.shape[0], k.shape[1], p.alloc, k.shape[3]});
    nv = seq::alloc_poisoned(be, v.dtype, {v.shape[0], v.shape[1], p.alloc, v.shape[3]});
  } else if (p.trim) {
    // The buffer is linear here (a chunk just wrote it), so temporal order is physical.
    const auto runs = drop_oldest({{0, stored_}}, stored_, keep_, stored_ - max_size_);
    nk = assemble(be, keys_, runs, max_size_);
    nv = assemble(be, values_, runs, max_size_);
  } else if (p.grow_to > 0) {
    nk = seq::regrow(be, keys_, stored_, p.grow_to);
    nv = seq::regrow(be, values_, stored_, p.grow_to);
  }
  seq::write_rows(be, k, nk, p.slot);
  seq::write_rows(be, v, nv, p.slot);
  keys_ = std::move(nk);
  values_ = std::move(nv);
  offset_ += 1;
  idx_ = p.idx_after;
  stored_ = p.live_after;
  // mlx-lm returns keys[:offset] below max_size, else the whole buffer; both are "the
  // live rows" on its paths. Physical order is fine for one query
  // (docs/semantics.md §Rotating cache).
  return {seq::slice(be, keys_, 0, stored_), seq::slice(be, values_, 0, stored_)};
}

FetchedKV RotatingKVCache::update_concat(const DTensor& k, const DTensor& v) {
  Backend& be = backend();
  const std::int64_t s = k.shape[2];
  DTensor nk, nv;
  if (!keys_) {
    // First chunk: stored as is, no trim even when S > max_size
    // (docs/semantics.md §Rotating cache). Copied so the cache never aliases a caller's tensor
    // (vllm-mlx#642).
    nk = seq::slice(be, k, 0, s);
    nv = seq::slice(be, v, 0, s);
  } else {
    // Re-linearise, keep at most max_size-1 old rows so the first new query still sees
    // max_size keys including itself, then append the chunk.
    const auto runs = temporal_runs(stored_, idx_, keep_);
    const std::int64_t drop = std::max<std::int64_t>(0, stored_ - max_size_ + 1);
    const auto kept_runs = drop_oldest(runs, stored_, keep_, drop);
    const std::int64_t kept = stored_ - drop;
    nk = assemble(be, keys_, kept_runs, kept + s);
    nv = assemble(be, values_, kept_runs, kept + s);
    seq::write_rows(be, k, nk, kept);
    seq::write_rows(be, v, nv, kept);
  }
  keys_ = std::move(nk);
  values_ = std::move(nv);
  offset_ += s;
  idx_ = stored_ = seq::length(keys_);
  return {seq::slice(be, keys_, 0, stored_), seq::slice(be, values_, 0, stored_)};
}

std::int64_t RotatingKVCache::next_key_count(std::int64_t n) const {
  KVLAB_REQUIRE(n >= 1, invalid_argument, kRotating, " next_key_count for N = ", n, " tokens");
  if (n > 1) return std::min(stored_, max_size_ - 1) + n;
  return plan_in_place().live_after;
}

CacheMask RotatingKVCache::make_mask(std::int64_t n, int window) const {
  KVLAB_REQUIRE(n >= 1, invalid_argument, kRotating, " make_mask for N = ", n, " tokens");
  KVLAB_REQUIRE(window >= 0, invalid_argument, kRotating, " make_mask window ", window, " is negative");
  CacheMask mask;
  if (n > 1) {
    // W = window or max_size over o = min(max_size-1, offset) previous keys. The update
    // returns min(stored, max_size-1) + N keys in temporal order, sinks first, so o counts
    // stored rows (mlx-lm's o on its paths, right for adopted caches too). Without sinks
    // (or under a narrower window) the lower-right aligned causal spec with window W is
    // create_causal_mask(N, o, W); the window only bites when o + N > W.
    const std::int64_t w = window > 0 ? window : max_size_;
    const std::int64_t o = std::min(stored_, max_size_ - 1);
    mask.spec.kind = MaskKind::causal;
    mask.spec.window = o + n > w ? static_cast<int>(w) : 0;
    if (keep_ == 0 || w != max_size_ || o + n <= w) return mask;
    // With sinks, each query of the chunk sees what it would see decoding one token at a
    // time: the keep sinks and the newest max_size − keep keys up to itself. A plain
    // window of W keys would trade the sinks for older tokens the ring no longer holds
    // for a single query (mlx-lm's make_mask does: docs/upstream-bugs.md §U10; mlx-vlm
    // 0.7.10 keeps the sinks).
    const std::int64_t len = o + n, recent = max_size_ - keep_;
    Tensor array(DType::u8, {1, 1, n, len});
    const TensorView view = array.view();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t q = o + i;
      for (std::int64_t r = 0; r < len; ++r) view.store_int(i * len + r, r <= q && (r < keep_ || q - r < recent) ? 1 : 0);
    }
    mask.spec.kind = MaskKind::boolean;
    mask.spec.window = 0;
    mask.array = std::move(array);
    return mask;
  }
  if (window == 0) return mask;  // one query sees every stored key
  // The returned keys are the live rows in physical ring order; the query sees the last
  // W of them in temporal order. Not needed when at most W keys come back (mlx-lm:
  // offset >= W and max_size > W, the same condition on its paths).
  const InPlacePlan p = plan_in_place();
  const std::int64_t len = p.live_after;
  if (len <= window) return mask;
  Tensor array(DType::u8, {1, 1, 1, len});
  const TensorView view = array.view();
  std::int64_t rank = 0;
  for (const Run& r : temporal_runs(len, p.idx_after, keep_))
    for (std::int64_t t = 0; t < r.length; ++t, ++rank) view.store_int(r.begin + t, rank >= len - window ? 1 : 0);
  mask.spec.kind = MaskKind::boolean;
  mask.array = std::move(array);
  return mask;
}

std::int64_t RotatingKVCache::trim(std::int64_t n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, kRotating, " trim by n = ", n, " tokens");
  // A wrapped ring has lost the rows a trim would have to restore: refuse, as mlx-lm's
  // is_trimmable() does (prefix reuse must not cut a ring, mlx-vlm#1715 / #1748).
  if (!is_trimmable()) return 0;
  const std::int64_t removed = std::min(offset_, n);
  // offset < max_size: the buffer is linear. An adopted cache may hold fewer rows than
  // offset; only those can be removed from the buffer.
  const std::int64_t rows = std::min(removed, stored_);
  if (rows > 0) {
    seq::poison_rows(backend(), keys_, stored_ - rows, stored_);
    seq::poison_rows(backend(), values_, stored_ - rows, stored_);
  }
  offset_ -= removed;
  stored_ -= rows;
  idx_ = stored_;
  return removed;
}

std::size_t RotatingKVCache::nbytes() const { return keys_ ? keys_.nbytes() + values_.nbytes() : 0; }

FetchedKV RotatingKVCache::temporal() const {
  if (!keys_ || stored_ == 0) return {};
  const auto runs = temporal_runs(stored_, idx_, keep_);
  return {assemble(backend(), keys_, runs, stored_), assemble(backend(), values_, runs, stored_)};
}

CacheState RotatingKVCache::state() const {
  // Physical order, not re-linearised (mlx-lm); the live rows only, so the stored row
  // count is the tensors' length and the cursor in meta places the ring.
  CacheState s{std::string(kRotating),
               {},
               {{"keep", std::to_string(keep_)},
                {"max_size", std::to_string(max_size_)},
                {"offset", std::to_string(offset_)},
                {"idx", std::to_string(idx_)}}};
  if (keys_ && stored_ > 0) {
    const bool whole = stored_ == seq::length(keys_);
    s.tensors.emplace("keys", backend().download(whole ? keys_ : seq::slice(backend(), keys_, 0, stored_)));
    s.tensors.emplace("values", backend().download(whole ? values_ : seq::slice(backend(), values_, 0, stored_)));
  }
  return s;
}

std::unique_ptr<RotatingKVCache> RotatingKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == kRotating, corrupt, "state of class '", state.class_name, "' cannot be loaded as a ",
                kRotating);
  // Any integer here: the checks below name what a negative one breaks.
  const auto field = [&](const char* name) { return meta_integer(state, kRotating, name, INT64_MIN); };
  const std::int64_t keep = field("keep"), max_size = field("max_size"), offset = field("offset"), idx = field("idx");
  KVLAB_REQUIRE(max_size >= 1 && max_size <= std::numeric_limits<std::int32_t>::max(), corrupt, kRotating,
                " state field 'max_size' = ", max_size, " is out of range");
  KVLAB_REQUIRE(keep >= 0 && keep < max_size, corrupt, kRotating, " state field 'keep' = ", keep,
                " is outside [0, max_size = ", max_size, ")");
  KVLAB_REQUIRE(offset >= 0 && offset <= std::numeric_limits<std::int32_t>::max(), corrupt, kRotating,
                " state field 'offset' = ", offset, " is out of range");
  for (const auto& [name, tensor] : state.tensors)
    KVLAB_REQUIRE(name == "keys" || name == "values", corrupt, kRotating, " state has an unknown tensor '", name, "'");
  const bool has_keys = state.tensors.count("keys") != 0, has_values = state.tensors.count("values") != 0;
  KVLAB_REQUIRE(has_keys == has_values, corrupt, kRotating, " state has ", has_keys ? "keys but no values" : "values but no keys");

  auto cache = std::make_unique<RotatingKVCache>(backend, max_size, keep);
  std::int64_t stored = 0;
  if (has_keys) {
    DTensor k = backend.upload(state.tensors.at("keys"));
    DTensor v = backend.upload(state.tensors.at("values"));
    try {
      validate_kv_update(k, v, kRotating);
    } catch (const Error& e) {
      fail(ErrorKind::corrupt, cat(kRotating, " state tensors 'keys'/'values': ", e.what()));
    }
    stored = seq::length(k);
    cache->keys_ = std::move(k);
    cache->values_ = std::move(v);
  }
  // offset is read, never inferred from the shapes (maclocal-api#46); it must cover the
  // stored rows, and the cursor must describe a layout the update paths can produce:
  // linear (idx == stored) or a full ring (stored == max_size, keep <= idx < max_size).
  KVLAB_REQUIRE(offset >= stored, corrupt, kRotating, " state field 'offset' = ", offset, " is less than its ", stored,
                " stored rows");
  const bool linear = idx == stored;
  const bool ring = stored == max_size && idx >= keep && idx < stored;
  KVLAB_REQUIRE(linear || ring, corrupt, kRotating, " state field 'idx' = ", idx, " does not fit ", stored,
                " stored rows (max_size ", max_size, ", keep ", keep, ")");
  cache->offset_ = offset;
  cache->idx_ = idx;
  cache->stored_ = stored;
  return cache;
}

std::vector<SequenceContent> RotatingKVCache::content(ContentForm) const {
  const FetchedKV rows = temporal();
  const std::int64_t live = rows.length();
  if (live >= offset_) return {newest_content(offset_, live, plain_parts(rows))};
  // A ring that evicted: the sinks [0, keep) stay, the other rows are the newest run.
  SequenceContent c = newest_content(offset_, live - keep_, plain_parts(rows));
  std::vector<std::int32_t> sinks;
  for (std::int64_t p = 0; p < keep_; ++p) sinks.push_back(static_cast<std::int32_t>(p));
  c.positions.insert(c.positions.begin(), sinks.begin(), sinks.end());
  return {std::move(c)};
}

std::vector<BackingBuffer> RotatingKVCache::buffers() const {
  if (!keys_) return {};
  return {{"keys", keys_, stored_}, {"values", values_, stored_}};
}

}  // namespace kvlab
