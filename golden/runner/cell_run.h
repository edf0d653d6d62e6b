// A cell script (golden/files/cell_script.h) run on an engine: kvlab's oracle (a tiny model
// over cache/cell_kv_cache.h) or llama.cpp (adapters/llama), each answering the same
// calls; and the comparison of two runs, output by output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/cell_kv_cache.h"
#include "golden/files/cell_script.h"
#include "golden/files/scenario.h"
#include "golden/model/model.h"

namespace kvlab::cells {

// What a cell script needs of an engine: llama_decode and llama_memory_seq_*.
class CellEngine {
 public:
  virtual ~CellEngine() = default;
  virtual std::vector<golden::CellOutput> decode(const std::vector<golden::CellToken>& batch) = 0;
  virtual void seq_rm(int seq, std::int32_t p0, std::int32_t p1) = 0;
  virtual void seq_cp(int src, int dst, std::int32_t p0, std::int32_t p1) = 0;
  virtual void seq_keep(int seq) = 0;
  virtual void seq_add(int seq, std::int32_t p0, std::int32_t p1, std::int32_t delta) = 0;
  virtual void seq_div(int seq, std::int32_t p0, std::int32_t p1, int d) = 0;
  virtual std::int32_t pos_max(int seq) const = 0;
  virtual std::int32_t pos_min(int seq) const = 0;
  virtual std::int64_t vocab() const = 0;
  // Whether what `seq` attends to is where kvlab's isolation and the engine's shared cell
  // positions part (CellKVCache::holds_a_split_cell); only the oracle knows.
  virtual bool holds_a_split_cell(int /*seq*/) const { return false; }
  virtual bool holds_a_divided_cell(int /*seq*/) const { return false; }
  // Whether a query of `seq` at `pos` sees a sliding-window key that had left the
  // sequence's window (CellKVCache::sees_a_key_that_left).
  virtual bool sees_a_key_that_left(int /*seq*/, std::int32_t /*pos*/) const { return false; }
  // Called after every command (the oracle notes which keys left their window).
  virtual void after_command() {}
};

// kvlab's oracle: the model's forward_cells over one CellKVCache.
class OracleEngine final : public CellEngine {
 public:
  explicit OracleEngine(const golden::Model& model, Positions positions = Positions::per_holder);
  std::vector<golden::CellOutput> decode(const std::vector<golden::CellToken>& batch) override;
  void seq_rm(int seq, std::int32_t p0, std::int32_t p1) override { cache_.seq_rm(seq, p0, p1); }
  void seq_cp(int src, int dst, std::int32_t p0, std::int32_t p1) override { cache_.seq_cp(src, dst, p0, p1); }
  void seq_keep(int seq) override { cache_.seq_keep(seq); }
  void seq_add(int seq, std::int32_t p0, std::int32_t p1, std::int32_t d) override { cache_.seq_add(seq, p0, p1, d); }
  void seq_div(int seq, std::int32_t p0, std::int32_t p1, int d) override { cache_.seq_div(seq, p0, p1, d); }
  std::int32_t pos_max(int seq) const override { return cache_.pos_max(seq); }
  std::int32_t pos_min(int seq) const override { return cache_.pos_min(seq); }
  std::int64_t vocab() const override { return model_.vocab_size(); }
  bool holds_a_split_cell(int seq) const override { return cache_.holds_a_split_cell(seq); }
  bool holds_a_divided_cell(int seq) const override { return cache_.holds_a_divided_cell(seq); }
  bool sees_a_key_that_left(int seq, std::int32_t pos) const override {
    return cache_.sees_a_key_that_left(seq, pos, model_.sliding_window());
  }
  void after_command() override { cache_.note_window(model_.sliding_window()); }

 private:
  const golden::Model& model_;
  CellKVCache cache_;
};

// One recorded output: the command that made it, its sequence and position.
struct Output {
  int command = 0;
  int seq = 0;
  std::int32_t pos = 0;
  golden::CellOutput out;
  bool split = false;    // the oracle's holds_a_split_cell(seq) when it was made
  bool divided = false;  // the oracle's holds_a_divided_cell(seq) when it was made
  bool left = false;     // the oracle's sees_a_key_that_left(seq, pos) when it was made
  std::int32_t pos_min = -1;  // the engine's smallest position of seq right after the call
};

struct Run {
  std::vector<Output> outputs;
  std::vector<std::int32_t> fed;  // the tokens the d commands fed, in order
  std::string error;              // "" or the kvlab::Error that ended the run
  int error_command = -1;
};

// Runs `script` on `engine`. teacher: the tokens d commands feed, in order (another run's
// `fed`), so two engines see the same inputs; null: each d feeds its sequence's greedy
// token (the first index of the largest logit). A kvlab::Error ends the run and is kept.
Run run_script(CellEngine& engine, const std::vector<cell_script::Command>& script, std::uint64_t seed,
               const std::vector<std::int32_t>* teacher = nullptr);

// A random script (seeded; the same seed gives the same script): prompts, decode rounds
// of several sequences, and every verb, with cp onto an emptied range, shifts both ways
// and divisions, a decode after each verb so its effect reaches an output.
std::string random_script(std::uint64_t seed, int sequences, int length);

// How run b answers where run a (the oracle's) is the reference: the first output whose
// logits move by more than tol.max_dlogit, or whose top token differs where a's top two
// are further apart than 2·max_dlogit; or a run that ended in an error or early.
struct Verdict {
  bool agree = true;
  std::string finding;   // one line naming the output, the figures and the oracle's flags
  double max_dlogit = 0;  // over the outputs compared
  std::int64_t compared = 0;
};
Verdict compare(const Run& a, const Run& b, const golden::Tolerance& tol);

}  // namespace kvlab::cells
