// Runs a golden scenario (golden/README.md "Scenarios") through a tiny model on kvlab's
// caches over one backend and returns the golden: the single-request call pattern of
// mlx-lm's generate_step, kvlab's kv-quantization and window policies, batches with
// left padding / filter / extend (BatchKVCache, or DeviceBatchKVCache's device-resident
// offsets with batch_cache=device), prefix reuse through PrefixCache, save → load.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "cache/cache.h"
#include "golden/files/golden_file.h"
#include "golden/model/model.h"
#include "golden/files/scenario.h"

namespace kvlab::golden {

struct RunContext {
  Backend* backend = nullptr;
  std::string backend_name = "reference";
  std::string model_id, model_sha256;
  std::filesystem::path scratch;  // where save/load scenarios put their cache file
  // Applied to every cache the runner creates or restores; tests swap in a bug-zoo
  // mutant this way (a wrapper around the real cache, its batch verbs included).
  // Identity when empty.
  std::function<std::unique_ptr<Cache>(std::unique_ptr<Cache>, int layer)> wrap_cache;
  // Teacher forcing: when set, sequence i is fed teacher->sequences[i].tokens[step] as its
  // next input instead of its own greedy token (which is still what it records), so two
  // runs see the same inputs at every step and their logits compare over the whole
  // stream — llama.cpp's --kl-divergence evaluates the same way. The golden's metadata
  // says `teacher_forced` = 1; the teacher must have the same prompts and enough steps.
  const Golden* teacher = nullptr;
};

// A kvlab::Error raised mid-run (a cache misuse, a mutant's crash made safe) ends that
// sequence with status "error: kvlab::Error: <message>" and its steps so far, as an
// engine's exception does in the mlx-lm replay; other errors propagate.
Golden run_scenario(const Model& model, const Scenario& scenario, const RunContext& context);

}  // namespace kvlab::golden
