#include "property_tests/zoo/mutants.h"

#include <memory>
#include <utility>

#include "cache/cache_script.h"
#include "cache/chunked_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "cache/seq_ops.h"
#include "reference/affine_quantize.h"

namespace kvlab::prop::zoo {

std::vector<std::int32_t> per_row(const std::vector<std::int32_t>& offsets, std::int64_t batch) {
  if (static_cast<std::int64_t>(offsets.size()) == batch) return offsets;
  return std::vector<std::int32_t>(static_cast<std::size_t>(batch), offsets.at(0));
}

DTensor rope_at(Backend& be, const DTensor& x, const RopeParams& rope, const std::vector<std::int32_t>& positions) {
  if (rope.dims == 0) return x;
  DTensor offsets = be.allocate(DType::i32, {static_cast<std::int64_t>(positions.size())});
  be.upload(offsets, positions.data());
  DTensor out = be.allocate(x.dtype, x.shape);
  be.rope({x, rope, Offsets{0, offsets}, out});
  return out;
}

void set_positions(Backend& be, AttendResult& r, const std::vector<std::int32_t>& positions) {
  r.positions = positions;
  r.position_offsets = be.allocate(DType::i32, {static_cast<std::int64_t>(positions.size())});
  be.upload(r.position_offsets, positions.data());
}

namespace {

// ---- mutant attention steps --------------------------------------------------------

enum class AttendFault {
  positions_after_update,  // (a) queries roped at the offset read after the update
  plain_update_always,     // (b) update() whatever the cache kind
  mask_after_update,       // (h) make_mask called on the post-update state
};

// cache/attend.cc with one step moved or one branch removed.
AttendResult mutant_attend(AttendFault fault, Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v,
                           const AttendOptions& o) {
  Backend& be = cache.backend();
  AttendResult r;
  set_positions(be, r, per_row(cache.offsets(), q.shape.at(0)));
  const DTensor k_rot = rope_at(be, k, o.rope, r.positions);
  if (fault != AttendFault::mask_after_update) r.mask = cache.make_mask(q.shape.at(2), o.window);
  if (cache.is_quantized() && fault != AttendFault::plain_update_always) r.quantized_kv = cache.update_quantized(k_rot, v);
  else r.kv = cache.update(k_rot, v);  // (b) mlx-swift-lm#71: Error on a quantized cache
  if (fault == AttendFault::mask_after_update) r.mask = cache.make_mask(q.shape.at(2), o.window);
  // (a) mlx-lm#1097 / #1384: `offset` aliases the cache's counter, so reading it after
  // update_and_fetch gives offset + L; K was roped before (its graph captured the old value).
  const std::vector<std::int32_t> q_pos =
      fault == AttendFault::positions_after_update ? per_row(cache.offsets(), q.shape.at(0)) : r.positions;
  const DTensor q_rot = rope_at(be, q, o.rope, q_pos);
  AttentionParams params = o.attention;
  params.mask = r.mask.spec;
  std::optional<DTensor> mask_array;
  if (r.mask.array) mask_array = be.upload(*r.mask.array);
  const std::int64_t dv = r.kv ? r.kv->values.shape.at(3)
                               : r.quantized_kv->values.spec.unpacked_dim(r.quantized_kv->values.wq.shape.at(3));
  r.out = be.allocate(q.dtype, {q.shape.at(0), q.shape.at(1), q.shape.at(2), dv});
  const DTensor* m = mask_array ? &*mask_array : nullptr;
  if (r.kv) be.sdpa({q_rot, r.kv->keys, r.kv->values, params, m, nullptr, r.out});
  else be.quantized_sdpa({q_rot, r.quantized_kv->keys, r.quantized_kv->values, params, m, nullptr, r.out});
  return r;
}

// ---- wrapper caches ------------------------------------------------------------------

// (f) mlx-lm QuantizedKVCache's first allocation is dim // (32 // bits) words wide
// (docs/upstream-bugs.md §U1); writing the real D·bits/32 words into it is a broadcast error
// for bits 5/6 at D = 128 and bits 3 at D = 256. to_quantized and regrowth take the
// width from the existing array, so only a fresh cache's first update fails.
class MlxAllocWidthCache final : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  FetchedQuantizedKV update_quantized(const DTensor& k, const DTensor& v) override {
    if (inner_->empty()) {
      const auto& q = dynamic_cast<const QuantizedKVCache&>(*inner_);
      for (const std::int64_t d : {k.shape.at(3), v.shape.at(3)}) {
        const std::int64_t alloc = d / (32 / q.spec().bits), real = q.spec().packed_words(d);
        KVLAB_REQUIRE(alloc == real, shape_mismatch, "[broadcast_shapes] cannot write ", real,
                      " packed words into the ", alloc, "-word buffer allocated as dim // (32 // bits)");
      }
    }
    return inner_->update_quantized(k, v);
  }
};

// (u10) a ring's chunk mask is the plain window of max_size keys over the returned keys,
// sinks or not (mlx-lm's make_mask, and kvlab's own before mlx-vlm's replay showed it
// wrong: docs/upstream-bugs.md §U10): the later queries of a chunk lose the sinks.
class ChunkMaskDropsSinksCache final : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  CacheMask make_mask(std::int64_t n, int window) const override {
    if (n <= 1) return inner_->make_mask(n, window);
    const auto& ring = dynamic_cast<const RotatingKVCache&>(*inner_);
    const std::int64_t w = window > 0 ? window : ring.max_size(), o = std::min(ring.stored(), ring.max_size() - 1);
    CacheMask mask;
    mask.spec.kind = MaskKind::causal;
    mask.spec.window = o + n > w ? static_cast<int>(w) : 0;
    return mask;
  }
};

// (g1) trim reports the removal but leaves the offset where it was.
class TrimKeepsOffsetCache final : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  std::int64_t trim(std::int64_t n) override {
    const std::int64_t off = inner_->offsets().at(0);
    return std::min(n, off);
  }
};

// (g2) mlx-lm ConcatenateKVCache (docs/upstream-bugs.md §U3): every update concatenates
// onto the untrimmed buffer and sets offset = its length; trim lowers the offset only,
// so trimmed tokens come back with the next update. Serialises as a KVCache.
class ConcatenateKVCache final : public Cache {
 public:
  ConcatenateKVCache(Backend& be, DTensor k, DTensor v) : Cache(be), keys_(std::move(k)), values_(std::move(v)) {
    offset_ = keys_ ? keys_.shape.at(2) : 0;
  }
  std::string_view class_name() const override { return "KVCache"; }
  FetchedKV update(const DTensor& k, const DTensor& v) override {
    keys_ = keys_ ? seq::concat(backend(), keys_, k) : k;
    values_ = values_ ? seq::concat(backend(), values_, v) : v;
    offset_ = keys_.shape.at(2);
    return {keys_, values_};
  }
  std::int64_t kv_length() const override { return offset_; }
  std::vector<std::int32_t> offsets() const override { return {static_cast<std::int32_t>(offset_)}; }
  CacheMask make_mask(std::int64_t n, int window) const override {
    CacheMask m;
    if (n > 1 || window > 0) m.spec = MaskSpec{MaskKind::causal, window, {}, {}};
    return m;
  }
  bool is_trimmable() const override { return true; }
  std::int64_t trim(std::int64_t n) override {
    const std::int64_t removed = std::min(n, offset_);
    offset_ -= removed;
    return removed;
  }
  bool empty() const override { return !keys_; }
  std::size_t nbytes() const override { return keys_ ? keys_.nbytes() + values_.nbytes() : 0; }
  CacheState state() const override {
    CacheState s{"KVCache", {}, {{"offset", std::to_string(offset_)}}};
    if (keys_ && offset_ > 0) {
      s.tensors.emplace("keys", backend().download(seq::slice(backend(), keys_, 0, offset_)));
      s.tensors.emplace("values", backend().download(seq::slice(backend(), values_, 0, offset_)));
    }
    return s;
  }
  std::vector<SequenceContent> content(ContentForm form) const override {
    return cache_from_state(backend(), state())->content(form);  // as BasicForwardingCache
  }
  std::vector<BackingBuffer> buffers() const override { return cache_from_state(backend(), state())->buffers(); }

 private:
  DTensor keys_, values_;
  std::int64_t offset_ = 0;
};

// (t19) kvlab itself before issue 19 (found by the deep property run, shrunk to Decode,
// Trim(1), SaveLoad): KVCache::state() saved rows [0, offset) whenever a buffer existed,
// so a cache trimmed to no tokens saved zero-row blocks, and from_state adopted them
// through the KVCache(keys, values) constructor, whose update checks reject S = 0. The
// fix touched both sides, so the mutant needs both: this wrapper saves the old state and
// restore_adopts_stored_rows below loads it the old way.
class ZeroRowEmptyStateCache final : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  CacheState state() const override {
    CacheState s = inner_->state();
    const auto& kv = dynamic_cast<const KVCache&>(*inner_);
    if (kv.offset() == 0 && kv.key_buffer()) {
      s.tensors.emplace("keys", backend().download(seq::slice(backend(), kv.key_buffer(), 0, 0)));
      s.tensors.emplace("values", backend().download(seq::slice(backend(), kv.value_buffer(), 0, 0)));
    }
    return s;
  }
};

// ---- mutant restore / policy / extract ---------------------------------------------

// (e) quantized and unquantized states mixed: the restore dequantizes a
// QuantizedKVCache state into a plain KVCache, dropping the QuantSpec (vllm-mlx#443/#451:
// the quantized wrapper had no state, prefix entries were stored as plain K/V).
std::unique_ptr<Cache> restore_drops_spec(Backend& be, const CacheState& s) {
  if (s.class_name != "QuantizedKVCache" || s.tensors.empty()) return cache_from_state(be, s);
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, std::stoi(s.meta.at("bits")),
                                         std::stoi(s.meta.at("group_size")));
  CacheState plain{"KVCache", {}, {{"offset", s.meta.at("offset")}}};
  for (const char* part : {"keys", "values"}) {
    const std::string p(part);
    plain.tensors.emplace(p, ref::affine_dequantize(ref::QuantizedTensor{
                                 s.tensors.at(p + ".wq"), s.tensors.at(p + ".scales"), s.tensors.at(p + ".biases"), spec}));
  }
  return cache_from_state(be, plain);
}

// (t19) The old KVCache::from_state: stored rows are adopted by the constructor (an
// update of S = stored rows), so zero stored rows throw instead of loading empty.
std::unique_ptr<Cache> restore_adopts_stored_rows(Backend& be, const CacheState& s) {
  if (s.class_name != "KVCache" || s.tensors.count("keys") == 0) return cache_from_state(be, s);
  auto c = std::make_unique<KVCache>(be, be.upload(s.tensors.at("keys")), be.upload(s.tensors.at("values")));
  KVLAB_REQUIRE(s.meta.at("offset") == std::to_string(c->offset()), corrupt, "KVCache state offset '",
                s.meta.at("offset"), "' disagrees with its ", c->offset(), " stored rows");
  return c;
}

// (d) mlx-lm maybe_quantize_kv_cache calls to_quantized on every layer, and
// RotatingKVCache.to_quantized raises NotImplementedError mid-generation (mlx-lm#1573).
std::vector<QuantizeDecision> policy_quantizes_rings(std::vector<std::unique_ptr<Cache>>& layers,
                                                     const QuantSpec& spec, Rounding rounding, std::int64_t start) {
  for (const auto& l : layers)
    KVLAB_REQUIRE(dynamic_cast<const RotatingKVCache*>(l.get()) == nullptr, unsupported,
                  "RotatingKVCache Quantization NYI");
  return maybe_quantize_kv_caches(layers, spec, rounding, start);
}

// Adopts rows [begin, begin + count) of (1, H, L, D) blocks as the newest of `offset`.
std::unique_ptr<Cache> adopt(Backend& be, const RotatingKVCache& r, const DTensor& k, const DTensor& v,
                             std::int64_t begin, std::int64_t count) {
  return std::make_unique<RotatingKVCache>(be, r.max_size(), seq::slice(be, k, begin, begin + count),
                                           seq::slice(be, v, begin, begin + count), r.offset());
}

// (c1) mlx-lm#1114 / vllm-mlx PR 256 family: the window slice starts one row late
// (a `-k:` slice computed from a padding that went negative), dropping the oldest token.
std::unique_ptr<Cache> extract_off_by_one(Backend& be, const Cache& c) {
  const auto& r = dynamic_cast<const RotatingKVCache&>(c);
  const FetchedKV t = r.temporal();
  const std::int64_t len = t.length(), rows = std::min(r.offset(), r.max_size());
  return adopt(be, r, t.keys, t.values, len - rows + 1, rows - 1);
}

// (c2) mlx-lm#738 family: the snapshot takes the ring buffer in physical order as if
// it were temporal (merge/extract used offset instead of _idx).
std::unique_ptr<Cache> extract_physical_order(Backend& be, const Cache& c) {
  const auto& r = dynamic_cast<const RotatingKVCache&>(c);
  const std::int64_t rows = std::min(r.offset(), r.max_size());
  const std::int64_t live = std::min(r.stored(), r.key_buffer().shape.at(2));
  return adopt(be, r, r.key_buffer(), r.value_buffer(), live - rows, rows);
}

}  // namespace

std::unique_ptr<Cache> unwrap(std::unique_ptr<Cache> c) {
  if (auto* f = dynamic_cast<ForwardingCache*>(c.get())) return f->release();
  if (dynamic_cast<ConcatenateKVCache*>(c.get()) != nullptr) return cache_from_state(c->backend(), c->state());
  return c;
}

std::vector<QuantizeDecision> unwrapping_policy(std::vector<std::unique_ptr<Cache>>& layers, const QuantSpec& spec,
                                                Rounding rounding, std::int64_t start) {
  for (auto& l : layers) l = unwrap(std::move(l));
  return maybe_quantize_kv_caches(layers, spec, rounding, start);
}

std::unique_ptr<Cache> unwrapping_extract(Backend& be, const Cache& c) {
  const auto* f = dynamic_cast<const ForwardingCache*>(&c);
  return cache_script::extract_newest(be, f != nullptr ? f->inner() : c);
}

void unwrapping_trim_front(std::unique_ptr<Cache>& c) {
  auto* f = dynamic_cast<ForwardingCache*>(c.get());
  production_hooks().trim_front(f != nullptr ? f->inner_slot() : c);
}

Mutant mutant(std::string id, std::string upstream, std::vector<std::string> first) {
  return {std::move(id), std::move(upstream), production_hooks(), std::move(first)};
}

std::vector<Mutant> all_mutants() {
  std::vector<Mutant> out;
  const auto attend_with = [](AttendFault f) {
    return [f](Cache& c, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& o) {
      return mutant_attend(f, c, q, k, v, o);
    };
  };
  out.push_back(mutant("a.positions-after-update", "mlx-lm#1097 / #1384"));
  out.back().hooks.attend = attend_with(AttendFault::positions_after_update);
  out.push_back(mutant("b.update-on-quantized", "mlx-swift-lm#71"));
  out.back().hooks.attend = attend_with(AttendFault::plain_update_always);
  const std::vector<std::string> ring{"Stateful.RotatingKVCache"}, quantized{"Stateful.QuantizedKVCache"};
  out.push_back(mutant("c1.extract-off-by-one", "mlx-lm#1114 / vllm-mlx#256", ring));
  out.back().hooks.extract = extract_off_by_one;
  out.push_back(mutant("c2.extract-physical-order", "mlx-lm#738", ring));
  out.back().hooks.extract = extract_physical_order;
  out.push_back(mutant("d.policy-quantizes-rings", "mlx-lm#1573 / #1583", ring));
  out.back().hooks.quantize_policy = policy_quantizes_rings;
  out.push_back(mutant("e.restore-drops-quant-spec", "vllm-mlx#443 / #451"));
  out.back().hooks.restore = restore_drops_spec;
  out.push_back(mutant("f.mlx-alloc-width", "mlx-lm QuantizedKVCache (docs/upstream-bugs.md §U1)", quantized));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    if (dynamic_cast<const QuantizedKVCache*>(c.get()) == nullptr) return c;
    return std::make_unique<MlxAllocWidthCache>(std::move(c));
  };
  out.push_back(mutant("g1.trim-keeps-offset", "vlm#1715 family"));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    return std::make_unique<TrimKeepsOffsetCache>(std::move(c));
  };
  out.back().hooks.quantize_policy = unwrapping_policy;
  out.back().hooks.extract = unwrapping_extract;
  out.back().hooks.trim_front = unwrapping_trim_front;
  out.push_back(mutant("g2.concatenate-trim-resurrects", "mlx-lm ConcatenateKVCache (docs/upstream-bugs.md §U3)"));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    const auto* kv = dynamic_cast<const KVCache*>(c.get());
    if (kv == nullptr) return c;
    if (kv->offset() == 0) return std::make_unique<ConcatenateKVCache>(c->backend(), DTensor{}, DTensor{});
    const FetchedKV f = kv->fetch();
    return std::make_unique<ConcatenateKVCache>(c->backend(), f.keys, f.values);
  };
  out.back().hooks.quantize_policy = unwrapping_policy;
  out.push_back(mutant("t19.empty-kv-state-zero-rows", "kvlab issue 19 (deep run: Decode, Trim(1), SaveLoad)",
                       {"R7.TrimmedEmptyRoundTrips"}));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    if (dynamic_cast<const KVCache*>(c.get()) == nullptr) return c;
    return std::make_unique<ZeroRowEmptyStateCache>(std::move(c));
  };
  out.back().hooks.restore = restore_adopts_stored_rows;
  out.back().hooks.quantize_policy = unwrapping_policy;
  out.back().hooks.extract = unwrapping_extract;
  out.back().hooks.trim_front = unwrapping_trim_front;
  out.push_back(mutant("u10.ring-chunk-mask-drops-sinks", "mlx-lm make_mask (docs/upstream-bugs.md §U10)", ring));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    if (dynamic_cast<const RotatingKVCache*>(c.get()) == nullptr) return c;
    return std::make_unique<ChunkMaskDropsSinksCache>(std::move(c));
  };
  out.back().hooks.extract = unwrapping_extract;
  out.back().hooks.quantize_policy = unwrapping_policy;
  out.push_back(mutant("h.mask-after-update", "docs/lifecycle.md §Mask before the update", ring));
  out.back().hooks.attend = attend_with(AttendFault::mask_after_update);
  for (Mutant& m : attention_mutants()) out.push_back(std::move(m));
  return out;
}

}  // namespace kvlab::prop::zoo
