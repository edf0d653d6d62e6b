// One llama.cpp context over a GGUF model, as the llama.cpp replays drive it: sequences
// in one unified cell pool (kv_unified), batches that carry positions and sequence ids,
// the sequence verbs of llama_memory_*, and per layer the attention output (the input of
// the output projection, llama.cpp's graph tensor "kqv_out-<layer>") captured through the
// eval callback. Every llama.cpp failure is a kvlab::Error naming the call.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

struct llama_model;
struct llama_context;
struct ggml_tensor;

namespace kvlab::llama {

struct SessionOptions {
  std::string cache_type = "f32";  // K and V cache type: f32, f16, q8_0, q4_0, ...
  int n_ctx = 256;
  int n_seq_max = 4;
  // One thread: ggml's CPU workers spin at every graph node's barrier, so two of them on a
  // busy two-core machine (ctest -j2) wait out each other's time slices, many times over
  // (docs/ci.md §Test costs). The test models are too small to gain from a second one.
  int threads = 1;
  bool swa_full = false;  // llama.cpp's default: the sliding-window cache keeps what future tokens can see
};

// One token of a batch: its id, position, sequence and whether its outputs are wanted.
struct BatchToken {
  std::int32_t token = 0;
  std::int32_t pos = 0;
  std::int32_t seq = 0;
  bool output = false;
};

// What one llama_decode produced for a token whose output was wanted.
struct TokenOutput {
  std::vector<float> logits;                  // vocab
  std::vector<std::vector<float>> attention;  // per layer: Hq*Dv
};

class Session {
 public:
  Session(const std::filesystem::path& gguf, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // One llama_decode of these tokens (in this order, one ubatch); the outputs of the tokens
  // marked output, in batch order. Throws kvlab::Error when llama_decode fails.
  std::vector<TokenOutput> decode(const std::vector<BatchToken>& tokens);

  // llama_memory_seq_* (positions [p0, p1), -1 = open end).
  void seq_rm(int seq, int p0, int p1);
  void seq_cp(int src, int dst, int p0, int p1);
  void seq_keep(int seq);
  void seq_add(int seq, int p0, int p1, int delta);
  void seq_div(int seq, int p0, int p1, int d);
  int seq_pos_min(int seq) const;
  int seq_pos_max(int seq) const;
  void clear();
  // llama_state_seq_save_file / load_file of one sequence.
  void save_seq(const std::filesystem::path& file, int seq, const std::vector<std::int32_t>& tokens);
  void load_seq(const std::filesystem::path& file, int seq);

  int layers() const { return layers_; }
  int vocab() const { return vocab_; }
  int sliding_window() const { return n_swa_; }
  std::string cache_type() const { return options_.cache_type; }

 private:
  static bool on_tensor(::ggml_tensor* t, bool ask, void* self);

  SessionOptions options_;
  llama_model* model_ = nullptr;
  llama_context* ctx_ = nullptr;
  int layers_ = 0, vocab_ = 0, n_swa_ = 0;
  // The eval callback's capture of the current decode: per layer (tokens x width).
  std::vector<std::vector<float>> captured_;
  std::vector<std::int64_t> captured_width_, captured_tokens_;
};

// "llama-cpp-python <version> (vendored llama.cpp)": the pinned engine this was built on.
std::string engine_version();

}  // namespace kvlab::llama
