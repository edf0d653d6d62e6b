// The forward pass of the tiny golden models (golden/README.md), written as plainly as
// the reference: the dense parts (embedding, norms, projections, MLP, logits) are host
// loops in f32 storage with double accumulation; every attention goes through kvlab's
// caches and attend() / attend_shared() on the caches' backend, so the same model runs
// on any backend and a cache bug shows up in the logits.
//
// Architectures as mlx-lm 0.32.2 defines them (mlx_lm/models/llama.py, gemma4_text.py):
// parameter names, shapes and the order of operations follow those files.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/cache.h"
#include "cache/cell_kv_cache.h"
#include "kvlab/tensor.h"

namespace kvlab::golden {

enum class LayerKind : std::uint8_t { full, sliding };

// What the runner needs to know about one layer to build its cache.
struct LayerInfo {
  LayerKind kind = LayerKind::full;
  bool owns_cache = true;   // false: a KV-shared layer (gemma4_text), reads `producer`'s
  int producer = -1;        // the layer whose cache a shared layer reads; its own index otherwise
  std::int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
};

// One forward call's record: logits and per-layer attention outputs at the LAST
// position of every row (rows are left-padded, so that is column L-1 for all of them).
struct ForwardRecord {
  Tensor logits;                  // (B, vocab) f32
  std::vector<Tensor> attention;  // per layer: (B, n_heads * head_dim) f32, the o_proj input
};

// One token of a call over a cell cache (llama.cpp's batch entry): its id, position,
// sequence, and whether its outputs are recorded.
struct CellToken {
  std::int32_t token = 0;
  std::int32_t pos = 0;
  int seq = 0;
  bool output = false;
};
// The outputs of one recorded token: logits and per layer the attention output (o_proj input).
struct CellOutput {
  std::vector<float> logits;
  std::vector<std::vector<float>> attention;
};

class Model {
 public:
  virtual ~Model() = default;

  // The model of `dir`: config.json + model.safetensors (F32). Throws kvlab::Error naming
  // the file and the bad key / tensor for anything malformed, unsupported or missing.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);
  // The same from an already-parsed config and weights (tests perturb either).
  static std::unique_ptr<Model> create(const nlohmann::json& config, std::map<std::string, Tensor> weights);

  virtual std::string_view model_type() const = 0;  // "llama" | "gemma4_text"
  virtual std::int64_t vocab_size() const = 0;
  virtual int sliding_window() const = 0;           // 0 when the model has no sliding layers
  virtual const std::vector<LayerInfo>& layers() const = 0;

  // One call: tokens (B, L) row-major. `caches` has one entry per layer: the layer's
  // cache for layers that own one, nullptr for KV-shared layers. Caches of one call share
  // B; each row's positions are its cache's offsets (left padding is the caches' concern).
  virtual ForwardRecord forward(std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t L,
                                std::span<Cache* const> caches) const = 0;

  // One call over a cell cache (cache/cell_kv_cache.h, docs/semantics.md §Cell cache):
  // each token's K (before RoPE) and V become a new cell its sequence holds at its
  // position; then each token attends to what its sequence holds at positions ≤ its own
  // (sliding layers: within the window), keys rotated at the positions held now. The
  // outputs of the tokens marked output, in batch order. The dense parts are forward()'s.
  // A model without it throws unsupported.
  virtual std::vector<CellOutput> forward_cells(std::span<const CellToken> batch, cells::CellKVCache& cache) const;
  // Mutable weights by mlx-lm name, for perturbation tests; throws naming unknown names.
  virtual Tensor& weight(const std::string& name) = 0;
};

// Writes the model of `config` (which holds "kvlab_seed") to `dir`: config.json as given
// and model.safetensors with deterministic weights (see golden/README.md). Returns the
// SHA-256 (hex) of model.safetensors.
std::string write_tiny_model(const nlohmann::json& config, const std::string& id, const std::filesystem::path& dir);

// SHA-256 of a file, lowercase hex.
std::string sha256_file(const std::filesystem::path& path);
// SHA-256 of bytes in memory, lowercase hex.
std::string sha256_hex(std::string_view bytes);

// Incremental SHA-256 (FIPS 180-4): update() any number of times, then hex() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  std::string hex();  // finishes the hash; the object is spent afterwards

 private:
  void block(const unsigned char* p);
  std::array<std::uint32_t, 8> state_;
  std::array<unsigned char, 64> buffer_{};
  std::size_t used_ = 0;
  std::uint64_t length_ = 0;
};

// The caches of mlx-lm's make_cache for `model` on `backend`: KVCache for full layers,
// RotatingKVCache(sliding_window, keep 0) for sliding ones, nullptr for KV-shared layers.
// With `left_padding` (one entry per row): BatchKVCache / BatchRotatingKVCache instead.
std::vector<std::unique_ptr<Cache>> make_caches(const Model& model, Backend& backend,
                                                std::span<const std::int32_t> left_padding = {});
// The raw pointers forward() takes.
std::vector<Cache*> cache_pointers(const std::vector<std::unique_ptr<Cache>>& caches);

}  // namespace kvlab::golden
