#include "cache/state_file.h"

#include <optional>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/safetensors_file.h"

namespace kvlab {
namespace {

using json = nlohmann::json;

using safetensors::kMetadataKey;
constexpr std::string_view kFormatKey = "kvlab.format";
constexpr std::string_view kLayersKey = "kvlab.layers";
constexpr std::string_view kUserPrefix = "user.";

std::string layer_prefix(std::size_t layer) { return "L." + std::to_string(layer) + "."; }

// nlohmann refuses to dump invalid UTF-8; checking each string up front lets the error
// name the offending entry and keeps the file untouched.
void require_utf8(const std::string& s, const std::string& what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception& e) {
    fail(ErrorKind::invalid_argument, cat(what, " is not valid UTF-8: ", e.what()));
  }
}

// ---------------------------------------------------------------------------------
// Writer

struct PlannedTensor {
  const Tensor* tensor;
  std::uint64_t begin, end;
};

// Builds the padded JSON header; `planned` receives the tensors in data order.
std::string build_header(const std::vector<CacheState>& layers, const std::map<std::string, std::string>& user,
                         std::vector<PlannedTensor>& planned) {
  json header = json::object();
  json meta = json::object();
  meta[std::string(kFormatKey)] = kStateFileFormat;
  meta[std::string(kLayersKey)] = std::to_string(layers.size());
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const CacheState& s = layers[i];
    const std::string prefix = layer_prefix(i);
    KVLAB_REQUIRE(!s.class_name.empty(), invalid_argument, "layer ", i, " has an empty class name");
    require_utf8(s.class_name, cat("class name of layer ", i));
    meta[prefix + "class"] = s.class_name;
    for (const auto& [key, value] : s.meta) {
      require_utf8(key, cat("meta key of layer ", i));
      require_utf8(value, cat("meta value '", key, "' of layer ", i));
      meta[prefix + "meta." + key] = value;
    }
    for (const auto& [name, tensor] : s.tensors) {
      KVLAB_REQUIRE(!name.empty(), invalid_argument, "layer ", i, " has a tensor with an empty name");
      require_utf8(name, cat("tensor name of layer ", i));
      const std::uint64_t bytes = tensor.nbytes();
      json shape = json::array();
      for (std::int64_t d : tensor.shape()) shape.push_back(d);
      header[prefix + name] = {{"dtype", safetensors::dtype_code(tensor.dtype())},
                               {"shape", std::move(shape)},
                               {"data_offsets", {cursor, cursor + bytes}}};
      planned.push_back({&tensor, cursor, cursor + bytes});
      cursor += bytes;
    }
  }
  for (const auto& [key, value] : user) {
    require_utf8(key, "user metadata key");
    require_utf8(value, cat("user metadata value '", key, "'"));
    meta[std::string(kUserPrefix) + key] = value;
  }
  header[std::string(kMetadataKey)] = std::move(meta);
  std::string text = header.dump();
  safetensors::pad_header(text);
  return text;
}

// ---------------------------------------------------------------------------------
// Reader

safetensors::FileErrors corrupt_errors(const std::filesystem::path& path) {
  return {ErrorKind::corrupt, cat("cache state file '", path.string(), "' is corrupt: "),
          "data region", ')', "gap", "trailing bytes", "has unknown dtype ", ""};
}

[[noreturn]] void corrupt(const std::filesystem::path& path, const std::string& what) {
  corrupt_errors(path).raise(what);
}

constexpr const char* kNoun = "cache state file";

// Splits "L.<index>.<rest>" into (index, rest); nullopt unless it has that form with a
// non-empty rest.
std::optional<std::pair<std::size_t, std::string>> split_layer_key(const std::string& key) {
  if (key.rfind("L.", 0) != 0) return std::nullopt;
  const std::size_t dot = key.find('.', 2);
  if (dot == std::string::npos || dot + 1 >= key.size()) return std::nullopt;
  const auto index = safetensors::parse_index(std::string_view(key).substr(2, dot - 2));
  if (!index) return std::nullopt;
  return std::make_pair(*index, key.substr(dot + 1));
}

// A parsed entry and the layer and in-layer name its key "L.<layer>.<name>" gives it.
struct TensorEntry : safetensors::Entry {
  std::size_t layer;
  std::string name;
};

TensorEntry parse_tensor_entry(const std::filesystem::path& path, const std::string& key, const json& entry,
                               std::size_t layer_count, std::uint64_t data_size) {
  const auto split = split_layer_key(key);
  if (!split) corrupt(path, cat("header key \"", key, "\" is neither __metadata__ nor L.<layer>.<tensor>"));
  if (split->first >= layer_count)
    corrupt(path, cat("tensor \"", key, "\" names layer ", split->first, " but the file has ", layer_count, " layers"));
  return {safetensors::parse_entry(key, entry, data_size, corrupt_errors(path)), split->first, split->second};
}

// Reads __metadata__ into layer classes/meta and user metadata; returns the layer count.
std::size_t parse_metadata(const std::filesystem::path& path, const json& header, LoadedStates& out) {
  const json& meta = safetensors::metadata(header, "the header has no __metadata__", corrupt_errors(path));

  const auto format = meta.find(kFormatKey);
  if (format == meta.end()) corrupt(path, cat("metadata has no ", kFormatKey, " (not a kvlab cache state file)"));
  if (format->get<std::string>() != kStateFileFormat)
    corrupt(path,
            cat("format is \"", format->get<std::string>(), "\", this reader accepts \"", kStateFileFormat, "\""));
  const auto layers = meta.find(kLayersKey);
  if (layers == meta.end()) corrupt(path, cat("metadata has no ", kLayersKey));
  const auto count = safetensors::parse_index(layers->get<std::string>());
  // Every layer needs its own "L.<i>.class" entry, so a count above the number of
  // entries is a lie; checking it first bounds the allocation below by the header size.
  if (!count || *count > meta.size())
    corrupt(path, cat(kLayersKey, " is \"", layers->get<std::string>(), "\", not a layer count"));
  out.layers.resize(*count);

  for (const auto& [key, value] : meta.items()) {
    if (key == kFormatKey || key == kLayersKey) continue;
    if (key.rfind(kUserPrefix, 0) == 0) {
      out.user_metadata.emplace(key.substr(kUserPrefix.size()), value.get<std::string>());
      continue;
    }
    const auto split = split_layer_key(key);
    if (!split) corrupt(path, cat("unknown metadata key \"", key, "\""));
    if (split->first >= *count)
      corrupt(path, cat("metadata \"", key, "\" names layer ", split->first, " but the file has ", *count, " layers"));
    CacheState& layer = out.layers[split->first];
    if (split->second == "class") {
      layer.class_name = value.get<std::string>();
    } else if (split->second.rfind("meta.", 0) == 0) {
      layer.meta.emplace(split->second.substr(5), value.get<std::string>());
    } else {
      corrupt(path, cat("unknown metadata key \"", key, "\""));
    }
  }
  for (std::size_t i = 0; i < *count; ++i)
    if (out.layers[i].class_name.empty())
      corrupt(path, cat("layer ", i, " has no class name (", layer_prefix(i), "class)"));
  return *count;
}

}  // namespace

void save_cache_states(const std::filesystem::path& path, const std::vector<CacheState>& layers,
                       const std::map<std::string, std::string>& user_metadata) {
  // Everything that can be rejected is rejected before the file system is touched.
  std::vector<PlannedTensor> planned;
  const std::string header = build_header(layers, user_metadata, planned);
  unsigned char length[8];
  safetensors::encode_length(header.size(), length);

  safetensors::TempFile tmp(path, kNoun);
  tmp.write(length, sizeof length);
  tmp.write(header.data(), header.size());
  for (const PlannedTensor& t : planned)
    safetensors::write_tensor_bytes(tmp, *t.tensor);
  tmp.commit();
}

std::optional<std::uint64_t> defer_above(TensorLoad load) {
  switch (load) {
    case TensorLoad::eager: return std::nullopt;
    case TensorLoad::deferred: return safetensors::kDeferAboveBytes;
    case TensorLoad::deferred_all: return 0;
  }
  return std::nullopt;
}

LoadedStates load_cache_states(const std::filesystem::path& path, TensorLoad load) {
  const auto file = std::make_shared<const safetensors::InputFile>(path, kNoun, corrupt_errors(path));
  const safetensors::Header parsed = safetensors::read_header(*file, corrupt_errors(path));
  const json& header = parsed.json;
  const std::uint64_t data_start = parsed.data_start, data_size = parsed.data_size;

  LoadedStates out;
  const std::size_t layer_count = parse_metadata(path, header, out);

  std::vector<TensorEntry> entries;
  for (const auto& [key, entry] : header.items())
    if (key != kMetadataKey) entries.push_back(parse_tensor_entry(path, key, entry, layer_count, data_size));

  std::vector<const safetensors::Entry*> ranges;
  for (const TensorEntry& t : entries) ranges.push_back(&t);
  safetensors::require_tiling(std::move(ranges), data_size, corrupt_errors(path));

  for (const TensorEntry& t : entries)
    out.layers[t.layer].tensors.emplace(t.name,
                                        safetensors::read_entry(file, data_start, t, defer_above(load)));
  return out;
}

}  // namespace kvlab
