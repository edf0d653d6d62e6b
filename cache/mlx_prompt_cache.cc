#include "cache/mlx_prompt_cache.h"

#include <charconv>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "cache/registry.h"
#include "core/safetensors_file.h"
#include "reference/reference_backend.h"

namespace kvlab {
namespace {

using json = nlohmann::json;
using safetensors::kMetadataKey;

constexpr const char* kNoun = "mlx-lm prompt cache file";
constexpr const char* kClasses =
    "KVCache, RotatingKVCache, QuantizedKVCache, ChunkedKVCache, BatchKVCache, BatchRotatingKVCache";
// mlx stores a Python bool as a 0-d BOOL tensor; kvlab has no bool dtype, and a BOOL is
// one byte holding 0 or 1, so it is read as U8 and remembered as a flag.
constexpr std::string_view kBoolCode = "BOOL";

safetensors::FileErrors corrupt_errors(const std::filesystem::path& path) {
  return {ErrorKind::corrupt, cat(kNoun, " '", path.string(), "' is corrupt: "), "data region", ')', "gap",
          "trailing bytes", "has unknown dtype ", " (mlx-lm caches use F32, F16, BF16, U32, I32 and BOOL)"};
}

// The first `rows` rows (axis 2) of a (B, H, L, W) block: mlx-lm's buffers are
// step-padded beyond the live rows, kvlab's states hold the live rows only.
Tensor take_rows(const Tensor& t, std::int64_t rows) {
  if (rows == t.dim(2)) return t;
  const std::int64_t b = t.dim(0), h = t.dim(1), len = t.dim(2), w = t.dim(3);
  Tensor out(t.dtype(), {b, h, rows, w});
  const auto row_bytes = static_cast<std::size_t>(w) * dtype_size(t.dtype());
  for (std::int64_t i = 0; i < b * h; ++i)
    if (rows > 0)
      std::memcpy(out.data() + static_cast<std::size_t>(i * rows) * row_bytes,
                  t.data() + static_cast<std::size_t>(i * len) * row_bytes, static_cast<std::size_t>(rows) * row_bytes);
  return out;
}

// Whether kvlab's own cache accepts the state (its from_state checks every shape against
// the meta: ranks, dtypes, head dims against bits and group size, offsets against rows),
// on the host reference backend; the error, when not, in kvlab's words.
std::optional<std::string> rejected_by_kvlab(const CacheState& state) {
  ReferenceBackend backend;
  try {
    (void)cache_from_state(backend, state);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------
// Reading

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

LoadedStates load_mlx_prompt_cache(const std::filesystem::path& path) {
  const safetensors::FileErrors errors = corrupt_errors(path);
  const safetensors::InputFile file(path, kNoun, errors);
  const safetensors::Header h = safetensors::read_header(file, errors);
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
    Tensor t(e.dtype, e.shape);
    if (e.end > e.begin) file.read(h.data_start + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
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
    if (converter == converters().end())
      errors.raise(cat("layer ", i, " has class '", meta.classes[i], "', which kvlab cannot read (it reads ", kClasses,
                       ")"));
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

// ---------------------------------------------------------------------------------
// Writing

namespace {

// A kvlab state read field by field; what the class does not take has no place in
// mlx-lm's state and is refused rather than dropped.
class StateReader {
 public:
  StateReader(const CacheState& s, std::size_t layer) : s_(s), layer_(layer) {}

  std::int64_t meta_int(const std::string& name) {
    const std::string& text = meta(name);
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) bad(cat("meta '", name, "' is '", text, "', not an integer"));
    return v;
  }
  const std::string& meta(const std::string& name) {
    const auto it = s_.meta.find(name);
    if (it == s_.meta.end()) bad(cat("has no meta '", name, "'"));
    used_meta_.insert(name);
    return it->second;
  }
  const Tensor* tensor(const std::string& name) {
    const auto it = s_.tensors.find(name);
    if (it == s_.tensors.end()) return nullptr;
    used_tensors_.insert(name);
    return &it->second;
  }
  void finish() const {
    for (const auto& [name, value] : s_.meta)
      if (used_meta_.count(name) == 0) bad(cat("has meta '", name, "', which mlx-lm's ", s_.class_name, " has no field for"));
    for (const auto& [name, value] : s_.tensors)
      if (used_tensors_.count(name) == 0)
        bad(cat("has tensor '", name, "', which mlx-lm's ", s_.class_name, " has no field for"));
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(ErrorKind::invalid_argument, cat("cannot save layer ", layer_, " (", s_.class_name, ") for mlx-lm: it ", what));
  }

 private:
  const CacheState& s_;
  std::size_t layer_;
  std::set<std::string> used_meta_, used_tensors_;
};

// The tensors, scalars and metadata of the file being built, in mlx-lm's naming.
class FileBuilder {
 public:
  struct Planned {
    std::string key;
    std::string_view code;
    const Tensor* tensor;
  };

  void array(std::size_t layer, const std::string& field, const Tensor& t) {
    planned_.push_back({key(layer, field), safetensors::dtype_code(t.dtype()), &t});
  }
  void optional_array(std::size_t layer, const std::string& field, const Tensor* t) {
    if (t) return array(layer, field, *t);
    owned_.emplace_back(DType::f32, Shape{0});  // mlx.array([]) for None
    add_scalar(layer, field, "none", safetensors::dtype_code(DType::f32));
  }
  void integer(StateReader& r, std::size_t layer, const std::string& field, std::int64_t v, const char* name) {
    // mx.array(int) is int32; a larger value would not survive mlx-lm's own save either.
    if (v < INT32_MIN || v > INT32_MAX) r.bad(cat("has ", name, " = ", v, ", outside int32"));
    const std::int64_t values[] = {v};
    owned_.push_back(Tensor::from_ints(DType::i32, {}, values));
    add_scalar(layer, field, "scalar", safetensors::dtype_code(DType::i32));
  }
  void flag(std::size_t layer, const std::string& field, bool v) {
    const std::int64_t values[] = {v ? 1 : 0};
    owned_.push_back(Tensor::from_ints(DType::u8, {}, values));
    add_scalar(layer, field, "scalar", kBoolCode);
  }

  const std::vector<Planned>& planned() const { return planned_; }
  const std::vector<std::pair<std::string, std::string>>& scalars() const { return scalars_; }

 private:
  static std::string key(std::size_t layer, const std::string& field) { return cat(layer, ".", field); }
  void add_scalar(std::size_t layer, const std::string& field, const char* type, std::string_view code) {
    planned_.push_back({key(layer, field), code, &owned_.back()});
    scalars_.emplace_back(key(layer, field), type);
  }

  std::deque<Tensor> owned_;  // stable addresses for `planned_`
  std::vector<Planned> planned_;
  std::vector<std::pair<std::string, std::string>> scalars_;
};

void write_kv_pair(FileBuilder& f, StateReader& r, std::size_t layer) {
  const Tensor *k = r.tensor("keys"), *v = r.tensor("values");
  if ((k == nullptr) != (v == nullptr)) r.bad("has keys without values or the reverse");
  f.optional_array(layer, "0", k);
  f.optional_array(layer, "1", v);
}

void write_kv(FileBuilder& f, StateReader& r, std::size_t layer) {
  write_kv_pair(f, r, layer);
  f.integer(r, layer, "2", r.meta_int("offset"), "offset");
}

void write_rotating(FileBuilder& f, StateReader& r, std::size_t layer) {
  write_kv_pair(f, r, layer);
  f.integer(r, layer, "2", r.meta_int("offset"), "offset");
  f.integer(r, layer, "3", r.meta_int("keep"), "keep");
  f.integer(r, layer, "4", r.meta_int("max_size"), "max_size");
  f.integer(r, layer, "5", r.meta_int("idx"), "idx");
}

void write_quantized(FileBuilder& f, StateReader& r, std::size_t layer) {
  const std::string& mode = r.meta("mode");
  if (mode != "affine") r.bad(cat("is quantized in mode '", mode, "'; mlx-lm 0.32.2's QuantizedKVCache is affine only"));
  (void)r.meta("rounding");  // mlx-lm records none: the loading device's rounding applies
  for (const auto& [side, field] : {std::pair{"keys", "0"}, std::pair{"values", "1"}}) {
    const std::string s(side);
    const Tensor *wq = r.tensor(s + ".wq"), *scales = r.tensor(s + ".scales"), *biases = r.tensor(s + ".biases");
    const int present = (wq != nullptr) + (scales != nullptr) + (biases != nullptr);
    if (present != 0 && present != 3) r.bad(cat("has ", present, " of the 3 parts of ", s, " (wq, scales, biases)"));
    if (present == 0) {
      f.optional_array(layer, field, nullptr);
    } else {
      f.array(layer, std::string(field) + ".0", *wq);
      f.array(layer, std::string(field) + ".1", *scales);
      f.array(layer, std::string(field) + ".2", *biases);
    }
  }
  f.integer(r, layer, "2", r.meta_int("offset"), "offset");
  f.integer(r, layer, "3", r.meta_int("group_size"), "group_size");
  f.integer(r, layer, "4", r.meta_int("bits"), "bits");
}

void write_chunked(FileBuilder& f, StateReader& r, std::size_t layer) {
  write_kv_pair(f, r, layer);
  f.integer(r, layer, "2", r.meta_int("offset"), "offset");
  f.integer(r, layer, "3", r.meta_int("chunk_size"), "chunk_size");
  f.integer(r, layer, "4", r.meta_int("start_position"), "start_position");
}

void write_rows(FileBuilder& f, StateReader& r, std::size_t layer) {
  for (const auto& [name, field] : {std::pair{"offset", "2"}, std::pair{"left_padding", "3"}}) {
    const Tensor* t = r.tensor(name);
    if (t == nullptr) r.bad(cat("has no tensor '", name, "'"));
    if (t->dtype() != DType::i32 || t->rank() != 1) r.bad(cat("has '", name, "' ", dtype_name(t->dtype()), shape_str(t->shape()), ", expected i32 (B,)"));
    f.array(layer, field, *t);
  }
}

void write_batch(FileBuilder& f, StateReader& r, std::size_t layer) {
  if (r.tensor("right_padding"))
    r.bad("has a pending right padding (prepare without finalize); mlx-lm's state has no _right_padding");
  write_kv_pair(f, r, layer);
  write_rows(f, r, layer);
  f.integer(r, layer, "4", r.meta_int("idx"), "idx");
}

void write_batch_rotating(FileBuilder& f, StateReader& r, std::size_t layer) {
  if (r.tensor("lengths"))
    r.bad("has pending lengths (prepare with right padding, not finalized); mlx-lm's state has no _lengths");
  write_kv_pair(f, r, layer);
  write_rows(f, r, layer);
  f.integer(r, layer, "4", r.meta_int("max_size"), "max_size");
  f.integer(r, layer, "5", r.meta_int("_offset"), "_offset");
  f.integer(r, layer, "6", r.meta_int("_idx"), "_idx");
  const std::string& rotated = r.meta("rotated");
  if (rotated != "true" && rotated != "false") r.bad(cat("has rotated = '", rotated, "', expected true or false"));
  f.flag(layer, "7", rotated == "true");
}

using LayerWriter = void (*)(FileBuilder&, StateReader&, std::size_t);
const std::map<std::string, LayerWriter, std::less<>>& writers() {
  static const std::map<std::string, LayerWriter, std::less<>> table = {
      {"KVCache", write_kv},           {"RotatingKVCache", write_rotating},
      {"QuantizedKVCache", write_quantized}, {"ChunkedKVCache", write_chunked},
      {"BatchKVCache", write_batch},   {"BatchRotatingKVCache", write_batch_rotating}};
  return table;
}

// tree_unflatten gives back "0.<key>" verbatim only for a non-empty key without dots
// that is not all digits (dots nest, digits make a list).
void require_plain_user_key(const std::string& key) {
  const bool digits = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
  KVLAB_REQUIRE(!key.empty() && key.find('.') == std::string::npos && !digits, invalid_argument,
                "user metadata key '", key, "' would not survive mlx-lm's tree_unflatten (empty, dotted or numeric)");
}

}  // namespace

void save_mlx_prompt_cache(const std::filesystem::path& path, const std::vector<CacheState>& layers,
                           const std::map<std::string, std::string>& user_metadata) {
  FileBuilder files;
  json meta = json::object();
  for (const auto& [key, value] : user_metadata) {
    require_plain_user_key(key);
    meta["0." + key] = value;
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const auto writer = writers().find(layers[i].class_name);
    KVLAB_REQUIRE(writer != writers().end(), invalid_argument, "cannot save layer ", i, " (", layers[i].class_name,
                  ") for mlx-lm: ", kMlxPromptCacheVersion, " has no such class (it has ", kClasses, ")");
    // A state kvlab's own cache would refuse would load into mlx-lm as nonsense.
    if (const auto why = rejected_by_kvlab(layers[i]))
      fail(ErrorKind::invalid_argument, cat("cannot save layer ", i, " (", layers[i].class_name,
                                            ") for mlx-lm: it is not a valid cache state: ", *why));
    StateReader reader(layers[i], i);
    writer->second(files, reader, i);
    reader.finish();
    meta[cat("1.", i)] = layers[i].class_name;
  }
  meta["2.0"] = "";
  for (std::size_t j = 0; j < files.scalars().size(); ++j) {
    meta[cat("2.", j + 1, ".0")] = files.scalars()[j].first;
    meta[cat("2.", j + 1, ".1")] = files.scalars()[j].second;
  }

  json header = json::object();
  std::uint64_t cursor = 0;
  for (const auto& p : files.planned()) {
    const std::uint64_t bytes = p.tensor->nbytes();
    header[p.key] = {{"dtype", p.code}, {"shape", p.tensor->shape()}, {"data_offsets", {cursor, cursor + bytes}}};
    cursor += bytes;
  }
  header[std::string(kMetadataKey)] = std::move(meta);
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    fail(ErrorKind::invalid_argument, cat("cannot save an mlx-lm prompt cache: a string is not valid UTF-8: ", e.what()));
  }
  safetensors::pad_header(text);
  unsigned char length[8];
  safetensors::encode_length(text.size(), length);

  safetensors::TempFile tmp(path, kNoun);
  tmp.write(length, sizeof length);
  tmp.write(text.data(), text.size());
  for (const auto& p : files.planned())
    if (p.tensor->nbytes() > 0) tmp.write(p.tensor->data(), p.tensor->nbytes());
  tmp.commit();
}

LoadedStates load_any_cache_states(const std::filesystem::path& path, StateFileFormat* format) {
  const StateFileFormat f = detect_state_file_format(path);
  if (format) *format = f;
  return f == StateFileFormat::kvlab ? load_cache_states(path) : load_mlx_prompt_cache(path);
}

}  // namespace kvlab
