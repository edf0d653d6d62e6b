// Mutants for the docs/upstream-bugs.md mechanisms of the attention step, RoPE, quantized
// attention, TurboQuant, restore, the quantize policy, kv_length, state files and ChunkedKVCache.
// Each reproduces one upstream mechanism as test-only code (a Hooks override, a wrapper
// cache or an alternative implementation); the comment above each names the bug.
#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "cache/chunked_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/registry.h"
#include "cache/seq_ops.h"
#include "property_tests/zoo/mutants.h"
#include "reference/bitpack.h"
#include "reference/mask.h"
#include "reference/turboquant.h"

namespace kvlab::prop::zoo {

namespace {

// Attention over what the update returned (cache/attend.cc step 5), with the cache's mask.
DTensor attention_over(Backend& be, const DTensor& q_rot, const AttendResult& r, const AttendOptions& o) {
  AttentionParams params = o.attention;
  params.mask = r.mask.spec;
  std::optional<DTensor> mask_array;
  if (r.mask.array) mask_array = be.upload(*r.mask.array);
  const DTensor* m = mask_array ? &*mask_array : nullptr;
  const DTensor* sinks = o.sinks ? &*o.sinks : nullptr;
  const std::int64_t dv = r.kv ? r.kv->values.shape.at(3)
                               : r.quantized_kv->values.spec.unpacked_dim(r.quantized_kv->values.wq.shape.at(3));
  DTensor out = be.allocate(q_rot.dtype, {q_rot.shape.at(0), q_rot.shape.at(1), q_rot.shape.at(2), dv});
  if (r.kv) be.sdpa({q_rot, r.kv->keys, r.kv->values, params, m, sinks, out});
  else be.quantized_sdpa({q_rot, r.quantized_kv->keys, r.quantized_kv->values, params, m, sinks, out});
  return out;
}

// cache/attend.cc steps 1–4 (positions, RoPE of K, mask, update); returns the roped Q.
DTensor attend_update(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& o,
                      AttendResult& r) {
  Backend& be = cache.backend();
  set_positions(be, r, per_row(cache.offsets(), q.shape.at(0)));
  const DTensor q_rot = rope_at(be, q, o.rope, r.positions), k_rot = rope_at(be, k, o.rope, r.positions);
  r.mask = cache.make_mask(q.shape.at(2), o.window);
  if (cache.is_quantized()) r.quantized_kv = cache.update_quantized(k_rot, v);
  else r.kv = cache.update(k_rot, v);
  return q_rot;
}

// ---- (i) offsets aliasing the live array (docs/upstream-bugs.md rows 1, 4, 5) -------------------

// mlx-lm#1097 / #1806, vlm#966: BatchKVCache keeps its offsets in an mx.array advanced by
// `self.offset += S`, which overwrites the array in place; the model's `offset =
// cache.offset` is that same array. Here offsets live in one vector the caller can hold
// by reference, and update() advances it in place.
class LiveOffsetsCache final : public ForwardingCache {
 public:
  explicit LiveOffsetsCache(std::unique_ptr<Cache> inner) : ForwardingCache(std::move(inner)), live_(inner_->offsets()) {}
  std::vector<std::int32_t> offsets() const override { return live_; }
  const std::vector<std::int32_t>& offset_alias() const { return live_; }  // the array itself, not a copy
  FetchedKV update(const DTensor& k, const DTensor& v) override {
    FetchedKV f = inner_->update(k, v);
    advance(k.shape.at(2));
    return f;
  }
  FetchedQuantizedKV update_quantized(const DTensor& k, const DTensor& v) override {
    FetchedQuantizedKV f = inner_->update_quantized(k, v);
    advance(k.shape.at(2));
    return f;
  }
  std::int64_t trim(std::int64_t n) override {
    const std::int64_t removed = inner_->trim(n);
    live_ = inner_->offsets();
    return removed;
  }

 private:
  void advance(std::int64_t s) {
    for (std::int32_t& o : live_) o += static_cast<std::int32_t>(s);  // `offset += S`, in place
  }
  std::vector<std::int32_t> live_;
};

// A model step that takes `offset = cache.offset` once, before the update, as the real
// model files do: K is roped before the update (right), the queries after it and the
// positions handed on to KV-shared layers are read through the alias (offset + L).
AttendResult alias_attend(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& o) {
  auto* live = dynamic_cast<LiveOffsetsCache*>(&cache);
  if (live == nullptr) return attend(cache, q, k, v, o);
  Backend& be = cache.backend();
  const std::int64_t batch = q.shape.at(0);
  const std::vector<std::int32_t>& offset = live->offset_alias();
  AttendResult r;
  const DTensor k_rot = rope_at(be, k, o.rope, per_row(offset, batch));
  r.mask = cache.make_mask(q.shape.at(2), o.window);
  if (cache.is_quantized()) r.quantized_kv = cache.update_quantized(k_rot, v);
  else r.kv = cache.update(k_rot, v);
  set_positions(be, r, per_row(offset, batch));
  r.out = attention_over(be, rope_at(be, q, o.rope, r.positions), r, o);
  return r;
}

// ---- (k) quantized GQA mask broadcast (rows 10, 11) -------------------------------------

// mlx-lm#1467 / vlm#1567: for R = Hq/Hkv > 1 the scores are (B, Hkv, R, L, T); a (B, 1, L,
// T) padding mask broadcast right-aligned puts its batch axis on the kv-head axis, so the
// heads of batch row b read the padding of row (kv head) instead of their own.
AttendResult gqa_mask_by_kv_head(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v,
                                 const AttendOptions& o) {
  Backend& be = cache.backend();
  AttendResult r;
  const DTensor q_rot = attend_update(cache, q, k, v, o, r);
  const std::int64_t batch = q.shape.at(0), hq = q.shape.at(1), n = q.shape.at(2);
  const MaskSpec& spec = r.mask.spec;
  const bool faulty = r.quantized_kv && batch >= 2 && spec.kind == MaskKind::causal && !spec.left_padding.empty() &&
                      hq > r.quantized_kv->keys.wq.shape.at(1);
  if (!faulty) {
    r.out = attention_over(be, q_rot, r, o);
    return r;
  }
  const std::int64_t hkv = r.quantized_kv->keys.wq.shape.at(1), ratio = hq / hkv, lk = r.quantized_kv->length();
  const Tensor rows =
      ref::create_causal_mask(n, lk - n, spec.window, spec.left_padding, spec.right_padding, ref::MaskForm::boolean);
  Tensor per_head(DType::u8, {batch, hq, n, lk});
  const auto block = static_cast<std::size_t>(n * lk);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t wrong_row = (h / ratio) % batch;  // the kv head's index used as the batch row
      std::copy_n(rows.data() + static_cast<std::size_t>(wrong_row) * block, block,
                  per_head.data() + static_cast<std::size_t>(b * hq + h) * block);
    }
  AttentionParams p = o.attention;
  p.mask = MaskSpec{MaskKind::boolean, 0, {}, {}};
  const DTensor mask = be.upload(per_head);
  r.out = be.allocate(q.dtype, {batch, hq, n, r.quantized_kv->values.spec.unpacked_dim(r.quantized_kv->values.wq.shape.at(3))});
  be.quantized_sdpa({q_rot, r.quantized_kv->keys, r.quantized_kv->values, p, &mask, nullptr, r.out});
  return r;
}

// ---- (q) P·V of quantized attention drops the tail columns (row 56) ---------------------

// mlx#4250: quantized_matmul(transpose=False) on Metal launched floor(N/64) column blocks
// of 64 (bn), so for N = Dv not a multiple of 64 the last N mod 64 output columns of P·V
// were never written (zeros).
AttendResult pv_drops_tail(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& o) {
  Backend& be = cache.backend();
  AttendResult r;
  const DTensor q_rot = attend_update(cache, q, k, v, o, r);
  r.out = attention_over(be, q_rot, r, o);
  if (!r.quantized_kv) return r;
  Tensor out = be.download(r.out);
  const std::int64_t dv = out.dim(3), covered = dv / 64 * 64;
  float* p = out.view().as<float>();
  for (std::int64_t row = 0; row < out.numel() / dv; ++row)
    std::fill(p + row * dv + covered, p + (row + 1) * dv, 0.0f);
  r.out = be.upload(out);
  return r;
}

// ---- (m) TurboQuant: another rotation basis for L = 1 (row 39) ---------------------------

// vlm#973: the fused L = 1 quantize kernel encoded with the dense rotation while the codec
// (prefill, and every decode) used the randomized Hadamard transform, so one cache mixed
// two bases and decode tokens came back rotated wrong. The wrapper encodes single-token
// updates with a dense-rotation codec of the same bits and codebook and splices the codes
// into the cache's state.
class TurboL1DenseBasisCache final : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  FetchedKV update(const DTensor& k, const DTensor& v) override {
    const auto& tq = dynamic_cast<const TurboQuantKVCache&>(*inner_);
    if (k.shape.at(2) != 1 || tq.key_side().dim == 0) return inner_->update(k, v);
    Backend& be = backend();
    CacheState s = tq.state();
    for (const auto& [side, x, name] : {std::tuple{&tq.key_side(), &k, std::string("keys")},
                                        std::tuple{&tq.value_side(), &v, std::string("values")}}) {
      const bool split = side->parts.size() == 2;
      for (std::size_t i = 0; i < side->parts.size(); ++i) {
        const TurboQuantCodec& c = side->parts[i].codec;
        const TurboQuantCodec& fused = dense_codec(c);
        const std::string prefix = split ? name + (i == 0 ? ".low" : ".high") : name;
        DTensor norms = be.allocate(DType::f16, {x->shape[0], x->shape[1], 1, 1});
        DTensor indices = be.allocate(DType::u32, {x->shape[0], x->shape[1], 1, ref::packed_word_count(c.dim, c.bits)});
        be.turboquant_encode({*x, fused, norms, indices});
        append_row(be, s, prefix + ".norms", norms);
        append_row(be, s, prefix + ".indices", indices);
      }
    }
    s.meta["offset"] = std::to_string(tq.offset() + 1);
    inner_ = TurboQuantKVCache::from_state(be, s);
    return dynamic_cast<const TurboQuantKVCache&>(*inner_).fetch();
  }

 private:
  const TurboQuantCodec& dense_codec(const TurboQuantCodec& c) {
    const auto key = std::pair{c.dim, c.bits};
    auto it = fused_.find(key);
    if (it == fused_.end())
      it = fused_.emplace(key, ref::make_turboquant_codec(c.dim, c.bits, 0, ref::TurboQuantRotation::dense)).first;
    it->second.channels = c.channels;
    return it->second;
  }
  static void append_row(Backend& be, CacheState& s, const std::string& name, const DTensor& row) {
    const auto it = s.tensors.find(name);
    if (it == s.tensors.end()) {
      s.tensors.emplace(name, be.download(row));
      return;
    }
    it->second = be.download(seq::concat(be, be.upload(it->second), row));
  }
  std::map<std::pair<int, int>, TurboQuantCodec> fused_;
};

// ---- (o) quantize policy (row 9) ---------------------------------------------------------

// mlx-lm#477 (fixed by #495): maybe_quantize_kv_cache tested `isinstance(cache[0],
// KVCache) and cache[0].offset > start` and then converted every layer: a hybrid model
// whose layer 0 is not a KVCache was never quantized, and layer 0 decided for all. This
// mutant keeps `>=` so that only the layer-0 decision is wrong (o2 has the `>`).
std::vector<QuantizeDecision> policy_layer0_only(std::vector<std::unique_ptr<Cache>>& layers, const QuantSpec& spec,
                                                 Rounding rounding, std::int64_t start) {
  const auto* first = layers.empty() ? nullptr : dynamic_cast<const KVCache*>(layers[0].get());
  const bool go = first != nullptr && first->offset() >= start;
  return maybe_quantize_kv_caches(layers, spec, rounding, go ? 0 : std::int64_t{1} << 40);
}

// mlx-lm#477 with the per-layer loop but the old comparison `offset > start`.
std::vector<QuantizeDecision> policy_greater_than(std::vector<std::unique_ptr<Cache>>& layers, const QuantSpec& spec,
                                                  Rounding rounding, std::int64_t start) {
  return maybe_quantize_kv_caches(layers, spec, rounding, start + 1);
}

// ---- (p) kv_length of a quantized cache (row 36) -----------------------------------------

// vlm#1481: models read the key length as `keys.shape[-2]`; on QuantizedKVCache's packed
// buffers that is the allocated row count (the capacity, a step of 256), not the tokens.
class KvLengthFromBufferCache final : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  std::int64_t kv_length() const override { return dynamic_cast<const QuantizedKVCache&>(*inner_).capacity(); }
};

// ---- (r) a state loader that trusts the file's counts (row 55) --------------------------

std::optional<DType> dtype_named(const std::string& s) {
  static const std::map<std::string, DType> names{{"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
                                                  {"U32", DType::u32}, {"I32", DType::i32}, {"U8", DType::u8}};
  const auto it = names.find(s);
  return it == names.end() ? std::nullopt : std::optional<DType>(it->second);
}

// mlx-swift-lm PR #451 territory: a loader that believes the header (length clamped to
// the file, tensor bytes read as far as the file goes and zero-filled after, layers
// counted from the class entries instead of checking kvlab.layers) and installs each
// layer into the live list as soon as it is built. It fails only where it cannot go on.
void lenient_load_into(const std::filesystem::path& path, Backend& be, std::vector<std::unique_ptr<Cache>>& layers) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  KVLAB_REQUIRE(bytes.size() >= 8, io, "cannot read ", path.string());
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  n = std::min<std::uint64_t>(n, bytes.size() - 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  KVLAB_REQUIRE(!header.is_discarded() && header.is_object(), corrupt, "unparsable header in ", path.string());
  const std::string data = bytes.substr(8 + n);
  std::map<std::size_t, CacheState> states;
  const auto layer_of = [](const std::string& key) -> std::optional<std::pair<std::size_t, std::string>> {
    if (key.rfind("L.", 0) != 0) return std::nullopt;
    const std::size_t dot = key.find('.', 2);
    if (dot == std::string::npos) return std::nullopt;
    return std::pair{static_cast<std::size_t>(std::stoul(key.substr(2, dot - 2))), key.substr(dot + 1)};
  };
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      for (const auto& [mk, mv] : entry.items()) {
        const auto l = layer_of(mk);
        if (!l || !mv.is_string()) continue;
        if (l->second == "class") states[l->first].class_name = mv.get<std::string>();
        else if (l->second.rfind("meta.", 0) == 0) states[l->first].meta[l->second.substr(5)] = mv.get<std::string>();
      }
      continue;
    }
    const auto l = layer_of(key);
    const auto dtype = entry.contains("dtype") ? dtype_named(entry["dtype"].get<std::string>()) : std::nullopt;
    if (!l || !dtype) continue;
    Shape shape;
    for (const auto& d : entry["shape"]) shape.push_back(d.get<std::int64_t>());
    Tensor t(*dtype, shape);
    const auto begin = std::min<std::size_t>(entry["data_offsets"][0].get<std::size_t>(), data.size());
    std::copy_n(data.data() + begin, std::min(t.nbytes(), data.size() - begin), reinterpret_cast<char*>(t.data()));
    states[l->first].tensors.emplace(l->second, std::move(t));
  }
  layers.resize(states.size());
  std::size_t i = 0;
  for (const auto& [index, state] : states) layers[i++] = cache_from_state(be, state);
}

// ---- (s) ChunkedKVCache ------------------------------------------------------------------

// mlx-lm#1673: maybe_trim_front compared keys.shape[2] (the step-padded capacity) with
// chunk_size and cut `capacity − chunk_size` rows, dropping live tokens whenever
// chunk_size < 256. Faithful as far as a valid state goes: start moves by the cut,
// at most to the offset.
void trim_front_on_capacity(std::unique_ptr<Cache>& c) {
  auto* ch = dynamic_cast<ChunkedKVCache*>(c.get());
  KVLAB_REQUIRE(ch != nullptr, misuse, "maybe_trim_front needs a ChunkedKVCache, got ", c->class_name());
  if (ch->capacity() <= ch->chunk_size()) return;
  const std::int64_t valid = ch->offset() - ch->start_position();
  const std::int64_t cut = std::min(ch->capacity() - ch->chunk_size(), valid);
  CacheState s = ch->state();
  for (auto& [name, t] : s.tensors) t = t.slice(2, cut, valid);
  s.meta["start_position"] = std::to_string(ch->start_position() + cut);
  c = ChunkedKVCache::from_state(c->backend(), s);
}

// docs/upstream-bugs.md §U4: ChunkedKVCache's meta_state has no offset and the state setter sets
// offset = keys.shape[2] (the stored rows), so a reload after a front trim puts the
// offset at the row count (300 → 260 with start 295 in the stand-in run).
std::unique_ptr<Cache> chunked_restore_offset_from_rows(Backend& be, const CacheState& s) {
  if (s.class_name != "ChunkedKVCache" || s.tensors.count("keys") == 0) return cache_from_state(be, s);
  CacheState inferred = s;
  inferred.meta["offset"] = std::to_string(s.tensors.at("keys").dim(2));
  return cache_from_state(be, inferred);
}

}  // namespace

std::vector<Mutant> attention_mutants() {
  std::vector<Mutant> out;
  const auto wrap_all = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    return std::make_unique<LiveOffsetsCache>(std::move(c));
  };
  out.push_back(mutant("i.offsets-alias-in-place", "mlx-lm#1097 / #1806 / vlm#966 (docs/upstream-bugs.md rows 1, 4, 5)",
                       {"Stateful.KVCache"}));
  out.back().hooks.wrap = wrap_all;
  out.back().hooks.attend = alias_attend;
  out.back().hooks.quantize_policy = unwrapping_policy;
  out.back().hooks.extract = unwrapping_extract;
  out.back().hooks.trim_front = unwrapping_trim_front;

  // gemma3n: the KV-shared layers read cache.offset after the producer layer's update.
  out.push_back(mutant("j.shared-layer-post-update-offset", "mlx-lm#1384 / #1396 (docs/upstream-bugs.md row 2)",
                       {"M5.PositionsArePreUpdateOffsets"}));
  out.back().hooks.attend_shared = [](Backend& be, const AttendResult& producer, const DTensor& q,
                                      const AttendOptions& o, const Cache& cache) {
    AttendResult late = producer;
    set_positions(be, late, per_row(cache.offsets(), q.shape.at(0)));
    return attend_shared(be, late, q, o);
  };

  out.push_back(mutant("k.quantized-gqa-mask-by-kv-head", "mlx-lm#1467 / vlm#1567 (docs/upstream-bugs.md rows 10, 11)",
                       {"R2.QuantizedBatchGqaPaddedMask"}));
  out.back().hooks.attend = gqa_mask_by_kv_head;

  // SuScaledRoPE / eager RoPE read a (B,) offset as one scalar: every row at row 0's.
  out.push_back(mutant("l1.rope-row0-offset", "mlx-lm#707 / vlm#1883 (docs/upstream-bugs.md rows 29, 31)", {"R1.RopeVectorOffsetsPerRow"}));
  out.back().hooks.rope = [](Backend& be, const DTensor& x, const RopeParams& p, const Offsets& off,
                             const DTensor& dst) {
    if (!off.per_row) return be.rope({x, p, off, dst});
    std::vector<std::int32_t> rows(static_cast<std::size_t>(off.per_row->numel()));
    be.download(*off.per_row, rows.data());
    be.rope({x, p, Offsets{rows.at(0), std::nullopt}, dst});
  };
  // Yarn/SuScaled RoPE scaled x[..., :dims] by mscale with a slice assignment, which
  // writes into the caller's array (the rope output itself is right).
  out.push_back(mutant("l2.rope-modifies-input", "mlx-lm#1003 (docs/upstream-bugs.md row 33)", {"R1.RopeVectorOffsetsPerRow"}));
  out.back().hooks.rope = [](Backend& be, const DTensor& x, const RopeParams& p, const Offsets& off,
                             const DTensor& dst) {
    be.rope({x, p, off, dst});
    Tensor in = be.download(x);
    const std::int64_t d = in.dim(-1);
    float* v = in.view().as<float>();
    for (std::int64_t i = 0; i < in.numel(); ++i)
      if (i % d < p.dims) v[i] *= 1.1f;  // mscale = 0.1·ln(factor) + 1 for a Yarn factor of e
    be.upload(x, in.data());
  };

  out.push_back(mutant("m.turboquant-l1-dense-basis", "vlm#973 (docs/upstream-bugs.md row 39)",
                       {"M7.TurboQuantPrefillSplitInvariant", "Stateful.TurboQuantKVCache"}));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    if (dynamic_cast<const TurboQuantKVCache*>(c.get()) == nullptr) return c;
    return std::make_unique<TurboL1DenseBasisCache>(std::move(c));
  };

  // maclocal-api#46: the QuantizedKVCache state setter never sets the offset; a restore
  // that takes it from the packed tensors instead of the meta accepts any disagreement.
  out.push_back(mutant("n.restore-offset-from-quantized-shapes", "maclocal-api#46 (docs/upstream-bugs.md row 54)",
                       {"R5.RestoreRejectsInconsistentOffset"}));
  out.back().hooks.restore = [](Backend& be, const CacheState& s) {
    if (s.class_name != "QuantizedKVCache" || s.tensors.count("keys.wq") == 0) return cache_from_state(be, s);
    CacheState inferred = s;
    inferred.meta["offset"] = std::to_string(s.tensors.at("keys.wq").dim(2));
    return cache_from_state(be, inferred);
  };

  out.push_back(mutant("o1.policy-layer0-only", "mlx-lm#477 / #495 (docs/upstream-bugs.md row 9)", {"R4.QuantizePolicyPerLayer"}));
  out.back().hooks.quantize_policy = policy_layer0_only;
  out.push_back(mutant("o2.policy-greater-than", "mlx-lm#477 / #495 (docs/upstream-bugs.md row 9)", {"R4.QuantizePolicyPerLayer"}));
  out.back().hooks.quantize_policy = policy_greater_than;

  out.push_back(mutant("p.quantized-kv-length-from-buffer", "vlm#1481 / #1483 (docs/upstream-bugs.md row 36)",
                       {"Stateful.QuantizedKVCache"}));
  out.back().hooks.wrap = [](std::unique_ptr<Cache> c) -> std::unique_ptr<Cache> {
    if (dynamic_cast<const QuantizedKVCache*>(c.get()) == nullptr) return c;
    return std::make_unique<KvLengthFromBufferCache>(std::move(c));
  };

  out.push_back(mutant("q.quantized-pv-drops-tail-columns", "mlx#4250 / #4251 (docs/upstream-bugs.md row 56)",
                       {"R3.QuantizedPvValueDims"}));
  out.back().hooks.attend = pv_drops_tail;

  out.push_back(mutant("r.state-loader-trusts-counts", "mlx-swift-lm PR #451 (docs/upstream-bugs.md row 55)",
                       {"R6.StateFileCorruptionIsAnError"}));
  out.back().hooks.load_into = lenient_load_into;

  out.push_back(mutant("s1.chunked-trim-on-capacity", "mlx-lm#1673 (docs/semantics.md §Chunked cache)", {"Stateful.ChunkedKVCache"}));
  out.back().hooks.trim_front = trim_front_on_capacity;
  out.push_back(mutant("s2.chunked-restore-offset-from-rows", "docs/upstream-bugs.md §U4", {"Stateful.ChunkedKVCache"}));
  out.back().hooks.restore = chunked_restore_offset_from_rows;
  return out;
}

}  // namespace kvlab::prop::zoo
