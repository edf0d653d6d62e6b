// Running a script of the cache command language over a cache, and reading its content
// (cache/cache_script.h); the grammar and the plans are in cache_script.cc.
#include <algorithm>
#include <cstring>
#include <optional>

#include "cache/batch_cache.h"
#include "cache/cache_script.h"
#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "kvlab/error.h"

namespace kvlab::cache_script {
// ---- running ------------------------------------------------------------------------------

namespace {

std::unique_ptr<Cache> make_cache(Backend& be, const CacheSetup& s, std::int64_t rows) {
  return kvlab::make_cache(be, s.kind, with_rows(s, rows));
}

// Rows [row, row + numel/D) of a flat (rows, D) tensor, seen as `shape`.
DTensor rows_of(const DTensor& flat, std::int64_t row, Shape shape) {
  const std::size_t row_bytes = static_cast<std::size_t>(flat.shape.at(1)) * dtype_size(flat.dtype);
  return DTensor{flat.buffer, flat.offset + static_cast<std::size_t>(row) * row_bytes, flat.dtype, std::move(shape)};
}

// The prefix commands' state: the store, the main cache's token log and the id table
// (downloaded once, on the first `w`).
class PrefixRun {
 public:
  PrefixRun(Backend& be, const CacheSetup& s, const DTensor& k, const DTensor& v) : be_(be), s_(s), k_(k), v_(v) {}

  // Tokens `ids` through update() alone, each its row block of the table.
  void write(Cache& cache, const std::vector<std::int32_t>& ids) {
    if (!loaded_) {
      kt_ = be_.download(k_), vt_ = be_.download(v_);
      loaded_ = true;
    }
    const auto n = static_cast<std::int64_t>(ids.size());
    const std::size_t row = static_cast<std::size_t>(s_.dim) * dtype_size(s_.dtype);
    Tensor kb(s_.dtype, {1, s_.hkv, n, s_.dim}), vb(s_.dtype, {1, s_.hkv, n, s_.dim});
    for (std::int64_t h = 0; h < s_.hkv; ++h)
      for (std::int64_t j = 0; j < n; ++j) {
        const auto from = static_cast<std::size_t>(ids[static_cast<std::size_t>(j)] * s_.hkv + h) * row;
        const auto to = static_cast<std::size_t>(h * n + j) * row;
        std::memcpy(kb.data() + to, kt_.data() + from, row);
        std::memcpy(vb.data() + to, vt_.data() + from, row);
      }
    if (cache.is_quantized()) {
      cache.update_quantized(be_.upload(kb), be_.upload(vb));
    } else {
      cache.update(be_.upload(kb), be_.upload(vb));
    }
    log_.insert(log_.end(), ids.begin(), ids.end());
  }
  void insert(std::unique_ptr<Cache>& cache) {
    KVLAB_REQUIRE(!log_.empty(), invalid_argument, "command 'i' inserts a cache that holds no token yet");
    LayerCaches layers;
    layers.push_back(std::move(cache));
    try {
      (void)store_.insert(kModel, CacheFormat::of(layers), log_, layers);
    } catch (...) {
      cache = std::move(layers[0]);
      throw;
    }
    cache = std::move(layers[0]);
  }
  // The best stored match for `ids`, or an empty cache.
  std::unique_ptr<Cache> get(const Cache& cache, const std::vector<std::int32_t>& ids) {
    PrefixFetch got = store_.fetch(kModel, CacheFormat({CacheFormat::layer(cache)}), ids);
    log_.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(got.reused));
    if (got.kind == MatchKind::miss) return make_cache(be_, s_, 1);
    return std::move(got.caches.at(0));
  }
  void trimmed(std::int64_t n) { log_.resize(log_.size() - std::min(log_.size(), static_cast<std::size_t>(n))); }

 private:
  static constexpr const char* kModel = "script";
  Backend& be_;
  const CacheSetup& s_;
  const DTensor &k_, &v_;
  bool loaded_ = false;
  Tensor kt_, vt_;
  std::vector<std::int32_t> log_;
  PrefixCache store_;
};

// The batch rebuilt from its rows: each extracted, then merged by the class's merge.
std::unique_ptr<Cache> merged_rows(Backend& be, Cache& cache) {
  const BatchCache& batch = batch_verbs(cache, "merge");
  const CacheKindInfo* kind = kind_of(cache);
  KVLAB_REQUIRE(kind != nullptr, misuse, "merge of a ", cache.class_name(), ", which the catalogue does not list");
  std::vector<std::unique_ptr<Cache>> rows;
  std::vector<const Cache*> ptrs;
  for (std::int64_t i = 0; i < batch.batch_size(); ++i) {
    rows.push_back(batch.extract_sequence(i));
    ptrs.push_back(rows.back().get());
  }
  return merge_caches(be, kind->kind, ptrs);
}

}  // namespace

std::unique_ptr<Cache> run_script(Backend& be, const CacheSetup& setup, const Script& script, const DTensor& q,
                                  const DTensor& k, const DTensor& v, Observer& observer) {
  const Plan plan = plan_script(setup, script);
  KVLAB_REQUIRE(q.shape == (Shape{plan.q_rows, setup.dim}) && k.shape == (Shape{plan.kv_rows, setup.dim}) &&
                    v.shape == k.shape,
                internal, "cache script inputs q ", shape_str(q.shape), ", k ", shape_str(k.shape),
                " do not fit its plan");
  const AttendOptions options = attend_options(setup);
  std::unique_ptr<Cache> cache = make_cache(be, setup, setup.batch);
  std::size_t next = 0;
  std::optional<AttendResult> producer;
  PrefixRun prefix(be, setup, k, v);
  auto attend_step = [&](Cache& target) {
    const Step& st = plan.steps.at(next++);
    target.maybe_trim_front();  // llama4's order
    const DTensor qs = rows_of(q, st.q_row, {st.batch, setup.hq, st.tokens, setup.dim});
    const DTensor ks = rows_of(k, st.kv_row, {st.batch, setup.hkv, st.tokens, setup.dim});
    const DTensor vs = rows_of(v, st.kv_row, {st.batch, setup.hkv, st.tokens, setup.dim});
    AttendResult r = attend(target, qs, ks, vs, options);
    observer.attention(st, qs, r, r.out);
    return r;
  };
  for (const Command& c : script) {
    switch (c.verb) {
      case Verb::chunk: producer = attend_step(*cache); break;
      case Verb::decode:
        for (std::int64_t i = 0; i + 1 < c.n; ++i) {
          producer = attend_step(*cache);
          observer.after_command(*cache);
        }
        producer = attend_step(*cache);
        break;
      case Verb::update: {
        const Step& st = plan.steps.at(next++);
        cache->maybe_trim_front();  // as before an attention
        const DTensor ks = rows_of(k, st.kv_row, {st.batch, setup.hkv, st.tokens, setup.dim});
        const DTensor vs = rows_of(v, st.kv_row, {st.batch, setup.hkv, st.tokens, setup.dim});
        if (cache->is_quantized()) {
          cache->update_quantized(ks, vs);
        } else {
          cache->update(ks, vs);
        }
        observer.stored(st);
        break;
      }
      case Verb::trim:
        if (cache->is_trimmable()) prefix.trimmed(cache->trim(c.n));
        break;
      case Verb::write_ids:
        prefix.write(*cache, c.ids);
        observer.stored(plan.steps.at(next++));
        break;
      case Verb::insert: prefix.insert(cache); break;
      case Verb::merge: cache = merged_rows(be, *cache); break;
      case Verb::get: cache = prefix.get(*cache, c.ids); break;
      case Verb::shared: {
        const Step& st = plan.steps.at(next++);
        const DTensor qs = rows_of(q, st.q_row, {st.batch, setup.hq, st.tokens, setup.dim});
        const DTensor out = attend_shared(be, *producer, qs, options);
        observer.attention(st, qs, *producer, out);
        break;
      }
      case Verb::right_chunk:
        prepare_right(batch_verbs(*cache, "prepare"),
                      right_padding_rule(setup, static_cast<std::int64_t>(cache->offsets().size())), c.n);
        producer = attend_step(*cache);
        break;
      case Verb::reload: cache = cache_from_state(be, cache->state()); break;
      case Verb::finalize: batch_verbs(*cache, "finalize").finalize(); break;
      case Verb::filter: batch_verbs(*cache, "filter").filter(c.keep); break;
      case Verb::extend: {
        std::unique_ptr<Cache> other = make_cache(be, setup, c.rows);
        attend_step(*other);
        batch_verbs(*cache, "extend").extend(*other);
        break;
      }
      case Verb::quantize: {
        std::unique_ptr<Cache> quantized = cache->quantized_form(setup.spec, Rounding::mlx_cpu);
        KVLAB_REQUIRE(quantized != nullptr, invalid_argument, "command 'q' needs a KVCache, not ", cache->class_name());
        cache = std::move(quantized);
        break;
      }
      case Verb::policy: {
        std::vector<std::unique_ptr<Cache>> layers;
        layers.push_back(std::move(cache));
        try {
          (void)maybe_quantize_kv_caches(layers, setup.spec, Rounding::mlx_cpu, c.n);
        } catch (...) {
          cache = std::move(layers[0]);  // the policy replaces nothing when it throws
          throw;
        }
        cache = std::move(layers[0]);
        break;
      }
      case Verb::extract: cache = extract_newest(be, *cache); break;
      case Verb::trim_front: (void)cache->maybe_trim_front(); break;
    }
    observer.after_command(*cache);
  }
  return cache;
}

std::unique_ptr<Cache> extract_newest(Backend& be, const Cache& cache) {
  KVLAB_REQUIRE(is_kind(cache, Kind::rotating), misuse, "extract needs a RotatingKVCache, got ", cache.class_name());
  // The temporal rows from content(), the window from the state's metadata.
  const SequenceContent held = cache.content().at(0);
  const CacheState state = cache.state();
  const std::int64_t max_size = std::stoll(state.meta.at("max_size")), offset = cache.offsets().at(0);
  const FetchedKV t{held.part("keys"), held.part("values")};
  const std::int64_t len = t.length(), keep_rows = std::min(offset, max_size);
  const Tensor k = be.download(t.keys), v = be.download(t.values);
  return std::make_unique<RotatingKVCache>(be, max_size, be.upload(k.slice(2, len - keep_rows, len)),
                                           be.upload(v.slice(2, len - keep_rows, len)), offset);
}

// ---- content ----------------------------------------------------------------------------

namespace {

// Appends the (b, H, L, W) blocks' rows into one (N, W) host tensor.
class Rows {
 public:
  Rows(std::string name, DType dtype, std::int64_t width) : name_(std::move(name)), dtype_(dtype), width_(width) {}
  void add(const Tensor& block) {
    const auto* p = block.data();
    bytes_.insert(bytes_.end(), p, p + block.nbytes());
  }
  void add(Backend& be, const DTensor& block) {
    if (block && block.numel() > 0) add(be.download(block));
  }
  const std::string& name() const { return name_; }
  Component done() const {
    const std::int64_t row_bytes = width_ * static_cast<std::int64_t>(dtype_size(dtype_));
    Tensor t(dtype_, {static_cast<std::int64_t>(bytes_.size()) / row_bytes, width_});
    if (!bytes_.empty()) std::memcpy(t.data(), bytes_.data(), bytes_.size());
    return {name_, std::move(t)};
  }

 private:
  std::string name_;
  DType dtype_;
  std::int64_t width_;
  std::vector<std::byte> bytes_;
};

std::vector<Rows> packed_rows(const CacheSetup& s) {
  std::vector<Rows> out;
  for (const char* side : {"keys", "values"}) {
    const std::string n(side);
    if (s.kind == Kind::turboquant) {
      out.emplace_back(n + ".norms", DType::f16, 1);
      out.emplace_back(n + ".indices", DType::u32, (s.dim * static_cast<std::int64_t>(s.tq_bits) + 31) / 32);
      continue;
    }
    out.emplace_back(n + ".wq", DType::u32, s.spec.packed_words(s.dim));
    out.emplace_back(n + ".scales", s.spec.scale_dtype(s.dtype), s.spec.groups(s.dim));
    if (s.spec.has_biases()) out.emplace_back(n + ".biases", s.dtype, s.spec.groups(s.dim));
  }
  return out;
}

}  // namespace

std::vector<Component> cache_content(const Cache& cache, const CacheSetup& s) {
  Backend& be = cache.backend();
  // The components come from the setup, so an empty cache still has every (0, W) one.
  std::vector<Rows> rows;
  if (is_packed(s.kind) || s.quantizes) {
    rows = packed_rows(s);
  } else {
    rows = {Rows("keys", s.dtype, s.dim), Rows("values", s.dtype, s.dim)};
  }
  if (!cache.empty()) {
    for (const SequenceContent& seq : cache.content()) {
      for (const ContentPart& part : seq.parts) {
        for (Rows& r : rows)
          if (r.name() == part.name) r.add(be, part.rows);
      }
    }
  }
  std::vector<Component> out;
  for (const Rows& r : rows) out.push_back(r.done());
  return out;
}

}  // namespace kvlab::cache_script
