// mlx-lm 0.32.2's `gemma4_text` (mlx_lm/models/gemma4_text.py), dense variant: sliding
// and full layers (full ones with global_head_dim and proportional partial RoPE),
// q/k RMSNorm and a scale-free v norm per head, attention scale 1, the last
// num_kv_shared_layers layers reading the K/V of the last earlier layer of their type,
// sandwich norms, GeGLU MLP (double width on KV-shared layers), per-layer inputs,
// layer_scalar, tied LM head and a tanh softcap on the logits.
#include <cfloat>
#include <cmath>
#include <optional>

#include "cache/attend.h"
#include "golden/model/model_internal.h"

namespace kvlab::golden::detail {

namespace {

using dense::Mat;

struct Layer {
  LayerInfo info;
  bool has_kv = true;
  std::int64_t intermediate = 0;
  RopeParams rope;
};

struct GemmaConfig {
  std::int64_t hidden = 0, n_layers = 0, heads = 0, kv_heads = 0, vocab = 0, vocab_ple = 0, ple = 0, shared = 0;
  float eps = 0;
  int window = 0;
  bool tied = true;
  std::optional<float> softcap;
  std::vector<Layer> layers;
};

// RoPE of one layer type from rope_parameters[layer_key] (initialize_rope): "default"
// rotates all head_dim features; "proportional" (ProportionalRoPE) rotates the first
// rotated/2 pairs (i, i + head_dim/2) with wavelengths factor·base^(2i/head_dim) and
// leaves the rest. mlx gives the rest +inf wavelengths (angle 0); kvlab's RoPE accepts
// only finite ones, so they get FLT_MAX: the angle is ~1e-38·position, whose cosine is 1
// and whose sine term x2·θ vanishes in the rounding of x1 (|x1| ≫ 1e-30), so the
// features pass unchanged while the pairing (i, i + head_dim/2) stays mlx's.
RopeParams rope_for(const ConfigReader& c, const json& params, std::int64_t head_dim, bool traditional) {
  if (!params.is_object()) c.bad("rope_parameters", "entries must be objects");
  const auto num = [&](const char* key, double fallback) {
    const auto it = params.find(key);
    if (it == params.end() || it->is_null()) return fallback;
    if (!it->is_number()) c.bad("rope_parameters", cat("has non-numeric ", key));
    return it->get<double>();
  };
  json type = "default";
  if (params.contains("type") && !params["type"].is_null()) type = params["type"];
  else if (params.contains("rope_type")) type = params["rope_type"];
  const double base = num("rope_theta", 10000.0);
  if (!(base > 0.0 && std::isfinite(base))) c.bad("rope_parameters", "has a rope_theta that is not positive");
  if (head_dim % 2 != 0) c.bad("head_dim", "must be even for RoPE");
  RopeParams rope;
  rope.dims = static_cast<int>(head_dim);
  rope.traditional = traditional;
  rope.base = static_cast<float>(base);
  if (type == "default") return rope;
  if (type != "proportional")
    c.unsupported("rope_parameters", cat("has rope type ", type.dump(), "; supported: default, proportional"));
  // int(dims * partial_rotary_factor), as Python truncates it.
  const double rotated_f = static_cast<double>(head_dim) * num("partial_rotary_factor", 1.0);
  if (!(rotated_f >= 0.0 && rotated_f <= static_cast<double>(head_dim)))
    c.bad("rope_parameters", "has partial_rotary_factor outside [0, 1]");
  const auto rotated = static_cast<std::int64_t>(rotated_f);
  const auto factor = static_cast<float>(num("factor", 1.0));
  // mlx: exponents = arange(0, rotated, 2, f32) / dims; freqs = factor * base ** exponents (f32).
  for (std::int64_t i = 0; i < rotated; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(head_dim);
    const auto p = static_cast<float>(std::pow(static_cast<double>(rope.base), static_cast<double>(e)));
    rope.freqs.push_back(factor * p);
  }
  rope.freqs.resize(static_cast<std::size_t>(head_dim / 2), FLT_MAX);
  return rope;
}

GemmaConfig parse_gemma(const json& config) {
  const ConfigReader c(config);
  KVLAB_REQUIRE(c.string("model_type") == "gemma4_text", invalid_argument, "config key \"model_type\" is not gemma4_text");
  // Defaults are mlx-lm's ModelArgs defaults.
  GemmaConfig k;
  k.hidden = c.has("hidden_size") ? c.positive("hidden_size") : 1536;
  k.n_layers = c.has("num_hidden_layers") ? c.positive("num_hidden_layers") : 35;
  const std::int64_t intermediate = c.has("intermediate_size") ? c.positive("intermediate_size") : 6144;
  k.heads = c.has("num_attention_heads") ? c.positive("num_attention_heads") : 8;
  const std::int64_t head_dim = c.has("head_dim") ? c.positive("head_dim") : 256;
  // mlx-lm uses global_head_dim only when truthy: 0 or null mean head_dim.
  const std::int64_t global_head_dim =
      config.contains("global_head_dim") && config["global_head_dim"].is_null() ? 0 : c.integer("global_head_dim", 512);
  k.eps = static_cast<float>(c.number("rms_norm_eps", 1e-6));
  if (!(k.eps > 0.0f)) c.bad("rms_norm_eps", "must be positive");
  k.vocab = c.has("vocab_size") ? c.positive("vocab_size") : 262144;
  k.vocab_ple = c.has("vocab_size_per_layer_input") ? c.positive("vocab_size_per_layer_input") : 262144;
  k.kv_heads = c.has("num_key_value_heads") ? c.positive("num_key_value_heads") : 1;
  k.shared = c.integer("num_kv_shared_layers", 20);
  if (k.shared < 0 || k.shared >= k.n_layers) c.bad("num_kv_shared_layers", "must be in [0, num_hidden_layers)");
  k.ple = c.integer("hidden_size_per_layer_input", 256);
  if (k.ple < 0 || k.ple > (1 << 20)) c.bad("hidden_size_per_layer_input", "must be >= 0");
  const std::int64_t window = c.integer("sliding_window", 512);
  if (window <= 0 || window > (1 << 20)) c.bad("sliding_window", "must be positive");
  const bool traditional = c.boolean("rope_traditional", false);
  const bool double_wide = c.boolean("use_double_wide_mlp", true);
  k.tied = c.boolean("tie_word_embeddings", true);
  if (c.boolean("attention_k_eq_v", false)) c.unsupported("attention_k_eq_v", "true is not supported");
  if (c.boolean("enable_moe_block", false)) c.unsupported("enable_moe_block", "true is not supported");
  if (k.heads % k.kv_heads != 0) c.bad("num_key_value_heads", "must divide num_attention_heads");
  // A missing key takes the default 30.0; an explicit null means no softcap.
  if (!config.contains("final_logit_softcapping")) k.softcap = 30.0f;
  else if (c.has("final_logit_softcapping")) k.softcap = static_cast<float>(c.number("final_logit_softcapping"));
  if (k.softcap && !(*k.softcap > 0.0f && std::isfinite(*k.softcap)))
    c.bad("final_logit_softcapping", "must be positive");

  std::vector<LayerKind> kinds;
  if (c.has("layer_types")) {
    kinds = c.layer_kinds("layer_types", k.n_layers);
  } else {  // __post_init__: (pattern-1) sliding then one full, repeated
    const std::int64_t pattern = c.integer("sliding_window_pattern", 5);
    if (pattern <= 0) c.bad("sliding_window_pattern", "must be positive");
    for (std::int64_t l = 0; l < k.n_layers; ++l)
      kinds.push_back(l % pattern == pattern - 1 ? LayerKind::full : LayerKind::sliding);
  }
  json rope_parameters = {
      {"full_attention", {{"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}, {"rope_type", "proportional"}}},
      {"sliding_attention", {{"partial_rotary_factor", 1.0}, {"rope_theta", 10000.0}, {"rope_type", "default"}}}};
  if (c.has("rope_parameters")) rope_parameters = c.at("rope_parameters");
  if (!rope_parameters.is_object()) c.bad("rope_parameters", "is not an object");

  const std::int64_t first_shared = k.n_layers - k.shared;
  std::map<LayerKind, int> last_of_kind;  // Gemma4TextModel.previous_kvs
  for (std::int64_t l = 0; l < k.n_layers; ++l) {
    Layer layer;
    LayerInfo& info = layer.info;
    info.kind = kinds[static_cast<std::size_t>(l)];
    const bool full = info.kind == LayerKind::full;
    info.head_dim = full && global_head_dim > 0 ? global_head_dim : head_dim;
    info.n_heads = k.heads;
    info.n_kv_heads = k.kv_heads;
    layer.has_kv = l < first_shared;
    info.owns_cache = layer.has_kv;
    if (layer.has_kv) {
      info.producer = static_cast<int>(l);
      last_of_kind[info.kind] = static_cast<int>(l);
    } else {
      const auto it = last_of_kind.find(info.kind);
      if (it == last_of_kind.end())
        c.bad("num_kv_shared_layers", cat("makes layer ", l, " share K/V, but no earlier layer has its type"));
      info.producer = it->second;
    }
    layer.intermediate = intermediate * (double_wide && l >= first_shared && first_shared > 0 ? 2 : 1);
    const char* key = full ? "full_attention" : "sliding_attention";
    const json params = rope_parameters.contains(key) ? rope_parameters[key] : json::object();
    layer.rope = rope_for(c, params, info.head_dim, traditional);
    k.layers.push_back(layer);
  }
  if (std::any_of(kinds.begin(), kinds.end(), [](LayerKind x) { return x == LayerKind::sliding; }))
    k.window = static_cast<int>(window);
  return k;
}

std::string lname(std::size_t l, const char* rest) { return cat("model.layers.", l, ".", rest); }

class Gemma4 final : public Model {
 public:
  Gemma4(const json& config, std::map<std::string, Tensor> weights)
      : k_(parse_gemma(config)), w_(gemma4_parameters(config), std::move(weights)) {
    for (const Layer& l : k_.layers) infos_.push_back(l.info);
  }

  std::string_view model_type() const override { return "gemma4_text"; }
  std::int64_t vocab_size() const override { return k_.vocab; }
  int sliding_window() const override { return k_.window; }
  const std::vector<LayerInfo>& layers() const override { return infos_; }
  Tensor& weight(const std::string& name) override { return w_.mutable_at(name); }

  ForwardRecord forward(std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t L,
                        std::span<Cache* const> caches) const override {
    check_call(*this, tokens, B, L, caches);
    ForwardRecord rec;
    // Python float scales meet f32 arrays as f32 scalars (mlx's weak scalar typing).
    const auto f32 = [](double x) { return static_cast<float>(x); };
    Mat h = dense::embedding(tokens, w_.at("model.embed_tokens.weight"));
    dense::scale_by(h, f32(std::sqrt(static_cast<double>(k_.hidden))));
    const Mat ple = per_layer_inputs(tokens, h);
    std::vector<std::optional<AttendResult>> kv(k_.layers.size());
    for (std::size_t l = 0; l < k_.layers.size(); ++l) {
      const Layer& layer = k_.layers[l];
      const LayerInfo& info = layer.info;
      const auto W = [&](const char* rest) -> const Tensor& { return w_.at(lname(l, rest)); };
      const std::int64_t hd = info.head_dim;
      const std::size_t producer = static_cast<std::size_t>(info.producer);
      Backend& be = caches[producer]->backend();

      const Mat x = dense::rms_norm(h, &W("input_layernorm.weight"), k_.eps);
      const Mat q = dense::rms_norm(dense::linear(x, W("self_attn.q_proj.weight")).reshaped(hd),
                                    &W("self_attn.q_norm.weight"), k_.eps)
                        .reshaped(k_.heads * hd);
      AttendOptions opt;
      opt.rope = layer.rope;
      opt.attention.scale = 1.0f;
      opt.window = info.kind == LayerKind::sliding ? k_.window : 0;
      DTensor out;
      if (layer.has_kv) {
        const Mat kk = dense::rms_norm(dense::linear(x, W("self_attn.k_proj.weight")).reshaped(hd),
                                       &W("self_attn.k_norm.weight"), k_.eps)
                           .reshaped(k_.kv_heads * hd);
        const Mat v = dense::rms_norm(dense::linear(x, W("self_attn.v_proj.weight")).reshaped(hd), nullptr, k_.eps)
                          .reshaped(k_.kv_heads * hd);
        kv[l] = attend(*caches[l], to_heads(be, q, B, L, k_.heads), to_heads(be, kk, B, L, k_.kv_heads),
                       to_heads(be, v, B, L, k_.kv_heads), opt);
        out = kv[l]->out;
      } else {
        // The producer's post-update K/V, mask and pre-update offsets (mlx-lm passes
        // (keys, values) and `offset` from intermediates[previous_kvs[l]]).
        out = attend_shared(be, *kv[producer], to_heads(be, q, B, L, k_.heads), opt);
      }
      const Mat attn = from_heads(be, out);
      rec.attention.push_back(last_positions(attn, B, L));
      // Sandwich norms around attention and MLP.
      dense::add_into(h, dense::rms_norm(dense::linear(attn, W("self_attn.o_proj.weight")),
                                         &W("post_attention_layernorm.weight"), k_.eps));
      const Mat n = dense::rms_norm(h, &W("pre_feedforward_layernorm.weight"), k_.eps);
      const Mat m = dense::geglu(dense::linear(n, W("mlp.gate_proj.weight")), dense::linear(n, W("mlp.up_proj.weight")));
      dense::add_into(h, dense::rms_norm(dense::linear(m, W("mlp.down_proj.weight")),
                                         &W("post_feedforward_layernorm.weight"), k_.eps));
      if (k_.ple > 0) {
        // gelu_approx and the multiply are separate mlx ops here (not the compiled geglu).
        const Mat gate = dense::multiply(dense::gelu_approx(dense::linear(h, W("per_layer_input_gate.weight"))),
                                         ple.columns(static_cast<std::int64_t>(l) * k_.ple, k_.ple));
        dense::add_into(h, dense::rms_norm(dense::linear(gate, W("per_layer_projection.weight")),
                                           &W("post_per_layer_input_norm.weight"), k_.eps));
      }
      dense::scale_by(h, reinterpret_cast<const float*>(W("layer_scalar").data())[0]);
    }
    const Mat last = dense::rms_norm(last_rows(h, B, L), &w_.at("model.norm.weight"), k_.eps);
    Mat logits = dense::linear(last, w_.at(k_.tied ? "model.embed_tokens.weight" : "lm_head.weight"));
    if (k_.softcap) dense::softcap(logits, *k_.softcap);
    rec.logits = Tensor::from_values(DType::f32, {B, k_.vocab}, logits.v);
    return rec;
  }

 private:
  // (B·L, layers·ple): (norm(proj(h)·hidden^-0.5) + embed_per_layer·√ple)·2^-0.5, where h
  // is the already scaled input embedding (_get_per_layer_inputs, _project_per_layer_inputs).
  Mat per_layer_inputs(std::span<const std::int32_t> tokens, const Mat& h) const {
    if (k_.ple == 0) return {};
    const auto f32 = [](double x) { return static_cast<float>(x); };
    Mat pli = dense::embedding(tokens, w_.at("model.embed_tokens_per_layer.weight"));
    dense::scale_by(pli, f32(std::sqrt(static_cast<double>(k_.ple))));
    Mat proj = dense::linear(h, w_.at("model.per_layer_model_projection.weight"));
    dense::scale_by(proj, f32(std::pow(static_cast<double>(k_.hidden), -0.5)));
    proj = dense::rms_norm(proj.reshaped(k_.ple), &w_.at("model.per_layer_projection_norm.weight"), k_.eps)
               .reshaped(k_.n_layers * k_.ple);
    dense::add_into(proj, pli);
    dense::scale_by(proj, f32(std::pow(2.0, -0.5)));
    return proj;
  }

  GemmaConfig k_;
  Weights w_;
  std::vector<LayerInfo> infos_;
};

}  // namespace

ParamList gemma4_parameters(const json& config) {
  const GemmaConfig k = parse_gemma(config);
  ParamList p;
  p.push_back({"model.embed_tokens.weight", {k.vocab, k.hidden}});
  if (k.ple > 0) p.push_back({"model.embed_tokens_per_layer.weight", {k.vocab_ple, k.n_layers * k.ple}});
  for (std::size_t l = 0; l < k.layers.size(); ++l) {
    const Layer& layer = k.layers[l];
    const std::int64_t hd = layer.info.head_dim, I = layer.intermediate;
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight",
                             "post_feedforward_layernorm.weight", "pre_feedforward_layernorm.weight"})
      p.push_back({lname(l, norm), {k.hidden}});
    p.push_back({lname(l, "layer_scalar"), {1}});
    p.push_back({lname(l, "mlp.down_proj.weight"), {k.hidden, I}});
    p.push_back({lname(l, "mlp.gate_proj.weight"), {I, k.hidden}});
    p.push_back({lname(l, "mlp.up_proj.weight"), {I, k.hidden}});
    if (k.ple > 0) {
      p.push_back({lname(l, "per_layer_input_gate.weight"), {k.ple, k.hidden}});
      p.push_back({lname(l, "per_layer_projection.weight"), {k.hidden, k.ple}});
      p.push_back({lname(l, "post_per_layer_input_norm.weight"), {k.hidden}});
    }
    if (layer.has_kv) {
      p.push_back({lname(l, "self_attn.k_norm.weight"), {hd}});
      p.push_back({lname(l, "self_attn.k_proj.weight"), {k.kv_heads * hd, k.hidden}});
      p.push_back({lname(l, "self_attn.v_proj.weight"), {k.kv_heads * hd, k.hidden}});
    }
    p.push_back({lname(l, "self_attn.o_proj.weight"), {k.hidden, k.heads * hd}});
    p.push_back({lname(l, "self_attn.q_norm.weight"), {hd}});
    p.push_back({lname(l, "self_attn.q_proj.weight"), {k.heads * hd, k.hidden}});
  }
  p.push_back({"model.norm.weight", {k.hidden}});
  if (k.ple > 0) {
    p.push_back({"model.per_layer_model_projection.weight", {k.n_layers * k.ple, k.hidden}});
    p.push_back({"model.per_layer_projection_norm.weight", {k.ple}});
  }
  if (!k.tied) p.push_back({"lm_head.weight", {k.vocab, k.hidden}});
  return p;
}

std::unique_ptr<Model> make_gemma4(const json& config, std::map<std::string, Tensor> weights) {
  return std::make_unique<Gemma4>(config, std::move(weights));
}

}  // namespace kvlab::golden::detail
