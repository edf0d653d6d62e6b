// The writer half of cache/mlx_prompt_cache.h: kvlab CacheStates as a file mlx-lm
// 0.32.2's load_prompt_cache loads and continues from.
#include <charconv>
#include <deque>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "cache/mlx_prompt_cache.h"
#include "cache/mlx_prompt_cache_internal.h"
#include "core/safetensors_file.h"

namespace kvlab {

namespace {

using json = nlohmann::json;
using safetensors::kMetadataKey;
using mlx_prompt_cache::kBoolCode;
using mlx_prompt_cache::kClasses;
using mlx_prompt_cache::kNoun;
using mlx_prompt_cache::rejected_by_kvlab;

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
    safetensors::write_tensor_bytes(tmp, *p.tensor);
  tmp.commit();
}

}  // namespace kvlab
