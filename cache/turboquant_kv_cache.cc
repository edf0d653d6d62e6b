#include "cache/turboquant_kv_cache.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "cache/kv_cache.h"
#include "cache/seq_ops.h"
#include "reference/bitpack.h"
#include "reference/turboquant.h"

namespace kvlab {

namespace {

constexpr const char* kTurboQuant = "TurboQuantKVCache";

bool fractional(double bits) { return bits != std::floor(bits); }

void validate_bits(double bits, const char* what) {
  // Steps of 0.5 (mlx-vlm _validate_bits); the codec widths bound it to 1..8.
  KVLAB_REQUIRE(std::isfinite(bits) && bits >= 1.0 && bits <= 8.0 && std::floor(2.0 * bits) == 2.0 * bits,
                invalid_argument, kTurboQuant, " ", what, " = ", bits, " is not in [1, 8] in steps of 0.5");
}

// mlx-vlm _select_outlier_indices: round((b − ⌊b⌋)·D / (⌈b⌉ − ⌊b⌋)) clamped to [1, D−1].
// Python's round() ties to even, which is nearbyint's default rounding mode.
std::int64_t high_channel_count(double bits, std::int64_t dim) {
  const auto want = static_cast<std::int64_t>(std::nearbyint((bits - std::floor(bits)) * static_cast<double>(dim)));
  return std::clamp<std::int64_t>(want, 1, dim - 1);
}

// The `count` channels with the largest mean |x| over (B, H, S), ascending; ties in the
// score go to the higher index (stable order by (score, index)).
std::vector<std::int32_t> select_high_channels(Backend& be, const DTensor& x, std::int64_t count) {
  const Tensor t = be.download(x);
  const std::int64_t dim = t.dim(3), rows = t.numel() / dim;
  std::vector<double> score(static_cast<std::size_t>(dim), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < dim; ++d) score[static_cast<std::size_t>(d)] += std::abs(t.view().load(r * dim + d));
  std::vector<std::int32_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return score[static_cast<std::size_t>(a)] < score[static_cast<std::size_t>(b)];
  });
  std::vector<std::int32_t> high(order.end() - count, order.end());
  std::sort(high.begin(), high.end());
  return high;
}

// Fills side.parts with codecs for head dim `dim`; `high` is the split codec's outlier
// set (ignored for integer bits). Deterministic in (bits, seed, dim, high).
void build_codecs(TurboQuantSide& side, std::int64_t dim, const std::vector<std::int32_t>& high) {
  side.dim = dim;
  side.parts.clear();
  if (!fractional(side.bits)) {
    side.parts.push_back({ref::make_turboquant_codec(static_cast<int>(dim), static_cast<int>(side.bits), side.seed),
                          {}, {}});
    return;
  }
  std::vector<std::int32_t> low;
  for (std::int32_t d = 0; d < dim; ++d)
    if (!std::binary_search(high.begin(), high.end(), d)) low.push_back(d);
  TurboQuantPart lo{ref::make_turboquant_codec(static_cast<int>(low.size()), static_cast<int>(std::floor(side.bits)),
                                               side.seed),
                    {}, {}};
  TurboQuantPart hi{ref::make_turboquant_codec(static_cast<int>(high.size()), static_cast<int>(std::ceil(side.bits)),
                                               side.seed + TurboQuantKVCache::kSplitSeedOffset),
                    {}, {}};
  lo.codec.channels = std::move(low);
  hi.codec.channels = high;
  side.parts.push_back(std::move(lo));
  side.parts.push_back(std::move(hi));
}

std::int64_t words(const TurboQuantCodec& c) { return ref::packed_word_count(c.dim, c.bits); }

// Codes of x (B, H, S, D) for every part, in fresh tensors: (norms, indices) per part.
std::vector<std::pair<DTensor, DTensor>> encode_side(Backend& be, const TurboQuantSide& side, const DTensor& x) {
  std::vector<std::pair<DTensor, DTensor>> out;
  for (const TurboQuantPart& p : side.parts) {
    DTensor norms = be.allocate(DType::f16, {x.shape[0], x.shape[1], x.shape[2], 1});
    DTensor indices = be.allocate(DType::u32, {x.shape[0], x.shape[1], x.shape[2], words(p.codec)});
    be.turboquant_encode({x, p.codec, norms, indices});
    out.emplace_back(std::move(norms), std::move(indices));
  }
  return out;
}

// Rows [0, n) of a side dequantized into one (B, H, n, D) tensor; the parts' channel
// sets partition [0, D), so every element is written exactly once.
DTensor decode_side(Backend& be, const TurboQuantSide& side, std::int64_t n, DType dtype) {
  const DTensor& first = side.parts.front().norms;
  DTensor out = be.allocate(dtype, {seq::batch(first), seq::heads(first), n, side.dim});
  for (const TurboQuantPart& p : side.parts) {
    be.turboquant_decode({seq::slice(be, p.norms, 0, n), seq::slice(be, p.indices, 0, n), p.codec, out});
  }
  return out;
}

std::string join(const std::vector<std::int32_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string side_text(const TurboQuantSide& side, const char* name) {
  std::string s = cat(name, " ", side.bits, " b");
  if (fractional(side.bits)) {
    if (side.parts.empty()) return s + cat(" split (channels chosen on the first update; seeds ", side.seed, "/",
                                           side.seed + TurboQuantKVCache::kSplitSeedOffset, ")");
    const TurboQuantCodec &lo = side.parts[0].codec, &hi = side.parts[1].codec;
    return s + cat(" = ", hi.dim, " ch x ", hi.bits, " b (seed ", side.seed + TurboQuantKVCache::kSplitSeedOffset,
                   ") + ", lo.dim, " ch x ", lo.bits, " b (seed ", side.seed, ")");
  }
  return s + cat(" (seed ", side.seed, ")");
}

double side_bits(const TurboQuantSide& side, bool storage) {
  double total = 0;
  for (const TurboQuantPart& p : side.parts)
    total += storage ? static_cast<double>(words(p.codec) * 32 + 16) : static_cast<double>(p.codec.dim * p.codec.bits);
  return total;
}

}  // namespace

std::string_view fractional_bits_name(FractionalBits m) {
  switch (m) {
    case FractionalBits::split_channels: return "split_channels";
    case FractionalBits::k_floor_v_ceil: return "k_floor_v_ceil";
  }
  fail(ErrorKind::invalid_argument, cat("unknown FractionalBits ", static_cast<int>(m)));
}

FractionalBits fractional_bits_from_name(std::string_view name) {
  for (FractionalBits m : {FractionalBits::split_channels, FractionalBits::k_floor_v_ceil})
    if (fractional_bits_name(m) == name) return m;
  fail(ErrorKind::invalid_argument,
       cat("unknown fractional-bits meaning '", name, "' (expected split_channels or k_floor_v_ceil)"));
}

TurboQuantKVCache::TurboQuantKVCache(Backend& backend, double bits, std::uint64_t seed, std::optional<double> key_bits,
                                     std::optional<double> value_bits, FractionalBits meaning)
    : Cache(backend), bits_(bits), seed_(seed), meaning_(meaning) {
  validate_bits(bits, "bits");
  if (key_bits) validate_bits(*key_bits, "key_bits");
  if (value_bits) validate_bits(*value_bits, "value_bits");
  (void)fractional_bits_name(meaning);  // rejects an out-of-range enum value
  // mlx-vlm resolve_kv_bits only under k_floor_v_ceil; the split meaning keeps `bits`
  // on both sides and splits channels instead.
  const bool kv_split = meaning == FractionalBits::k_floor_v_ceil && fractional(bits);
  keys_.bits = key_bits.value_or(kv_split ? std::floor(bits) : bits);
  values_.bits = value_bits.value_or(kv_split ? std::ceil(bits) : bits);
  keys_.seed = seed;
  values_.seed = seed + kValueSeedOffset;
}

std::int64_t TurboQuantKVCache::capacity() const { return has_rows() ? seq::length(keys_.parts[0].norms) : 0; }

void TurboQuantKVCache::check_update(const DTensor& k, const DTensor& v) const {
  validate_kv_update(k, v, kTurboQuant);
  if (keys_.dim == 0) {
    for (const auto& [side, d, what] :
         {std::tuple{&keys_, k.shape[3], "keys"}, std::tuple{&values_, v.shape[3], "values"}}) {
      KVLAB_REQUIRE(!fractional(side->bits) || d >= 2, invalid_argument, kTurboQuant, " ", what, " head dim ", d,
                    " cannot be split for ", side->bits, " bits (needs D >= 2)");
      KVLAB_REQUIRE(d <= std::numeric_limits<std::int32_t>::max(), invalid_argument, kTurboQuant, " ", what, " head dim ", d,
                    " is too large");
    }
    return;
  }
  // Codecs are fixed by the first update: its dtype and head dims stay the cache's.
  KVLAB_REQUIRE(k.dtype == dtype_, dtype_mismatch, kTurboQuant, " holds ", dtype_name(dtype_),
                " (the dtype of its first keys) but the update is ", dtype_name(k.dtype));
  KVLAB_REQUIRE(k.shape[3] == keys_.dim && v.shape[3] == values_.dim, shape_mismatch, kTurboQuant,
                " codecs are built for (Dk, Dv) = (", keys_.dim, ", ", values_.dim, ") but the update has keys ",
                shape_str(k.shape), " and values ", shape_str(v.shape));
  if (has_rows()) {
    const DTensor& n = keys_.parts[0].norms;
    KVLAB_REQUIRE(k.shape[0] == seq::batch(n) && k.shape[1] == seq::heads(n), shape_mismatch, kTurboQuant,
                  " holds (B, H) = (", seq::batch(n), ", ", seq::heads(n), ") but the update has keys ",
                  shape_str(k.shape));
  }
}

void TurboQuantKVCache::reserve(std::int64_t s, std::int64_t b, std::int64_t h) {
  Backend& be = backend();
  const std::int64_t prev = offset_;
  if (has_rows() && prev + s <= capacity()) return;
  const std::int64_t grown = seq::grown_capacity(prev, has_rows() ? capacity() : 0, s, kStep);
  for (TurboQuantSide* side : {&keys_, &values_}) {
    for (TurboQuantPart& p : side->parts) {
      if (p.norms) {
        p.norms = seq::regrow(be, p.norms, prev, grown);
        p.indices = seq::regrow(be, p.indices, prev, grown);
      } else {
        p.norms = seq::alloc_poisoned(be, DType::f16, {b, h, grown, 1});
        p.indices = seq::alloc_poisoned(be, DType::u32, {b, h, grown, words(p.codec)});
      }
    }
  }
}

FetchedKV TurboQuantKVCache::update(const DTensor& k, const DTensor& v) {
  check_update(k, v);
  Backend& be = backend();
  // Build (first update) and encode into side copies first: an Error from a kernel
  // leaves the cache exactly as it was.
  TurboQuantSide keys = keys_, values = values_;
  for (auto& [side, x] : {std::pair{&keys, &k}, std::pair{&values, &v}}) {
    if (side->dim != 0) continue;
    const std::int64_t d = x->shape[3];
    build_codecs(*side, d,
                 fractional(side->bits) ? select_high_channels(be, *x, high_channel_count(side->bits, d))
                                        : std::vector<std::int32_t>{});
  }
  const auto codes_k = encode_side(be, keys, k);
  const auto codes_v = encode_side(be, values, v);
  if (keys_.dim == 0) dtype_ = k.dtype;
  keys_ = std::move(keys);
  values_ = std::move(values);
  reserve(k.shape[2], k.shape[0], k.shape[1]);
  for (auto& [side, codes] : {std::pair{&keys_, &codes_k}, std::pair{&values_, &codes_v}}) {
    for (std::size_t i = 0; i < side->parts.size(); ++i) {
      seq::write_rows(be, (*codes)[i].first, side->parts[i].norms, offset_);
      seq::write_rows(be, (*codes)[i].second, side->parts[i].indices, offset_);
    }
  }
  offset_ += k.shape[2];
  return fetch();
}

FetchedKV TurboQuantKVCache::fetch() const {
  if (!has_rows() || offset_ == 0) return {};
  return {decode_side(backend(), keys_, offset_, dtype_), decode_side(backend(), values_, offset_, dtype_)};
}

CacheMask TurboQuantKVCache::make_mask(std::int64_t n, int window) const {
  return KVCache(backend()).make_mask(n, window);  // docs/semantics.md §TurboQuant cache: the same as KVCache's
}

std::int64_t TurboQuantKVCache::trim(std::int64_t n) {
  KVLAB_REQUIRE(n >= 0, invalid_argument, kTurboQuant, " trim by ", n, " tokens");
  const std::int64_t removed = std::min(offset_, n);
  if (removed > 0) {
    // mlx-vlm only lowers the offset; here the stale codes become poison too.
    for (TurboQuantSide* side : {&keys_, &values_})
      for (TurboQuantPart& p : side->parts) {
        seq::poison_rows(backend(), p.norms, offset_ - removed, offset_);
        seq::poison_rows(backend(), p.indices, offset_ - removed, offset_);
      }
  }
  offset_ -= removed;
  return removed;
}

std::size_t TurboQuantKVCache::nbytes() const {
  std::size_t total = 0;
  for (const TurboQuantSide* side : {&keys_, &values_})
    for (const TurboQuantPart& p : side->parts)
      if (p.norms) total += p.norms.nbytes() + p.indices.nbytes();
  return total;
}

std::string TurboQuantKVCache::describe() const {
  const bool kv = meaning_ == FractionalBits::k_floor_v_ceil;
  return cat(kTurboQuant, " ", bits_, " bits, meaning ", fractional_bits_name(meaning_),
             kv ? " (mlx-vlm resolve_kv_bits: K floor, V ceil)" : " (paper/kvquant: outlier-channel split per side)",
             ": ", side_text(keys_, "keys"), ", ", side_text(values_, "values"));
}

double TurboQuantKVCache::bits_per_element(KVSide side) const {
  KVLAB_REQUIRE(keys_.dim > 0, misuse, kTurboQuant, " bits_per_element() needs the head dims: call update() first");
  const double k = side_bits(keys_, true), v = side_bits(values_, true);
  const auto dk = static_cast<double>(keys_.dim), dv = static_cast<double>(values_.dim);
  return side == KVSide::keys ? k / dk : side == KVSide::values ? v / dv : (k + v) / (dk + dv);
}

double TurboQuantKVCache::code_bits_per_element(KVSide side) const {
  KVLAB_REQUIRE(keys_.dim > 0, misuse, kTurboQuant, " code_bits_per_element() needs the head dims: call update() first");
  const double k = side_bits(keys_, false), v = side_bits(values_, false);
  const auto dk = static_cast<double>(keys_.dim), dv = static_cast<double>(values_.dim);
  return side == KVSide::keys ? k / dk : side == KVSide::values ? v / dv : (k + v) / (dk + dv);
}

// ---- state ------------------------------------------------------------------------------

namespace {

const char* kSideNames[2] = {"keys", "values"};

// Tensor names of one side's parts: "keys" / "keys.low" / "keys.high".
std::vector<std::string> part_prefixes(const TurboQuantSide& side, const std::string& name) {
  if (!fractional(side.bits)) return {name};
  return {name + ".low", name + ".high"};
}

template <class T>
T meta_number(const CacheState& st, const std::string& field) {
  const std::string& text = meta_field(st, kTurboQuant, field);
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  KVLAB_REQUIRE(!text.empty() && ec == std::errc() && end == text.data() + text.size(), corrupt, kTurboQuant,
                " state field '", field, "' = '", text, "' is not a number");
  return value;
}

double meta_bits(const CacheState& st, const std::string& field) {
  const auto bits = meta_number<double>(st, field);
  try {
    validate_bits(bits, field.c_str());
  } catch (const Error& e) {
    fail(ErrorKind::corrupt, cat(kTurboQuant, " state field '", field, "': ", e.what()));
  }
  return bits;
}

std::vector<std::int32_t> meta_channels(const CacheState& st, const std::string& field, std::int64_t dim,
                                        std::int64_t count) {
  const std::string& text = meta_field(st, kTurboQuant, field);
  std::vector<std::int32_t> out;
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    std::int32_t ch = -1;
    const auto [end, ec] = std::from_chars(text.data() + pos, text.data() + comma, ch);
    KVLAB_REQUIRE(ec == std::errc() && end == text.data() + comma && ch >= 0 && ch < dim &&
                      (out.empty() || ch > out.back()),
                  corrupt, kTurboQuant, " state field '", field, "' = '", text, "': '", text.substr(pos, comma - pos),
                  "' is not an ascending channel in [0, ", dim, ")");
    out.push_back(ch);
    pos = comma + 1;
  }
  KVLAB_REQUIRE(static_cast<std::int64_t>(out.size()) == count, corrupt, kTurboQuant, " state field '", field, "' lists ",
                out.size(), " channels but the split needs ", count, " of D = ", dim);
  return out;
}

const Tensor& state_tensor(const CacheState& st, const std::string& name) {
  const auto it = st.tensors.find(name);
  KVLAB_REQUIRE(it != st.tensors.end(), corrupt, kTurboQuant, " state has no tensor '", name, "'");
  return it->second;
}

// Checks one part's rows against its codec, the offset and (B, H) of the first part.
void load_part(Backend& be, const CacheState& st, const std::string& prefix, TurboQuantPart& part,
               std::int64_t offset, Shape& bh) {
  const Tensor& norms = state_tensor(st, prefix + ".norms");
  const Tensor& indices = state_tensor(st, prefix + ".indices");
  KVLAB_REQUIRE(norms.dtype() == DType::f16 && indices.dtype() == DType::u32, corrupt, kTurboQuant, " state tensors '",
                prefix, ".norms' / '", prefix, ".indices' are ", dtype_name(norms.dtype()), " / ",
                dtype_name(indices.dtype()), ", expected f16 / u32");
  KVLAB_REQUIRE(norms.rank() == 4 && indices.rank() == 4, corrupt, kTurboQuant, " state tensors '", prefix,
                ".*' have shapes ", shape_str(norms.shape()), " / ", shape_str(indices.shape()),
                ", expected (B, H, L, W)");
  if (bh.empty()) bh = {norms.dim(0), norms.dim(1)};
  const std::int64_t w = words(part.codec);
  const Shape want_n{bh[0], bh[1], offset, 1}, want_i{bh[0], bh[1], offset, w};
  KVLAB_REQUIRE(norms.shape() == want_n, corrupt, kTurboQuant, " state tensor '", prefix, ".norms' has shape ",
                shape_str(norms.shape()), ", expected ", shape_str(want_n), " ('offset' ", offset, ")");
  KVLAB_REQUIRE(indices.shape() == want_i, corrupt, kTurboQuant, " state tensor '", prefix, ".indices' has shape ",
                shape_str(indices.shape()), ", expected ", shape_str(want_i), " (", part.codec.dim, " channels x ",
                part.codec.bits, " b)");
  part.norms = be.upload(norms);
  part.indices = be.upload(indices);
}

}  // namespace

CacheState TurboQuantKVCache::state() const {
  CacheState s{std::string(class_name()),
               {},
               {{"offset", std::to_string(offset_)},
                {"bits", cat(bits_)},
                {"key_bits", cat(keys_.bits)},
                {"value_bits", cat(values_.bits)},
                {"seed", std::to_string(seed_)},
                {"meaning", std::string(fractional_bits_name(meaning_))}}};
  if (keys_.dim == 0) return s;  // no codecs yet: the next update builds them
  s.meta.emplace("key_dim", std::to_string(keys_.dim));
  s.meta.emplace("value_dim", std::to_string(values_.dim));
  s.meta.emplace("dtype", std::string(dtype_name(dtype_)));
  const TurboQuantSide* sides[2] = {&keys_, &values_};
  for (int i = 0; i < 2; ++i) {
    const TurboQuantSide& side = *sides[i];
    const std::string name = kSideNames[i];
    // The outlier choice depends on the first tensor seen; without it a split cache
    // could not be rebuilt (docs/upstream-bugs.md §U16).
    if (fractional(side.bits)) s.meta.emplace(name + ".high_channels", join(side.parts[1].codec.channels));
    if (offset_ == 0) continue;
    const auto prefixes = part_prefixes(side, name);
    for (std::size_t p = 0; p < side.parts.size(); ++p) {
      s.tensors.emplace(prefixes[p] + ".norms",
                        backend().download(seq::slice(backend(), side.parts[p].norms, 0, offset_)));
      s.tensors.emplace(prefixes[p] + ".indices",
                        backend().download(seq::slice(backend(), side.parts[p].indices, 0, offset_)));
    }
  }
  return s;
}

std::unique_ptr<TurboQuantKVCache> TurboQuantKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == kTurboQuant, corrupt, "state of class '", state.class_name, "' cannot be loaded as a ",
                kTurboQuant);
  const auto offset = meta_number<std::int64_t>(state, "offset");
  KVLAB_REQUIRE(offset >= 0, corrupt, kTurboQuant, " state field 'offset' = ", offset, " is negative");
  const double bits = meta_bits(state, "bits"), kb = meta_bits(state, "key_bits"), vb = meta_bits(state, "value_bits");
  const auto seed = meta_number<std::uint64_t>(state, "seed");
  FractionalBits meaning{};
  try {
    meaning = fractional_bits_from_name(meta_field(state, kTurboQuant, "meaning"));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::corrupt) throw;
    fail(ErrorKind::corrupt, cat(kTurboQuant, " state field 'meaning': ", e.what()));
  }
  auto cache = std::make_unique<TurboQuantKVCache>(backend, bits, seed, kb, vb, meaning);
  const bool built = state.meta.count("key_dim") != 0;
  std::vector<std::string> expected;
  if (built) {
    const auto dtype_text = meta_field(state, kTurboQuant, "dtype");
    try {
      cache->dtype_ = dtype_from_name(dtype_text);
    } catch (const Error& e) {
      fail(ErrorKind::corrupt, cat(kTurboQuant, " state field 'dtype': ", e.what()));
    }
    KVLAB_REQUIRE(is_float(cache->dtype_), corrupt, kTurboQuant, " state field 'dtype' = '", dtype_text,
                  "' is not a float dtype");
    TurboQuantSide* sides[2] = {&cache->keys_, &cache->values_};
    for (int i = 0; i < 2; ++i) {
      TurboQuantSide& side = *sides[i];
      const std::string name = kSideNames[i], dim_field = i == 0 ? "key_dim" : "value_dim";
      const auto dim = meta_number<std::int64_t>(state, dim_field);
      const std::int64_t min_dim = fractional(side.bits) ? 2 : 1;
      KVLAB_REQUIRE(dim >= min_dim && dim <= std::numeric_limits<std::int32_t>::max(), corrupt, kTurboQuant,
                    " state field '", dim_field, "' = ", dim, " is out of range for ", side.bits, " bits");
      // The codecs are a function of (bits, seed, dim, outlier channels): rebuilt exactly.
      build_codecs(side, dim,
                   fractional(side.bits)
                       ? meta_channels(state, name + ".high_channels", dim, high_channel_count(side.bits, dim))
                       : std::vector<std::int32_t>{});
      for (const std::string& prefix : part_prefixes(side, name)) {
        expected.push_back(prefix + ".norms");
        expected.push_back(prefix + ".indices");
      }
    }
  } else {
    KVLAB_REQUIRE(offset == 0, corrupt, kTurboQuant, " state 'offset' is ", offset, " but it has no 'key_dim'");
  }
  for (const auto& [name, tensor] : state.tensors) {
    KVLAB_REQUIRE(offset > 0 && std::find(expected.begin(), expected.end(), name) != expected.end(), corrupt, kTurboQuant,
                  " state has an unexpected tensor '", name, "' (offset ", offset, ")");
  }
  if (offset == 0) return cache;
  Shape bh;
  for (int i = 0; i < 2; ++i) {
    TurboQuantSide& side = i == 0 ? cache->keys_ : cache->values_;
    const auto prefixes = part_prefixes(side, kSideNames[i]);
    for (std::size_t p = 0; p < side.parts.size(); ++p)
      load_part(backend, state, prefixes[p], side.parts[p], offset, bh);
  }
  cache->offset_ = offset;  // capacity == offset, as a KVCache adopting its state
  return cache;
}

std::vector<SequenceContent> TurboQuantKVCache::content(ContentForm form) const {
  if (form == ContentForm::decoded) return {newest_content(offset_, offset_, plain_parts(fetch()))};
  std::vector<ContentPart> parts;
  for (const BackingBuffer& b : buffers()) {
    parts.push_back({b.name, offset_ > 0 ? seq::slice(backend(), b.buffer, 0, offset_) : DTensor{}});
  }
  return {newest_content(offset_, offset_, std::move(parts))};
}

std::vector<BackingBuffer> TurboQuantKVCache::buffers() const {
  std::vector<BackingBuffer> out;
  if (!has_rows()) return out;
  for (const auto& [side, name] : {std::pair{&keys_, "keys"}, std::pair{&values_, "values"}}) {
    const auto prefixes = part_prefixes(*side, name);
    for (std::size_t p = 0; p < side->parts.size(); ++p) {
      out.push_back({prefixes[p] + ".norms", side->parts[p].norms, offset_});
      out.push_back({prefixes[p] + ".indices", side->parts[p].indices, offset_});
    }
  }
  return out;
}

}  // namespace kvlab
