// The deterministic weights of a tiny golden model (golden/README.md "Models").
//
// Element i of tensor `name` is u·scale with u = ((bits(i) >> 40) − 2^23)·2^-23, bits
// from harness::CounterRng(id + ":" + kvlab_seed, name): 24 random bits, so u is exact
// in f32 and lies in [-1, 1); scale is a power of two, so u·scale is exact too. Norm
// weights are 1 + u/4 (exact in double, rounded once to f32 by IEEE round-to-nearest-
// even), layer_scalar is 1. No libm call is involved, so every compiler writes the same
// bytes; the file's SHA-256 is checked in next to the config.
//
// Scales (chosen so that greedy decoding of a 13-token prompt neither collapses onto one
// token nor sits on near-ties; see tests/golden/test_model.cc):
//   linear weights (out, in): 4 / 2^e with 4^e the smallest power of 4 >= in, i.e.
//     about 4/√in, so each projection keeps activations O(1);
//   embed_tokens: 2^-2 for llama; 2^-4 for gemma4_text, whose embeddings enter the
//     residual multiplied by √hidden = 8 (with tied embeddings a larger embedding makes
//     the model copy its input token forever);
//   embed_tokens_per_layer: 1.
#include <bit>
#include <fstream>

#include "core/safetensors_file.h"
#include "golden/model/model_internal.h"
#include "harness/rng.h"

namespace kvlab::golden {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Fill : std::uint8_t { scaled, norm, one };

struct Rule {
  Fill fill = Fill::scaled;
  float scale = 1.0f;
};

Rule rule_for(const std::string& model_type, const std::string& name, const Shape& shape) {
  if (ends_with(name, "layer_scalar")) return {Fill::one, 1.0f};
  if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight")) return {Fill::norm, 1.0f};
  if (name == "model.embed_tokens_per_layer.weight") return {Fill::scaled, 1.0f};
  if (name == "model.embed_tokens.weight") return {Fill::scaled, model_type == "llama" ? 0x1p-2f : 0x1p-4f};
  KVLAB_REQUIRE(shape.size() == 2, internal, "no weight rule for \"", name, "\" ", shape_str(shape));
  int e = 0;
  while ((std::int64_t{1} << (2 * e)) < shape[1]) ++e;
  return {Fill::scaled, 4.0f / static_cast<float>(std::int64_t{1} << e)};
}

Tensor make_weight(const harness::CounterRng& rng, const Rule& rule, const Shape& shape) {
  Tensor t(DType::f32, shape);
  auto* out = reinterpret_cast<float*>(t.data());
  const auto n = static_cast<std::uint64_t>(t.numel());
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int64_t>(rng.bits(i) >> 40) - (std::int64_t{1} << 23);
    const double u = static_cast<double>(k) * 0x1p-23;
    switch (rule.fill) {
      case Fill::one: out[i] = 1.0f; break;
      case Fill::norm: out[i] = static_cast<float>(1.0 + u / 4.0); break;
      case Fill::scaled: out[i] = static_cast<float>(u * static_cast<double>(rule.scale)); break;
    }
  }
  return t;
}

}  // namespace

std::string write_tiny_model(const nlohmann::json& config, const std::string& id, const std::filesystem::path& dir) {
  const detail::ConfigReader c(config);
  const std::int64_t seed = c.integer("kvlab_seed");
  const std::string model_type = c.string("model_type");
  const detail::ParamList params = detail::parameters_of(config);  // also validates the config

  std::map<std::string, Tensor> tensors;
  const std::string line = id + ":" + std::to_string(seed);
  for (const auto& [name, shape] : params)
    tensors.emplace(name, make_weight(harness::CounterRng(line, name), rule_for(model_type, name, shape), shape));

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KVLAB_REQUIRE(!ec, io, "cannot create the model directory '", dir.string(), "': ", ec.message());
  {
    const std::string text = config.dump(2) + "\n";
    safetensors::TempFile tmp(dir / "config.json", "model config");
    tmp.write(text.data(), text.size());
    tmp.commit();
  }
  return detail::write_f32_safetensors(dir / "model.safetensors", tensors, "model weights file");
}

}  // namespace kvlab::golden
