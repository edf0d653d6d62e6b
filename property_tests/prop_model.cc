#include "property_tests/prop_model.h"

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "cache/cache_script.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "harness/ops/ops.h"
#include "property_tests/repro_line.h"
#include "reference/affine_quantize.h"
#include "reference/rope.h"

namespace kvlab {
void showValue(const QuantSpec& s, std::ostream& os) { os << to_string(s); }
void showValue(CacheKind k, std::ostream& os) { os << cache_kind_info(k).class_name; }
}  // namespace kvlab

namespace kvlab::prop {

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<std::int64_t> range(std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> out;
  for (std::int64_t p = lo; p < hi; ++p) out.push_back(p);
  return out;
}

}  // namespace

float content(Stream s, std::int64_t b, std::int64_t pos, std::int64_t head, std::int64_t d) {
  std::uint64_t h = mix(static_cast<std::uint64_t>(s));
  for (const std::int64_t v : {b, pos, head, d}) h = mix(h ^ static_cast<std::uint64_t>(v));
  return static_cast<float>(static_cast<double>(h >> 40) / 16777216.0 * 2.0 - 1.0);
}

const char* kind_name(Kind k) { return cache_kind_info(k).class_name.data(); }

float Config::scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk))); }

std::ostream& operator<<(std::ostream& os, const Config& c) {
  os << kind_name(c.kind) << "{B=" << c.batch << " Hkv=" << c.kv_heads << " R=" << c.q_ratio << " Dk=" << c.dk
     << " Dv=" << c.dv << " rope=" << c.rope_dims << " window=" << c.window;
  if (c.kind == Kind::rotating) os << " max=" << c.max_size << " keep=" << c.keep;
  if (c.kind == Kind::chunked) os << " chunk=" << c.chunk_size;
  if (c.kind == Kind::turboquant) {
    os << " bits=" << c.tq_bits << " seed=" << c.tq_seed << " meaning=" << fractional_bits_name(c.tq_meaning);
    if (c.tq_key_bits) os << " key_bits=" << *c.tq_key_bits;
    if (c.tq_value_bits) os << " value_bits=" << *c.tq_value_bits;
  }
  if (c.kind == Kind::quantized || c.quantizable)
    os << " spec=" << to_string(c.spec) << " rounding=" << rounding_name(c.rounding);
  return os << "}";
}
void showValue(const Config& c, std::ostream& os) { os << c; }

bool real_dims() {
  const char* v = std::getenv("KVLAB_PROP_DIMS");
  return v != nullptr && std::string(v) == "real";
}

std::int64_t max_tokens(Kind k) { return k == Kind::turboquant ? 256 : 1000; }

// ---- model -----------------------------------------------------------------------

namespace {
// Rotating: the positions of `len` live rows in temporal order. Sinks [0, keep) stay;
// the rest is the newest run ending at offset (mlx-lm's _temporal_order;
// docs/semantics.md §Rotating cache).
std::vector<std::int64_t> rotating_positions(const Model& m, std::int64_t len) {
  if (len >= m.offset) return range(0, m.offset);
  std::vector<std::int64_t> out = range(0, m.cfg.keep);
  for (const std::int64_t p : range(m.offset - (len - m.cfg.keep), m.offset)) out.push_back(p);
  return out;
}
}  // namespace

std::vector<std::int64_t> Model::returned_positions(std::int64_t n) const {
  std::vector<std::int64_t> out = cfg.kind == Kind::rotating
                                      ? rotating_positions(*this, std::min(stored, cfg.max_size - 1))
                                      : range(cfg.kind == Kind::chunked ? start : 0, offset);
  for (const std::int64_t p : range(offset, offset + n)) out.push_back(p);
  return out;
}

std::vector<std::int64_t> Model::held_positions() const {
  return cfg.kind == Kind::rotating ? rotating_positions(*this, stored)
                                    : range(cfg.kind == Kind::chunked ? start : 0, offset);
}

void Model::append(std::int64_t n, bool roped_keys) {
  if (cfg.kind == Kind::rotating) {
    // S == 1: cut a post-chunk overhang to max, then grow until full (mlx-lm's
    // _update_in_place). S > 1: keep max-1 old rows and append (_update_concat). Both:
    // docs/semantics.md §Rotating cache.
    stored = n == 1 ? std::min(std::min(stored, cfg.max_size) + 1, cfg.max_size)
                    : std::min(stored, cfg.max_size - 1) + n;
  } else {
    stored = offset - start + n;
  }
  if (cfg.kind == Kind::turboquant && tq_first == 0) {  // the codecs are built now, once
    tq_first = n;
    tq_first_roped = roped_keys;
  }
  offset += n;
  roped.resize(idx(offset), roped_keys ? 1 : 0);
}

void Model::trim(std::int64_t n) {
  const std::int64_t removed = std::min(n, trim_limit());
  offset -= removed;
  stored -= removed;
  roped.resize(idx(offset));
}

void Model::trim_front() {
  if (offset - start <= cfg.chunk_size) return;
  start = offset - cfg.chunk_size;
  stored = cfg.chunk_size;
}

// ---- hooks -------------------------------------------------------------------------

Hooks production_hooks() {
  Hooks h;
  h.attend = [](Cache& c, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& o) {
    return attend(c, q, k, v, o);
  };
  h.restore = [](Backend& be, const CacheState& s) { return cache_from_state(be, s); };
  h.quantize_policy = maybe_quantize_kv_caches;
  h.extract = cache_script::extract_newest;
  h.wrap = [](std::unique_ptr<Cache> c) { return c; };
  h.attend_shared = [](Backend& be, const AttendResult& r, const DTensor& q, const AttendOptions& o, const Cache&) {
    return attend_shared(be, r, q, o);
  };
  h.rope = [](Backend& be, const DTensor& x, const RopeParams& p, const Offsets& o, const DTensor& out) {
    be.rope({x, p, o, out});
  };
  h.trim_front = [](std::unique_ptr<Cache>& c) {
    KVLAB_REQUIRE(c->maybe_trim_front(), misuse, "maybe_trim_front needs a ChunkedKVCache, got ", c->class_name());
  };
  h.load_into = [](const std::filesystem::path& path, Backend& be, std::vector<std::unique_ptr<Cache>>& layers) {
    LoadedCaches loaded = load_caches(path, be);  // builds new objects; throws before anything is replaced
    layers = std::move(loaded.layers);
  };
  return h;
}

// ---- Sut ---------------------------------------------------------------------------

std::unique_ptr<Cache> make_cache(Backend& be, const Config& c) {
  CacheSetup s;
  s.max_size = c.max_size;
  s.keep = c.keep;
  s.spec = c.spec;
  s.rounding = c.rounding;
  s.chunk = c.chunk_size;
  s.tq_bits = c.tq_bits;
  s.seed = c.tq_seed;
  s.tq_key_bits = c.tq_key_bits;
  s.tq_value_bits = c.tq_value_bits;
  s.tq_meaning = c.tq_meaning;
  return kvlab::make_cache(be, c.kind, s);
}

Sut::Sut(const Config& c, const Hooks& h)
    : owned_backend(make_prop_backend()), be(*owned_backend), cfg(c), hooks(h) {
  replace(make_cache(be, c));
}

AttendOptions attend_options(const Config& cfg) {
  AttendOptions o;
  o.rope.dims = cfg.rope_dims;
  o.attention.scale = cfg.scale();
  o.window = cfg.window;
  return o;
}

Tensor Sut::raw(Stream s, std::int64_t p0, std::int64_t n) {
  const std::int64_t heads = s == Stream::query ? cfg.q_heads() : cfg.kv_heads;
  const std::int64_t dim = s == Stream::value ? cfg.dv : cfg.dk;
  Tensor t(DType::f32, {cfg.batch, heads, n, dim});
  float* out = t.view().as<float>();
  for (std::int64_t b = 0; b < cfg.batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t d = 0; d < dim; ++d) *out++ = content(s, b, p0 + i, h, d);
  return t;
}

bool Sut::reference_backend() const { return prop_backend_name() == "reference"; }

Tensor Sut::backend_rope(const Tensor& x, std::int64_t p0) {
  const RopeParams rope = attend_options(cfg).rope;
  const std::vector<std::int32_t> offsets(idx(x.dim(0)), static_cast<std::int32_t>(p0));
  DTensor per_row = be.allocate(DType::i32, {x.dim(0)});
  be.upload(per_row, offsets.data());
  const DTensor in = be.upload(x);
  const DTensor out = be.allocate(x.dtype(), x.shape());
  be.rope({in, rope, Offsets{0, per_row}, out});
  Tensor got = be.download(out);
  const Tensor want = ref::rope(x, rope, static_cast<std::int32_t>(p0));
  const std::vector<double> budget = harness::ops::rope_budget(x, rope, offsets, want);
  const float *g = got.view().as<const float>(), *w = want.view().as<const float>();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double d = std::abs(static_cast<double>(g[i]) - static_cast<double>(w[i]));
    if (!(d <= budget[idx(i)]))
      RC_FAIL("backend RoPE at " + std::to_string(p0) + ": element " + std::to_string(i) + " of " +
              shape_str(x.shape()) + " is " + std::to_string(g[i]) + ", ref::rope " + std::to_string(w[i]) +
              ", beyond the rope op's budget " + std::to_string(budget[idx(i)]));
  }
  return got;
}

void Sut::attended_keys(std::int64_t p0, std::int64_t n, const Model& m) {
  if (cfg.rope_dims == 0 || reference_backend() || n == 0) return;
  const Tensor got = backend_rope(raw(Stream::key, p0, n), p0);
  row(1, p0 + n - 1, m);  // the memo reaches past p0 + n
  const std::int64_t dim = cfg.dk;
  const auto put = [&](std::vector<std::vector<float>>& memo, const Tensor& rows) {
    const float* src = rows.view().as<const float>();
    for (std::int64_t i = 0; i < n && p0 + i < static_cast<std::int64_t>(memo.size()); ++i)
      for (std::int64_t bh = 0; bh < cfg.batch * cfg.kv_heads; ++bh)
        std::copy_n(src + (bh * n + i) * dim, dim, memo[idx(p0 + i)].data() + bh * dim);
  };
  put(memo_[1], got);
  // TurboQuant: rows already round-tripped through the codecs were made from ref::rope's
  // rows; redo them from the backend's (the round trip stays the reference codec's).
  if (static_cast<std::int64_t>(memo_[4].size()) > p0 && turbo_[0]) put(memo_[4], turbo_roundtrip(*turbo_[0], got));
}

const float* Sut::row(int which, std::int64_t pos, const Model& m) {
  std::vector<std::vector<float>>& memo = memo_[which];
  const auto have = static_cast<std::int64_t>(memo.size());
  if (pos >= have) {
    // Fill [have, pos + 64) in one go; roped keys with one rope call at scalar offset
    // `have`, which is exactly attend's position have + t.
    const std::int64_t n = pos + 64 - have;
    const Stream s = which % 3 == 2 ? Stream::value : Stream::key;
    Tensor t;
    if (which < 3) {
      t = raw(s, have, n);
      if (which == 1) t = ref::rope(t, attend_options(cfg).rope, static_cast<std::int32_t>(have));
    } else {
      // From the plain rows (which may hold a backend's own RoPE, attended_keys).
      row(which - 3, have + n - 1, m);
      const std::int64_t dim = s == Stream::value ? cfg.dv : cfg.dk;
      t = Tensor(DType::f32, {cfg.batch, cfg.kv_heads, n, dim});
      float* dst = t.view().as<float>();
      for (std::int64_t bh = 0; bh < cfg.batch * cfg.kv_heads; ++bh)
        for (std::int64_t i = 0; i < n; ++i)
          std::copy_n(memo_[which - 3][idx(have + i)].data() + bh * dim, dim, dst + (bh * n + i) * dim);
    }
    if (which >= 3) {
      // The codecs come from the first update's tensor; encoding is per token row, so
      // each row's round trip does not depend on the rows around it.
      RC_ASSERT(m.tq_first > 0);
      std::optional<std::vector<TurboQuantCodec>>& codecs = turbo_[s == Stream::key ? 0 : 1];
      if (!codecs) {
        Model first_model = m;
        first_model.roped.assign(idx(m.tq_first), m.tq_first_roped ? 1 : 0);
        codecs = turbo_codecs(cfg, s == Stream::key, gather(s, range(0, m.tq_first), first_model, false));
      }
      t = turbo_roundtrip(*codecs, t);
    }
    const float* src = t.view().as<const float>();
    const std::int64_t heads = cfg.kv_heads, dim = s == Stream::value ? cfg.dv : cfg.dk;
    memo.resize(idx(have + n), std::vector<float>(idx(cfg.batch * heads * dim)));
    for (std::int64_t bh = 0; bh < cfg.batch * heads; ++bh)
      for (std::int64_t i = 0; i < n; ++i)
        std::copy_n(src + (bh * n + i) * dim, dim, memo[idx(have + i)].data() + bh * dim);
  }
  return memo[idx(pos)].data();
}

Tensor Sut::expected(Stream s, const std::vector<std::int64_t>& positions, const Model& m) {
  return gather(s, positions, m, cfg.kind == Kind::turboquant);
}

Tensor Sut::gather(Stream s, const std::vector<std::int64_t>& positions, const Model& m, bool coded) {
  const std::int64_t n = static_cast<std::int64_t>(positions.size());
  const std::int64_t heads = cfg.kv_heads, dim = s == Stream::value ? cfg.dv : cfg.dk;
  Tensor t(DType::f32, {cfg.batch, heads, n, dim});
  float* out = t.view().as<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t p = positions[idx(i)];
    const bool rot = s == Stream::key && cfg.rope_dims > 0 && p < static_cast<std::int64_t>(m.roped.size()) &&
                     m.roped[idx(p)] != 0;
    const int base = s == Stream::value ? 2 : rot ? 1 : 0;
    const float* src = row(coded ? base + 3 : base, p, m);
    for (std::int64_t bh = 0; bh < cfg.batch * heads; ++bh)
      std::copy_n(src + bh * dim, dim, out + (bh * n + i) * dim);
  }
  return t;
}

// ---- checks ------------------------------------------------------------------------

std::string first_difference(const Tensor& a, const Tensor& b, double tol) {
  std::ostringstream os;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    os << "shape/dtype " << shape_str(a.shape()) << " " << dtype_name(a.dtype()) << " vs " << shape_str(b.shape())
       << " " << dtype_name(b.dtype());
    return os.str();
  }
  if (a.nbytes() == 0) return {};  // empty blocks (a chunked cache trimmed to start) have no data pointer
  if (tol == 0.0 && std::memcmp(a.data(), b.data(), a.nbytes()) == 0) return {};
  if (a.dtype() == DType::f32) {  // fast path: raw floats
    const float *x = a.view().as<const float>(), *y = b.view().as<const float>();
    std::int64_t i = 0;
    for (; i < a.numel(); ++i) {
      const double d = std::abs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
      if (!(tol == 0.0 ? x[i] == y[i] : d <= tol)) break;
    }
    if (i == a.numel()) return {};
  }
  const bool is_float = a.dtype() == DType::f32 || a.dtype() == DType::f16 || a.dtype() == DType::bf16;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (is_float) {
      const double x = a.view().load(i), y = b.view().load(i);
      const bool same = tol == 0.0 ? (std::isnan(x) && std::isnan(y)) || x == y : std::abs(x - y) <= tol;
      if (!same) {
        os << "element " << i << " of " << shape_str(a.shape()) << ": " << x << " vs " << y;
        return os.str();
      }
    } else if (a.view().load_int(i) != b.view().load_int(i)) {
      os << "element " << i << " of " << shape_str(a.shape()) << ": " << a.view().load_int(i) << " vs "
         << b.view().load_int(i);
      return os.str();
    }
  }
  return {};
}

void expect_same(const Tensor& actual, const Tensor& expected, const std::string& what, double tol) {
  const std::string d = first_difference(actual, expected, tol);
  if (!d.empty()) RC_FAIL(what + ": " + d);
}

namespace {

void expect_quantized(Sut& sut, const Model& m, const FetchedQuantizedKV& f, const std::vector<std::int64_t>& pos,
                      const std::string& what) {
  for (const Stream s : {Stream::key, Stream::value}) {
    const QuantizedDTensor& q = s == Stream::key ? f.keys : f.values;
    const ref::QuantizedTensor e = ref::affine_quantize(sut.expected(s, pos, m), sut.cfg.spec, sut.cfg.rounding);
    const std::string n = what + (s == Stream::key ? " keys" : " values");
    expect_same(sut.be.download(q.wq), e.wq, n + " codes");
    expect_same(sut.be.download(q.scales), e.scales, n + " scales");
    expect_same(sut.be.download(q.biases), e.biases, n + " biases");
  }
}

}  // namespace

void check_poison(Backend& be, const DTensor& buffer, std::int64_t begin, const std::string& what) {
  const std::int64_t cap = buffer.shape.at(2);
  if (begin >= cap) return;
  const Tensor t = be.download(buffer);
  const std::int64_t outer = t.dim(0) * t.dim(1), w = t.dim(3);
  // Raw bit tests (this runs after every command): NaN for float dtypes, all ones for codes.
  const std::byte* data = t.data();
  const DType dtype = t.dtype();
  const auto poison = [data, dtype](std::int64_t i) {
    const auto at = static_cast<std::size_t>(i);
    switch (dtype) {
      case DType::f32: return std::isnan(reinterpret_cast<const float*>(data)[at]);
      case DType::f16: {
        const std::uint16_t x = reinterpret_cast<const std::uint16_t*>(data)[at];
        return (x & 0x7C00u) == 0x7C00u && (x & 0x03FFu) != 0;
      }
      case DType::bf16: {
        const std::uint16_t x = reinterpret_cast<const std::uint16_t*>(data)[at];
        return (x & 0x7F80u) == 0x7F80u && (x & 0x007Fu) != 0;
      }
      case DType::u32: return reinterpret_cast<const std::uint32_t*>(data)[at] == 0xFFFFFFFFu;
      default: return false;
    }
  };
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = (o * cap + begin) * w; i < (o + 1) * cap * w; ++i)
      if (!poison(i))
        RC_FAIL(what + ": unused row " + std::to_string(i / w % cap) + " of " + std::to_string(cap) +
                " is not poison (a stale or zero slot would be read silently)");
}

void check_observables(Sut& sut, const Model& m, bool content) {
  const Cache* c = sut.cache.get();
  RC_ASSERT(c->offsets() == std::vector<std::int32_t>{static_cast<std::int32_t>(m.offset)});
  if (c->is_quantized() != m.quantized)
    RC_FAIL(std::string("cache ") + std::string(c->class_name()) + (m.quantized ? " is not" : " is") +
            " quantized, the model says the opposite");
  const std::int64_t kv_len = m.cfg.kind == Kind::rotating ? std::min(m.stored, m.cfg.max_size)
                              : m.cfg.kind == Kind::chunked ? m.offset - m.start
                                                            : m.offset;
  if (c->kv_length() != kv_len)  // mlx-vlm#1481: one accessor, right for every kind
    RC_FAIL("kv_length() " + std::to_string(c->kv_length()) + ", the model says " + std::to_string(kv_len));
  RC_ASSERT(c->is_trimmable() == m.trimmable());
  // The class the model expects: to_quantized turns a KVCache into a QuantizedKVCache.
  // Wrappers (zoo) report their content and buffers through their serialized state.
  const CacheKindInfo& want = cache_kind_info(m.quantized ? Kind::quantized : m.cfg.kind);
  const std::string cls(want.class_name);
  if (c->class_name() != want.class_name)
    RC_FAIL("cache class " + std::string(c->class_name()) + ", the model says " + cls);
  if (want.kind == Kind::chunked) {
    const CacheState st = c->state();
    const auto it = st.meta.find("chunk_size");
    RC_ASSERT(it != st.meta.end() && it->second == std::to_string(m.cfg.chunk_size));
  }
  // Rows past those in use are poison; a ring that wrapped has none.
  const std::int64_t used = m.cfg.kind == Kind::rotating  ? m.stored
                            : m.cfg.kind == Kind::chunked ? m.offset - m.start
                                                          : m.offset;
  const std::vector<BackingBuffer> buffers = c->buffers();
  if (want.kind == Kind::kv && buffers.empty()) RC_ASSERT(m.offset == 0);
  for (const BackingBuffer& b : buffers) check_poison(sut.be, b.buffer, used, cls + " " + b.name);

  const std::vector<std::int64_t> held = m.held_positions();
  const std::vector<SequenceContent> stored = c->content();
  RC_ASSERT(stored.size() == 1u);
  if (want.quantized) RC_ASSERT(stored[0].spec == std::optional<QuantSpec>(sut.cfg.spec));
  if (std::vector<std::int64_t>(stored[0].positions.begin(), stored[0].positions.end()) != held)
    RC_FAIL(cls + " holds " + std::to_string(stored[0].positions.size()) + " positions, not the model's " +
            std::to_string(held.size()));
  if (held.empty()) return;
  if (want.quantized) {
    const SequenceContent& q = stored[0];
    const FetchedQuantizedKV f{{q.part("keys.wq"), q.part("keys.scales"), q.part("keys.biases"), sut.cfg.spec},
                               {q.part("values.wq"), q.part("values.scales"), q.part("values.biases"), sut.cfg.spec}};
    expect_quantized(sut, m, f, held, cls + " content");
    return;
  }
  if (want.packed && !content) return;  // TurboQuant: decoding is a full pass
  const SequenceContent plain = want.packed ? c->content(ContentForm::decoded).at(0) : stored[0];
  expect_same(sut.be.download(plain.part("keys")), sut.expected(Stream::key, held, m), cls + " content keys");
  expect_same(sut.be.download(plain.part("values")), sut.expected(Stream::value, held, m), cls + " content values");
}

void check_fetched(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, const FetchedKV* kv,
                   const FetchedQuantizedKV* qkv, bool order_free) {
  const auto n = static_cast<std::int64_t>(positions.size());
  if (qkv != nullptr) {
    RC_ASSERT(qkv->length() == n);
    expect_quantized(sut, after, *qkv, positions, "update_quantized result");
    return;
  }
  RC_ASSERT(kv != nullptr);
  RC_ASSERT(kv->length() == n);
  if (!order_free) {
    expect_same(sut.be.download(kv->keys), sut.expected(Stream::key, positions, after), "update keys");
    expect_same(sut.be.download(kv->values), sut.expected(Stream::value, positions, after), "update values");
    return;
  }
  // A single-token rotating update returns the ring in physical order
  // (docs/semantics.md §Rotating cache): compare the per-(b, h, d) sums over keys, which do not
  // depend on the order.
  for (const Stream s : {Stream::key, Stream::value}) {
    const Tensor a = sut.be.download(s == Stream::key ? kv->keys : kv->values);
    const Tensor e = sut.expected(s, positions, after);
    const std::int64_t bh = a.dim(0) * a.dim(1), dim = a.dim(3);
    for (std::int64_t r = 0; r < bh; ++r)
      for (std::int64_t d = 0; d < dim; ++d) {
        double sa = 0, se = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          sa += a.view().load((r * n + i) * dim + d);
          se += e.view().load((r * n + i) * dim + d);
        }
        if (!(std::abs(sa - se) <= 1e-3)) RC_FAIL("single-token rotating update returned other keys than the window");
      }
  }
}

Tensor oracle_attention(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, std::int64_t n) {
  const Config& c = sut.cfg;
  const auto lk = static_cast<std::int64_t>(positions.size());
  const std::int64_t p0 = positions.back() - n + 1;
  Tensor q = sut.raw(Stream::query, p0, n);
  if (c.rope_dims > 0) q = ref::rope(q, attend_options(c).rope, static_cast<std::int32_t>(p0));
  Tensor k = sut.expected(Stream::key, positions, after), v = sut.expected(Stream::value, positions, after);
  if (after.quantized) {
    k = ref::affine_dequantize(ref::affine_quantize(k, c.spec, c.rounding));
    v = ref::affine_dequantize(ref::affine_quantize(v, c.spec, c.rounding));
  }
  // The window, by index into the returned keys: the cache's own max_size for a ring
  // (its chunk mask: docs/semantics.md §Rotating cache), attend's window otherwise.
  std::int64_t w = c.window > 0 ? c.window : std::numeric_limits<std::int64_t>::max();
  if (c.kind == Kind::rotating && c.window == 0) w = c.max_size;
  // A ring with sinks gives each query of a chunk what decoding one token at a time would:
  // the sinks (the first keep returned keys) and the newest max_size − keep up to it.
  const bool sinks = c.kind == Kind::rotating && c.keep > 0 && c.window == 0 && n > 1 && lk > c.max_size;
  const auto seen = [&](std::int64_t j, std::int64_t i) { return !sinks || j < c.keep || i - j < c.max_size - c.keep; };
  Tensor out(DType::f32, {c.batch, c.q_heads(), n, c.dv});
  const float *qp = q.view().as<float>(), *kp = k.view().as<float>(), *vp = v.view().as<float>();
  float* op = out.view().as<float>();
  std::vector<double> p(idx(lk));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.q_heads(); ++h) {
      const std::int64_t kh = b * c.kv_heads + h / c.q_ratio;
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t i = lk - n + t;
        std::int64_t lo = sinks ? 0 : (w > i ? 0 : i - w + 1);
        if (c.kind == Kind::chunked) {
          // llama4: keys of the query's own chunk only; the returned keys are the
          // contiguous positions [start, offset + n), so index = position − positions[0].
          const std::int64_t q_pos = positions[idx(i)], first = q_pos / c.chunk_size * c.chunk_size;
          lo = std::max({std::int64_t{0}, first - positions.front(), w > q_pos ? 0 : q_pos - w + 1 - positions.front()});
        }
        const float* qr = qp + ((b * c.q_heads() + h) * n + t) * c.dk;
        double mx = -INFINITY, sum = 0;
        for (std::int64_t j = lo; j <= i; ++j) {
          if (!seen(j, i)) continue;
          double s = 0;
          for (std::int64_t d = 0; d < c.dk; ++d) s += static_cast<double>(qr[d]) * kp[(kh * lk + j) * c.dk + d];
          p[idx(j)] = s * static_cast<double>(c.scale());
          mx = std::max(mx, p[idx(j)]);
        }
        for (std::int64_t j = lo; j <= i; ++j)
          if (seen(j, i)) sum += (p[idx(j)] = std::exp(p[idx(j)] - mx));
        for (std::int64_t d = 0; d < c.dv; ++d) {
          double acc = 0;
          for (std::int64_t j = lo; j <= i; ++j)
            if (seen(j, i)) acc += p[idx(j)] * vp[(kh * lk + j) * c.dv + d];
          op[((b * c.q_heads() + h) * n + t) * c.dv + d] = static_cast<float>(acc / sum);
        }
      }
    }
  return out;
}

void check_attend(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, std::int64_t n,
                  const AttendResult& r) {
  const std::int64_t p0 = positions.back() - n + 1;
  RC_ASSERT(r.positions == std::vector<std::int32_t>(idx(sut.cfg.batch), static_cast<std::int32_t>(p0)));
  expect_same(sut.be.download(r.out), oracle_attention(sut, after, positions, n), "attend output vs oracle",
              after.quantized ? 1e-4 : 2e-5);
}

void check_same_state(const CacheState& a, const CacheState& b) {
  RC_ASSERT(a.class_name == b.class_name);
  RC_ASSERT(a.meta == b.meta);
  RC_ASSERT(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    const auto it = b.tensors.find(name);
    if (it == b.tensors.end()) RC_FAIL("state tensor " + name + " lost in the round trip");
    expect_same(t, it->second, "state tensor " + name);
  }
}

}  // namespace kvlab::prop
