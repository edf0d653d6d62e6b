#include "cache/cache.h"

#include <charconv>
#include <limits>

namespace kvlab {

FetchedKV Cache::update(const DTensor&, const DTensor&) {
  // mlx-swift-lm#71 / SwiftLM#71: models called update on a QuantizedKVCache and the
  // process died with a fatalError. Here it is a recoverable, named misuse.
  fail(ErrorKind::misuse, cat("update() called on ", class_name(),
                              ", which stores quantized data; use update_quantized()"));
}

FetchedQuantizedKV Cache::update_quantized(const DTensor&, const DTensor&) {
  fail(ErrorKind::misuse, cat("update_quantized() called on ", class_name(),
                              ", which stores plain data; use update()"));
}

DTensor Cache::snapshot_positions(std::int64_t batch) const {
  std::vector<std::int32_t> offs = offsets();
  if (static_cast<std::int64_t>(offs.size()) != batch) {
    KVLAB_REQUIRE(offs.size() == 1, shape_mismatch, class_name(), " reports ", offs.size(), " offsets for a batch of ",
                  batch, " rows");
    offs.assign(static_cast<std::size_t>(batch), offs[0]);
  }
  DTensor out = backend().allocate(DType::i32, {batch});
  backend().upload(out, offs.data());
  return out;
}

const std::string& meta_field(const CacheState& st, const char* who, const std::string& field) {
  const auto it = st.meta.find(field);
  KVLAB_REQUIRE(it != st.meta.end(), corrupt, who, " state has no '", field, "'");
  return it->second;
}

std::int64_t meta_integer(const CacheState& st, const char* who, const std::string& field, std::int64_t min,
                          std::int64_t max) {
  const std::string& text = meta_field(st, who, field);
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool whole = !text.empty() && ec == std::errc() && end == text.data() + text.size();
  // "-0" parses as 0; a field that must not be negative does not take a minus sign either.
  const bool sign_ok = min < 0 || text.empty() || text[0] != '-';
  if (whole && sign_ok && value >= min && value <= max) return value;
  if (min == std::numeric_limits<std::int64_t>::min() && max == std::numeric_limits<std::int64_t>::max()) {
    fail(ErrorKind::corrupt, cat(who, " state field '", field, "' = '", text, "', expected an integer"));
  }
  fail(ErrorKind::corrupt, cat(who, " state field '", field, "' = '", text, "', expected an integer in [", min, ", ",
                               max, "]"));
}

Tensor i32_tensor(const std::vector<std::int32_t>& v) {
  const std::vector<std::int64_t> wide(v.begin(), v.end());
  return Tensor::from_ints(DType::i32, {static_cast<std::int64_t>(v.size())}, wide);
}

const DTensor& SequenceContent::part(std::string_view name) const {
  std::string names;
  for (const ContentPart& p : parts) {
    if (p.name == name) return p.rows;
    names += cat(names.empty() ? "" : ", ", p.name);
  }
  fail(ErrorKind::invalid_argument, cat("content has no part '", name, "' (parts: ", names, ")"));
}

SequenceContent newest_content(std::int64_t offset, std::int64_t length, std::vector<ContentPart> parts) {
  SequenceContent c;
  for (std::int64_t p = offset - length; p < offset; ++p) c.positions.push_back(static_cast<std::int32_t>(p));
  c.parts = std::move(parts);
  return c;
}

std::vector<ContentPart> plain_parts(const FetchedKV& kv) { return {{"keys", kv.keys}, {"values", kv.values}}; }

std::vector<ContentPart> packed_parts(const FetchedQuantizedKV& kv) {
  std::vector<ContentPart> out;
  for (const auto& [side, q] : {std::pair{"keys", &kv.keys}, std::pair{"values", &kv.values}}) {
    out.push_back({cat(side, ".wq"), q->wq});
    out.push_back({cat(side, ".scales"), q->scales});
    if (q->spec.has_biases()) out.push_back({cat(side, ".biases"), q->biases});
  }
  return out;
}

std::uint32_t nan_poison_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: return 0x7fc00000u;
    case DType::f16: return 0x7e00u;
    case DType::bf16: return 0x7fc0u;
    default: fail(ErrorKind::dtype_mismatch, cat("NaN poison needs a float dtype, got ", dtype_name(dtype)));
  }
}

}  // namespace kvlab
