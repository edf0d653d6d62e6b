// The model weights file: plain safetensors, F32 only, as mlx.core.load reads it and
// as the strict primitives of core/safetensors*.h check it.
#include "core/safetensors.h"
#include "core/safetensors_file.h"
#include "golden/model/model_internal.h"

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
  for (const auto& [name, t] : tensors)
    KVLAB_REQUIRE(t.dtype() == DType::f32, dtype_mismatch, noun, ": tensor \"", name, "\" is ",
                  dtype_name(t.dtype()), ", only F32 is written");
  // Tensors in name order, no metadata: the bytes depend on nothing but the tensors.
  safetensors::write_tensor_file(path, noun, {tensors, {}});
  return sha256_file(path);
}

std::map<std::string, Tensor> read_f32_safetensors(const std::filesystem::path& path, const std::string& noun) {
  const safetensors::FileErrors errors = weights_errors(path, noun);
  // mlx writes {"format": "mlx"} as metadata; nothing in it matters here.
  safetensors::TensorFile file = safetensors::read_tensor_file(path, noun, errors, kMaxWeightsBytes);
  for (const auto& [key, t] : file.tensors)
    if (t.dtype() != DType::f32)
      errors.raise(cat("tensor \"", key, "\" is ", safetensors::dtype_code(t.dtype()), "; model weights must be F32"));
  return std::move(file.tensors);
}

}  // namespace kvlab::golden::detail
