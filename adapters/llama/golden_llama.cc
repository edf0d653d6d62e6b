// kvlab_golden_llama: the golden scenarios (golden/README.md "Scenarios") replayed through
// llama.cpp's own library on a GGUF of the same tiny model (adapters/llama/gguf_model.py),
// written as goldens in kvlab's format for `kvlab golden diff` (golden/replay_llama_cpp.sh).
//
//   kvlab_golden_llama --gguf M.gguf --model-id ID --model-sha256 HEX --scenarios FILE --out DIR
//                      [--only NAME] [--threads N]
//
// How each scenario key becomes llama.cpp calls (docs/engines.md §llama.cpp goldens):
// - every request is a sequence of one unified cell pool; a call of the request is a
//   llama_decode whose tokens carry their positions and sequence id (generate_step's
//   pattern: the prompt but its last token, the last token, then one token per step);
// - kv_bits=8/4: the K and V cache types q8_0 / q4_0 for the whole run (llama.cpp has no
//   quantization start and no affine format: a representation difference by design);
// - max_kv_size=W: kvlab's policy (the first 4 tokens kept, the rest a window of W - 4),
//   applied with llama_memory_seq_rm before each call whose position is ≥ W; no
//   position is shifted, so every stored key keeps the rotation of its position;
// - batch (prompts, finish, join): the requests' tokens share each llama_decode, one row
//   per live sequence; a finished request's cells are removed (seq_rm), a joiner's prompt
//   is decoded on its own and its steps then share the batches;
// - prefix=M second=N: the second request's sequence gets the first's cells of positions
//   [0, M) by llama_memory_seq_cp, unless a sliding-window layer no longer holds what
//   position M needs (llama.cpp's server rule): then it recomputes from scratch;
// - save_at=K: after step K, llama_state_seq_save_file, llama_memory_clear,
//   llama_state_seq_load_file, and the request goes on.
// A scenario this cannot express gets DIR/<id>.<name>.llama.cpp.not-replayed with the reason.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "adapters/llama/llama_session.h"
#include "golden/files/golden_file.h"
#include "golden/files/scenario.h"
#include "kvlab/error.h"

namespace kvlab::llama {
namespace {

constexpr const char* kEngine = "llama.cpp";
constexpr int kWindowKeep = 4;  // golden/README.md "Caches": kvlab's max_kv_size policy keeps 4

// One request: its sequence, prompt, quota of steps and what it recorded.
struct Request {
  int seq = 0;
  std::vector<std::int32_t> prompt;
  int quota = 0;
  int next_pos = 0;
  std::int32_t pending = 0;  // the token the next call feeds
  std::vector<std::int32_t> tokens;
  std::vector<float> logits;
  std::vector<std::vector<float>> attention;  // per layer, rows of steps
  std::string status = "ok";
  std::optional<std::int64_t> reused;
  bool live() const { return status == "ok" && static_cast<int>(tokens.size()) < quota; }
};

int greedy(const std::vector<float>& logits) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int>(best);
}

void record(Request& r, const TokenOutput& out) {
  r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
  if (r.attention.empty()) r.attention.resize(out.attention.size());
  for (std::size_t l = 0; l < out.attention.size(); ++l)
    r.attention[l].insert(r.attention[l].end(), out.attention[l].begin(), out.attention[l].end());
  r.pending = greedy(out.logits);
  r.tokens.push_back(r.pending);
}

class Replay {
 public:
  Replay(Session& session, const golden::Scenario& s, std::filesystem::path scratch)
      : llm_(session), s_(s), scratch_(std::move(scratch)) {}

  std::vector<Request> run() {
    const int vocab = llm_.vocab();
    std::vector<Request> reqs;
    auto add = [&](std::vector<std::int32_t> prompt, int quota) {
      Request r;
      r.seq = static_cast<int>(reqs.size());
      r.prompt = std::move(prompt);
      r.quota = quota;
      reqs.push_back(std::move(r));
    };
    for (std::size_t p = 0; p < s_.prompts.size(); ++p) {
      const int quota = s_.finish && s_.finish->request == static_cast<int>(p) ? s_.finish->after : s_.steps;
      add(golden::prompt_tokens(s_.seed, static_cast<int>(p), s_.prompts[p], vocab), quota);
    }
    if (s_.is_batch()) {
      run_batch(reqs);
      return reqs;
    }
    guarded(reqs[0], [&] { run_single(reqs[0], 0); });
    if (s_.prefix) {
      std::vector<std::int32_t> second(reqs[0].prompt.begin(), reqs[0].prompt.begin() + s_.prefix->shared);
      const auto fresh = golden::prompt_tokens(s_.seed, 1, s_.prefix->fresh, vocab);
      second.insert(second.end(), fresh.begin(), fresh.end());
      add(second, s_.steps);
      guarded(reqs[1], [&] { run_prefix(reqs[0], reqs[1]); });
    }
    return reqs;
  }

 private:
  template <class Body>
  static void guarded(Request& r, Body&& body) {
    try {
      body();
    } catch (const Error& e) {
      r.status = cat("error: kvlab::Error: ", e.what());
    }
  }

  // Before a call at position `pos`: kvlab's max_kv_size window (the first 4 kept).
  void evict_for(const Request& r, int pos) {
    if (!s_.max_kv_size || pos < *s_.max_kv_size) return;
    const int recent = *s_.max_kv_size - kWindowKeep;  // including the token this call adds
    llm_.seq_rm(r.seq, kWindowKeep, pos - recent + 1);
  }

  // Prompt tokens [from, size) of r: all but the last in one call, the last in one more.
  void prefill(Request& r, std::size_t from) {
    KVLAB_REQUIRE(from < r.prompt.size(), invalid_argument, "a request needs a token to process");
    if (s_.max_kv_size)
      KVLAB_REQUIRE(static_cast<int>(r.prompt.size()) <= *s_.max_kv_size, unsupported, "a prompt of ",
                    r.prompt.size(), " tokens over max_kv_size ", *s_.max_kv_size);
    std::vector<BatchToken> head;
    for (std::size_t i = from; i + 1 < r.prompt.size(); ++i)
      head.push_back({r.prompt[i], static_cast<std::int32_t>(i), r.seq, false});
    if (!head.empty()) llm_.decode(head);
    r.next_pos = static_cast<int>(r.prompt.size()) - 1;
    r.pending = r.prompt.back();
  }

  void step(Request& r) {
    evict_for(r, r.next_pos);
    const auto outs = llm_.decode({{r.pending, r.next_pos, r.seq, true}});
    ++r.next_pos;
    record(r, outs.at(0));
  }

  void run_single(Request& r, std::size_t from) {
    prefill(r, from);
    while (r.live()) {
      step(r);
      const int done = static_cast<int>(r.tokens.size()) - 1;
      if (s_.save_at && *s_.save_at == done && r.live()) save_and_reload(r);
    }
  }

  void save_and_reload(Request& r) {
    std::filesystem::create_directories(scratch_);
    const auto file = scratch_ / cat("seq", r.seq, ".llama-state");
    std::vector<std::int32_t> held(r.prompt);
    held.insert(held.end(), r.tokens.begin(), r.tokens.end() - 1);
    llm_.save_seq(file, r.seq, held);
    llm_.clear();
    KVLAB_REQUIRE(llm_.seq_pos_max(r.seq) == -1, internal, "llama_memory_clear left sequence ", r.seq, " cells");
    llm_.load_seq(file, r.seq);
    std::filesystem::remove(file);
  }

  // The second request takes the first's cells of [0, M) when every layer still holds
  // what a call at position M attends to; a sliding layer of window n holds positions
  // ≥ M - n + 1 at best, so llama.cpp's server reuses only when seq_pos_min(copy) ≤
  // max(0, M - n) (else it recomputes the prompt).
  void run_prefix(Request& first, Request& second) {
    const int shared = s_.prefix->shared;
    llm_.seq_cp(first.seq, second.seq, 0, shared);
    int reused = shared;
    if (llm_.sliding_window() > 0) {
      const int lowest = llm_.seq_pos_min(second.seq);
      if (lowest < 0 || lowest > std::max(0, shared - llm_.sliding_window())) {
        llm_.seq_rm(second.seq, -1, -1);
        reused = 0;
      }
    }
    second.reused = reused;
    run_single(second, static_cast<std::size_t>(reused));
  }

  void run_batch(std::vector<Request>& reqs) {
    // The requests that start together: their prompts (but the last tokens) in one call.
    std::vector<BatchToken> head;
    for (auto& r : reqs)
      for (std::size_t i = 0; i + 1 < r.prompt.size(); ++i)
        head.push_back({r.prompt[i], static_cast<std::int32_t>(i), r.seq, false});
    for (auto& r : reqs) {
      r.next_pos = static_cast<int>(r.prompt.size()) - 1;
      r.pending = r.prompt.back();
    }
    try {
      if (!head.empty()) llm_.decode(head);
    } catch (const Error& e) {
      for (auto& r : reqs) r.status = cat("error: kvlab::Error: ", e.what());
      return;
    }
    bool joined = !s_.join;
    for (int round = 0;; ++round) {
      std::vector<Request*> live;
      std::vector<BatchToken> batch;
      for (auto& r : reqs)
        if (r.live()) {
          live.push_back(&r);
          batch.push_back({r.pending, r.next_pos, r.seq, true});
        }
      if (live.empty()) break;
      try {
        const auto outs = llm_.decode(batch);
        for (std::size_t i = 0; i < live.size(); ++i) {
          ++live[i]->next_pos;
          record(*live[i], outs.at(i));
          if (!live[i]->live()) llm_.seq_rm(live[i]->seq, -1, -1);  // finished: its cells go
        }
      } catch (const Error& e) {
        for (auto* r : live) r->status = cat("error: kvlab::Error: ", e.what());
      }
      if (!joined && round == s_.join->after_step) {
        joined = true;
        Request j;
        j.seq = static_cast<int>(reqs.size());
        j.prompt = golden::prompt_tokens(s_.seed, static_cast<int>(reqs.size()), s_.join->prompt, llm_.vocab());
        j.quota = s_.steps;
        reqs.push_back(std::move(j));
        guarded(reqs.back(), [&] { prefill(reqs.back(), 0); });
      }
    }
  }

  Session& llm_;
  const golden::Scenario& s_;
  std::filesystem::path scratch_;
};

// Why llama.cpp cannot run this scenario as kvlab defines it, or nothing.
std::optional<std::string> not_replayable(const golden::Scenario& s) {
  if (s.kv_bits && *s.kv_bits != 8 && *s.kv_bits != 4)
    return cat("kv_bits=", *s.kv_bits, ": llama.cpp's cache types have 8-bit (q8_0) and 4-bit (q4_0) rows only");
  if (s.max_kv_size && s.is_batch()) return std::string("max_kv_size in a batch: kvlab's window policy is per request");
  return std::nullopt;
}

std::string cache_type_of(const golden::Scenario& s) {
  if (!s.kv_bits) return "f32";
  return *s.kv_bits == 8 ? "q8_0" : "q4_0";
}

golden::Golden to_golden(const std::vector<Request>& reqs, const golden::Scenario& s, const std::string& model_id,
                         const std::string& model_sha256, const Session& llm) {
  golden::Golden g;
  std::string classes;
  for (int l = 0; l < llm.layers(); ++l) classes += cat(l ? "," : "", "llama_kv_cache(", llm.cache_type(), ")");
  g.meta = {{"model", model_id},
            {"model_sha256", model_sha256},
            {"scenario", s.name},
            {"scenario_line", s.line},
            {"engine", kEngine},
            {"engine_version", engine_version()},
            {"backend", "ggml-cpu"},
            {"layers", std::to_string(llm.layers())},
            {"cache_classes", classes}};
  for (const Request& r : reqs) {
    golden::SequenceRecord rec;
    rec.prompt = r.prompt;
    rec.tokens = r.tokens;
    const auto S = static_cast<std::int64_t>(r.tokens.size());
    rec.logits = Tensor::from_values(DType::f32, Shape{S, llm.vocab()}, r.logits);
    for (const auto& a : r.attention)
      rec.attention.push_back(Tensor::from_values(DType::f32, Shape{S, S ? static_cast<std::int64_t>(a.size()) / S : 0}, a));
    rec.status = r.status;
    rec.reused = r.reused;
    g.sequences.push_back(std::move(rec));
  }
  return g;
}

int usage() {
  std::cerr << "usage: kvlab_golden_llama --gguf M.gguf --model-id ID --model-sha256 HEX --scenarios FILE "
               "--out DIR [--only NAME] [--threads N]\n";
  return 2;
}

int main_(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (argc % 2 == 0 || !args.count("--gguf") || !args.count("--model-id") || !args.count("--scenarios") ||
      !args.count("--out") || !args.count("--model-sha256"))
    return usage();
  for (const auto& [k, v] : args)
    if (k != "--gguf" && k != "--model-id" && k != "--scenarios" && k != "--out" && k != "--only" &&
        k != "--threads" && k != "--model-sha256") {
      std::cerr << "kvlab_golden_llama: unknown option " << k << "\n";
      return usage();
    }
  const std::filesystem::path out = args["--out"];
  std::filesystem::create_directories(out);
  const std::string id = args["--model-id"];
  for (const golden::Scenario& s : golden::read_scenarios(args["--scenarios"])) {
    if (args.count("--only") && args["--only"] != s.name) continue;
    const auto stem = out / cat(id, ".", s.name, ".", kEngine);
    std::filesystem::remove(stem.string() + ".safetensors");
    std::filesystem::remove(stem.string() + ".not-replayed");
    if (auto why = not_replayable(s)) {
      std::ofstream(stem.string() + ".not-replayed") << *why << "\n";
      std::cout << id << "." << s.name << ": not replayed: " << *why << "\n";
      continue;
    }
    SessionOptions opt;
    opt.cache_type = cache_type_of(s);
    if (args.count("--threads")) opt.threads = std::atoi(args["--threads"].c_str());
    Session llm(args["--gguf"], opt);
    Replay replay(llm, s, out / "scratch");
    const auto reqs = replay.run();
    golden::write_golden(stem.string() + ".safetensors", to_golden(reqs, s, id, args["--model-sha256"], llm));
    std::cout << id << "." << s.name << ": " << reqs.size() << " sequence(s) -> " << stem.string()
              << ".safetensors\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvlab::llama

namespace kvlab::llama {
int cells_main(const std::map<std::string, std::string>& args);
}

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string_view(argv[1]) == "cells") {
      std::map<std::string, std::string> args;
      if (argc % 2 != 0) {
        std::cerr << "kvlab_golden_llama cells: options come in pairs (--key value)\n";
        return 2;
      }
      for (int i = 2; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
      return kvlab::llama::cells_main(args);
    }
    return kvlab::llama::main_(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvlab_golden_llama: " << e.what() << "\n";
    return 1;
  }
}
