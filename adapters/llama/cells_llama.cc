// kvlab_golden_llama cells: cell scripts (golden/files/cell_script.h) through kvlab's
// oracle and through llama.cpp, compared output by output (golden/runner/cell_run.h).
//
//   kvlab_golden_llama cells --model-dir DIR --gguf M.gguf --model-id ID --seed S
//       (--count N [--length L] [--sequences K] | --script SCRIPT) [--json OUT.jsonl]
//       [--div-as-add 1] [--positions per-holder|per-cell] [--swa-full 1]
//
// Script i of a --count run is random_script(S + i, K, L) with prompt seed S + i; a
// --script run replays one (the repro line every divergent script prints). llama.cpp
// runs with its f32 cache, flash attention off and one unified cell pool (kv_unified), so
// sequences share cells as llama-server --kv-unified does; the oracle's tokens are fed to
// both (teacher forcing), so every output compares. --div-as-add 1 sends each seq_div to
// llama.cpp as the seq_add calls that give the same positions (the second route of the
// register's seq_div entry); --positions per-cell runs the oracle with llama.cpp's one
// position per cell (the flavour in which the register's shared-cell entry must vanish);
// --swa-full 1 gives llama.cpp's sliding-window layers a full-size cache (llama.cpp's
// swa_full; by default it reuses the cells no future token of their sequence can see).
// Exit 0 whatever the verdicts (the
// register, tools/cell_replay_table.py, judges them); 2 for a --script the oracle refuses
// (INVALID, naming the command); 1 on a usage or engine error.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "adapters/llama/llama_session.h"
#include "golden/runner/cell_run.h"
#include "kvlab/error.h"

namespace kvlab::llama {
namespace {

// llama.cpp behind the cell engine interface.
class LlamaEngine final : public cells::CellEngine {
 public:
  LlamaEngine(const std::filesystem::path& gguf, const SessionOptions& opt, bool div_as_add)
      : s_(gguf, opt), div_as_add_(div_as_add) {}
  std::vector<golden::CellOutput> decode(const std::vector<golden::CellToken>& batch) override {
    std::vector<BatchToken> tokens;
    for (const auto& t : batch) tokens.push_back({t.token, t.pos, t.seq, t.output});
    std::vector<golden::CellOutput> outs;
    for (auto& o : s_.decode(tokens)) outs.push_back({std::move(o.logits), std::move(o.attention)});
    return outs;
  }
  void seq_rm(int seq, std::int32_t p0, std::int32_t p1) override { s_.seq_rm(seq, p0, p1); }
  void seq_cp(int src, int dst, std::int32_t p0, std::int32_t p1) override { s_.seq_cp(src, dst, p0, p1); }
  void seq_keep(int seq) override { s_.seq_keep(seq); }
  void seq_add(int seq, std::int32_t p0, std::int32_t p1, std::int32_t d) override { s_.seq_add(seq, p0, p1, d); }
  // div_as_add: seq_div as one seq_add per held position (p -> p/d), the same positions
  // by another verb; ascending, so no cell moves into a range still to be moved.
  void seq_div(int seq, std::int32_t p0, std::int32_t p1, int d) override {
    if (!div_as_add_) return s_.seq_div(seq, p0, p1, d);
    const std::int32_t top = std::min(p1 < 0 ? s_.seq_pos_max(seq) + 1 : p1, s_.seq_pos_max(seq) + 1);
    for (std::int32_t p = std::max(p0, 0); p < top; ++p)
      if (p / d != p) s_.seq_add(seq, p, p + 1, p / d - p);
  }
  std::int32_t pos_max(int seq) const override { return s_.seq_pos_max(seq); }
  std::int32_t pos_min(int seq) const override { return s_.seq_pos_min(seq); }
  std::int64_t vocab() const override { return s_.vocab(); }
  void clear() { s_.clear(); }

 private:
  Session s_;
  bool div_as_add_;
};

}  // namespace

int cells_main(const std::map<std::string, std::string>& args) {
  auto get = [&](const std::string& k) {
    const auto it = args.find(k);
    KVLAB_REQUIRE(it != args.end(), invalid_argument, "kvlab_golden_llama cells: missing ", k);
    return it->second;
  };
  auto number = [&](const std::string& k, long fallback) {
    const auto it = args.find(k);
    if (it == args.end()) return fallback;
    std::size_t used = 0;
    const long v = std::stol(it->second, &used);
    KVLAB_REQUIRE(used == it->second.size() && v >= 0, invalid_argument, "kvlab_golden_llama cells: ", k, " ",
                  it->second, " is not a non-negative integer");
    return v;
  };
  for (const auto& [k, v] : args)
    KVLAB_REQUIRE(k == "--model-dir" || k == "--gguf" || k == "--model-id" || k == "--seed" || k == "--count" ||
                      k == "--length" || k == "--sequences" || k == "--script" || k == "--json" ||
                      k == "--div-as-add" || k == "--positions" || k == "--swa-full",
                  invalid_argument, "kvlab_golden_llama cells: unknown option ", k);
  const auto model = golden::Model::load(get("--model-dir"));
  const std::string gguf = get("--gguf"), id = get("--model-id");
  const auto seed = static_cast<std::uint64_t>(number("--seed", 1));
  std::vector<std::pair<std::uint64_t, std::string>> scripts;
  if (args.count("--script")) {
    scripts.emplace_back(seed, get("--script"));
  } else {
    const long count = number("--count", 0), length = number("--length", 14), seqs = number("--sequences", 3);
    KVLAB_REQUIRE(count > 0, invalid_argument, "kvlab_golden_llama cells: give --count N or --script SCRIPT");
    for (long i = 0; i < count; ++i)
      scripts.emplace_back(seed + static_cast<std::uint64_t>(i),
                           cells::random_script(seed + static_cast<std::uint64_t>(i), static_cast<int>(seqs),
                                                static_cast<int>(length)));
  }
  std::ofstream json;
  if (args.count("--json")) json.open(get("--json"));
  const bool div_as_add = number("--div-as-add", 0) != 0;
  const std::string positions = args.count("--positions") ? get("--positions") : "per-holder";
  KVLAB_REQUIRE(positions == "per-holder" || positions == "per-cell", invalid_argument,
                "kvlab_golden_llama cells: --positions ", positions, " is not per-holder or per-cell");
  const cells::Positions held = positions == "per-cell" ? cells::Positions::per_cell : cells::Positions::per_holder;
  const bool swa_full = number("--swa-full", 0) != 0;
  const std::string route = cat(div_as_add ? "div-as-add" : "direct", positions == "per-cell" ? "+per-cell" : "",
                                swa_full ? "+swa-full" : "");
  SessionOptions opt;
  opt.n_seq_max = cell_script::kMaxSequences;
  opt.n_ctx = 512;
  opt.swa_full = swa_full;
  LlamaEngine llm(gguf, opt, div_as_add);
  int divergent = 0;
  for (const auto& [s, text] : scripts) {
    const auto script = cell_script::parse(text);
    cells::OracleEngine oracle(*model, held);
    const cells::Run a = cells::run_script(oracle, script, s);
    if (!a.error.empty() && args.count("--script")) {  // the script itself is invalid
      std::cout << "INVALID: " << a.error << "\n";
      return 2;
    }
    llm.clear();  // one context for every script: each starts on an empty cell pool
    const cells::Run b = cells::run_script(llm, script, s, &a.fed);
    const cells::Verdict v = cells::compare(a, b, golden::Tolerance{});
    const std::string repro = cat("kvlab_golden_llama cells --model-dir ", get("--model-dir"), " --gguf ", gguf,
                                  " --model-id ", id, div_as_add ? " --div-as-add 1" : "",
                                  positions == "per-cell" ? " --positions per-cell" : "",
                                  swa_full ? " --swa-full 1" : "", " --seed ", s,
                                  " --script ", text);
    if (!v.agree) {
      ++divergent;
      std::cout << "DIVERGES seed " << s << ": " << v.finding << "\n  repro: " << repro << "\n";
    }
    if (json.is_open())
      json << nlohmann::json{{"model", id}, {"route", route}, {"seed", s}, {"script", text}, {"agree", v.agree},
                             {"finding", v.finding}, {"max_dlogit", v.max_dlogit}, {"outputs", v.compared},
                             {"repro", repro}}
                  .dump()
           << "\n";
  }
  std::cout << id << ": " << scripts.size() << " cell script(s), " << scripts.size() - static_cast<std::size_t>(divergent)
            << " agree, " << divergent << " diverge (seed " << seed << ")\n";
  return 0;
}

}  // namespace kvlab::llama
