// BatchLayout (cache/batch_layout.h) and BatchKVCache (cache/batch_kv_cache.h).
// BatchLayout is implemented here because the layout is BatchKVCache's bookkeeping;
// BatchQuantizedKVCache reuses it with six components instead of two.
#include "cache/batch_kv_cache.h"

#include <algorithm>
#include <array>
#include <limits>

#include "cache/seq_ops.h"

namespace kvlab {

namespace {

constexpr std::int64_t kMaxI32 = std::numeric_limits<std::int32_t>::max();


// A (B, H_c, length, W_c) block shaped like `like` (B and length replaced), all poison.
DTensor poisoned_like(Backend& be, const DTensor& like, std::int64_t batch, std::int64_t length) {
  return seq::alloc_poisoned(be, like.dtype, {batch, seq::heads(like), length, seq::width(like)});
}

}  // namespace

// ---- construction and observers -------------------------------------------------------

BatchLayout::BatchLayout(Backend& backend, std::string_view owner, std::vector<std::string> names,
                         std::vector<std::int32_t> left_padding)
    : backend_(&backend), owner_(owner), names_(std::move(names)) {
  KVLAB_REQUIRE(!left_padding.empty(), invalid_argument, owner_,
                " needs at least one sequence (left_padding is empty)");
  for (std::size_t b = 0; b < left_padding.size(); ++b) {
    KVLAB_REQUIRE(left_padding[b] >= 0, invalid_argument, owner_, " left_padding[", b, "] = ", left_padding[b],
                  " is negative");
  }
  left_padding_ = std::move(left_padding);
}

std::vector<std::int32_t> BatchLayout::offsets() const {
  std::vector<std::int32_t> out;
  out.reserve(left_padding_.size());
  for (const std::int32_t lp : left_padding_) out.push_back(static_cast<std::int32_t>(idx_ - lp));
  return out;
}

std::size_t BatchLayout::nbytes() const {
  std::size_t total = 0;
  for (const DTensor& c : components_) total += c.nbytes();
  return total;
}

void BatchLayout::require_row_vector(const std::vector<std::int32_t>& v, const char* what) const {
  KVLAB_REQUIRE(static_cast<std::int64_t>(v.size()) == batch_size(), shape_mismatch, owner_, " ", what, " has ",
                v.size(), " entries for ", batch_size(), " sequences");
  for (std::size_t b = 0; b < v.size(); ++b) {
    KVLAB_REQUIRE(v[b] >= 0, invalid_argument, owner_, " ", what, "[", b, "] = ", v[b], " is negative");
  }
}

// ---- update -------------------------------------------------------------------------------

void BatchLayout::append(const std::vector<DTensor>& chunks) {
  KVLAB_REQUIRE(chunks.size() == names_.size(), internal, owner_, " append of ", chunks.size(),
                " components, expected ", names_.size());
  for (const DTensor& c : chunks) seq::require_block(c, "update chunk");
  const std::int64_t s = seq::length(chunks[0]);
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const DTensor& in = chunks[c];
    KVLAB_REQUIRE(seq::batch(in) == batch_size() && seq::length(in) == s, shape_mismatch, owner_, " holds ",
                  batch_size(), " sequences but the update's ", names_[c], " have shape ", shape_str(in.shape));
    if (empty()) continue;
    const DTensor& held = components_[c];
    KVLAB_REQUIRE(in.dtype == held.dtype, dtype_mismatch, owner_, " holds ", names_[c], " of dtype ",
                  dtype_name(held.dtype), " but the update's are ", dtype_name(in.dtype));
    KVLAB_REQUIRE(seq::heads(in) == seq::heads(held) && seq::width(in) == seq::width(held), shape_mismatch, owner_,
                  " holds ", names_[c], " ", shape_str(held.shape), " but the update's have shape ",
                  shape_str(in.shape));
  }
  KVLAB_REQUIRE(s <= kMaxI32 - idx_, invalid_argument, owner_, " update of ", s, " tokens at column ", idx_,
                " overflows the int32 offsets");

  Backend& be = *backend_;
  const std::int64_t prev = idx_;
  std::vector<DTensor> next = components_;
  next.resize(chunks.size());
  if (empty() || prev + s > capacity()) {
    const std::int64_t grown = seq::grown_capacity(prev, empty() ? 0 : capacity(), s, kStep);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      next[c] = empty() ? poisoned_like(be, chunks[c], batch_size(), grown)
                        : seq::regrow(be, components_[c], prev, grown);
    }
  }
  for (std::size_t c = 0; c < chunks.size(); ++c) seq::write_rows(be, chunks[c], next[c], prev);
  components_ = std::move(next);
  idx_ = prev + s;
}

std::vector<DTensor> BatchLayout::fetch() const {
  std::vector<DTensor> out;
  for (const DTensor& c : components_) out.push_back(seq::slice(*backend_, c, 0, idx_));
  return out;
}

// ---- padding --------------------------------------------------------------------------------

void BatchLayout::prepare(const std::optional<std::vector<std::int32_t>>& left_padding,
                          const std::optional<std::vector<std::int32_t>>& right_padding) {
  std::vector<std::int32_t> next_left = left_padding_;
  if (left_padding) {
    // Left padding describes columns that precede everything stored
    // (docs/semantics.md §Batch cache).
    KVLAB_REQUIRE(empty(), misuse, owner_, " prepare(left_padding) after ", idx_,
                  " columns were stored; left padding is only valid while empty");
    require_row_vector(*left_padding, "prepare left_padding");
    for (std::size_t b = 0; b < next_left.size(); ++b) {
      const std::int64_t sum = std::int64_t{next_left[b]} + (*left_padding)[b];
      KVLAB_REQUIRE(sum <= kMaxI32, invalid_argument, owner_, " left_padding[", b, "] + ", (*left_padding)[b],
                    " overflows int32");
      next_left[b] = static_cast<std::int32_t>(sum);
    }
  }
  std::optional<std::vector<std::int32_t>> next_right = right_padding_;
  if (right_padding) {
    require_row_vector(*right_padding, "prepare right_padding");
    if (std::any_of(right_padding->begin(), right_padding->end(), [](std::int32_t r) { return r > 0; })) {
      // mlx-lm overwrites a pending pad silently; two pending pads cannot both be rolled.
      KVLAB_REQUIRE(!right_padding_, misuse, owner_,
                    " prepare(right_padding) while a right padding is already pending");
      next_right = right_padding;
    }
  }
  left_padding_ = std::move(next_left);
  right_padding_ = std::move(next_right);
}

void BatchLayout::finalize() {
  if (!right_padding_) return;
  const std::vector<std::int32_t>& rp = *right_padding_;
  const std::vector<std::int32_t> off = offsets();
  for (std::size_t b = 0; b < rp.size(); ++b) {
    // A row without pads has nothing to roll, whatever its offset: one joined by extend
    // while the pad was pending may still be inside its left padding (found by the
    // property: extend with an empty batch of left padding 1 during a prompt).
    KVLAB_REQUIRE(rp[b] == 0 || rp[b] <= off[b], misuse, owner_, " finalize: right_padding[", b, "] = ", rp[b],
                  " exceeds the ", off[b], " tokens row ", b, " holds");
  }
  // Roll over the whole capacity (docs/kernels.md §Cache data movement,
  // docs/semantics.md §Batch cache): the trailing pads move past _idx, the front receives wrapped
  // junk that the larger left padding hides.
  std::vector<DTensor> next;
  for (const DTensor& c : components_) next.push_back(seq::roll(*backend_, c, rp));
  components_ = std::move(next);
  for (std::size_t b = 0; b < rp.size(); ++b) left_padding_[b] += rp[b];  // offset −= rp follows
  right_padding_.reset();
}

CacheMask BatchLayout::make_mask(std::int64_t n, int window) const {
  return batch_causal_mask(owner_, n, window, left_padding_);
}

CacheMask batch_causal_mask(std::string_view owner, std::int64_t n, int window,
                            const std::vector<std::int32_t>& left_padding) {
  KVLAB_REQUIRE(n >= 1, invalid_argument, owner, " make_mask for N = ", n, " tokens");
  KVLAB_REQUIRE(window >= 0, invalid_argument, owner, " make_mask window ", window, " is negative");
  // create_causal_mask(N, offset=_idx, left_padding) (docs/semantics.md §Batch cache): the
  // structured causal mask is lower-right aligned (offset = Lk − Lq = _idx), so the two are
  // identical. It is always a mask, even for N == 1, because padded columns must stay hidden. Using
  // _idx rather than the per-row offset is mlx-vlm#1208's fix.
  CacheMask mask;
  mask.spec.kind = MaskKind::causal;
  mask.spec.window = window;
  mask.spec.left_padding = left_padding;
  return mask;
}

// ---- batch reshaping ----------------------------------------------------------------------------

void BatchLayout::filter(const std::vector<std::int32_t>& batch_indices) {
  KVLAB_REQUIRE(!batch_indices.empty(), invalid_argument, owner_, " filter with no batch indices");
  std::vector<bool> seen(left_padding_.size(), false);
  for (std::size_t p = 0; p < batch_indices.size(); ++p) {
    const std::int32_t i = batch_indices[p];
    KVLAB_REQUIRE(0 <= i && i < batch_size(), invalid_argument, owner_, " filter: batch index ", i, " (position ", p,
                  ") is outside [0, ", batch_size(), ")");
    KVLAB_REQUIRE(!seen[static_cast<std::size_t>(i)], invalid_argument, owner_, " filter: batch index ", i,
                  " appears more than once");
    seen[static_cast<std::size_t>(i)] = true;
  }
  std::vector<std::int32_t> lp;
  std::optional<std::vector<std::int32_t>> rp;
  if (right_padding_) rp.emplace();
  for (const std::int32_t i : batch_indices) {
    lp.push_back(left_padding_[static_cast<std::size_t>(i)]);
    // docs/upstream-bugs.md §U7: mlx-lm leaves _right_padding at the old batch size; mlx-vlm
    // filters it.
    if (rp) rp->push_back((*right_padding_)[static_cast<std::size_t>(i)]);
  }
  // Shift left by the smallest padding (never past the cursor, which trim can put
  // below the padding). An empty cache has no columns to drop, so its padding stays.
  const std::int64_t shift = empty() ? 0 : std::min<std::int64_t>(*std::min_element(lp.begin(), lp.end()), idx_);
  std::vector<DTensor> next;
  for (const DTensor& c : components_) {
    // Gather and shift in one block copy per kept row: rows [shift, _idx) of source row i.
    DTensor out = poisoned_like(*backend_, c, static_cast<std::int64_t>(lp.size()), seq::length(c) - shift);
    std::vector<SeqBlock> blocks;
    for (std::size_t d = 0; d < batch_indices.size(); ++d)
      blocks.push_back({batch_indices[d], shift, static_cast<std::int64_t>(d), 0, idx_ - shift});
    backend_->kv_copy_blocks({c, blocks, out});
    next.push_back(std::move(out));
  }
  for (std::int32_t& l : lp) l -= static_cast<std::int32_t>(shift);
  components_ = std::move(next);
  left_padding_ = std::move(lp);
  right_padding_ = std::move(rp);
  idx_ -= shift;
}

void BatchLayout::require_compatible(const BatchLayout& other) const {
  KVLAB_REQUIRE(backend_ == other.backend_, invalid_argument, owner_, " cannot combine caches on backends '",
                backend_->name(), "' and '", other.backend_->name(), "'");
  KVLAB_REQUIRE(names_ == other.names_ && owner_ == other.owner_, invalid_argument, owner_, " cannot combine with ",
                other.owner_);
  if (empty() || other.empty()) return;
  for (std::size_t c = 0; c < components_.size(); ++c) {
    const DTensor &a = components_[c], &b = other.components_[c];
    KVLAB_REQUIRE(a.dtype == b.dtype, dtype_mismatch, owner_, " cannot combine ", names_[c], " of dtype ",
                  dtype_name(a.dtype), " with ", dtype_name(b.dtype));
    KVLAB_REQUIRE(seq::heads(a) == seq::heads(b) && seq::width(a) == seq::width(b), shape_mismatch, owner_,
                  " cannot combine ", names_[c], " ", shape_str(a.shape), " with ", shape_str(b.shape),
                  " (heads or width differ)");
  }
}

void BatchLayout::extend(const BatchLayout& other) {
  require_compatible(other);
  // `other` may be *this: everything is computed into locals before the commit.
  const std::int64_t max_idx = std::max(idx_, other.idx_);
  // mlx-lm: max over capacities (an empty side is a zero-length placeholder with its own
  // batch size, mlx-lm#1141); each side's rows end up right-justified at max_idx.
  const std::int64_t max_size = std::max(capacity(), other.capacity());
  const std::array<const BatchLayout*, 2> sides{this, &other};
  std::vector<std::int32_t> lp;
  for (const BatchLayout* side : sides) {
    const std::int64_t left = max_idx - side->idx_;
    for (std::size_t b = 0; b < side->left_padding_.size(); ++b) {
      const std::int64_t v = side->left_padding_[b] + left;
      KVLAB_REQUIRE(v <= kMaxI32, invalid_argument, owner_, " extend: left_padding of row ", b, " (", v,
                    ") overflows int32");
      lp.push_back(static_cast<std::int32_t>(v));
    }
  }
  std::optional<std::vector<std::int32_t>> rp;
  if (right_padding_ || other.right_padding_) {
    // A pending right pad belongs to its rows; the other side's rows have none.
    rp.emplace();
    for (const BatchLayout* side : sides) {
      const auto& r = side->right_padding_;
      if (r) rp->insert(rp->end(), r->begin(), r->end());
      else rp->insert(rp->end(), side->left_padding_.size(), 0);
    }
  }
  std::vector<DTensor> next;
  if (!empty() || !other.empty()) {
    const std::vector<DTensor>& like = empty() ? other.components_ : components_;
    const auto total = static_cast<std::int64_t>(lp.size());
    for (std::size_t c = 0; c < like.size(); ++c) {
      DTensor out = poisoned_like(*backend_, like[c], total, max_size);
      std::int64_t first_row = 0;
      for (const BatchLayout* side : sides) {
        if (!side->empty() && side->idx_ > 0) {
          std::vector<SeqBlock> blocks;
          for (std::int64_t b = 0; b < side->batch_size(); ++b)
            blocks.push_back({b, 0, first_row + b, max_idx - side->idx_, side->idx_});
          backend_->kv_copy_blocks({side->components_[c], blocks, out});
        }
        first_row += side->batch_size();
      }
      next.push_back(std::move(out));
    }
  }
  components_ = std::move(next);
  left_padding_ = std::move(lp);
  right_padding_ = std::move(rp);
  idx_ = max_idx;
}

std::vector<DTensor> BatchLayout::extract_row(std::int64_t i) const {
  KVLAB_REQUIRE(0 <= i && i < batch_size(), invalid_argument, owner_, " extract(", i, ") outside [0, ", batch_size(),
                ")");
  // mlx-lm PR #1746: extracting between prepare(right_padding) and finalize() returned
  // the pads as tokens, and later requests crashed on mask-width != key-length.
  KVLAB_REQUIRE(!right_padding_, misuse, owner_, " extract(", i, ") while right_padding[", i, "] = ",
                (*right_padding_)[static_cast<std::size_t>(i)], " is pending; call finalize() first");
  // Clamp the padding into [0, _idx] (vllm-mlx#256 sliced with a negative padding).
  const std::int64_t begin = std::clamp<std::int64_t>(left_padding_[static_cast<std::size_t>(i)], 0, idx_);
  const std::int64_t len = idx_ - begin;
  std::vector<DTensor> out;
  if (empty() || len == 0) return out;
  for (const DTensor& c : components_) {
    DTensor row = backend_->allocate(c.dtype, {1, seq::heads(c), len, seq::width(c)});
    const SeqBlock block{i, begin, 0, 0, len};
    backend_->kv_copy_blocks({c, {&block, 1}, row});
    out.push_back(std::move(row));
  }
  return out;
}

BatchLayout BatchLayout::merge(Backend& backend, std::string_view owner, std::vector<std::string> names,
                               const std::vector<MergeRow>& rows) {
  KVLAB_REQUIRE(!rows.empty(), invalid_argument, owner, " merge of an empty list of caches");
  std::int64_t longest = 0;
  const MergeRow* like = nullptr;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const MergeRow& row = rows[r];
    KVLAB_REQUIRE(row.length >= 0 && row.length <= kMaxI32, invalid_argument, owner, " merge: cache ", r, " holds ",
                  row.length, " tokens");
    if (row.length == 0) continue;
    KVLAB_REQUIRE(row.buffers.size() == names.size(), internal, owner, " merge: cache ", r, " has ",
                  row.buffers.size(), " components");
    if (!like) like = &row;
    for (std::size_t c = 0; c < names.size(); ++c) {
      const DTensor &t = row.buffers[c], &ref = like->buffers[c];
      seq::require_block(t, "merge source");
      KVLAB_REQUIRE(seq::batch(t) == 1 && seq::length(t) >= row.length, shape_mismatch, owner, " merge: cache ", r,
                    " ", names[c], " ", shape_str(t.shape), " is not one sequence of ", row.length, " tokens");
      KVLAB_REQUIRE(t.dtype == ref.dtype, dtype_mismatch, owner, " merge: cache ", r, " ", names[c], " are ",
                    dtype_name(t.dtype), " but earlier caches hold ", dtype_name(ref.dtype));
      KVLAB_REQUIRE(seq::heads(t) == seq::heads(ref) && seq::width(t) == seq::width(ref), shape_mismatch, owner,
                    " merge: cache ", r, " ", names[c], " ", shape_str(t.shape), " differ in heads or width from ",
                    shape_str(ref.shape));
    }
    longest = std::max(longest, row.length);
  }
  std::vector<std::int32_t> lp;
  for (const MergeRow& row : rows) lp.push_back(static_cast<std::int32_t>(longest - row.length));
  BatchLayout out(backend, owner, std::move(names), std::move(lp));
  if (longest == 0) return out;  // mlx-lm: every cache empty -> an empty batch
  const auto batch = static_cast<std::int64_t>(rows.size());
  for (std::size_t c = 0; c < out.names_.size(); ++c) {
    DTensor merged = poisoned_like(backend, like->buffers[c], batch, longest);
    for (std::int64_t b = 0; b < batch; ++b) {
      const MergeRow& row = rows[static_cast<std::size_t>(b)];
      if (row.length == 0) continue;
      const SeqBlock block{0, 0, b, longest - row.length, row.length};
      backend.kv_copy_blocks({row.buffers[c], {&block, 1}, merged});
    }
    out.components_.push_back(std::move(merged));
  }
  out.idx_ = longest;
  return out;
}

std::int64_t BatchLayout::trim(std::int64_t n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, owner_, " trim by ", n, " tokens");
  KVLAB_REQUIRE(!right_padding_, misuse, owner_, " trim(", n, ") while a right padding is pending");
  // mlx-lm: n' = min(_idx, n) for every row at once. A row with fewer real tokens goes
  // back to negative offset, the same state as before its prefill (offset = −padding).
  const std::int64_t removed = std::min(idx_, n);
  for (const DTensor& c : components_) seq::poison_rows(*backend_, c, idx_ - removed, idx_);
  idx_ -= removed;
  return removed;
}

// ---- state ------------------------------------------------------------------------------------

void BatchLayout::save(CacheState& s) const {
  const std::vector<DTensor> live = fetch();
  for (std::size_t c = 0; c < live.size(); ++c) s.tensors.emplace(names_[c], backend_->download(live[c]));
  s.tensors.emplace("left_padding", i32_tensor(left_padding_));
  s.tensors.emplace("offset", i32_tensor(offsets()));
  // docs/upstream-bugs.md §U6: mlx-lm's from_state lacks _right_padding, so a save between prepare
  // and finalize loses it.
  if (right_padding_) s.tensors.emplace("right_padding", i32_tensor(*right_padding_));
  s.meta["idx"] = std::to_string(idx_);
}

namespace {

std::vector<std::int32_t> load_row_vector(const CacheState& s, std::string_view owner, const std::string& field,
                                          std::optional<std::int64_t> batch) {
  const auto it = s.tensors.find(field);
  KVLAB_REQUIRE(it != s.tensors.end(), corrupt, owner, " state has no '", field, "'");
  const Tensor& t = it->second;
  KVLAB_REQUIRE(t.dtype() == DType::i32 && t.rank() == 1 && t.dim(0) >= 1, corrupt, owner, " state '", field,
                "' is ", dtype_name(t.dtype()), shape_str(t.shape()), ", expected int32 (B,) with B >= 1");
  KVLAB_REQUIRE(!batch || t.dim(0) == *batch, corrupt, owner, " state '", field, "' has ", t.dim(0),
                " entries for ", *batch, " sequences");
  std::vector<std::int32_t> out;
  for (const std::int64_t v : t.to_ints()) out.push_back(static_cast<std::int32_t>(v));
  return out;
}

}  // namespace

BatchLayout BatchLayout::load(Backend& backend, std::string_view owner, std::vector<std::string> names,
                              const CacheState& s) {
  const std::int64_t idx = meta_integer(s, std::string(owner).c_str(), "idx", 0, kMaxI32);

  std::vector<std::int32_t> lp = load_row_vector(s, owner, "left_padding", std::nullopt);
  const auto batch = static_cast<std::int64_t>(lp.size());
  for (std::size_t b = 0; b < lp.size(); ++b)
    KVLAB_REQUIRE(lp[b] >= 0, corrupt, owner, " state 'left_padding'[", b, "] = ", lp[b], " is negative");
  const std::vector<std::int32_t> off = load_row_vector(s, owner, "offset", batch);
  for (std::size_t b = 0; b < off.size(); ++b) {
    KVLAB_REQUIRE(off[b] == idx - lp[b], corrupt, owner, " state 'offset'[", b, "] = ", off[b],
                  " disagrees with idx − left_padding = ", idx - lp[b]);
  }
  std::optional<std::vector<std::int32_t>> rp;
  if (s.tensors.count("right_padding")) {
    rp = load_row_vector(s, owner, "right_padding", batch);
    for (std::size_t b = 0; b < rp->size(); ++b)
      KVLAB_REQUIRE((*rp)[b] >= 0, corrupt, owner, " state 'right_padding'[", b, "] = ", (*rp)[b], " is negative");
  }

  for (const auto& [name, tensor] : s.tensors) {
    const bool known = name == "left_padding" || name == "offset" || name == "right_padding" ||
                       std::find(names.begin(), names.end(), name) != names.end();
    KVLAB_REQUIRE(known, corrupt, owner, " state has an unexpected tensor '", name, "'");
  }
  BatchLayout out(backend, owner, std::move(names), std::move(lp));
  std::size_t present = 0;
  for (const std::string& name : out.names_) present += s.tensors.count(name);
  KVLAB_REQUIRE(present == 0 || present == out.names_.size(), corrupt, owner, " state has ", present, " of the ",
                out.names_.size(), " component tensors");
  KVLAB_REQUIRE(present > 0 || idx == 0, corrupt, owner, " state 'idx' = ", idx, " but it holds no tensors");
  for (std::size_t c = 0; c < present; ++c) {
    const Tensor& t = s.tensors.at(out.names_[c]);
    KVLAB_REQUIRE(t.rank() == 4 && t.dim(0) == batch && t.dim(2) == idx, corrupt, owner, " state '", out.names_[c],
                  "' has shape ", shape_str(t.shape()), ", expected (", batch, ", H, ", idx, ", W)");
    out.components_.push_back(backend.upload(t));
  }
  out.idx_ = idx;
  out.right_padding_ = std::move(rp);
  return out;
}

// ---- BatchKVCache -------------------------------------------------------------------------------

BatchKVCache::BatchKVCache(Backend& backend, std::vector<std::int32_t> left_padding)
    : Cache(backend), layout_(backend, "BatchKVCache", {"keys", "values"}, std::move(left_padding)) {}

FetchedKV BatchKVCache::update(const DTensor& k, const DTensor& v) {
  validate_kv_update(k, v, "BatchKVCache");
  layout_.append({k, v});
  return fetch();
}

FetchedKV BatchKVCache::fetch() const {
  std::vector<DTensor> kv = layout_.fetch();
  if (kv.empty()) return {};
  return {std::move(kv[0]), std::move(kv[1])};
}

std::unique_ptr<KVCache> BatchKVCache::extract(std::int64_t i) const {
  std::vector<DTensor> row = layout_.extract_row(i);
  if (row.empty()) return std::make_unique<KVCache>(backend());
  return std::make_unique<KVCache>(backend(), std::move(row[0]), std::move(row[1]));
}

std::unique_ptr<BatchKVCache> BatchKVCache::merge(Backend& backend, std::span<const KVCache* const> caches) {
  std::vector<BatchLayout::MergeRow> rows;
  for (std::size_t r = 0; r < caches.size(); ++r) {
    const KVCache* c = caches[r];
    KVLAB_REQUIRE(c != nullptr, invalid_argument, "BatchKVCache merge: cache ", r, " is null");
    KVLAB_REQUIRE(&c->backend() == &backend, invalid_argument, "BatchKVCache merge: cache ", r, " lives on backend '",
                  c->backend().name(), "', not '", backend.name(), "'");
    // The stored rows [0, offset) of the buffers (mlx-lm's merge reads c.keys[..., :c.offset];
    // docs/semantics.md §Batch cache).
    if (c->empty() || c->offset() == 0) rows.push_back({{}, 0});
    else rows.push_back({{c->key_buffer(), c->value_buffer()}, c->offset()});
  }
  return std::unique_ptr<BatchKVCache>(
      new BatchKVCache(backend, BatchLayout::merge(backend, "BatchKVCache", {"keys", "values"}, rows)));
}

CacheState BatchKVCache::state() const {
  CacheState s{std::string(class_name()), {}, {}};
  layout_.save(s);
  return s;
}

std::unique_ptr<BatchKVCache> BatchKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == "BatchKVCache", corrupt, "state of class '", state.class_name,
                "' cannot be loaded as a BatchKVCache");
  BatchLayout layout = BatchLayout::load(backend, "BatchKVCache", {"keys", "values"}, state);
  if (!layout.empty()) {
    const DTensor &k = layout.components()[0], &v = layout.components()[1];
    KVLAB_REQUIRE(is_float(k.dtype) && k.dtype == v.dtype && seq::heads(k) == seq::heads(v), corrupt,
                  "BatchKVCache state 'keys' ", dtype_name(k.dtype), shape_str(k.shape), " and 'values' ",
                  dtype_name(v.dtype), shape_str(v.shape), " must share a float dtype and head count");
  }
  return std::unique_ptr<BatchKVCache>(new BatchKVCache(backend, std::move(layout)));
}

std::vector<SequenceContent> BatchKVCache::content(ContentForm form) const {
  // Each row through extract(): its real tokens, left padding dropped; a pending right
  // padding is refused there, as mlx-lm PR #1746 requires.
  std::vector<SequenceContent> out;
  const std::vector<std::int32_t> offs = offsets();
  for (std::int64_t i = 0; i < batch_size(); ++i) {
    const std::unique_ptr<KVCache> row = extract(i);
    out.push_back(newest_content(offs[static_cast<std::size_t>(i)], row->kv_length(),
                                 std::move(row->content(form).at(0).parts)));
  }
  return out;
}

std::vector<BackingBuffer> BatchKVCache::buffers() const {
  if (empty()) return {};
  return {{"keys", key_buffer(), idx()}, {"values", value_buffer(), idx()}};
}

}  // namespace kvlab
