#include "adapters/llama/llama_session.h"

#include <cstring>
#include <string_view>

#include "ggml-backend.h"
#include "ggml.h"
#include "kvlab/error.h"
#include "llama.h"

namespace kvlab::llama {
namespace {

constexpr std::string_view kAttentionTensor = "kqv_out-";

ggml_type cache_type_named(const std::string& name) {
  static const std::pair<const char*, ggml_type> kTypes[] = {
      {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
      {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
      {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL}};
  for (const auto& [n, t] : kTypes)
    if (name == n) return t;
  fail(ErrorKind::invalid_argument,
       cat("llama.cpp cache type '", name, "' is not one of f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl"));
}

// llama.cpp logs to stderr by default; keep its warnings and errors, drop the rest.
void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

std::string engine_version() { return "llama-cpp-python " KVLAB_LLAMA_CPP_PYTHON_VERSION " (vendored llama.cpp)"; }

Session::Session(const std::filesystem::path& gguf, const SessionOptions& options) : options_(options) {
  static const bool initialized = [] {
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    return true;
  }();
  (void)initialized;
  const ggml_type type = cache_type_named(options.cache_type);
  KVLAB_REQUIRE(std::filesystem::is_regular_file(gguf), io, "llama.cpp model: no file ", gguf.string());
  llama_model_params mp = llama_model_default_params();
  mp.check_tensors = true;  // a GGUF whose tensor data is corrupt is refused at load
  model_ = llama_model_load_from_file(gguf.string().c_str(), mp);
  KVLAB_REQUIRE(model_ != nullptr, io, "llama_model_load_from_file refused ", gguf.string(), " (its log is above)");
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(options.n_ctx);
  cp.n_batch = cp.n_ubatch = static_cast<std::uint32_t>(options.n_ctx);
  cp.n_seq_max = static_cast<std::uint32_t>(options.n_seq_max);
  cp.n_threads = cp.n_threads_batch = options.threads;
  // llama.cpp's flash-attention graph casts an f32 K or V to f16 before the kernel
  // (llama-graph.cpp build_attn_mha), so an f32 cache is only f32 without it; quantized
  // V needs it.
  cp.flash_attn_type = type == GGML_TYPE_F32 ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_ENABLED;
  cp.type_k = cp.type_v = type;
  cp.kv_unified = true;  // one cell pool for every sequence, split_simple keeps batch order
  cp.swa_full = options.swa_full;
  cp.no_perf = true;
  cp.cb_eval = &Session::on_tensor;
  cp.cb_eval_user_data = this;
  ctx_ = llama_init_from_model(model_, cp);
  if (ctx_ == nullptr) {
    llama_model_free(model_);
    fail(ErrorKind::unsupported,
         cat("llama_init_from_model refused cache type ", options.cache_type, " (its log is above)"));
  }
  layers_ = llama_model_n_layer(model_);
  vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_));
  n_swa_ = llama_model_n_swa(model_);
}

Session::~Session() {
  if (ctx_ != nullptr) llama_free(ctx_);
  if (model_ != nullptr) llama_model_free(model_);
}

bool Session::on_tensor(::ggml_tensor* t, bool ask, void* user) {
  const std::string_view name(t->name);
  if (name.substr(0, kAttentionTensor.size()) != kAttentionTensor) return !ask;  // ask: not wanted; else go on
  if (ask) return true;
  auto* self = static_cast<Session*>(user);
  const int layer = std::atoi(t->name + kAttentionTensor.size());
  if (layer < 0 || layer >= self->layers_ || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
  const std::int64_t width = t->ne[0], tokens = ggml_nrows(t);
  auto& out = self->captured_[static_cast<std::size_t>(layer)];
  out.resize(static_cast<std::size_t>(width * tokens));
  ggml_backend_tensor_get(t, out.data(), 0, ggml_nbytes(t));
  self->captured_width_[static_cast<std::size_t>(layer)] = width;
  self->captured_tokens_[static_cast<std::size_t>(layer)] = tokens;
  return true;
}

std::vector<TokenOutput> Session::decode(const std::vector<BatchToken>& tokens) {
  KVLAB_REQUIRE(!tokens.empty(), invalid_argument, "llama.cpp decode of an empty batch");
  KVLAB_REQUIRE(static_cast<int>(tokens.size()) <= options_.n_ctx, invalid_argument, "llama.cpp batch of ",
                tokens.size(), " tokens exceeds n_batch ", options_.n_ctx);
  llama_batch batch = llama_batch_init(static_cast<std::int32_t>(tokens.size()), 0, 1);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const BatchToken& t = tokens[i];
    KVLAB_REQUIRE(t.token >= 0 && t.token < vocab_, invalid_argument, "llama.cpp token ", t.token,
                  " outside the vocabulary of ", vocab_);
    KVLAB_REQUIRE(t.seq >= 0 && t.seq < options_.n_seq_max, invalid_argument, "llama.cpp sequence ", t.seq,
                  " outside [0, ", options_.n_seq_max, ")");
    batch.token[i] = t.token;
    batch.pos[i] = t.pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = t.seq;
    batch.logits[i] = t.output ? 1 : 0;
  }
  batch.n_tokens = static_cast<std::int32_t>(tokens.size());
  captured_.assign(static_cast<std::size_t>(layers_), {});
  captured_width_.assign(static_cast<std::size_t>(layers_), 0);
  captured_tokens_.assign(static_cast<std::size_t>(layers_), 0);
  const int rc = llama_decode(ctx_, batch);
  llama_batch_free(batch);
  KVLAB_REQUIRE(rc == 0, device, "llama_decode returned ", rc, " for a batch of ", tokens.size(), " tokens");
  std::vector<TokenOutput> outs;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].output) continue;
    TokenOutput o;
    const float* logits = llama_get_logits_ith(ctx_, static_cast<std::int32_t>(i));
    KVLAB_REQUIRE(logits != nullptr, internal, "llama_get_logits_ith(", i, ") returned no logits");
    o.logits.assign(logits, logits + vocab_);
    for (int l = 0; l < layers_; ++l) {
      const auto li = static_cast<std::size_t>(l);
      // One ubatch in batch order: column i is token i (n_ubatch = n_batch, kv_unified).
      KVLAB_REQUIRE(captured_tokens_[li] == static_cast<std::int64_t>(tokens.size()), internal,
                    "llama.cpp's kqv_out-", l, " held ", captured_tokens_[li], " tokens for a batch of ",
                    tokens.size(), " (split into ubatches, or not captured)");
      const auto w = captured_width_[li];
      const float* row = captured_[li].data() + static_cast<std::int64_t>(i) * w;
      o.attention.emplace_back(row, row + w);
    }
    outs.push_back(std::move(o));
  }
  return outs;
}

void Session::seq_rm(int seq, int p0, int p1) {
  KVLAB_REQUIRE(llama_memory_seq_rm(llama_get_memory(ctx_), seq, p0, p1), unsupported, "llama_memory_seq_rm(",
                seq, ", ", p0, ", ", p1, ") refused (a partial removal the memory cannot do)");
}
void Session::seq_cp(int src, int dst, int p0, int p1) { llama_memory_seq_cp(llama_get_memory(ctx_), src, dst, p0, p1); }
void Session::seq_keep(int seq) { llama_memory_seq_keep(llama_get_memory(ctx_), seq); }
void Session::seq_add(int seq, int p0, int p1, int delta) {
  llama_memory_seq_add(llama_get_memory(ctx_), seq, p0, p1, delta);
}
void Session::seq_div(int seq, int p0, int p1, int d) {
  KVLAB_REQUIRE(d > 1, invalid_argument, "llama_memory_seq_div by ", d, ": the divisor must be > 1");
  llama_memory_seq_div(llama_get_memory(ctx_), seq, p0, p1, d);
}
int Session::seq_pos_min(int seq) const { return llama_memory_seq_pos_min(llama_get_memory(ctx_), seq); }
int Session::seq_pos_max(int seq) const { return llama_memory_seq_pos_max(llama_get_memory(ctx_), seq); }
void Session::clear() { llama_memory_clear(llama_get_memory(ctx_), true); }

void Session::save_seq(const std::filesystem::path& file, int seq, const std::vector<std::int32_t>& tokens) {
  const std::size_t n = llama_state_seq_save_file(ctx_, file.string().c_str(), seq, tokens.data(), tokens.size());
  KVLAB_REQUIRE(n > 0, io, "llama_state_seq_save_file(", file.string(), ", seq ", seq, ") wrote nothing");
}

void Session::load_seq(const std::filesystem::path& file, int seq) {
  std::vector<llama_token> tokens(static_cast<std::size_t>(options_.n_ctx));
  std::size_t count = 0;
  const std::size_t n =
      llama_state_seq_load_file(ctx_, file.string().c_str(), seq, tokens.data(), tokens.size(), &count);
  KVLAB_REQUIRE(n > 0, io, "llama_state_seq_load_file(", file.string(), ", seq ", seq, ") read nothing");
}

}  // namespace kvlab::llama
