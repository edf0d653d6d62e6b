// Batch lifecycle mutants (test-only): docs/upstream-bugs.md mechanisms of BatchKVCache,
// BatchQuantizedKVCache and BatchRotatingKVCache, each a wrapper of a real batch cache
// (BatchHooks::wrap) or a BatchHooks restore / merge. The real caches reject or repair
// every one of these states, so the mutants build them from the public API: run the real
// operation, then rewrite the cache's state (CacheState) the way the buggy upstream code
// would have left it, and restore it. Killed by B1/B2 (batch
// rows == token logs) and L1 (rotating lifecycle); see the kill matrix of test_zoo.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>

#include "cache/catalogue.h"
#include "cache/registry.h"
#include "cache/seq_ops.h"
#include "property_tests/zoo/batch_mutants.h"

namespace kvlab::prop::zoo {

namespace {

using I64 = std::int64_t;
using Indices = std::vector<std::int32_t>;

Tensor i32(const std::vector<I64>& v) { return Tensor::from_ints(DType::i32, {static_cast<I64>(v.size())}, v); }

template <class T>
std::vector<I64> wide(const std::vector<T>& v) {
  return {v.begin(), v.end()};
}

// Moves batch row b of a float (B, H, L, W) state tensor by `by` columns towards the
// front: column j takes column j + by (NaN where that is outside [0, L)).
void shift_row(Tensor& t, I64 b, I64 by) {
  const I64 heads = t.dim(1), len = t.dim(2), width = t.dim(3);
  const Tensor src = t;
  const ConstTensorView in = src.view();
  const TensorView out = t.view();
  for (I64 h = 0; h < heads; ++h)
    for (I64 j = 0; j < len; ++j)
      for (I64 d = 0; d < width; ++d) {
        const I64 from = j + by;
        const bool inside = from >= 0 && from < len;
        const float x = inside ? static_cast<float>(in.load(((b * heads + h) * len + from) * width + d))
                               : std::numeric_limits<float>::quiet_NaN();
        out.store(((b * heads + h) * len + j) * width + d, x);
      }
}

// ---- BatchKVCache -------------------------------------------------------------------------
// Each a wrapper of a BatchKVCache (BatchForwardingCache) overriding the faulty verb.

// 24 (mlx-lm PR #1746): extract between prepare(right_padding) and finalize() returns the
// pads written so far as tokens, with an offset that counts them.
class ExtractKeepsPendingPads final : public BatchForwardingCache<BatchKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  std::unique_ptr<Cache> extract_sequence(I64 i) const override {
    if (!inner_->right_padding()) return inner_->extract(i);
    CacheState s = inner_->state();
    s.tensors.erase("right_padding");
    return BatchKVCache::from_state(backend(), s)->extract(i);
  }
};

// 51 (vlm#1574, #1441): a per-row list keeps its old order through filter: the pending
// right padding of the first k rows instead of the kept rows'.
class FilterKeepsPadOrder final : public BatchForwardingCache<BatchKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  void filter(const Indices& idx) override {
    const auto rp = inner_->right_padding();
    inner_->filter(idx);
    if (!rp) return;
    CacheState s = inner_->state();
    const Indices first(rp->begin(), rp->begin() + static_cast<std::ptrdiff_t>(idx.size()));
    s.tensors.insert_or_assign("right_padding", i32(wide(first)));
    inner_ = BatchKVCache::from_state(backend(), s);
  }
};

// 51 (vlm#1574): the same on extend: the joined rows' entries land in front of the
// existing rows' (a list rebuilt from a compact form), so pads roll in the wrong rows.
class ExtendMisalignsPads final : public BatchForwardingCache<BatchKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  void extend(const Cache& other_cache) override {
    std::unique_ptr<BatchKVCache> keep;
    const BatchKVCache& other = real_operand(other_cache, keep);
    const I64 joined = other.batch_size();
    inner_->extend(other);
    const auto rp = inner_->right_padding();
    if (!rp) return;
    std::vector<I64> moved(rp->size());
    for (std::size_t b = 0; b < moved.size(); ++b)
      moved[b] = (*rp)[(b + static_cast<std::size_t>(joined)) % moved.size()];
    CacheState s = inner_->state();
    s.tensors.insert_or_assign("right_padding", i32(moved));
    inner_ = BatchKVCache::from_state(backend(), s);
  }
};

// mlx-lm BatchKVCache.filter indexes arrays with whatever it is given (duplicates clone a
// row, vlm#1441 got an IndexError later): here bad indices are silently dropped.
class FilterSanitizesIndices final : public BatchForwardingCache<BatchKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  void filter(const Indices& idx) override {
    Indices ok;
    std::vector<bool> seen(static_cast<std::size_t>(inner_->batch_size()), false);
    for (const std::int32_t i : idx)
      if (i >= 0 && i < inner_->batch_size() && !seen[static_cast<std::size_t>(i)]) {
        seen[static_cast<std::size_t>(i)] = true;
        ok.push_back(i);
      }
    if (ok.empty()) ok.push_back(0);
    inner_->filter(ok);
  }
};

// 41 (vlm#1110): extend keeps every row's old left padding instead of adding the columns
// that right-justify the shorter side, so that side's offsets do not survive.
class ExtendKeepsLeftPadding final : public BatchForwardingCache<BatchKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  void extend(const Cache& other_cache) override {
    std::unique_ptr<BatchKVCache> keep;
    const BatchKVCache& other = real_operand(other_cache, keep);
    std::vector<I64> old = wide(inner_->left_padding());
    for (const std::int32_t lp : other.left_padding()) old.push_back(lp);
    inner_->extend(other);
    std::vector<I64> off;
    for (const I64 lp : old) off.push_back(inner_->idx() - lp);
    CacheState s = inner_->state();
    s.tensors.insert_or_assign("left_padding", i32(old));
    s.tensors.insert_or_assign("offset", i32(off));
    inner_ = BatchKVCache::from_state(backend(), s);
  }
};

// 6 / 41 (mlx-lm#1141, vlm#1248: extend of caches with different capacities): each side
// is padded to (left zeros + its capacity) columns and then cut to the widest capacity;
// this one cuts the head instead of the unused tail, shifting that side's rows.
class ExtendCutsHead final : public BatchForwardingCache<BatchKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  void extend(const Cache& other_cache) override {
    std::unique_ptr<BatchKVCache> keep;
    const BatchKVCache& other = real_operand(other_cache, keep);
    const I64 cap[2] = {inner_->capacity(), other.capacity()}, idx[2] = {inner_->idx(), other.idx()};
    const I64 rows[2] = {inner_->batch_size(), other.batch_size()};
    inner_->extend(other);
    CacheState s = inner_->state();
    if (s.tensors.count("keys") == 0) return;
    const I64 max_cap = std::max(cap[0], cap[1]);
    bool changed = false;
    for (int side = 0; side < 2; ++side) {
      const I64 cut = cap[side] == 0 ? 0 : std::max<I64>(0, cap[side] + (inner_->idx() - idx[side]) - max_cap);
      if (cut == 0) continue;
      changed = true;
      for (I64 b = 0; b < rows[side]; ++b)
        for (const char* name : {"keys", "values"}) shift_row(s.tensors.at(name), (side == 0 ? 0 : rows[0]) + b, cut);
    }
    if (changed) inner_ = BatchKVCache::from_state(backend(), s);
  }
};

// 26 (docs/upstream-bugs.md §U6, mlx-lm BatchKVCache.from_state): the pending right padding is not
// part of the state; a cache saved mid-prompt never rolls its pads.
std::unique_ptr<Cache> restore_without_right_padding(Backend& be, const CacheState& s) {
  CacheState t = s;
  t.tensors.erase("right_padding");
  return BatchKVCache::from_state(be, t);
}

// ---- BatchQuantizedKVCache (docs/upstream-bugs.md row 34: mlx-lm PRs #941 / #1322 never merged)

// A quantized merge that right-aligns the codes but leaves the scales and biases of each
// row at column 0: packed rows and their group parameters no longer line up.
std::unique_ptr<Cache> merge_scales_unaligned(Backend& be, std::span<const QuantizedKVCache* const> rows) {
  const auto merged = BatchQuantizedKVCache::merge(be, rows);
  CacheState s = merged->state();
  const std::vector<std::int32_t> lp = merged->left_padding();
  for (auto& [name, t] : s.tensors) {
    const bool group_param = name.find(".scales") != std::string::npos || name.find(".biases") != std::string::npos;
    if (!group_param || !is_float(t.dtype())) continue;
    for (std::size_t b = 0; b < lp.size(); ++b)
      if (lp[b] > 0) shift_row(t, static_cast<I64>(b), lp[b]);
  }
  return BatchQuantizedKVCache::from_state(be, s);
}

// A quantized merge that silently dequantizes into a plain BatchKVCache (the bits, the
// spec and the memory saving are gone; vllm-mlx stores quantized and serves float).
std::unique_ptr<Cache> merge_dequantizes(Backend& be, std::span<const QuantizedKVCache* const> rows) {
  std::vector<std::unique_ptr<KVCache>> plain;
  std::vector<const KVCache*> ptrs;
  for (const QuantizedKVCache* q : rows) {
    if (q->offset() == 0) {
      plain.push_back(std::make_unique<KVCache>(be));
    } else {
      const FetchedQuantizedKV f = q->fetch();
      const auto decode = [&](const QuantizedDTensor& x) {
        DTensor out = be.allocate(DType::f32, {seq::batch(x.wq), seq::heads(x.wq), seq::length(x.wq),
                                               seq::width(x.scales) * x.spec.group_size});
        be.dequantize({{x.wq, x.scales, x.biases, x.spec}, out});
        return out;
      };
      plain.push_back(std::make_unique<KVCache>(be, decode(f.keys), decode(f.values)));
    }
    ptrs.push_back(plain.back().get());
  }
  return BatchKVCache::merge(be, ptrs);
}

// ---- BatchRotatingKVCache -------------------------------------------------------------------

// 20 (mlx-lm#439): the pads of a right-padded prompt stay in the window: an update does
// not roll the pads it already holds to the front first, so its trim evicts real tokens.
class UpdateKeepsPadsInWindow final : public BatchForwardingCache<BatchRotatingKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  FetchedKV update(const DTensor& k, const DTensor& v) override {
    if (!inner_->pending_lengths()) return inner_->update(k, v);
    CacheState s = inner_->state();
    const Tensor lengths = s.tensors.at("lengths");
    s.tensors.erase("lengths");
    const auto unaware = BatchRotatingKVCache::from_state(backend(), s);
    FetchedKV out = unaware->update(k, v);
    CacheState after = unaware->state();
    after.tensors.insert_or_assign("lengths", lengths);
    inner_ = BatchRotatingKVCache::from_state(backend(), after);
    return out;
  }
};

// 25 (mlx-vlm 75f50e84): S == 1 while the right pad is pending takes the in-place path,
// which raises in mlx-lm, so a prefill whose last chunk is one token fails.
class SingleTokenInPlaceWhilePending final : public BatchForwardingCache<BatchRotatingKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  FetchedKV update(const DTensor& k, const DTensor& v) override {
    KVLAB_REQUIRE(!(k.shape.at(2) == 1 && inner_->pending_lengths()), misuse,
                  "finalize() should be called before decoding with S == 1 (in-place update while right padding "
                  "is pending)");
    return inner_->update(k, v);
  }
};

// 19 (mlx-lm#738): prepare's lengths count the last prompt token, which is processed
// later by the first decode step: every padded row keeps one pad as a token.
class PrepareCountsLastToken final : public BatchForwardingCache<BatchRotatingKVCache> {
 public:
  using BatchForwardingCache::BatchForwardingCache;
  void prepare(const Indices& lp, const Indices& lengths, const Indices& rp) override {
    Indices plus = lengths;
    if (std::any_of(rp.begin(), rp.end(), [](std::int32_t r) { return r > 0; }))
      for (std::int32_t& l : plus) ++l;
    inner_->prepare(lp, plus, rp);
  }
};

// 19 (mlx-lm#738): merge reads each ring by its offset in physical order instead of
// re-linearising it at the cursor (_idx): a wrapped ring's rows come out rotated.
std::unique_ptr<Cache> merge_physical_order(Backend& be, std::span<const RotatingKVCache* const> caches) {
  std::vector<std::unique_ptr<RotatingKVCache>> as_read;
  std::vector<const RotatingKVCache*> ptrs;
  for (const RotatingKVCache* r : caches) {
    const bool wrapped = !r->empty() && r->keep() == 0 && r->cursor() > 0 && r->cursor() < r->stored();
    if (!wrapped) {
      ptrs.push_back(r);
      continue;
    }
    const std::int64_t live = r->stored();
    as_read.push_back(std::make_unique<RotatingKVCache>(be, r->max_size(), seq::slice(be, r->key_buffer(), 0, live),
                                                        seq::slice(be, r->value_buffer(), 0, live), r->offset()));
    ptrs.push_back(as_read.back().get());
  }
  return BatchRotatingKVCache::merge(be, ptrs);
}

// 41 (vlm#1110): merge sets each row's offset to the length it stores instead of its
// true offset, which is larger once the window has slid.
std::unique_ptr<Cache> merge_offsets_are_lengths(Backend& be, std::span<const RotatingKVCache* const> caches) {
  const auto merged = BatchRotatingKVCache::merge(be, {caches.begin(), caches.end()});
  std::vector<I64> off;
  for (const I64 lp : merged->left_padding()) off.push_back(merged->cursor() - lp);
  CacheState s = merged->state();
  s.tensors.insert_or_assign("offset", i32(off));
  return BatchRotatingKVCache::from_state(be, s);
}

// 26 (docs/upstream-bugs.md §U6, mlx-lm BatchRotatingKVCache.from_state): _lengths is not restored.
std::unique_ptr<Cache> restore_without_lengths(Backend& be, const CacheState& s) {
  CacheState t = s;
  t.tensors.erase("lengths");
  return BatchRotatingKVCache::from_state(be, t);
}

// 26 (docs/upstream-bugs.md §U5): meta_state writes str(rotated) and the setter reads
// bool("False"), True.
std::unique_ptr<Cache> restore_rotated_from_string(Backend& be, const CacheState& s) {
  CacheState t = s;
  t.meta["rotated"] = "True";
  return BatchRotatingKVCache::from_state(be, t);
}

// ---- the hooks of one mutant ------------------------------------------------------------------

BatchMutant batch_mutant(std::string id, std::string upstream) {
  return {std::move(id), std::move(upstream), production_batch_hooks()};
}

// A restore whose states of class `kind` go through `mutant` (the others: the real one).
std::function<std::unique_ptr<Cache>(Backend&, const CacheState&)> restore_of(
    CacheKind kind, std::unique_ptr<Cache> (*mutant)(Backend&, const CacheState&)) {
  return [kind, mutant](Backend& be, const CacheState& s) {
    return s.class_name == cache_kind_info(kind).class_name ? mutant(be, s) : cache_from_state(be, s);
  };
}

// A merge whose rows of kind `kind` (single caches of class Single) go through `mutant`
// (the others: the real one).
template <class Single>
std::function<std::unique_ptr<Cache>(Backend&, std::span<const Cache* const>)> merge_of(
    CacheKind kind, std::unique_ptr<Cache> (*mutant)(Backend&, std::span<const Single* const>)) {
  return [kind, mutant](Backend& be, std::span<const Cache* const> rows) {
    if (rows.empty() || rows[0] == nullptr || !is_kind(*rows[0], kind)) return merge_batch(be, rows);
    return mutant(be, rows_of<Single>(rows));
  };
}

}  // namespace

std::vector<BatchMutant> batch_lifecycle_mutants() {
  std::vector<BatchMutant> out;
  out.push_back(batch_mutant("19a.rotating-merge-physical-order", "mlx-lm#738"));
  out.back().batch.merge = merge_of<RotatingKVCache>(CacheKind::rotating, merge_physical_order);
  out.push_back(batch_mutant("19b.rotating-prepare-counts-last-token", "mlx-lm#738"));
  out.back().batch.wrap = wrap_in<PrepareCountsLastToken>;
  out.push_back(batch_mutant("20.rotating-right-pads-in-window", "mlx-lm#439"));
  out.back().batch.wrap = wrap_in<UpdateKeepsPadsInWindow>;
  out.push_back(batch_mutant("24.extract-keeps-pending-pads", "mlx-lm PR #1746"));
  out.back().batch.wrap = wrap_in<ExtractKeepsPendingPads>;
  out.push_back(batch_mutant("25.rotating-s1-in-place-while-pending", "mlx-vlm 75f50e84"));
  out.back().batch.wrap = wrap_in<SingleTokenInPlaceWhilePending>;
  out.push_back(batch_mutant("26a.restore-drops-right-padding", "mlx-lm from_state (docs/upstream-bugs.md §U6)"));
  out.back().batch.restore = restore_of(CacheKind::batch_kv, restore_without_right_padding);
  out.push_back(batch_mutant("26b.rotating-restore-drops-lengths", "mlx-lm from_state (docs/upstream-bugs.md §U6)"));
  out.back().batch.restore = restore_of(CacheKind::batch_rotating, restore_without_lengths);
  out.push_back(batch_mutant("26c.rotating-restore-rotated-string", "mlx-lm bool(\"False\") (docs/upstream-bugs.md §U5)"));
  out.back().batch.restore = restore_of(CacheKind::batch_rotating, restore_rotated_from_string);
  out.push_back(batch_mutant("34a.quantized-merge-scales-unaligned", "mlx-lm#941 / #1322"));
  out.back().batch.merge = merge_of<QuantizedKVCache>(CacheKind::quantized, merge_scales_unaligned);
  out.push_back(batch_mutant("34b.quantized-merge-dequantizes", "mlx-lm#941 / #1322"));
  out.back().batch.merge = merge_of<QuantizedKVCache>(CacheKind::quantized, merge_dequantizes);
  out.push_back(batch_mutant("41a.extend-keeps-left-padding", "vlm#1110"));
  out.back().batch.wrap = wrap_in<ExtendKeepsLeftPadding>;
  out.push_back(batch_mutant("41b.rotating-merge-offsets-lengths", "vlm#1110"));
  out.back().batch.merge = merge_of<RotatingKVCache>(CacheKind::rotating, merge_offsets_are_lengths);
  out.push_back(batch_mutant("6.extend-cuts-head-not-tail", "mlx-lm#1141 / vlm#1248"));
  out.back().batch.wrap = wrap_in<ExtendCutsHead>;
  out.push_back(batch_mutant("51a.filter-keeps-pad-order", "vlm#1574 / #1441"));
  out.back().batch.wrap = wrap_in<FilterKeepsPadOrder>;
  out.push_back(batch_mutant("51b.extend-misaligns-pads", "vlm#1574"));
  out.back().batch.wrap = wrap_in<ExtendMisalignsPads>;
  out.push_back(batch_mutant("filter-accepts-bad-indices", "mlx-lm BatchKVCache.filter / vlm#1441"));
  out.back().batch.wrap = wrap_in<FilterSanitizesIndices>;
  return out;
}

}  // namespace kvlab::prop::zoo
