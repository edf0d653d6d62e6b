// The model weights file: plain safetensors, F32 only, as mlx.core.load reads it and
// as the strict primitives of core/safetensors*.h check it.
#include <cstring>

#include "core/safetensors.h"
#include "core/safetensors_file.h"
#include "golden/model_internal.h"

namespace kvlab::golden::detail {

namespace {

// The tiny models are well under a megabyte; 1 GiB leaves room for larger experiments
// and still refuses a size that only a damaged or hostile file would claim.
constexpr std::uint64_t kMaxWeightsBytes = 1ull << 30;

safetensors::FileErrors weights_errors(const std::filesystem::path& path, const std::string& noun) {
  return {ErrorKind::corrupt, cat(noun, " '", path.string(), "' is corrupt: "), "data region", ')', "gap",
          "trailing bytes", "has unknown dtype ", ""};
}

}  // namespace

std::string write_f32_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                                  const std::string& noun) {
  // nlohmann's default object is a std::map, so the header lists keys in sorted order,
  // the same order as the data below: the bytes depend on nothing but the tensors.
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t cursor = 0;
  for (const auto& [name, t] : tensors) {
    KVLAB_REQUIRE(t.dtype() == DType::f32, dtype_mismatch, noun, ": tensor \"", name, "\" is ",
                  dtype_name(t.dtype()), ", only F32 is written");
    const std::uint64_t bytes = t.nbytes();
    header[name] = {{"dtype", "F32"}, {"shape", t.shape()}, {"data_offsets", {cursor, cursor + bytes}}};
    cursor += bytes;
  }
  std::string text = header.dump();
  safetensors::pad_header(text);
  unsigned char length[8];
  safetensors::encode_length(text.size(), length);

  Sha256 hash;
  safetensors::TempFile tmp(path, noun);
  const auto put = [&](const void* data, std::size_t size) {
    tmp.write(data, size);
    hash.update(data, size);
  };
  put(length, sizeof length);
  put(text.data(), text.size());
  for (const auto& [name, t] : tensors) put(t.data(), t.nbytes());
  tmp.commit();
  return hash.hex();
}

std::map<std::string, Tensor> read_f32_safetensors(const std::filesystem::path& path, const std::string& noun) {
  const safetensors::FileErrors errors = weights_errors(path, noun);
  const safetensors::InputFile file(path, noun, errors);
  KVLAB_REQUIRE(file.size() <= kMaxWeightsBytes, corrupt, noun, " '", path.string(), "' is ", file.size(),
                " bytes, over the limit of ", kMaxWeightsBytes);
  const safetensors::Header h = safetensors::read_header(file, errors);
  std::vector<safetensors::Entry> entries;
  for (const auto& [key, entry] : h.json.items()) {
    if (key == safetensors::kMetadataKey) continue;  // mlx writes {"format": "mlx"}; nothing in it matters here
    entries.push_back(safetensors::parse_entry(key, entry, h.data_size, errors));
    if (entries.back().dtype != DType::f32)
      errors.raise(cat("tensor \"", key, "\" is ", safetensors::dtype_code(entries.back().dtype),
                       "; model weights must be F32"));
  }
  std::vector<const safetensors::Entry*> ranges;
  for (const auto& e : entries) ranges.push_back(&e);
  safetensors::require_tiling(std::move(ranges), h.data_size, errors);

  std::map<std::string, Tensor> out;
  for (const auto& e : entries) {
    Tensor t(DType::f32, e.shape);
    if (e.end > e.begin) file.read(h.data_start + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
    out.emplace(e.key, std::move(t));
  }
  return out;
}

}  // namespace kvlab::golden::detail
