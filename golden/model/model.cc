#include <algorithm>
#include <fstream>
#include <sstream>

#include "cache/batch_kv_cache.h"
#include "cache/batch_rotating_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "golden/files/inputs.h"
#include "golden/model/model_internal.h"
#include "reference/rope.h"
#include "reference/sdpa.h"

namespace kvlab::golden {

namespace detail {

// ---- config ----------------------------------------------------------------------------

ConfigReader::ConfigReader(const json& config) : config_(config) {
  KVLAB_REQUIRE(config.is_object(), invalid_argument, "model config is not a JSON object");
}

void ConfigReader::bad(const char* key, const std::string& why) const {
  fail(ErrorKind::invalid_argument, cat("config key \"", key, "\" ", why));
}

void ConfigReader::unsupported(const char* key, const std::string& why) const {
  fail(ErrorKind::unsupported, cat("config key \"", key, "\" ", why));
}

bool ConfigReader::has(const char* key) const {
  const auto it = config_.find(key);
  return it != config_.end() && !it->is_null();
}

const json& ConfigReader::at(const char* key) const {
  if (!has(key)) bad(key, "is missing");
  return config_.at(key);
}

std::int64_t ConfigReader::integer(const char* key) const {
  const json& v = at(key);
  if (!v.is_number_integer()) bad(key, cat("is ", v.dump(), ", expected an integer"));
  return v.get<std::int64_t>();
}

std::int64_t ConfigReader::integer(const char* key, std::int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

std::int64_t ConfigReader::positive(const char* key) const {
  const std::int64_t v = integer(key);
  // Bounded so that products of dimensions stay far from overflow.
  if (v <= 0 || v > (1 << 24)) bad(key, cat("is ", v, ", expected a positive size up to 2^24"));
  return v;
}

double ConfigReader::number(const char* key) const {
  const json& v = at(key);
  if (!v.is_number()) bad(key, cat("is ", v.dump(), ", expected a number"));
  return v.get<double>();
}

double ConfigReader::number(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }

bool ConfigReader::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = config_.at(key);
  if (!v.is_boolean()) bad(key, cat("is ", v.dump(), ", expected true or false"));
  return v.get<bool>();
}

std::string ConfigReader::string(const char* key) const {
  const json& v = at(key);
  if (!v.is_string()) bad(key, cat("is ", v.dump(), ", expected a string"));
  return v.get<std::string>();
}

std::vector<LayerKind> ConfigReader::layer_kinds(const char* key, std::int64_t layers) const {
  const json& v = at(key);
  if (!v.is_array() || static_cast<std::int64_t>(v.size()) != layers)
    bad(key, cat("must be an array of num_hidden_layers = ", layers, " entries"));
  std::vector<LayerKind> kinds;
  for (const json& e : v) {
    if (e == "full_attention") kinds.push_back(LayerKind::full);
    else if (e == "sliding_attention") kinds.push_back(LayerKind::sliding);
    else bad(key, cat("has the unsupported entry ", e.dump()));
  }
  return kinds;
}

ParamList parameters_of(const json& config) {
  const std::string type = ConfigReader(config).string("model_type");
  if (type == "llama") return llama_parameters(config);
  if (type == "gemma4_text") return gemma4_parameters(config);
  fail(ErrorKind::unsupported, cat("config key \"model_type\" is \"", type, "\"; supported: llama, gemma4_text"));
}

// ---- weights ---------------------------------------------------------------------------

Weights::Weights(const ParamList& expected, std::map<std::string, Tensor> weights) : map_(std::move(weights)) {
  std::map<std::string, Shape> want(expected.begin(), expected.end());
  for (const auto& [name, shape] : want) {
    const auto it = map_.find(name);
    KVLAB_REQUIRE(it != map_.end(), invalid_argument, "weight \"", name, "\" ", shape_str(shape), " is missing");
    KVLAB_REQUIRE(it->second.dtype() == DType::f32, dtype_mismatch, "weight \"", name, "\" is ",
                  dtype_name(it->second.dtype()), ", expected f32");
    KVLAB_REQUIRE(it->second.shape() == shape, shape_mismatch, "weight \"", name, "\" has shape ",
                  shape_str(it->second.shape()), ", expected ", shape_str(shape));
  }
  for (const auto& [name, tensor] : map_)
    KVLAB_REQUIRE(want.count(name) == 1, invalid_argument, "weight \"", name, "\" ", shape_str(tensor.shape()),
                  " is not a parameter of this model");
}

const Tensor* Weights::find(const std::string& name) const {
  const auto it = map_.find(name);
  return it == map_.end() ? nullptr : &it->second;
}

const Tensor& Weights::at(const std::string& name) const {
  const Tensor* t = find(name);
  KVLAB_REQUIRE(t != nullptr, invalid_argument, "no weight named \"", name, "\"");
  return *t;
}

Tensor& Weights::mutable_at(const std::string& name) {
  const auto it = map_.find(name);
  KVLAB_REQUIRE(it != map_.end(), invalid_argument, "no weight named \"", name, "\"");
  return it->second;
}

// ---- host rows ↔ backend heads ---------------------------------------------------------

DTensor to_heads(Backend& backend, const dense::Mat& x, std::int64_t B, std::int64_t L, std::int64_t heads) {
  KVLAB_REQUIRE(x.rows == B * L && x.width % heads == 0, shape_mismatch, "to_heads: rows (", x.rows, ", ", x.width,
                ") for B ", B, ", L ", L, ", ", heads, " heads");
  const std::int64_t D = x.width / heads;
  Tensor t(DType::f32, {B, heads, L, D});
  auto* out = reinterpret_cast<float*>(t.data());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t h = 0; h < heads; ++h)
        std::copy_n(x.row(b * L + l) + h * D, D, out + ((b * heads + h) * L + l) * D);
  return backend.upload(t);
}

dense::Mat from_heads(Backend& backend, const DTensor& t) {
  KVLAB_REQUIRE(t.shape.size() == 4 && t.dtype == DType::f32, shape_mismatch, "from_heads: ", shape_str(t.shape));
  const std::int64_t B = t.shape[0], H = t.shape[1], L = t.shape[2], D = t.shape[3];
  const Tensor host = backend.download(t);
  const auto* in = reinterpret_cast<const float*>(host.data());
  dense::Mat x(B * L, H * D);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t h = 0; h < H; ++h) std::copy_n(in + ((b * H + h) * L + l) * D, D, x.row(b * L + l) + h * D);
  return x;
}

dense::Mat last_rows(const dense::Mat& x, std::int64_t B, std::int64_t L) {
  dense::Mat out(B, x.width);
  for (std::int64_t b = 0; b < B; ++b) std::copy_n(x.row(b * L + L - 1), x.width, out.row(b));
  return out;
}

Tensor last_positions(const dense::Mat& x, std::int64_t B, std::int64_t L) {
  const dense::Mat rows = last_rows(x, B, L);
  return Tensor::from_values(DType::f32, {B, x.width}, rows.v);
}

void check_call(const Model& model, std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t L,
                std::span<Cache* const> caches) {
  KVLAB_REQUIRE(B > 0 && L > 0 && static_cast<std::int64_t>(tokens.size()) == B * L, shape_mismatch, "forward got ",
                tokens.size(), " tokens for B ", B, ", L ", L);
  const auto& layers = model.layers();
  KVLAB_REQUIRE(caches.size() == layers.size(), invalid_argument, "forward got ", caches.size(), " caches for ",
                layers.size(), " layers");
  for (std::size_t l = 0; l < layers.size(); ++l)
    KVLAB_REQUIRE((caches[l] != nullptr) == layers[l].owns_cache, invalid_argument, "layer ", l,
                  layers[l].owns_cache ? " owns a cache but got none" : " is KV-shared but got a cache");
}

std::vector<float> cell_attention(const cells::CellKVCache& cache, int layer, int seq, std::int32_t pos, int window,
                                  std::span<const float> q, std::int64_t heads, std::int64_t kv_heads,
                                  std::int64_t head_dim, const RopeParams& rope, float scale) {
  const auto seen = cache.visible(seq, pos, window);
  const auto N = static_cast<std::int64_t>(seen.size());
  KVLAB_REQUIRE(N > 0, internal, "cell attention: sequence ", seq, " at ", pos, " sees no cell (not even its own)");
  // Each key as its own batch row, rotated at the position its sequence holds it at.
  Tensor k(DType::f32, Shape{N, kv_heads, 1, head_dim});
  Tensor v(DType::f32, Shape{1, kv_heads, N, head_dim});
  std::vector<std::int64_t> at(static_cast<std::size_t>(N));
  float* kp = k.storage<float>().data();
  float* vp = v.storage<float>().data();
  for (std::int64_t n = 0; n < N; ++n) {
    const auto& e = seen[static_cast<std::size_t>(n)];
    at[static_cast<std::size_t>(n)] = e.pos;
    const auto kr = cache.k_raw(layer, e.cell);
    const auto vr = cache.v(layer, e.cell);
    std::copy(kr.begin(), kr.end(), kp + n * kv_heads * head_dim);
    for (std::int64_t h = 0; h < kv_heads; ++h)
      std::copy_n(vr.data() + h * head_dim, head_dim, vp + (h * N + n) * head_dim);
  }
  const Tensor k_rot = ref::rope(k, rope, Tensor::from_ints(DType::i32, Shape{N}, at));
  Tensor keys(DType::f32, Shape{1, kv_heads, N, head_dim});
  const float* kr = k_rot.storage<float>().data();
  float* dst = keys.storage<float>().data();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < kv_heads; ++h)
      std::copy_n(kr + (n * kv_heads + h) * head_dim, head_dim, dst + (h * N + n) * head_dim);
  const Tensor qt = Tensor::from_values(DType::f32, Shape{1, heads, 1, head_dim}, q);
  AttentionParams params;
  params.scale = scale;
  const Tensor out = ref::sdpa(ref::rope(qt, rope, pos), keys, v, params);
  const float* o = out.storage<float>().data();
  return {o, o + heads * head_dim};
}

}  // namespace detail

// ---- Model -----------------------------------------------------------------------------

std::vector<CellOutput> Model::forward_cells(std::span<const CellToken>, cells::CellKVCache&) const {
  fail(ErrorKind::unsupported, cat("model_type ", model_type(), " has no forward over a cell cache"));
}

std::unique_ptr<Model> Model::create(const nlohmann::json& config, std::map<std::string, Tensor> weights) {
  const std::string type = detail::ConfigReader(config).string("model_type");
  if (type == "llama") return detail::make_llama(config, std::move(weights));
  if (type == "gemma4_text") return detail::make_gemma4(config, std::move(weights));
  fail(ErrorKind::unsupported, cat("config key \"model_type\" is \"", type, "\"; supported: llama, gemma4_text"));
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "config.json";
  // A config is a few hundred bytes; a megabyte bounds what a damaged file can make us read.
  constexpr std::uintmax_t kMaxConfigBytes = 1u << 20;
  require_regular_file(config_path, "model config");
  require_regular_file(dir / "model.safetensors", "model weights file");
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(config_path, ec);
  KVLAB_REQUIRE(!ec, io, "cannot read '", config_path.string(), "': ", ec.message());
  KVLAB_REQUIRE(size <= kMaxConfigBytes, corrupt, "'", config_path.string(), "' is ", size,
                " bytes, more than a model config can be (", kMaxConfigBytes, ")");
  std::ifstream in(config_path, std::ios::binary);
  KVLAB_REQUIRE(in, io, "cannot open '", config_path.string(), "'");
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::corrupt, cat("'", config_path.string(), "' is not valid JSON: ", e.what()));
  }
  auto weights = detail::read_f32_safetensors(dir / "model.safetensors", "model weights file");
  try {
    return create(config, std::move(weights));
  } catch (const Error& e) {
    fail(e.kind(), cat("model '", dir.string(), "': ", e.message()));
  }
}

std::vector<std::unique_ptr<Cache>> make_caches(const Model& model, Backend& backend,
                                                std::span<const std::int32_t> left_padding) {
  std::vector<std::unique_ptr<Cache>> caches;
  const std::vector<std::int32_t> pad(left_padding.begin(), left_padding.end());
  for (const LayerInfo& info : model.layers()) {
    if (!info.owns_cache) caches.emplace_back();
    else if (info.kind == LayerKind::full && pad.empty()) caches.push_back(std::make_unique<KVCache>(backend));
    else if (info.kind == LayerKind::full) caches.push_back(std::make_unique<BatchKVCache>(backend, pad));
    else if (pad.empty()) caches.push_back(std::make_unique<RotatingKVCache>(backend, model.sliding_window(), 0));
    else caches.push_back(std::make_unique<BatchRotatingKVCache>(backend, model.sliding_window(), pad));
  }
  return caches;
}

std::vector<Cache*> cache_pointers(const std::vector<std::unique_ptr<Cache>>& caches) {
  std::vector<Cache*> out;
  for (const auto& c : caches) out.push_back(c.get());
  return out;
}

}  // namespace kvlab::golden
