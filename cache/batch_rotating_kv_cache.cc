#include "cache/batch_rotating_kv_cache.h"

#include <limits>

#include "cache/kv_cache.h"
#include "cache/seq_ops.h"

namespace kvlab {

namespace {

using I64 = std::int64_t;
using Rows = std::vector<I64>;

std::string list_str(const Rows& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::vector<std::int32_t> to_i32(const Rows& v) { return {v.begin(), v.end()}; }

// Rolling r trailing pads of a row to its front: they join the max(0, lp) invalid front
// columns. mlx-lm does lp += r; once lp is negative (real tokens already evicted) that
// absorbs the pads, and extract() later returns them as tokens (found by the property
// test: a right-padded row longer than the window, prefilled in chunks).
void add_roll(I64& lp, I64 r) {
  if (r > 0) lp = std::max<I64>(lp, 0) + r;
}

// Blocks that copy columns [t_begin, t_end) of a ring of capacity c, whose column t lives
// physically at (t + shift) mod c, to dst_at.. of batch row dst_b (at most two runs).
void append_blocks(std::vector<SeqBlock>& blocks, I64 c, I64 shift, I64 src_b, I64 t_begin, I64 t_end, I64 dst_b,
                   I64 dst_at) {
  for (I64 t = t_begin; t < t_end;) {
    const I64 p = (t + shift) % c;
    const I64 run = std::min(t_end - t, c - p);
    blocks.push_back({src_b, p, dst_b, dst_at + (t - t_begin), run});
    t += run;
  }
}

DTensor copy_into_new(Backend& be, const DTensor& src, Shape shape, const std::vector<SeqBlock>& blocks) {
  DTensor out = seq::alloc_poisoned(be, src.dtype, shape);
  if (!blocks.empty()) be.kv_copy_blocks({src, blocks, out});
  return out;
}

// Columns [begin, end) of src followed by the S columns of append, in a new block.
DTensor splice(Backend& be, const DTensor& src, I64 begin, I64 end, const DTensor& append) {
  std::vector<SeqBlock> blocks;
  for (I64 b = 0; b < seq::batch(src); ++b) append_blocks(blocks, seq::length(src), 0, b, begin, end, b, 0);
  DTensor out = copy_into_new(be, src, {seq::batch(src), seq::heads(src), end - begin + seq::length(append),
                                        seq::width(src)}, blocks);
  seq::write_rows(be, append, out, end - begin);
  return out;
}

void require_rows(const std::vector<std::int32_t>& v, I64 batch, const char* what, bool non_negative) {
  KVLAB_REQUIRE(static_cast<I64>(v.size()) == batch, shape_mismatch, "BatchRotatingKVCache ", what, " has ",
                v.size(), " entries for ", batch, " rows");
  for (std::size_t b = 0; b < v.size(); ++b)
    KVLAB_REQUIRE(!non_negative || v[b] >= 0, invalid_argument, "BatchRotatingKVCache ", what, "[", b, "] = ", v[b],
                  " is negative");
}

}  // namespace

BatchRotatingKVCache::BatchRotatingKVCache(Backend& backend, I64 max_size, Rows left_padding, Rows offset)
    : Cache(backend), max_size_(max_size), left_padding_(std::move(left_padding)), offset_(std::move(offset)) {}

BatchRotatingKVCache::BatchRotatingKVCache(Backend& backend, I64 max_size, std::vector<std::int32_t> left_padding)
    : Cache(backend), max_size_(max_size) {
  KVLAB_REQUIRE(max_size >= 1 && max_size <= std::numeric_limits<std::int32_t>::max(), invalid_argument,
                "BatchRotatingKVCache max_size ", max_size, " must be in [1, INT32_MAX]");
  KVLAB_REQUIRE(!left_padding.empty(), invalid_argument, "BatchRotatingKVCache needs at least one row");
  require_rows(left_padding, static_cast<I64>(left_padding.size()), "left_padding", true);
  for (const std::int32_t lp : left_padding) {
    left_padding_.push_back(lp);
    offset_.push_back(-lp);  // padding tokens get negative positions (docs/lifecycle.md §Attention step)
  }
}

std::vector<std::int32_t> BatchRotatingKVCache::offsets() const { return to_i32(offset_); }

void BatchRotatingKVCache::check_row(I64 i, const char* what) const {
  KVLAB_REQUIRE(0 <= i && i < batch_size(), invalid_argument, "BatchRotatingKVCache::", what, " row ", i,
                " out of range for ", batch_size(), " rows");
}

Rows BatchRotatingKVCache::pending_roll() const {
  Rows roll(offset_.size(), 0);
  if (lengths_)
    for (std::size_t b = 0; b < roll.size(); ++b) roll[b] = std::max<I64>(0, offset_[b] - (*lengths_)[b]);
  return roll;
}

FetchedKV BatchRotatingKVCache::linearised() const {
  const I64 len = temporal_length();
  std::vector<SeqBlock> blocks;
  for (I64 b = 0; b < batch_size(); ++b) append_blocks(blocks, capacity(), temporal_shift(), b, 0, len, b, 0);
  return {copy_into_new(backend(), keys_, {batch_size(), seq::heads(keys_), len, seq::width(keys_)}, blocks),
          copy_into_new(backend(), values_, {batch_size(), seq::heads(values_), len, seq::width(values_)}, blocks)};
}

// ---- update ----------------------------------------------------------------------------

FetchedKV BatchRotatingKVCache::update(const DTensor& k, const DTensor& v) {
  validate_kv_update(k, v, "BatchRotatingKVCache");
  KVLAB_REQUIRE(k.shape[0] == batch_size(), shape_mismatch, "BatchRotatingKVCache has ", batch_size(),
                " rows but the update has keys ", shape_str(k.shape));
  if (keys_) {
    KVLAB_REQUIRE(k.dtype == keys_.dtype, dtype_mismatch, "BatchRotatingKVCache holds ", dtype_name(keys_.dtype),
                  " but the update is ", dtype_name(k.dtype));
    KVLAB_REQUIRE(k.shape[1] == keys_.shape[1] && k.shape[3] == keys_.shape[3] && v.shape[3] == values_.shape[3],
                  shape_mismatch, "BatchRotatingKVCache holds (H, Dk, Dv) = (", keys_.shape[1], ", ", keys_.shape[3],
                  ", ", values_.shape[3], ") but the update has keys ", shape_str(k.shape), " and values ",
                  shape_str(v.shape));
  }
  // offsets() are int32, as mlx-lm's offset arrays.
  const I64 top = std::max(columns_, *std::max_element(offset_.begin(), offset_.end()));
  KVLAB_REQUIRE(top + k.shape[2] <= std::numeric_limits<std::int32_t>::max(), invalid_argument,
                "BatchRotatingKVCache update of ", k.shape[2], " tokens would take offset ", top, " past INT32_MAX");
  // mlx-lm raises for S == 1 while a right pad is pending; mlx-vlm 75f50e84 sends it
  // through the concat path, so a prefill whose last chunk is one token works
  // (docs/upstream-bugs.md row 25).
  if (k.shape[2] == 1 && !lengths_) return update_in_place(k, v);
  return update_concat(k, v);
}

FetchedKV BatchRotatingKVCache::update_concat(const DTensor& k, const DTensor& v) {
  Backend& be = backend();
  const I64 s = k.shape[2];
  Rows lp = left_padding_, off = offset_;
  DTensor nk, nv;
  if (!keys_) {
    // First chunk: stored whole, no trim even when S > max_size (as mlx-lm). Own copies,
    // never the caller's buffers (vllm-mlx#642: stored state aliasing live arrays).
    nk = seq::slice(be, k, 0, s);
    nv = seq::slice(be, v, 0, s);
  } else {
    FetchedKV t = linearised();
    const I64 len = temporal_length();
    const Rows roll = pending_roll();
    if (std::any_of(roll.begin(), roll.end(), [](I64 r) { return r > 0; })) {
      // Rows that already consumed their right padding move those pads to the front,
      // so the trim below evicts pads rather than real tokens (mlx-lm#439).
      t.keys = seq::roll(be, t.keys, to_i32(roll));
      t.values = seq::roll(be, t.values, to_i32(roll));
      for (std::size_t b = 0; b < lp.size(); ++b) add_roll(lp[b], roll[b]), off[b] -= roll[b];
    }
    // Keep max_size − 1 old columns so the first new query still sees max_size keys.
    const I64 trim = std::max<I64>(0, len - max_size_ + 1);
    for (I64& p : lp) p -= trim;  // goes negative once the padding is gone (docs/traces.md §T4)
    nk = splice(be, t.keys, trim, len, k);
    nv = splice(be, t.values, trim, len, v);
  }
  for (I64& o : off) o += s;
  keys_ = std::move(nk);
  values_ = std::move(nv);
  left_padding_ = std::move(lp);
  offset_ = std::move(off);
  columns_ += s;
  idx_ = seq::length(keys_);
  rotated_ = false;
  return {seq::slice(be, keys_, 0, idx_), seq::slice(be, values_, 0, idx_)};
}

FetchedKV BatchRotatingKVCache::update_in_place(const DTensor& k, const DTensor& v) {
  Backend& be = backend();
  DTensor nk = keys_, nv = values_;
  Rows lp = left_padding_;
  I64 idx = idx_;
  bool rotated = rotated_;
  if (!nk) {
    const I64 cap = std::min(kStep, max_size_);
    nk = seq::alloc_poisoned(be, k.dtype, {k.shape[0], k.shape[1], cap, k.shape[3]});
    nv = seq::alloc_poisoned(be, v.dtype, {v.shape[0], v.shape[1], cap, v.shape[3]});
    idx = 0;
  } else if (!rotated && idx >= seq::length(nk) && seq::length(nk) < max_size_) {
    // mlx-lm grows by min(step, max_size − _offset); on every reachable path _offset is
    // the stored length here. Growing from the stored length cannot go negative after an
    // external trim or restore (mlx-lm#950).
    const I64 c = seq::length(nk), grown = c + std::min(kStep, max_size_ - c);
    nk = seq::regrow(be, nk, c, grown);
    nv = seq::regrow(be, nv, c, grown);
    idx = c;
  }
  const I64 c = seq::length(nk);
  if (c > max_size_) {
    // A concat left max_size − 1 + S columns in temporal order: drop the oldest.
    nk = seq::slice(be, nk, c - max_size_, c);
    nv = seq::slice(be, nv, c - max_size_, c);
    for (I64& p : lp) p -= c - max_size_;
    idx = max_size_;
  }
  if (idx == max_size_) rotated = true, idx = 0;
  if (rotated)
    for (I64& p : lp) p -= 1;  // the column about to be overwritten is the oldest one
  seq::write_rows(be, k, nk, idx);
  seq::write_rows(be, v, nv, idx);
  keys_ = std::move(nk), values_ = std::move(nv);
  left_padding_ = std::move(lp);
  for (I64& o : offset_) o += 1;
  columns_ += 1;
  idx_ = idx + 1;
  rotated_ = rotated;
  // Physical order once wrapped: one query's attention does not depend on key order.
  const I64 len = rotated_ ? capacity() : idx_;
  return {seq::slice(be, keys_, 0, len), seq::slice(be, values_, 0, len)};
}

// ---- mask --------------------------------------------------------------------------------

CacheMask BatchRotatingKVCache::make_mask(I64 n, int window) const {
  KVLAB_REQUIRE(n >= 1, invalid_argument, "BatchRotatingKVCache::make_mask for N = ", n, " tokens");
  KVLAB_REQUIRE(window >= 0, invalid_argument, "BatchRotatingKVCache::make_mask window ", window, " is negative");
  // One mask serves every layer and is built before any update
  // (docs/lifecycle.md §Mask before the update), so it describes the layout the coming update
  // returns: trims and rotation anticipated.
  const I64 w = window > 0 ? window : max_size_;
  const I64 o = std::min(max_size_ - 1, columns_);
  const I64 len = o + n;
  Rows lp = left_padding_;
  bool rotated_now = false;
  I64 shift = 0;
  if (keys_ && (n > 1 || lengths_)) {
    // Concat path. The pending right-pad roll is anticipated too (mlx-lm does not; it
    // only affects rows whose queries are all padding, but the mask is then exact).
    const Rows roll = pending_roll();
    for (std::size_t b = 0; b < lp.size(); ++b) add_roll(lp[b], roll[b]);
    // mlx-lm computes this trim from _idx, which after a wrap is the cursor, not the
    // length _temporal_order() gives; it then hides one real key of every row whose
    // left_padding is still positive. The temporal length is what the update trims.
    const I64 trim = temporal_length() - max_size_ + 1;
    if (trim > 0)
      for (I64& p : lp) p -= trim;
  } else if (keys_) {
    const I64 trim = capacity() - max_size_;
    if (trim > 0)
      for (I64& p : lp) p -= trim;
    rotated_now = rotated_ || idx_ >= max_size_;
    if (rotated_now) {
      for (I64& p : lp) p -= 1;
      shift = (idx_ >= max_size_ ? 0 : idx_) + 1;  // temporal column j lands in slot (j + shift) mod L
    }
  }
  const I64 batch = batch_size();
  Tensor mask(DType::u8, {batch, 1, n, len});
  const TensorView view = mask.view();
  for (I64 b = 0; b < batch; ++b)
    for (I64 i = 0; i < n; ++i)
      for (I64 j = 0; j < len; ++j) {
        const I64 q = o + i;
        const bool keep = q >= j && q < j + w && j >= lp[static_cast<std::size_t>(b)];
        const I64 col = rotated_now ? (j + shift) % len : j;
        view.store_int((b * n + i) * len + col, keep ? 1 : 0);
      }
  CacheMask out;
  out.spec.kind = MaskKind::boolean;
  out.array = std::move(mask);
  return out;
}

// ---- trim, prepare, finalize -----------------------------------------------------------

bool BatchRotatingKVCache::is_trimmable() const {
  if (columns_ >= max_size_) return false;
  // Found by the lifecycle property: max_size 2, a right-padded prompt ending in a pad
  // (the row keeps 1 column, offset 7), merge; trim(1) then emptied the row.
  for (std::size_t b = 0; b < offset_.size(); ++b)
    if (offset_[b] > idx_ - std::max<I64>(0, left_padding_[b])) return false;
  return true;
}

std::int64_t BatchRotatingKVCache::trim(I64 n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, "BatchRotatingKVCache::trim by ", n, " tokens");
  // As BatchLayout::trim: the pending target offsets are absolute, so a trim reaching into
  // the prompt's real tokens would make finalize() keep later pads as tokens (found by
  // the lifecycle property: lengths 3, right pad 2, 4 columns, trim 2, a last pad column
  // -> extract [1, 2, pad], offset 3).
  KVLAB_REQUIRE(!lengths_, misuse, "BatchRotatingKVCache::trim(", n,
                ") while a right-padded prefill is pending; call finalize() first");
  if (n == 0) return 0;
  // mlx-lm trims a wrapped ring anyway and corrupts _idx; trim_prompt_cache checks
  // is_trimmable first, so here the unchecked call is a named misuse.
  KVLAB_REQUIRE(is_trimmable(), misuse, "BatchRotatingKVCache::trim(", n, ") after ", columns_,
                " columns with max_size ", max_size_, ": evicted columns cannot be restored");
  const I64 removed = std::min(n, idx_);
  if (removed > 0) {
    seq::poison_rows(backend(), keys_, idx_ - removed, idx_);
    seq::poison_rows(backend(), values_, idx_ - removed, idx_);
  }
  idx_ -= removed;
  columns_ -= removed;
  for (I64& o : offset_) o -= removed;
  return removed;
}

void BatchRotatingKVCache::prepare(const std::vector<std::int32_t>& left_padding,
                                   const std::vector<std::int32_t>& lengths,
                                   const std::vector<std::int32_t>& right_padding) {
  const I64 batch = batch_size();
  if (!left_padding.empty()) {
    KVLAB_REQUIRE(!keys_, misuse, "BatchRotatingKVCache::prepare(left_padding ", list_str(Rows(left_padding.begin(),
                  left_padding.end())), ") on a cache holding ", idx_, " columns; left padding only while empty");
    require_rows(left_padding, batch, "prepare left_padding", true);
  }
  if (!right_padding.empty()) require_rows(right_padding, batch, "prepare right_padding", true);
  if (!lengths.empty()) require_rows(lengths, batch, "prepare lengths", true);
  const bool right = std::any_of(right_padding.begin(), right_padding.end(), [](std::int32_t r) { return r > 0; });
  if (right) {
    KVLAB_REQUIRE(!lengths.empty(), invalid_argument, "BatchRotatingKVCache::prepare with right_padding ",
                  list_str(Rows(right_padding.begin(), right_padding.end())), " needs lengths");
    KVLAB_REQUIRE(!lengths_, misuse, "BatchRotatingKVCache::prepare(right_padding) while the target offsets ",
                  list_str(*lengths_), " are pending; call finalize() first");
  }
  for (std::size_t b = 0; b < left_padding.size(); ++b) {
    left_padding_[b] += left_padding[b];
    offset_[b] -= left_padding[b];
  }
  if (right) {
    Rows target(static_cast<std::size_t>(batch));
    for (std::size_t b = 0; b < target.size(); ++b) target[b] = lengths[b] + offset_[b];
    lengths_ = std::move(target);
  }
}

void BatchRotatingKVCache::finalize() {
  if (!lengths_) return;
  const Rows roll = pending_roll();
  if (keys_ && std::any_of(roll.begin(), roll.end(), [](I64 r) { return r > 0; })) {
    // A concat ran since prepare(), so the buffer is already temporal with C == _idx and
    // this roll moves the trailing pads to the front, as mlx-lm's dynamic_roll does.
    FetchedKV t = linearised();
    keys_ = seq::roll(backend(), t.keys, to_i32(roll));
    values_ = seq::roll(backend(), t.values, to_i32(roll));
    idx_ = seq::length(keys_);
    rotated_ = false;
  }
  for (std::size_t b = 0; b < roll.size(); ++b) add_roll(left_padding_[b], roll[b]), offset_[b] -= roll[b];
  lengths_.reset();
}

std::size_t BatchRotatingKVCache::nbytes() const { return keys_ ? keys_.nbytes() + values_.nbytes() : 0; }

// ---- batch surgery: filter, extend, extract, merge -------------------------------------

void BatchRotatingKVCache::filter(const std::vector<std::int32_t>& indices) {
  KVLAB_REQUIRE(!indices.empty(), invalid_argument, "BatchRotatingKVCache::filter with no rows to keep");
  std::vector<bool> seen(static_cast<std::size_t>(batch_size()), false);
  for (const std::int32_t i : indices) {
    check_row(i, "filter");
    // As BatchLayout::filter: a duplicate would clone a row (mlx-lm's array indexing does).
    KVLAB_REQUIRE(!seen[static_cast<std::size_t>(i)], invalid_argument, "BatchRotatingKVCache::filter: row ", i,
                  " appears more than once in ", list_str(Rows(indices.begin(), indices.end())));
    seen[static_cast<std::size_t>(i)] = true;
  }
  DTensor nk, nv;
  if (keys_) {
    nk = seq::gather(backend(), keys_, indices);
    nv = seq::gather(backend(), values_, indices);
  }
  Rows lp, off, len;
  for (const std::int32_t i : indices) {
    const auto u = static_cast<std::size_t>(i);
    lp.push_back(left_padding_[u]);
    off.push_back(offset_[u]);
    if (lengths_) len.push_back((*lengths_)[u]);
  }
  keys_ = std::move(nk);
  values_ = std::move(nv);
  left_padding_ = std::move(lp);
  offset_ = std::move(off);
  // mlx-lm leaves _lengths at the old batch size (docs/upstream-bugs.md §U7); mlx-vlm 570afed3
  // filters it, which keeps a pending right pad usable across a filter.
  if (lengths_) lengths_ = std::move(len);
}

void BatchRotatingKVCache::extend(const BatchRotatingKVCache& other) {
  KVLAB_REQUIRE(other.max_size_ == max_size_, invalid_argument, "BatchRotatingKVCache::extend of max_size ",
                max_size_, " with max_size ", other.max_size_);
  // mlx-lm does not concatenate _lengths; a pending right pad would be lost or misaligned.
  KVLAB_REQUIRE(!lengths_ && !other.lengths_, misuse,
                "BatchRotatingKVCache::extend while a right-padded prefill is pending; call finalize() first");
  const BatchRotatingKVCache* sides[2] = {this, &other};
  const DTensor* ref_k = keys_ ? &keys_ : (other.keys_ ? &other.keys_ : nullptr);
  const DTensor* ref_v = keys_ ? &values_ : &other.values_;
  if (keys_ && other.keys_)
    KVLAB_REQUIRE(keys_.dtype == other.keys_.dtype && keys_.shape[1] == other.keys_.shape[1] &&
                      keys_.shape[3] == other.keys_.shape[3] && values_.shape[3] == other.values_.shape[3],
                  shape_mismatch, "BatchRotatingKVCache::extend of keys ", dtype_name(keys_.dtype),
                  shape_str(keys_.shape), " / values ", shape_str(values_.shape), " with keys ",
                  dtype_name(other.keys_.dtype), shape_str(other.keys_.shape), " / values ",
                  shape_str(other.values_.shape));
  // Different ring phases cannot share one cursor: both go to temporal order first.
  const bool linearise = rotated_ != other.rotated_ || idx_ != other.idx_;
  I64 max_idx = 0, max_cap = 0;
  for (const auto* c : sides) {
    max_idx = std::max(max_idx, linearise ? c->temporal_length() : c->idx_);
    max_cap = std::max(max_cap, c->capacity());
  }
  Rows lp, off;
  std::vector<SeqBlock> blocks[2];
  I64 row0 = 0;
  for (int s = 0; s < 2; ++s) {
    const BatchRotatingKVCache& c = *sides[s];
    const I64 idx = linearise ? c.temporal_length() : c.idx_, left = max_idx - idx;
    // Columns that hold data; without linearising, a wrapped ring is copied as is.
    const I64 data = c.rotated_ ? c.capacity() : c.idx_;
    for (I64 b = 0; b < c.batch_size(); ++b) {
      if (c.keys_)
        append_blocks(blocks[s], c.capacity(), linearise ? c.temporal_shift() : 0, b, 0, std::min(data, max_cap - left),
                      row0 + b, left);
      lp.push_back(c.left_padding_[static_cast<std::size_t>(b)] + left);  // right-justified at max_idx
      off.push_back(c.offset_[static_cast<std::size_t>(b)]);
    }
    row0 += c.batch_size();
  }
  DTensor nk, nv;
  if (ref_k) {
    nk = seq::alloc_poisoned(backend(), ref_k->dtype, {row0, seq::heads(*ref_k), max_cap, seq::width(*ref_k)});
    nv = seq::alloc_poisoned(backend(), ref_v->dtype, {row0, seq::heads(*ref_v), max_cap, seq::width(*ref_v)});
    for (int s = 0; s < 2; ++s)
      if (!blocks[s].empty()) {
        backend().kv_copy_blocks({sides[s]->keys_, blocks[s], nk});
        backend().kv_copy_blocks({sides[s]->values_, blocks[s], nv});
      }
  }
  const bool rotated = !linearise && rotated_;
  columns_ = std::max(columns_, other.columns_);
  keys_ = std::move(nk);
  values_ = std::move(nv);
  left_padding_ = std::move(lp);
  offset_ = std::move(off);
  idx_ = max_idx;
  rotated_ = rotated;
}

FetchedKV BatchRotatingKVCache::extract_rows(I64 i) const {
  check_row(i, "extract");
  // mlx-lm PR #1746: an extract between prepare(right_padding) and finalize() carried the
  // pads and an offset counting them; later requests crashed on mask width != key count.
  KVLAB_REQUIRE(!lengths_, misuse, "BatchRotatingKVCache::extract(", i,
                ") while a right-padded prefill is pending; call finalize() first");
  if (!keys_) return {};
  const I64 len = temporal_length();
  // Clamp at 0: left_padding goes negative after eviction, and mlx-lm's negative slice
  // start then dropped the window (mlx-lm#1114, vllm-mlx#256). Also at most max_size
  // columns: right after a concat the buffer holds max_size − 1 + S (docs/upstream-bugs.md row 7).
  const I64 start = std::max({I64{0}, left_padding_[static_cast<std::size_t>(i)], len - max_size_});
  if (start >= len) return {};
  std::vector<SeqBlock> blocks;
  append_blocks(blocks, capacity(), temporal_shift(), i, start, len, 0, 0);
  return {copy_into_new(backend(), keys_, {1, seq::heads(keys_), len - start, seq::width(keys_)}, blocks),
          copy_into_new(backend(), values_, {1, seq::heads(values_), len - start, seq::width(values_)}, blocks)};
}

std::unique_ptr<RotatingKVCache> BatchRotatingKVCache::extract(I64 i) const {
  FetchedKV rows = extract_rows(i);
  if (!rows.keys) return std::make_unique<RotatingKVCache>(backend(), max_size_);
  return std::make_unique<RotatingKVCache>(backend(), max_size_, std::move(rows.keys), std::move(rows.values),
                                           offset_[static_cast<std::size_t>(i)]);
}

std::unique_ptr<BatchRotatingKVCache> BatchRotatingKVCache::merge(Backend& backend,
                                                                  const std::vector<const RotatingKVCache*>& caches) {
  KVLAB_REQUIRE(!caches.empty(), invalid_argument, "BatchRotatingKVCache::merge of no caches");
  std::vector<FetchedKV> rows(caches.size());
  Rows len, off;
  const FetchedKV* ref = nullptr;
  for (std::size_t b = 0; b < caches.size(); ++b) {
    const RotatingKVCache* c = caches[b];
    KVLAB_REQUIRE(c != nullptr, invalid_argument, "BatchRotatingKVCache::merge cache ", b, " is null");
    KVLAB_REQUIRE(c->max_size() == caches[0]->max_size(), invalid_argument, "BatchRotatingKVCache::merge cache ", b,
                  " has max_size ", c->max_size(), ", cache 0 has ", caches[0]->max_size());
    // Taking the newest len columns would drop the sinks (docs/upstream-bugs.md §U10); batching
    // requires keep == 0 in mlx-lm too.
    KVLAB_REQUIRE(c->keep() == 0, invalid_argument, "BatchRotatingKVCache::merge cache ", b, " has keep ", c->keep(),
                  "; only keep 0 can be batched");
    off.push_back(c->offset());
    len.push_back(0);
    if (c->empty()) continue;  // mlx-vlm#1916: empty rows are skipped, not copied
    KVLAB_REQUIRE(c->key_buffer().shape[0] == 1, shape_mismatch, "BatchRotatingKVCache::merge cache ", b,
                  " holds ", c->key_buffer().shape[0], " sequences, expected 1");
    rows[b] = c->temporal();
    const FetchedKV& r = rows[b];
    if (!r.keys) continue;  // trimmed down to nothing
    if (ref)
      KVLAB_REQUIRE(r.keys.dtype == ref->keys.dtype && r.keys.shape[1] == ref->keys.shape[1] &&
                        r.keys.shape[3] == ref->keys.shape[3] && r.values.shape[3] == ref->values.shape[3],
                    shape_mismatch, "BatchRotatingKVCache::merge cache ", b, " has keys ", dtype_name(r.keys.dtype),
                    shape_str(r.keys.shape), " / values ", shape_str(r.values.shape), ", the first has keys ",
                    dtype_name(ref->keys.dtype), shape_str(ref->keys.shape), " / values ", shape_str(ref->values.shape));
    else
      ref = &rows[b];
    len.back() = std::min(c->kv_length(), r.length());  // mlx-lm size() = min(offset, max_size)
  }
  const I64 lmax = *std::max_element(len.begin(), len.end());
  Rows lp;
  for (const I64 l : len) lp.push_back(lmax - l);
  std::unique_ptr<BatchRotatingKVCache> out(
      new BatchRotatingKVCache(backend, caches[0]->max_size(), std::move(lp), std::move(off)));
  if (lmax == 0) return out;
  const auto b_count = static_cast<I64>(caches.size());
  DTensor keys = seq::alloc_poisoned(backend, ref->keys.dtype, {b_count, seq::heads(ref->keys), lmax, seq::width(ref->keys)});
  DTensor values =
      seq::alloc_poisoned(backend, ref->values.dtype, {b_count, seq::heads(ref->values), lmax, seq::width(ref->values)});
  for (std::size_t b = 0; b < caches.size(); ++b) {
    if (len[b] == 0) continue;
    const I64 l = rows[b].length();
    const std::vector<SeqBlock> blocks{{0, l - len[b], static_cast<I64>(b), lmax - len[b], len[b]}};
    backend.kv_copy_blocks({rows[b].keys, blocks, keys});
    backend.kv_copy_blocks({rows[b].values, blocks, values});
  }
  out->keys_ = std::move(keys);
  out->values_ = std::move(values);
  out->idx_ = out->columns_ = lmax;  // offsets stay the true ones (beyond the window)
  return out;
}

}  // namespace kvlab
