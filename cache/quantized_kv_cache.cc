#include "cache/quantized_kv_cache.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "cache/catalogue.h"
#include "cache/rotating_kv_cache.h"
#include "cache/seq_ops.h"

namespace kvlab {

namespace {

constexpr const char* kQuantized = "QuantizedKVCache";

// Applies f to every component of a packed block (codes, scales, biases if any) and
// collects the results: slicing, regrowing and downloading treat the parts alike.
template <class F>
QuantizedDTensor map_parts(const QuantizedDTensor& q, F&& f) {
  QuantizedDTensor out;
  out.wq = f(q.wq);
  out.scales = f(q.scales);
  if (q.biases) out.biases = f(q.biases);
  out.spec = q.spec;
  return out;
}

template <class F>
void for_parts(const QuantizedDTensor& q, F&& f) {
  f(q.wq);
  f(q.scales);
  if (q.biases) f(q.biases);
}

void write_parts(Backend& be, const QuantizedDTensor& src, const QuantizedDTensor& dst, std::int64_t at) {
  seq::write_rows(be, src.wq, dst.wq, at);
  seq::write_rows(be, src.scales, dst.scales, at);
  if (src.biases) seq::write_rows(be, src.biases, dst.biases, at);
}

std::size_t parts_nbytes(const QuantizedDTensor& q) {
  if (!q.wq) return 0;  // an unallocated DTensor has shape () and would count one element
  return q.wq.nbytes() + q.scales.nbytes() + (q.biases ? q.biases.nbytes() : 0);
}

// The head dim a packed block stands for: groups · group_size.
std::int64_t head_dim(const QuantizedDTensor& q) { return seq::width(q.scales) * q.spec.group_size; }

// ---- from_state helpers: every failure is `corrupt` and names the field ------------

const Tensor& state_tensor(const CacheState& st, const std::string& name) {
  const auto it = st.tensors.find(name);
  KVLAB_REQUIRE(it != st.tensors.end(), corrupt, kQuantized, " state has no tensor '", name, "'");
  return it->second;
}

// Checks one side ("keys" / "values") against the QuantSpec and the offset, then uploads it.
QuantizedDTensor load_side(Backend& be, const CacheState& st, const std::string& side, const QuantSpec& spec,
                           std::int64_t offset) {
  const Tensor& wq = state_tensor(st, side + ".wq");
  const Tensor& scales = state_tensor(st, side + ".scales");
  for (const auto& [t, name] : {std::pair{&wq, ".wq"}, std::pair{&scales, ".scales"}}) {
    KVLAB_REQUIRE(t->rank() == 4, corrupt, kQuantized, " state tensor '", side, name, "' has shape ", shape_str(t->shape()),
                  ", expected (B, H, L, W)");
  }
  KVLAB_REQUIRE(wq.dtype() == DType::u32, corrupt, kQuantized, " state tensor '", side, ".wq' is ", dtype_name(wq.dtype()),
                ", expected u32 codes");
  const bool float_scales = spec.has_biases();
  KVLAB_REQUIRE(float_scales ? is_float(scales.dtype()) : scales.dtype() == DType::u8, corrupt, kQuantized,
                " state tensor '", side, ".scales' is ", dtype_name(scales.dtype()), ", expected ",
                float_scales ? "a float dtype" : "u8", " for ", to_string(spec));
  // The offset comes from meta and must equal the stored rows; it is never inferred
  // from the quantized shapes (maclocal-api#46).
  KVLAB_REQUIRE(wq.dim(2) == offset, corrupt, kQuantized, " state tensor '", side, ".wq' holds ", wq.dim(2),
                " rows but 'offset' is ", offset);
  KVLAB_REQUIRE(scales.dim(0) == wq.dim(0) && scales.dim(1) == wq.dim(1) && scales.dim(2) == wq.dim(2), corrupt,
                kQuantized, " state tensor '", side, ".scales' has shape ", shape_str(scales.shape()), " but '", side,
                ".wq' has ", shape_str(wq.shape()));
  const std::int64_t groups = scales.dim(3);
  KVLAB_REQUIRE(groups >= 1, corrupt, kQuantized, " state tensor '", side, ".scales' has no groups");
  const std::int64_t d = groups * spec.group_size;
  KVLAB_REQUIRE(wq.dim(3) == spec.packed_words(d), corrupt, kQuantized, " state tensor '", side, ".wq' has ", wq.dim(3),
                " words per row, but ", groups, " groups of ", spec.group_size, " (D = ", d, ") at ", spec.bits,
                " bits need D·bits/32 = ", spec.packed_words(d));
  QuantizedDTensor q;
  q.spec = spec;
  q.wq = be.upload(wq);
  q.scales = be.upload(scales);
  if (spec.has_biases()) {
    const Tensor& biases = state_tensor(st, side + ".biases");
    KVLAB_REQUIRE(biases.shape() == scales.shape() && biases.dtype() == scales.dtype(), corrupt, kQuantized,
                  " state tensor '", side, ".biases' is ", dtype_name(biases.dtype()), shape_str(biases.shape()),
                  " but '", side, ".scales' is ", dtype_name(scales.dtype()), shape_str(scales.shape()));
    q.biases = be.upload(biases);
  }
  return q;
}

// One side handed to the adopting constructor: the parts a cache of `spec` stores, with
// consistent shapes. `side` names it ("keys" / "values") in every message.
void check_adopted_side(const QuantizedDTensor& q, const QuantSpec& spec, const char* side) {
  KVLAB_REQUIRE(q.spec == spec, invalid_argument, kQuantized, " adopts ", side, " packed as ", to_string(q.spec),
                " into a ", to_string(spec), " cache");
  KVLAB_REQUIRE(q.wq && q.scales, invalid_argument, kQuantized, " adopts ", side, " without ", q.wq ? "scales" : "codes");
  KVLAB_REQUIRE(static_cast<bool>(q.biases) == spec.has_biases(), invalid_argument, kQuantized, " adopts ", side,
                spec.has_biases() ? " without the biases " : " with biases, which ", to_string(spec),
                spec.has_biases() ? " needs" : " does not have");
  seq::require_block(q.wq, "adopted codes");
  seq::require_block(q.scales, "adopted scales");
  KVLAB_REQUIRE(q.wq.dtype == DType::u32, dtype_mismatch, kQuantized, " adopts ", side, ".wq of dtype ",
                dtype_name(q.wq.dtype), ", expected u32 codes");
  KVLAB_REQUIRE(spec.has_biases() ? is_float(q.scales.dtype) : q.scales.dtype == DType::u8, dtype_mismatch, kQuantized,
                " adopts ", side, ".scales of dtype ", dtype_name(q.scales.dtype), ", expected ",
                spec.has_biases() ? "a float dtype" : "u8", " for ", to_string(spec));
  const Shape& w = q.wq.shape;
  const Shape& g = q.scales.shape;
  KVLAB_REQUIRE(g[0] == w[0] && g[1] == w[1] && g[2] == w[2] && g[3] >= 1, shape_mismatch, kQuantized, " adopts ", side,
                ".scales ", shape_str(g), " that do not match ", side, ".wq ", shape_str(w));
  const std::int64_t d = g[3] * spec.group_size;
  KVLAB_REQUIRE(w[3] == spec.packed_words(d), shape_mismatch, kQuantized, " adopts ", side, ".wq with ", w[3],
                " words per row, but ", g[3], " groups of ", spec.group_size, " (D = ", d, ") at ", spec.bits,
                " bits need D·bits/32 = ", spec.packed_words(d));
  if (spec.has_biases())
    KVLAB_REQUIRE(q.biases.dtype == q.scales.dtype && q.biases.shape == g, shape_mismatch, kQuantized, " adopts ", side,
                  ".biases ", dtype_name(q.biases.dtype), shape_str(q.biases.shape), " unlike its scales ",
                  dtype_name(q.scales.dtype), shape_str(g));
}

}  // namespace

QuantizedKVCache::QuantizedKVCache(Backend& backend, QuantSpec spec, Rounding rounding)
    : Cache(backend), spec_(spec), rounding_(rounding) {
  spec_.validate();
}

QuantizedKVCache::QuantizedKVCache(Backend& backend, QuantSpec spec, Rounding rounding, QuantizedDTensor keys,
                                   QuantizedDTensor values, std::int64_t offset)
    : QuantizedKVCache(backend, spec, rounding) {
  check_adopted_side(keys, spec_, "keys");
  check_adopted_side(values, spec_, "values");
  const Shape &k = keys.wq.shape, &v = values.wq.shape;
  KVLAB_REQUIRE(k[0] == v[0] && k[1] == v[1] && k[2] == v[2], shape_mismatch, kQuantized, " adopts keys ", shape_str(k),
                " and values ", shape_str(v), " that disagree on (B, H, L)");
  KVLAB_REQUIRE(keys.scales.dtype == values.scales.dtype, dtype_mismatch, kQuantized, " adopts keys.scales of dtype ",
                dtype_name(keys.scales.dtype), " and values.scales of dtype ", dtype_name(values.scales.dtype));
  KVLAB_REQUIRE(offset >= 1 && offset <= k[2] && offset <= std::numeric_limits<std::int32_t>::max(),
                invalid_argument, kQuantized, " adopted offset = ", offset, " must be in [1, L = ", k[2], "]");
  const std::int64_t capacity = k[2];
  keys_ = std::move(keys);
  values_ = std::move(values);
  offset_ = offset;
  // Rows past the offset are capacity: poison, as after a trim.
  if (offset_ < capacity) {
    const auto poison = [&](const DTensor& t) { seq::poison_rows(backend, t, offset_, capacity); };
    for_parts(keys_, poison);
    for_parts(values_, poison);
  }
}

void QuantizedKVCache::check_update(const DTensor& k, const DTensor& v) const {
  validate_kv_update(k, v, kQuantized);
  for (const auto& [d, what] :
       {std::pair{k.shape[3], "keys head dim Dk"}, std::pair{v.shape[3], "values head dim Dv"}}) {
    KVLAB_REQUIRE(d > 0 && d % spec_.group_size == 0, invalid_argument, kQuantized, " ", what, " = ", d,
                  " is not a positive multiple of group_size ", spec_.group_size, " (", to_string(spec_), ")");
  }
  if (!keys_.wq) return;
  // Scales/biases take the dtype of the first keys (mlx-lm); later chunks must match
  // rather than be cast silently. fp modes store u8 scales, so any float input fits.
  KVLAB_REQUIRE(!spec_.has_biases() || k.dtype == keys_.scales.dtype, dtype_mismatch, kQuantized, " holds ",
                dtype_name(keys_.scales.dtype), " scales (the dtype of its first keys) but the update is ",
                dtype_name(k.dtype));
  const std::int64_t dk = head_dim(keys_), dv = head_dim(values_);
  KVLAB_REQUIRE(k.shape[0] == seq::batch(keys_.wq) && k.shape[1] == seq::heads(keys_.wq) && k.shape[3] == dk &&
                    v.shape[3] == dv,
                shape_mismatch, kQuantized, " holds (B, H, Dk, Dv) = (", seq::batch(keys_.wq), ", ", seq::heads(keys_.wq),
                ", ", dk, ", ", dv, ") but the update has keys ", shape_str(k.shape), " and values ",
                shape_str(v.shape));
}

QuantizedDTensor quantize_rows(Backend& be, const DTensor& x, const QuantSpec& spec, Rounding rounding) {
  const std::int64_t b = x.shape.at(0), h = x.shape.at(1), s = x.shape.at(2), d = x.shape.at(3);
  QuantizedDTensor q;
  q.spec = spec;
  q.wq = be.allocate(DType::u32, {b, h, s, spec.packed_words(d)});
  q.scales = be.allocate(spec.scale_dtype(x.dtype), {b, h, s, spec.groups(d)});
  if (spec.has_biases()) q.biases = be.allocate(q.scales.dtype, q.scales.shape);
  be.quantize({x, rounding, q});
  return q;
}

void QuantizedKVCache::reserve(const QuantizedDTensor& qk, const QuantizedDTensor& qv, std::int64_t s,
                               std::int64_t exact_capacity) {
  Backend& be = backend();
  const std::int64_t prev = offset_;
  if (keys_.wq && prev + s <= capacity()) return;
  if (keys_.wq) {
    // The KVCache growth rule (docs/semantics.md §Common rules), applied to each of the three
    // arrays.
    const std::int64_t grown = seq::grown_capacity(prev, capacity(), s, kStep);
    const auto regrow = [&](const DTensor& t) { return seq::regrow(be, t, prev, grown); };
    keys_ = map_parts(keys_, regrow);
    values_ = map_parts(values_, regrow);
    return;
  }
  const std::int64_t rows = exact_capacity > 0 ? exact_capacity : seq::grown_capacity(0, 0, s, kStep);
  const auto fresh = [&](const DTensor& t) {
    return seq::alloc_poisoned(be, t.dtype, {seq::batch(t), seq::heads(t), rows, seq::width(t)});
  };
  keys_ = map_parts(qk, fresh);
  values_ = map_parts(qv, fresh);
}

void QuantizedKVCache::store(const QuantizedDTensor& qk, const QuantizedDTensor& qv) {
  write_parts(backend(), qk, keys_, offset_);
  write_parts(backend(), qv, values_, offset_);
  offset_ += seq::length(qk.wq);
}

FetchedQuantizedKV QuantizedKVCache::update_quantized(const DTensor& k, const DTensor& v) {
  check_update(k, v);
  // Quantize into fresh tensors before touching the buffers, so a kernel that rejects
  // its input leaves the cache as it was.
  const QuantizedDTensor qk = quantize_rows(backend(), k, spec_, rounding_), qv = quantize_rows(backend(), v, spec_, rounding_);
  reserve(qk, qv, seq::length(k), 0);
  store(qk, qv);
  return fetch();
}

std::vector<SequenceContent> QuantizedKVCache::content(ContentForm) const {
  FetchedQuantizedKV kv = fetch();
  kv.keys.spec = kv.values.spec = spec_;  // an empty fetch still names the packing
  SequenceContent c = newest_content(offset_, offset_, packed_parts(kv));
  c.spec = spec_;
  return {std::move(c)};
}

std::vector<BackingBuffer> QuantizedKVCache::buffers() const {
  if (!keys_.wq) return {};
  std::vector<BackingBuffer> out;
  for (ContentPart& p : packed_parts({keys_, values_})) out.push_back({std::move(p.name), std::move(p.rows), offset_});
  return out;
}

FetchedQuantizedKV QuantizedKVCache::fetch() const {
  if (!keys_.wq) return {};
  const auto live = [&](const DTensor& t) { return seq::slice(backend(), t, 0, offset_); };
  return {map_parts(keys_, live), map_parts(values_, live)};
}

CacheMask QuantizedKVCache::make_mask(std::int64_t n, int window) const {
  // Same rule as KVCache (docs/semantics.md §Quantized cache); the mask does not depend on the
  // buffers, so a bufferless KVCache states it once for both.
  return KVCache(backend()).make_mask(n, window);
}

std::int64_t QuantizedKVCache::trim(std::int64_t n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, kQuantized, " trim by ", n, " tokens");
  const std::int64_t removed = std::min(offset_, n);
  if (removed > 0) {
    const auto poison = [&](const DTensor& t) { seq::poison_rows(backend(), t, offset_ - removed, offset_); };
    for_parts(keys_, poison);
    for_parts(values_, poison);
  }
  offset_ -= removed;
  return removed;
}

std::size_t QuantizedKVCache::nbytes() const { return parts_nbytes(keys_) + parts_nbytes(values_); }

CacheState QuantizedKVCache::state() const {
  CacheState s{std::string(class_name()),
               {},
               {{"offset", std::to_string(offset_)},
                {"bits", std::to_string(spec_.bits)},
                {"group_size", std::to_string(spec_.group_size)},
                {"mode", std::string(quant_mode_name(spec_.mode))},
                {"rounding", std::string(rounding_name(rounding_))}}};
  if (offset_ == 0) return s;  // nothing stored: the next update starts afresh
  const FetchedQuantizedKV kv = fetch();
  for (const auto& [side, q] : {std::pair{"keys", &kv.keys}, std::pair{"values", &kv.values}}) {
    const std::string prefix(side);
    s.tensors.emplace(prefix + ".wq", backend().download(q->wq));
    s.tensors.emplace(prefix + ".scales", backend().download(q->scales));
    if (q->biases) s.tensors.emplace(prefix + ".biases", backend().download(q->biases));
  }
  return s;
}

std::unique_ptr<QuantizedKVCache> QuantizedKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == kQuantized, corrupt, "state of class '", state.class_name,
                "' cannot be loaded as a ", kQuantized);
  const std::int64_t offset = meta_integer(state, kQuantized, "offset");
  const std::int64_t bits = meta_integer(state, kQuantized, "bits"), group = meta_integer(state, kQuantized, "group_size");
  const QuantMode mode = meta_enum(state, kQuantized, "mode", quant_mode_from_name);
  const Rounding rounding = meta_enum(state, kQuantized, "rounding", rounding_from_name);
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  KVLAB_REQUIRE(bits <= kIntMax && group <= kIntMax, corrupt, kQuantized, " state fields 'bits' = ", bits,
                " / 'group_size' = ", group, " are out of range");
  const QuantSpec spec{mode, static_cast<int>(bits), static_cast<int>(group)};
  try {
    spec.validate();
  } catch (const Error& e) {
    fail(ErrorKind::corrupt, cat(kQuantized, " state fields 'mode'/'bits'/'group_size': ", e.what()));
  }
  auto cache = std::make_unique<QuantizedKVCache>(backend, spec, rounding);
  std::vector<std::string> expected;
  for (const char* side : {"keys", "values"})
    for (const char* part : {".wq", ".scales", ".biases"})
      if (spec.has_biases() || std::string_view(part) != ".biases") expected.push_back(std::string(side) + part);
  for (const auto& [name, tensor] : state.tensors) {
    KVLAB_REQUIRE(std::find(expected.begin(), expected.end(), name) != expected.end(), corrupt, kQuantized,
                  " state has an unexpected tensor '", name, "' for ", to_string(spec));
  }
  if (state.tensors.empty()) {
    KVLAB_REQUIRE(offset == 0, corrupt, kQuantized, " state 'offset' is ", offset, " but it stores no tensors");
    return cache;
  }
  KVLAB_REQUIRE(offset > 0, corrupt, kQuantized, " state 'offset' is 0 but it stores tensors");
  QuantizedDTensor keys = load_side(backend, state, "keys", spec, offset);
  QuantizedDTensor values = load_side(backend, state, "values", spec, offset);
  KVLAB_REQUIRE(seq::batch(keys.wq) == seq::batch(values.wq) && seq::heads(keys.wq) == seq::heads(values.wq) &&
                    keys.scales.dtype == values.scales.dtype,
                corrupt, kQuantized, " state tensors 'keys.scales' ", dtype_name(keys.scales.dtype),
                shape_str(keys.scales.shape), " and 'values.scales' ", dtype_name(values.scales.dtype),
                shape_str(values.scales.shape), " disagree on B, H or dtype");
  cache->keys_ = std::move(keys);
  cache->values_ = std::move(values);
  cache->offset_ = offset;
  return cache;
}

std::unique_ptr<Cache> KVCache::quantized_form(const QuantSpec& spec, Rounding rounding) const {
  return to_quantized(*this, spec, rounding);
}

std::string QuantizedKVCache::parameters() const { return cat(to_string(spec_), " ", rounding_name(rounding_)); }

std::unique_ptr<QuantizedKVCache> to_quantized(const KVCache& cache, const QuantSpec& spec, Rounding rounding) {
  auto q = std::make_unique<QuantizedKVCache>(cache.backend(), spec, rounding);
  if (cache.offset() == 0) return q;
  // Only the live rows [0, offset) are quantized; mlx-lm quantizes the whole buffer,
  // zero rows past the offset included. The capacity is kept, so nbytes() still
  // matches mlx-lm's; the rows past the offset are poison here.
  const FetchedKV live = cache.fetch();
  q->check_update(live.keys, live.values);
  const QuantizedDTensor qk = quantize_rows(q->backend(), live.keys, q->spec(), q->rounding());
  const QuantizedDTensor qv = quantize_rows(q->backend(), live.values, q->spec(), q->rounding());
  q->reserve(qk, qv, cache.offset(), cache.capacity());
  q->store(qk, qv);
  return q;
}

std::vector<QuantizeDecision> maybe_quantize_kv_caches(std::vector<std::unique_ptr<Cache>>& layers,
                                                       const QuantSpec& spec, Rounding rounding,
                                                       std::int64_t quantized_kv_start) {
  spec.validate();
  KVLAB_REQUIRE(quantized_kv_start >= 0, invalid_argument, "quantized_kv_start ", quantized_kv_start,
                " is negative");
  std::vector<QuantizeDecision> report;
  std::vector<std::pair<std::size_t, std::unique_ptr<Cache>>> converted;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Cache* c = layers[i].get();
    if (c == nullptr) {
      report.push_back({i, "skipped", "empty layer slot"});
    } else if (is_kind(*c, CacheKind::kv)) {
      // mlx-lm#495: every layer decides on its own offset, with >= (before it: layer 0
      // only, and >, which broke hybrid models, mlx-lm#477).
      const std::int64_t offset = c->offsets().at(0);
      std::unique_ptr<Cache> q = offset >= quantized_kv_start ? c->quantized_form(spec, rounding) : nullptr;
      if (offset >= quantized_kv_start && q == nullptr) {
        // A stand-in reporting the class (a test's wrapper) but not converting.
        report.push_back({i, "skipped", cat(c->class_name(), " has no quantized form")});
      } else if (q != nullptr) {
        converted.emplace_back(i, std::move(q));
        report.push_back({i, "quantized",
                          cat("KVCache offset ", offset, " >= quantized_kv_start ", quantized_kv_start, " -> ",
                              to_string(spec))});
      } else {
        report.push_back(
            {i, "below-start", cat("KVCache offset ", offset, " < quantized_kv_start ", quantized_kv_start)});
      }
    } else if (c->is_quantized()) {
      report.push_back({i, "already-quantized", cat(c->class_name(), " already stores quantized data")});
    } else if (is_kind(*c, CacheKind::rotating)) {
      // mlx-lm's RotatingKVCache.to_quantized raises NotImplementedError and
      // maybe_quantize_kv_cache calls it on every layer: --kv-bits crashes sliding-window
      // models mid-generation (mlx-lm#1573, #1583). The ring stays plain and is reported.
      report.push_back({i, "kept-unquantized",
                        "RotatingKVCache has no quantized form; kept plain instead of raising mid-generation "
                        "(mlx-lm#1573)"});
    } else {
      report.push_back({i, "skipped", cat(c->class_name(), " has no quantized form")});
    }
  }
  // Replaced only after every conversion succeeded: an Error above changes no layer.
  for (auto& [i, q] : converted) layers[i] = std::move(q);
  return report;
}

}  // namespace kvlab
