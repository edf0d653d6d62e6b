#include "cache/batch_quantized_kv_cache.h"

#include <limits>
#include <string>

#include "cache/seq_ops.h"

namespace kvlab {

namespace {

constexpr const char* kBatchQuantized = "BatchQuantizedKVCache";

// Component order: keys parts then values parts; biases only for affine. The names are
// QuantizedKVCache's state tensor names, so one row's state reads the same in both.
std::vector<std::string> component_names(const QuantSpec& spec) {
  std::vector<std::string> names;
  for (const char* side : {"keys", "values"})
    for (const char* part : {".wq", ".scales", ".biases"})
      if (spec.has_biases() || std::string_view(part) != ".biases") names.push_back(std::string(side) + part);
  return names;
}

const QuantSpec& validated(const QuantSpec& spec) {
  spec.validate();
  return spec;
}

// One side's stored components (wq, scales[, biases]) must describe D = groups·group_size
// features packed at spec.bits: the same checks QuantizedKVCache::from_state makes.
void check_side(const QuantSpec& spec, const std::vector<std::string>& names, const std::vector<DTensor>& c,
                std::size_t first) {
  const DTensor &wq = c[first], &scales = c[first + 1];
  const std::string side = names[first].substr(0, names[first].find('.'));
  KVLAB_REQUIRE(wq.dtype == DType::u32, corrupt, kBatchQuantized, " state '", names[first], "' is ", dtype_name(wq.dtype),
                ", expected u32 codes");
  KVLAB_REQUIRE(spec.has_biases() ? is_float(scales.dtype) : scales.dtype == DType::u8, corrupt, kBatchQuantized, " state '",
                names[first + 1], "' has dtype ", dtype_name(scales.dtype), " for ", to_string(spec));
  KVLAB_REQUIRE(seq::heads(wq) == seq::heads(scales) && seq::width(scales) >= 1 &&
                    seq::width(wq) * 32 == seq::width(scales) * spec.group_size * spec.bits,
                corrupt, kBatchQuantized, " state '", side, "' codes ", shape_str(wq.shape), " and scales ",
                shape_str(scales.shape), " do not fit ", to_string(spec));
  if (spec.has_biases()) {
    const DTensor& biases = c[first + 2];
    KVLAB_REQUIRE(biases.dtype == scales.dtype && biases.shape == scales.shape, corrupt, kBatchQuantized, " state '",
                  names[first + 2], "' ", dtype_name(biases.dtype), shape_str(biases.shape),
                  " differs from its scales ", dtype_name(scales.dtype), shape_str(scales.shape));
  }
}

}  // namespace

BatchQuantizedKVCache::BatchQuantizedKVCache(Backend& backend, std::vector<std::int32_t> left_padding, QuantSpec spec,
                                             Rounding rounding)
    : Cache(backend),
      spec_(validated(spec)),
      rounding_(rounding),
      layout_(backend, kBatchQuantized, component_names(spec), std::move(left_padding)) {}

BatchQuantizedKVCache::BatchQuantizedKVCache(Backend& backend, BatchLayout layout, QuantSpec spec, Rounding rounding)
    : Cache(backend), spec_(spec), rounding_(rounding), layout_(std::move(layout)) {}

std::vector<DTensor> BatchQuantizedKVCache::components_of(const QuantizedDTensor& k, const QuantizedDTensor& v) {
  std::vector<DTensor> out;
  for (const QuantizedDTensor* q : {&k, &v}) {
    out.push_back(q->wq);
    out.push_back(q->scales);
    if (q->spec.has_biases()) out.push_back(q->biases);
  }
  return out;
}

FetchedQuantizedKV BatchQuantizedKVCache::packed(const std::vector<DTensor>& c) const {
  if (c.empty()) return {};
  const std::size_t per_side = spec_.has_biases() ? 3 : 2;
  const auto side = [&](std::size_t first) {
    return QuantizedDTensor{c[first], c[first + 1], spec_.has_biases() ? c[first + 2] : DTensor{}, spec_};
  };
  return {side(0), side(per_side)};
}

QuantizedDTensor BatchQuantizedKVCache::quantize(const DTensor& x) const {
  return quantize_rows(backend(), x, spec_, rounding_);
}

FetchedQuantizedKV BatchQuantizedKVCache::update_quantized(const DTensor& k, const DTensor& v) {
  validate_kv_update(k, v, kBatchQuantized);
  spec_.validate_dim(k.shape[3]);
  spec_.validate_dim(v.shape[3]);
  // Quantizing first writes only fresh tensors; the layout validates the packed chunk
  // against what it holds (B, H, widths, scale dtype) before it changes anything.
  layout_.append(components_of(quantize(k), quantize(v)));
  return fetch();
}

FetchedQuantizedKV BatchQuantizedKVCache::fetch() const { return packed(layout_.fetch()); }
QuantizedDTensor BatchQuantizedKVCache::key_buffer() const { return packed(layout_.components()).keys; }
QuantizedDTensor BatchQuantizedKVCache::value_buffer() const { return packed(layout_.components()).values; }

void BatchQuantizedKVCache::extend(const BatchQuantizedKVCache& other) {
  // Codes of another spec have other widths or meanings; another rounding would mix two
  // quantizers in one cache (docs/quantization.md §Rounding flavours). Either is an Error before
  // anything moves.
  KVLAB_REQUIRE(spec_ == other.spec_ && rounding_ == other.rounding_, invalid_argument, kBatchQuantized, " cannot extend a ",
                to_string(spec_), " / ", rounding_name(rounding_), " cache with a ", to_string(other.spec_), " / ",
                rounding_name(other.rounding_), " one");
  layout_.extend(other.layout_);
}

std::unique_ptr<QuantizedKVCache> BatchQuantizedKVCache::extract(std::int64_t i) const {
  std::vector<DTensor> row = layout_.extract_row(i);
  if (row.empty()) return std::make_unique<QuantizedKVCache>(backend(), spec_, rounding_);
  // The row's packed blocks are fresh copies: adopted as they are, never re-quantized.
  const std::int64_t length = seq::length(row[0]);
  FetchedQuantizedKV kv = packed(row);
  return std::make_unique<QuantizedKVCache>(backend(), spec_, rounding_, std::move(kv.keys), std::move(kv.values),
                                            length);
}

std::unique_ptr<BatchQuantizedKVCache> BatchQuantizedKVCache::merge(Backend& backend,
                                                                    std::span<const QuantizedKVCache* const> caches) {
  KVLAB_REQUIRE(!caches.empty() && caches[0] != nullptr, invalid_argument, kBatchQuantized,
                " merge needs at least one cache (the first may not be null)");
  const QuantSpec spec = caches[0]->spec();
  const Rounding rounding = caches[0]->rounding();
  std::vector<BatchLayout::MergeRow> rows;
  for (std::size_t r = 0; r < caches.size(); ++r) {
    const QuantizedKVCache* c = caches[r];
    KVLAB_REQUIRE(c != nullptr, invalid_argument, kBatchQuantized, " merge: cache ", r, " is null");
    KVLAB_REQUIRE(&c->backend() == &backend, invalid_argument, kBatchQuantized, " merge: cache ", r, " lives on backend '",
                  c->backend().name(), "', not '", backend.name(), "'");
    KVLAB_REQUIRE(c->spec() == spec && c->rounding() == rounding, invalid_argument, kBatchQuantized, " merge: cache ", r, " is ",
                  to_string(c->spec()), " / ", rounding_name(c->rounding()), " but cache 0 is ", to_string(spec), " / ",
                  rounding_name(rounding));
    if (c->empty() || c->offset() == 0) rows.push_back({{}, 0});
    else rows.push_back({components_of(c->key_buffer(), c->value_buffer()), c->offset()});
  }
  BatchLayout layout = BatchLayout::merge(backend, kBatchQuantized, component_names(spec), rows);
  return std::unique_ptr<BatchQuantizedKVCache>(new BatchQuantizedKVCache(backend, std::move(layout), spec, rounding));
}

CacheState BatchQuantizedKVCache::state() const {
  CacheState s{std::string(class_name()),
               {},
               {{"bits", std::to_string(spec_.bits)},
                {"group_size", std::to_string(spec_.group_size)},
                {"mode", std::string(quant_mode_name(spec_.mode))},
                {"rounding", std::string(rounding_name(rounding_))}}};
  layout_.save(s);
  return s;
}

std::unique_ptr<BatchQuantizedKVCache> BatchQuantizedKVCache::from_state(Backend& backend, const CacheState& state) {
  KVLAB_REQUIRE(state.class_name == kBatchQuantized, corrupt, "state of class '", state.class_name, "' cannot be loaded as a ",
                kBatchQuantized);
  const int bits = static_cast<int>(meta_integer(state, kBatchQuantized, "bits", 0, INT32_MAX));
  const int group = static_cast<int>(meta_integer(state, kBatchQuantized, "group_size", 0, INT32_MAX));
  const QuantMode mode = meta_enum(state, kBatchQuantized, "mode", quant_mode_from_name);
  const Rounding rounding = meta_enum(state, kBatchQuantized, "rounding", rounding_from_name);
  const QuantSpec spec{mode, bits, group};
  try {
    spec.validate();
  } catch (const Error& e) {
    fail(ErrorKind::corrupt, cat(kBatchQuantized, " state fields 'mode'/'bits'/'group_size': ", e.what()));
  }
  const std::vector<std::string> names = component_names(spec);
  BatchLayout layout = BatchLayout::load(backend, kBatchQuantized, names, state);
  if (!layout.empty()) {
    const std::vector<DTensor>& c = layout.components();
    const std::size_t per_side = names.size() / 2;
    check_side(spec, names, c, 0);
    check_side(spec, names, c, per_side);
    KVLAB_REQUIRE(seq::heads(c[0]) == seq::heads(c[per_side]) && c[1].dtype == c[per_side + 1].dtype, corrupt, kBatchQuantized,
                  " state 'keys' and 'values' differ in head count or scale dtype");
  }
  return std::unique_ptr<BatchQuantizedKVCache>(new BatchQuantizedKVCache(backend, std::move(layout), spec, rounding));
}

std::vector<SequenceContent> BatchQuantizedKVCache::content(ContentForm form) const {
  std::vector<SequenceContent> out;
  const std::vector<std::int32_t> offs = offsets();
  for (std::int64_t i = 0; i < batch_size(); ++i) {
    const std::unique_ptr<QuantizedKVCache> row = extract(i);
    out.push_back(newest_content(offs[static_cast<std::size_t>(i)], row->kv_length(),
                                 std::move(row->content(form).at(0).parts)));
    out.back().spec = spec_;
  }
  return out;
}

std::vector<BackingBuffer> BatchQuantizedKVCache::buffers() const {
  if (empty()) return {};
  std::vector<BackingBuffer> out;
  for (ContentPart& p : packed_parts({key_buffer(), value_buffer()})) out.push_back({std::move(p.name), std::move(p.rows), idx()});
  return out;
}

}  // namespace kvlab
