// mlx-lm 0.32.2's `llama` (mlx_lm/models/llama.py): pre-norm blocks, GQA attention with
// RoPE on q and k at the cache offset, scale head_dim^-0.5, SwiGLU MLP, final RMSNorm,
// tied (or separate) LM head. Sliding layers (layer_types) use a RotatingKVCache of
// sliding_window and the windowed mask; full layers a KVCache.
#include <algorithm>
#include <cmath>

#include "cache/attend.h"
#include "golden/model/model_internal.h"

namespace kvlab::golden::detail {

namespace {

using dense::Mat;

struct LlamaConfig {
  std::int64_t hidden = 0, layers = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  float eps = 0;
  double rope_theta = 10000;
  bool rope_traditional = false, tied = true;
  int window = 0;
  std::vector<LayerKind> kinds;
};

LlamaConfig parse_llama(const json& config) {
  const ConfigReader c(config);
  KVLAB_REQUIRE(c.string("model_type") == "llama", invalid_argument, "config key \"model_type\" is not llama");
  LlamaConfig k;
  k.hidden = c.positive("hidden_size");
  k.layers = c.positive("num_hidden_layers");
  k.intermediate = c.positive("intermediate_size");
  k.heads = c.positive("num_attention_heads");
  k.kv_heads = c.has("num_key_value_heads") ? c.positive("num_key_value_heads") : k.heads;
  k.head_dim = c.has("head_dim") ? c.positive("head_dim") : k.hidden / k.heads;
  k.vocab = c.positive("vocab_size");
  k.eps = static_cast<float>(c.number("rms_norm_eps"));
  if (!(k.eps > 0.0f)) c.bad("rms_norm_eps", "must be positive");
  k.rope_theta = c.number("rope_theta", 10000.0);
  if (!(k.rope_theta > 0.0 && std::isfinite(k.rope_theta))) c.bad("rope_theta", "must be positive and finite");
  k.rope_traditional = c.boolean("rope_traditional", false);
  k.tied = c.boolean("tie_word_embeddings", true);
  if (k.heads % k.kv_heads != 0) c.bad("num_key_value_heads", "must divide num_attention_heads");
  if (k.head_dim % 2 != 0) c.bad("head_dim", "must be even for RoPE");
  if (c.boolean("attention_bias", false)) c.unsupported("attention_bias", "true is not supported");
  if (c.boolean("mlp_bias", false)) c.unsupported("mlp_bias", "true is not supported");
  if (c.has("rope_scaling")) {
    // initialize_rope: "type" or "rope_type", "default" when absent; only the plain
    // RoPE is reproduced here.
    const json& s = c.at("rope_scaling");
    json type = "default";
    if (!s.is_object()) c.bad("rope_scaling", "is not an object");
    if (s.contains("type") && !s["type"].is_null()) type = s["type"];
    else if (s.contains("rope_type")) type = s["rope_type"];
    if (type != "default")
      c.unsupported("rope_scaling", cat("has rope type ", type.dump(), "; only default is supported"));
  }
  k.kinds = c.has("layer_types") ? c.layer_kinds("layer_types", k.layers)
                                 : std::vector<LayerKind>(static_cast<std::size_t>(k.layers), LayerKind::full);
  if (std::find(k.kinds.begin(), k.kinds.end(), LayerKind::sliding) != k.kinds.end()) {
    const std::int64_t w = c.positive("sliding_window");
    if (w > (1 << 20)) c.bad("sliding_window", "is too large");
    k.window = static_cast<int>(w);
  }
  return k;
}

std::string layer_name(std::int64_t l, const char* rest) { return cat("model.layers.", l, ".", rest); }

class Llama final : public Model {
 public:
  Llama(const json& config, std::map<std::string, Tensor> weights)
      : k_(parse_llama(config)), w_(llama_parameters(config), std::move(weights)) {
    for (std::int64_t l = 0; l < k_.layers; ++l) {
      LayerInfo info;
      info.kind = k_.kinds[static_cast<std::size_t>(l)];
      info.producer = static_cast<int>(l);
      info.n_heads = k_.heads;
      info.n_kv_heads = k_.kv_heads;
      info.head_dim = k_.head_dim;
      layers_.push_back(info);
    }
  }

  std::string_view model_type() const override { return "llama"; }
  std::int64_t vocab_size() const override { return k_.vocab; }
  int sliding_window() const override { return k_.window; }
  const std::vector<LayerInfo>& layers() const override { return layers_; }
  Tensor& weight(const std::string& name) override { return w_.mutable_at(name); }

  ForwardRecord forward(std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t L,
                        std::span<Cache* const> caches) const override {
    check_call(*this, tokens, B, L, caches);
    ForwardRecord rec;
    Mat h = dense::embedding(tokens, w_.at("model.embed_tokens.weight"));
    for (std::int64_t l = 0; l < k_.layers; ++l) {
      const auto W = [&](const char* rest) -> const Tensor& { return w_.at(layer_name(l, rest)); };
      Cache& cache = *caches[static_cast<std::size_t>(l)];
      Backend& be = cache.backend();
      // Attention: r = o_proj(attn(input_layernorm(h))); h = h + r.
      const Mat x = dense::rms_norm(h, &W("input_layernorm.weight"), k_.eps);
      const Mat q = dense::linear(x, W("self_attn.q_proj.weight"));
      const Mat kk = dense::linear(x, W("self_attn.k_proj.weight"));
      const Mat v = dense::linear(x, W("self_attn.v_proj.weight"));
      AttendOptions opt;
      opt.rope.dims = static_cast<int>(k_.head_dim);
      opt.rope.traditional = k_.rope_traditional;
      opt.rope.base = static_cast<float>(k_.rope_theta);
      // mlx passes the python float head_dim**-0.5 to sdpa as a float32.
      opt.attention.scale = static_cast<float>(std::pow(static_cast<double>(k_.head_dim), -0.5));
      opt.window = layers_[static_cast<std::size_t>(l)].kind == LayerKind::sliding ? k_.window : 0;
      const AttendResult r = attend(cache, to_heads(be, q, B, L, k_.heads), to_heads(be, kk, B, L, k_.kv_heads),
                                    to_heads(be, v, B, L, k_.kv_heads), opt);
      const Mat attn = from_heads(be, r.out);
      rec.attention.push_back(last_positions(attn, B, L));
      dense::add_into(h, dense::linear(attn, W("self_attn.o_proj.weight")));
      // MLP: h = h + down(silu(gate(n)) · up(n)), n = post_attention_layernorm(h).
      const Mat n = dense::rms_norm(h, &W("post_attention_layernorm.weight"), k_.eps);
      const Mat m = dense::swiglu(dense::linear(n, W("mlp.gate_proj.weight")), dense::linear(n, W("mlp.up_proj.weight")));
      dense::add_into(h, dense::linear(m, W("mlp.down_proj.weight")));
    }
    // Only the last position's logits are recorded; rows are independent, so computing
    // the others (as mlx-lm does) would change nothing.
    const Mat last = dense::rms_norm(last_rows(h, B, L), &w_.at("model.norm.weight"), k_.eps);
    const Mat logits = dense::linear(last, w_.at(k_.tied ? "model.embed_tokens.weight" : "lm_head.weight"));
    rec.logits = Tensor::from_values(DType::f32, {B, k_.vocab}, logits.v);
    return rec;
  }

  std::vector<CellOutput> forward_cells(std::span<const CellToken> batch, cells::CellKVCache& cache) const override {
    KVLAB_REQUIRE(!batch.empty(), invalid_argument, "forward_cells: an empty batch");
    const auto T = static_cast<std::int64_t>(batch.size());
    std::vector<std::int32_t> ids;
    std::vector<std::int64_t> cell;
    for (const CellToken& t : batch) {
      ids.push_back(t.token);
      cell.push_back(cache.add_cell(t.seq, t.pos));
    }
    std::vector<CellOutput> outs;
    std::vector<std::int64_t> out_rows;
    for (std::int64_t t = 0; t < T; ++t)
      if (batch[static_cast<std::size_t>(t)].output) out_rows.push_back(t);
    outs.resize(out_rows.size());
    RopeParams rope;
    rope.dims = static_cast<int>(k_.head_dim);
    rope.traditional = k_.rope_traditional;
    rope.base = static_cast<float>(k_.rope_theta);
    const auto scale = static_cast<float>(std::pow(static_cast<double>(k_.head_dim), -0.5));
    const std::int64_t kv_width = k_.kv_heads * k_.head_dim, width = k_.heads * k_.head_dim;
    Mat h = dense::embedding(ids, w_.at("model.embed_tokens.weight"));
    for (std::int64_t l = 0; l < k_.layers; ++l) {
      const auto W = [&](const char* rest) -> const Tensor& { return w_.at(layer_name(l, rest)); };
      const int layer = static_cast<int>(l);
      const Mat x = dense::rms_norm(h, &W("input_layernorm.weight"), k_.eps);
      const Mat q = dense::linear(x, W("self_attn.q_proj.weight"));
      const Mat kk = dense::linear(x, W("self_attn.k_proj.weight"));
      const Mat v = dense::linear(x, W("self_attn.v_proj.weight"));
      for (std::int64_t t = 0; t < T; ++t)
        cache.set_kv(layer, cell[static_cast<std::size_t>(t)], {kk.row(t), static_cast<std::size_t>(kv_width)},
                     {v.row(t), static_cast<std::size_t>(kv_width)});
      const int window = layers_[static_cast<std::size_t>(l)].kind == LayerKind::sliding ? k_.window : 0;
      Mat attn(T, width);
      for (std::int64_t t = 0; t < T; ++t) {
        const CellToken& tok = batch[static_cast<std::size_t>(t)];
        const auto a = cell_attention(cache, layer, tok.seq, tok.pos, window, {q.row(t), static_cast<std::size_t>(width)},
                                      k_.heads, k_.kv_heads, k_.head_dim, rope, scale);
        std::copy(a.begin(), a.end(), attn.row(t));
      }
      for (std::size_t o = 0; o < out_rows.size(); ++o)
        outs[o].attention.emplace_back(attn.row(out_rows[o]), attn.row(out_rows[o]) + width);
      dense::add_into(h, dense::linear(attn, W("self_attn.o_proj.weight")));
      const Mat n = dense::rms_norm(h, &W("post_attention_layernorm.weight"), k_.eps);
      const Mat m = dense::swiglu(dense::linear(n, W("mlp.gate_proj.weight")), dense::linear(n, W("mlp.up_proj.weight")));
      dense::add_into(h, dense::linear(m, W("mlp.down_proj.weight")));
    }
    Mat last(static_cast<std::int64_t>(out_rows.size()), h.width);
    for (std::size_t o = 0; o < out_rows.size(); ++o)
      std::copy_n(h.row(out_rows[o]), h.width, last.row(static_cast<std::int64_t>(o)));
    const Mat logits = dense::linear(dense::rms_norm(last, &w_.at("model.norm.weight"), k_.eps),
                                     w_.at(k_.tied ? "model.embed_tokens.weight" : "lm_head.weight"));
    for (std::size_t o = 0; o < out_rows.size(); ++o)
      outs[o].logits.assign(logits.row(static_cast<std::int64_t>(o)), logits.row(static_cast<std::int64_t>(o)) + k_.vocab);
    return outs;
  }

 private:
  LlamaConfig k_;
  Weights w_;
  std::vector<LayerInfo> layers_;
};

}  // namespace

ParamList llama_parameters(const json& config) {
  const LlamaConfig k = parse_llama(config);
  ParamList p;
  p.push_back({"model.embed_tokens.weight", {k.vocab, k.hidden}});
  for (std::int64_t l = 0; l < k.layers; ++l) {
    p.push_back({layer_name(l, "input_layernorm.weight"), {k.hidden}});
    p.push_back({layer_name(l, "mlp.down_proj.weight"), {k.hidden, k.intermediate}});
    p.push_back({layer_name(l, "mlp.gate_proj.weight"), {k.intermediate, k.hidden}});
    p.push_back({layer_name(l, "mlp.up_proj.weight"), {k.intermediate, k.hidden}});
    p.push_back({layer_name(l, "post_attention_layernorm.weight"), {k.hidden}});
    p.push_back({layer_name(l, "self_attn.k_proj.weight"), {k.kv_heads * k.head_dim, k.hidden}});
    p.push_back({layer_name(l, "self_attn.o_proj.weight"), {k.hidden, k.heads * k.head_dim}});
    p.push_back({layer_name(l, "self_attn.q_proj.weight"), {k.heads * k.head_dim, k.hidden}});
    p.push_back({layer_name(l, "self_attn.v_proj.weight"), {k.kv_heads * k.head_dim, k.hidden}});
  }
  p.push_back({"model.norm.weight", {k.hidden}});
  if (!k.tied) p.push_back({"lm_head.weight", {k.vocab, k.hidden}});
  return p;
}

std::unique_ptr<Model> make_llama(const json& config, std::map<std::string, Tensor> weights) {
  return std::make_unique<Llama>(config, std::move(weights));
}

}  // namespace kvlab::golden::detail
