// The reader half of cache/mlx_prompt_cache.h (and format detection); the writer is
// mlx_prompt_cache_write.cc.
#include "cache/mlx_prompt_cache.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "cache/mlx_prompt_cache_internal.h"
#include "cache/registry.h"
#include "cache/shape_backend.h"
#include "core/safetensors_file.h"
#include "reference/reference_backend.h"

namespace kvlab {

namespace mlx_prompt_cache {

std::optional<std::string> rejected_by_kvlab(const CacheState& state) {
  // A deferred state is checked without its K/V (cache/shape_backend.h), an eager one
  // on the oracle, which also runs the kernels' own argument checks.
  const bool deferred = std::any_of(state.tensors.begin(), state.tensors.end(),
                                    [](const auto& entry) { return entry.second.is_deferred(); });
  ReferenceBackend reference;
  ShapeBackend shapes;
  try {
    (void)cache_from_state(deferred ? static_cast<Backend&>(shapes) : reference, state);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace mlx_prompt_cache

namespace {

using json = nlohmann::json;
using safetensors::kMetadataKey;
using mlx_prompt_cache::kBoolCode;
using mlx_prompt_cache::kClasses;
using mlx_prompt_cache::kNoun;
using mlx_prompt_cache::rejected_by_kvlab;

safetensors::FileErrors corrupt_errors(const std::filesystem::path& path) {
  return {ErrorKind::corrupt, cat(kNoun, " '", path.string(), "' is corrupt: "), "data region", ')', "gap",
          "trailing bytes", "has unknown dtype ", " (mlx-lm caches use F32, F16, BF16, U32, I32 and BOOL)"};
}

// The first `rows` rows (axis 2) of a (B, H, L, W) block: mlx-lm's buffers are
// step-padded beyond the live rows, kvlab's states hold the live rows only. A deferred
// block stays deferred (its rows are read when written out).
Tensor take_rows(const Tensor& t, std::int64_t rows) { return rows == t.dim(2) ? t : t.slice(2, 0, rows); }

// One tensor of the file, with what the scalars list says it stands for.
struct Slot {
  Tensor tensor;
  bool is_bool = false;
  std::string type;  // "" an array, else "scalar" | "string" | "none"
  bool used = false;
};

// The fields of one layer, taken by name; every field must be taken exactly once.
class LayerReader {
 public:
  LayerReader(const safetensors::FileErrors& errors, std::size_t layer, std::string cls,
              std::map<std::string, Slot>& slots)
      : errors_(errors), layer_(layer), cls_(std::move(cls)), slots_(slots) {}

  std::optional<Tensor> block(const std::string& field, const char* name) {
    Slot& s = take(field, name);
    if (s.type == "none") return std::nullopt;
    if (!s.type.empty() || s.is_bool) bad(field, name, cat("is a ", s.is_bool ? "bool" : s.type, ", expected an array"));
    if (s.tensor.rank() != 4) bad(field, name, cat("has shape ", shape_str(s.tensor.shape()), ", expected (B, H, L, W)"));
    return s.tensor;
  }

  Tensor row_vector(const std::string& field, const char* name) {
    Slot& s = take(field, name);
    if (!s.type.empty() || s.tensor.dtype() != DType::i32 || s.tensor.rank() != 1)
      bad(field, name, cat("is ", describe(s), ", expected an I32 array (B,)"));
    return s.tensor;
  }

  std::int64_t integer(const std::string& field, const char* name) {
    Slot& s = take(field, name);
    if (s.type != "scalar" || s.is_bool || s.tensor.dtype() != DType::i32 || s.tensor.rank() != 0)
      bad(field, name, cat("is ", describe(s), ", expected an int scalar (0-d I32)"));
    return s.tensor.to_ints()[0];
  }

  bool flag(const std::string& field, const char* name) {
    Slot& s = take(field, name);
    if (s.type != "scalar" || !s.is_bool || s.tensor.rank() != 0)
      bad(field, name, cat("is ", describe(s), ", expected a bool scalar (0-d BOOL)"));
    const std::int64_t v = s.tensor.to_ints()[0];
    if (v != 0 && v != 1) bad(field, name, cat("holds the byte ", v, ", not a bool (0 or 1)"));
    return v == 1;
  }

  // QuantizedKVCache's (wq, scales, biases), or nullopt for None.
  std::optional<std::vector<Tensor>> triple(const std::string& field, const char* name) {
    if (slots_.count(field) != 0) {
      if (slots_.at(field).type != "none") bad(field, name, "is not None, expected (wq, scales, biases)");
      take(field, name);
      return std::nullopt;
    }
    std::vector<Tensor> parts;
    for (const char* part : {".0", ".1", ".2"}) {
      const auto t = block(field + part, name);
      if (!t) bad(field + part, name, "is None inside a tuple");
      parts.push_back(*t);
    }
    return parts;
  }

  // Whatever the class did not take is a field mlx-lm's from_state would not accept.
  void finish() const {
    for (const auto& [key, slot] : slots_)
      if (!slot.used)
        errors_.raise(cat("tensor \"", layer_, ".", key, "\" is not a field of ", cls_, " (layer ", layer_, ")"));
  }

  [[noreturn]] void bad(const std::string& field, const char* name, const std::string& what) const {
    errors_.raise(cat("tensor \"", layer_, ".", field, "\" (", cls_, " ", name, " of layer ", layer_, ") ", what));
  }
  [[noreturn]] void inconsistent(const std::string& what) const {
    errors_.raise(cat("layer ", layer_, " (", cls_, "): ", what));
  }

 private:
  static std::string describe(const Slot& s) {
    const std::string kind = s.is_bool ? "BOOL" : std::string(dtype_name(s.tensor.dtype()));
    return cat(s.type.empty() ? "an array" : s.type, " ", kind, shape_str(s.tensor.shape()));
  }

  Slot& take(const std::string& field, const char* name) {
    const auto it = slots_.find(field);
    if (it == slots_.end())
      errors_.raise(cat("layer ", layer_, " (", cls_, ") has no tensor \"", layer_, ".", field, "\" (", name, ")"));
    it->second.used = true;
    return it->second;
  }

  const safetensors::FileErrors& errors_;
  std::size_t layer_;
  std::string cls_;
  std::map<std::string, Slot>& slots_;
};

// Checks a keys/values pair and returns its first `rows` rows as kvlab's "keys"/"values";
// nothing when the cache holds no rows, unless `keep_empty` (kvlab's ChunkedKVCache
// saves zero-row blocks once allocated, and needs them when start_position > 0).
void put_kv(LayerReader& r, CacheState& s, const std::optional<Tensor>& k, const std::optional<Tensor>& v,
            std::int64_t rows, const char* rows_what, bool keep_empty = false) {
  if (k.has_value() != v.has_value()) r.inconsistent(k ? "keys are set but values are None" : "values are set but keys are None");
  if (!k) {
    if (rows != 0) r.inconsistent(cat(rows_what, " is ", rows, " but keys and values are None"));
    return;
  }
  if (k->dim(2) != v->dim(2) || k->dim(0) != v->dim(0))
    r.inconsistent(cat("keys ", shape_str(k->shape()), " and values ", shape_str(v->shape()), " disagree on B or L"));
  if (rows < 0 || rows > k->dim(2))
    r.inconsistent(cat(rows_what, " is ", rows, " but keys hold ", k->dim(2), " rows"));
  if (rows == 0 && !keep_empty) return;
  s.tensors.emplace("keys", take_rows(*k, rows));
  s.tensors.emplace("values", take_rows(*v, rows));
}

std::string count(LayerReader& r, std::int64_t v, const char* name) {
  if (v < 0) r.inconsistent(cat(name, " is ", v, ", expected >= 0"));
  return std::to_string(v);
}

CacheState read_kv(LayerReader& r) {
  CacheState s{"KVCache", {}, {}};
  const auto k = r.block("0", "keys"), v = r.block("1", "values");
  const std::int64_t offset = r.integer("2", "offset");
  s.meta["offset"] = count(r, offset, "offset");
  put_kv(r, s, k, v, offset, "offset");
  return s;
}

CacheState read_rotating(LayerReader& r) {
  CacheState s{"RotatingKVCache", {}, {}};
  const auto k = r.block("0", "keys"), v = r.block("1", "values");
  const std::int64_t offset = r.integer("2", "offset");
  s.meta = {{"offset", count(r, offset, "offset")},
            {"keep", count(r, r.integer("3", "keep"), "keep")},
            {"max_size", count(r, r.integer("4", "max_size"), "max_size")},
            {"idx", count(r, r.integer("5", "_idx"), "_idx")}};
  // Live rows: the whole buffer once it wrapped or grew by concatenation, else offset
  // (a buffer grown in place is zero beyond offset).
  put_kv(r, s, k, v, k ? std::min(offset, k->dim(2)) : 0, "min(offset, rows)");
  return s;
}

CacheState read_quantized(LayerReader& r) {
  CacheState s{"QuantizedKVCache", {}, {}};
  const auto k = r.triple("0", "keys"), v = r.triple("1", "values");
  const std::int64_t offset = r.integer("2", "offset");
  s.meta = {{"offset", count(r, offset, "offset")},
            {"group_size", count(r, r.integer("3", "group_size"), "group_size")},
            {"bits", count(r, r.integer("4", "bits"), "bits")},
            {"mode", "affine"},       // the only mode mlx-lm 0.32.2's QuantizedKVCache uses
            {"rounding", "mlx"}};  // not recorded by mlx-lm; see the header
  if (k.has_value() != v.has_value()) r.inconsistent("one of keys and values is None");
  if (!k) {
    if (offset != 0) r.inconsistent(cat("offset is ", offset, " but keys and values are None"));
    return s;
  }
  const char* parts[] = {".wq", ".scales", ".biases"};
  for (const auto& [side, q] : {std::pair{"keys", &*k}, std::pair{"values", &*v}})
    for (std::size_t i = 0; i < 3; ++i) {
      const Tensor& t = (*q)[i];
      if (offset > t.dim(2)) r.inconsistent(cat("offset is ", offset, " but ", side, parts[i], " holds ", t.dim(2), " rows"));
      if (offset > 0) s.tensors.emplace(std::string(side) + parts[i], take_rows(t, offset));
    }
  return s;
}

CacheState read_chunked(LayerReader& r) {
  CacheState s{"ChunkedKVCache", {}, {}};
  const auto k = r.block("0", "keys"), v = r.block("1", "values");
  const std::int64_t offset = r.integer("2", "offset"), start = r.integer("4", "start_position");
  s.meta = {{"offset", count(r, offset, "offset")},
            {"chunk_size", count(r, r.integer("3", "chunk_size"), "chunk_size")},
            {"start_position", count(r, start, "start_position")}};
  if (start > offset) r.inconsistent(cat("start_position ", start, " is past offset ", offset));
  // The buffer starts at start_position; its live rows are offset − start_position.
  put_kv(r, s, k, v, offset - start, "offset - start_position", true);
  return s;
}

// The (B,) offset and left_padding of the batch classes, with the same B.
void read_rows(LayerReader& r, CacheState& s) {
  Tensor offset = r.row_vector("2", "offset"), left = r.row_vector("3", "left_padding");
  if (offset.dim(0) != left.dim(0))
    r.inconsistent(cat("offset has ", offset.dim(0), " rows but left_padding has ", left.dim(0)));
  s.tensors.emplace("offset", std::move(offset));
  s.tensors.emplace("left_padding", std::move(left));
}

CacheState read_batch(LayerReader& r) {
  CacheState s{"BatchKVCache", {}, {}};
  const auto k = r.block("0", "keys"), v = r.block("1", "values");
  read_rows(r, s);
  const std::int64_t idx = r.integer("4", "_idx");
  s.meta["idx"] = count(r, idx, "_idx");
  if (k && k->dim(0) != s.tensors.at("offset").dim(0))
    r.inconsistent(cat("keys ", shape_str(k->shape()), " and offset (", s.tensors.at("offset").dim(0), ",) disagree on B"));
  put_kv(r, s, k, v, idx, "_idx");
  return s;
}

CacheState read_batch_rotating(LayerReader& r) {
  CacheState s{"BatchRotatingKVCache", {}, {}};
  const auto k = r.block("0", "keys"), v = r.block("1", "values");
  read_rows(r, s);
  const std::int64_t idx = r.integer("6", "_idx");
  const bool rotated = r.flag("7", "rotated");
  s.meta = {{"max_size", count(r, r.integer("4", "max_size"), "max_size")},
            {"_offset", count(r, r.integer("5", "_offset"), "_offset")},
            {"_idx", count(r, idx, "_idx")},
            {"rotated", rotated ? "true" : "false"}};
  if (k && k->dim(0) != s.tensors.at("offset").dim(0))
    r.inconsistent(cat("keys ", shape_str(k->shape()), " and offset (", s.tensors.at("offset").dim(0), ",) disagree on B"));
  // A wrapped ring is the whole buffer; otherwise the columns before _idx.
  put_kv(r, s, k, v, rotated && k ? k->dim(2) : idx, rotated ? "the ring" : "_idx");
  return s;
}

using LayerConverter = CacheState (*)(LayerReader&);
const std::map<std::string, LayerConverter, std::less<>>& converters() {
  static const std::map<std::string, LayerConverter, std::less<>> table = {
      {"KVCache", read_kv},           {"RotatingKVCache", read_rotating},
      {"QuantizedKVCache", read_quantized}, {"ChunkedKVCache", read_chunked},
      {"BatchKVCache", read_batch},   {"BatchRotatingKVCache", read_batch_rotating}};
  return table;
}

// Splits "<a>.<rest>" into (a, rest); rest empty when there is no dot.
std::pair<std::string_view, std::string_view> split_first(std::string_view key) {
  const std::size_t dot = key.find('.');
  if (dot == std::string_view::npos) return {key, {}};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

struct Metadata {
  std::vector<std::string> classes;
  std::map<std::string, std::string> user;
  std::vector<std::pair<std::string, std::string>> scalars;  // (tensor key, type)
};

Metadata parse_metadata(const json& meta, const safetensors::FileErrors& errors) {
  if (meta.contains("kvlab.format")) errors.raise("it is a kvlab cache state file, not an mlx-lm prompt cache");
  Metadata out;
  std::map<std::size_t, std::string> classes;
  std::map<std::size_t, std::pair<std::optional<std::string>, std::optional<std::string>>> scalars;
  bool placeholder = false;
  for (const auto& [key, value_json] : meta.items()) {
    const std::string value = value_json.get<std::string>();
    const auto [list, rest] = split_first(key);
    if (list == "0" && !rest.empty()) {
      out.user.emplace(rest, value);
    } else if (list == "1" && safetensors::parse_index(rest)) {
      classes.emplace(*safetensors::parse_index(rest), value);
    } else if (key == "2.0") {
      if (!value.empty()) errors.raise(cat("metadata \"2.0\" is \"", value, "\", expected the empty placeholder"));
      placeholder = true;
    } else if (list == "2") {
      const auto [j, part] = split_first(rest);
      const auto index = safetensors::parse_index(j);
      if (!index || *index == 0 || (part != "0" && part != "1")) errors.raise(cat("unknown metadata key \"", key, "\""));
      (part == "0" ? scalars[*index].first : scalars[*index].second) = value;
    } else {
      errors.raise(cat("unknown metadata key \"", key, "\""));
    }
  }
  if (!placeholder) errors.raise("metadata has no \"2.0\" (not an mlx-lm prompt cache)");
  for (const auto& [i, name] : classes) {
    if (i != out.classes.size()) errors.raise(cat("metadata has no class name for layer ", out.classes.size(), " (\"1.", out.classes.size(), "\")"));
    out.classes.push_back(name);
  }
  for (const auto& [j, entry] : scalars) {
    if (!entry.first || !entry.second)
      errors.raise(cat("scalar entry \"2.", j, "\" lacks its ", entry.first ? "type (\"2." : "tensor key (\"2.", j,
                       entry.first ? ".1\")" : ".0\")"));
    if (*entry.second != "scalar" && *entry.second != "string" && *entry.second != "none")
      errors.raise(cat("scalar entry \"2.", j, "\" has type \"", *entry.second, "\", expected scalar, string or none"));
    out.scalars.emplace_back(*entry.first, *entry.second);
  }
  return out;
}

}  // namespace

const char* state_file_format_name(StateFileFormat f) { return f == StateFileFormat::kvlab ? "kvlab" : "mlx-lm"; }

StateFileFormat detect_state_file_format(const std::filesystem::path& path) {
  const safetensors::FileErrors errors{ErrorKind::corrupt, cat("cache file '", path.string(), "' is corrupt: "),
                                       "data region", ')', "gap", "trailing bytes", "has unknown dtype ", ""};
  const safetensors::InputFile file(path, "cache file", errors);
  const safetensors::Header h = safetensors::read_header(file, errors);
  const auto meta = h.json.find(kMetadataKey);
  if (meta != h.json.end() && meta->is_object()) {
    if (meta->contains("kvlab.format")) return StateFileFormat::kvlab;
    if (meta->contains("2.0")) return StateFileFormat::mlx_lm;
  }
  errors.raise("its metadata has neither kvlab.format (a kvlab cache state file) nor \"2.0\" (an mlx-lm prompt cache)");
}

LoadedStates load_mlx_prompt_cache(const std::filesystem::path& path, TensorLoad load, bool keep_unsupported) {
  const safetensors::FileErrors errors = corrupt_errors(path);
  const auto file = std::make_shared<const safetensors::InputFile>(path, kNoun, errors);
  const safetensors::Header h = safetensors::read_header(*file, errors);
  const Metadata meta = parse_metadata(safetensors::metadata(h.json, "the header has no __metadata__", errors), errors);
  const std::size_t layers = meta.classes.size();

  std::vector<safetensors::Entry> entries;
  std::vector<bool> is_bool;
  for (const auto& [key, entry] : h.json.items()) {
    if (key == kMetadataKey) continue;
    const auto [layer, field] = split_first(key);
    const auto index = safetensors::parse_index(layer);
    if (!index || field.empty()) errors.raise(cat("tensor key \"", key, "\" is not <layer>.<field>"));
    if (*index >= layers)
      errors.raise(cat("tensor \"", key, "\" names layer ", *index, " but the file has ", layers, " class names"));
    const bool flag = entry.is_object() && entry.contains("dtype") && entry["dtype"] == kBoolCode;
    json as_read = entry;
    if (flag) as_read["dtype"] = "U8";  // same size; see kBoolCode
    entries.push_back(safetensors::parse_entry(key, as_read, h.data_size, errors));
    is_bool.push_back(flag);
  }
  std::vector<const safetensors::Entry*> ranges;
  for (const auto& e : entries) ranges.push_back(&e);
  safetensors::require_tiling(std::move(ranges), h.data_size, errors);

  std::vector<std::map<std::string, Slot>> slots(layers);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const safetensors::Entry& e = entries[i];
    Tensor t = safetensors::read_entry(file, h.data_start, e, defer_above(load));
    const auto [layer, field] = split_first(e.key);
    slots[*safetensors::parse_index(layer)].emplace(std::string(field), Slot{std::move(t), is_bool[i], "", false});
  }
  for (const auto& [key, type] : meta.scalars) {
    const auto [layer, field] = split_first(key);
    const auto index = safetensors::parse_index(layer);
    Slot* slot = nullptr;
    if (index && *index < layers) {
      const auto it = slots[*index].find(std::string(field));
      if (it != slots[*index].end()) slot = &it->second;
    }
    if (slot == nullptr) errors.raise(cat("the scalars list names tensor \"", key, "\", which the file does not hold"));
    const Shape& shape = slot->tensor.shape();
    const bool fits = type == "scalar" ? shape.empty() : type == "none" ? shape == Shape{0} : shape.size() == 1;
    if (!fits) errors.raise(cat("tensor \"", key, "\" is listed as a ", type, " but has shape ", shape_str(shape)));
    slot->type = type;
  }

  LoadedStates out;
  out.user_metadata = meta.user;
  for (std::size_t i = 0; i < layers; ++i) {
    const auto converter = converters().find(meta.classes[i]);
    if (converter == converters().end()) {
      // Not a defect of the file: a class kvlab does not model (an SSM or hybrid model's
      // ArraysCache, MambaCache, CacheList). Described as it is when asked, else refused.
      std::string why = cat("layer ", i, " has class '", meta.classes[i], "', which kvlab cannot read (it reads ",
                            kClasses, ")");
      if (!keep_unsupported) fail(ErrorKind::unsupported, cat(kNoun, " '", path.string(), "': ", why));
      CacheState raw{meta.classes[i], {}, {}};
      for (auto& [field, slot] : slots[i]) raw.tensors.emplace(field, std::move(slot.tensor));
      out.layers.push_back(std::move(raw));
      out.unsupported.emplace(i, std::move(why));
      continue;
    }
    for (const auto& [field, slot] : slots[i])
      if (slot.is_bool && slot.type != "scalar")
        errors.raise(cat("tensor \"", i, ".", field, "\" is a BOOL array; only bool scalars are supported"));
    LayerReader reader(errors, i, meta.classes[i], slots[i]);
    out.layers.push_back(converter->second(reader));
    reader.finish();
    // What the mapping itself cannot see (a wq width that does not fit bits, per-row
    // offsets that disagree with _idx − left_padding, ...) kvlab's from_state does.
    if (const auto why = rejected_by_kvlab(out.layers.back()))
      errors.raise(cat("layer ", i, " (", meta.classes[i], ") is not a valid cache: ", *why));
  }
  return out;
}

LoadedStates load_any_cache_states(const std::filesystem::path& path, StateFileFormat* format, TensorLoad load,
                                   bool keep_unsupported) {
  const StateFileFormat f = detect_state_file_format(path);
  if (format) *format = f;
  return f == StateFileFormat::kvlab ? load_cache_states(path, load) : load_mlx_prompt_cache(path, load, keep_unsupported);
}

}  // namespace kvlab
