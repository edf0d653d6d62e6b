// What golden/model/model.cc, llama.cc, gemma4_text.cc and tiny_model_writer.cc share: config
// reading that names the key, the expected parameter list of an architecture, the
// weight store, and the hop between host rows and the backend's (B, H, L, D) tensors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden/model/dense.h"
#include "golden/model/model.h"
#include "kvlab/backend.h"
#include "kvlab/tensor.h"

namespace kvlab::golden::detail {

using json = nlohmann::json;

// Reads config keys the way mlx-lm's dataclasses do (a missing key takes the default
// the class declares; a JSON null is the same as missing for Optional fields); a key of
// the wrong type or out of range is Error(invalid_argument) naming it.
class ConfigReader {
 public:
  explicit ConfigReader(const json& config);
  bool has(const char* key) const;  // present and not null
  std::int64_t integer(const char* key) const;  // required
  std::int64_t integer(const char* key, std::int64_t fallback) const;
  std::int64_t positive(const char* key) const;  // required, > 0
  double number(const char* key) const;
  double number(const char* key, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key) const;
  const json& at(const char* key) const;  // required, any type
  // "layer_types": sliding_attention / full_attention, exactly `layers` entries.
  std::vector<LayerKind> layer_kinds(const char* key, std::int64_t layers) const;
  [[noreturn]] void bad(const char* key, const std::string& why) const;          // invalid_argument
  [[noreturn]] void unsupported(const char* key, const std::string& why) const;  // unsupported

 private:
  const json& config_;
};

// Parameter names and shapes exactly as mlx-lm's tree_flatten(model.parameters()) lists them.
using ParamList = std::vector<std::pair<std::string, Shape>>;
ParamList llama_parameters(const json& config);
ParamList gemma4_parameters(const json& config);
ParamList parameters_of(const json& config);  // by model_type

std::unique_ptr<Model> make_llama(const json& config, std::map<std::string, Tensor> weights);
std::unique_ptr<Model> make_gemma4(const json& config, std::map<std::string, Tensor> weights);

// The weights of one model, checked once against its ParamList: every name present,
// f32, with its shape, and nothing else (Error naming the first culprit).
class Weights {
 public:
  Weights(const ParamList& expected, std::map<std::string, Tensor> weights);
  const Tensor& at(const std::string& name) const;
  const Tensor* find(const std::string& name) const;  // nullptr when absent
  Tensor& mutable_at(const std::string& name);

 private:
  std::map<std::string, Tensor> map_;
};

// The model's attention plumbing: host rows (B·L, H·D) ↔ backend (B, H, L, D) f32.
DTensor to_heads(Backend& backend, const dense::Mat& x, std::int64_t B, std::int64_t L, std::int64_t heads);
dense::Mat from_heads(Backend& backend, const DTensor& t);
// Row L-1 of each of the B rows of x (B·L, W) as a (B, W) tensor.
Tensor last_positions(const dense::Mat& x, std::int64_t B, std::int64_t L);
dense::Mat last_rows(const dense::Mat& x, std::int64_t B, std::int64_t L);
// Attention of token t of a cell-cache call (Model::forward_cells): q (one row, heads·D,
// before RoPE) of sequence `seq` at `pos` over the cells the sequence holds at positions
// ≤ pos (and within `window` when > 0) in `layer`, every key rotated at its held position,
// through the reference rope and sdpa. Returns the (heads·D) output row.
std::vector<float> cell_attention(const cells::CellKVCache& cache, int layer, int seq, std::int32_t pos, int window,
                                  std::span<const float> q, std::int64_t heads, std::int64_t kv_heads,
                                  std::int64_t head_dim, const RopeParams& rope, float scale);
// Checks the call's shapes and that every layer has a cache exactly when it owns one.
void check_call(const Model& model, std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t L,
                std::span<Cache* const> caches);

// An F32 safetensors file of `tensors` (keys in sorted order, no metadata), written
// atomically; returns the SHA-256 of the bytes written. `noun` names the file in errors.
std::string write_f32_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                                  const std::string& noun);
// Reads such a file (any float dtype refused but F32; sizes bounded); Error names the file.
std::map<std::string, Tensor> read_f32_safetensors(const std::filesystem::path& path, const std::string& noun);

}  // namespace kvlab::golden::detail
