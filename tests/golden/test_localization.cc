// The proof that a golden diff localizes a model change (issue 18): deliberate changes,
// and what the diff must say about them. Each test records the unchanged model and the
// changed one on the reference backend and diffs them; the changes are chosen so the
// right answer is known in advance (where the change enters, and the first step at which
// it can show).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>

#include "golden/files/diff.h"
#include "golden/runner/runner.h"
#include "tests/golden/scratch_dir.h"
#include "harness/backends.h"

namespace kvlab::golden {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json config_of(const std::string& id) {
  std::ifstream in(fs::path(KVLAB_GOLDEN_SOURCE_DIR) / "models" / id / "config.json");
  return json::parse(in);
}

std::unique_ptr<Model> load(const std::string& id, const json& config) {
  const fs::path dir = test::process_scratch_dir("kvlab_golden_localization_") / id;
  fs::create_directories(dir);
  write_tiny_model(config, id, dir);
  return Model::load(dir);
}

Golden run(const Model& model, const std::string& id, const std::string& line, const Golden* teacher = nullptr) {
  static auto backend = harness::make_backend("reference");
  RunContext ctx;
  ctx.backend = backend.get();
  ctx.model_id = id;
  ctx.scratch = test::process_scratch_dir("kvlab_golden_localization_") / "scratch";
  ctx.teacher = teacher;
  return run_scenario(model, parse_scenario(line, "test"), ctx);
}

json diff(const Golden& a, const Golden& b) { return diff_goldens({&a, "unchanged"}, {&b, "changed"}, {}); }

double rel(const json& report, std::size_t layer, std::size_t step) {
  return report["sequences"][0]["layer_rel"][layer][step].get<double>();
}

TEST(Localization, APerturbedWeightIsNamedAtItsLayerAndTheFirstStep) {
  const json config = config_of("llama_dense");
  auto model = load("llama_dense", config);
  const std::string line = "plain prompts=13 steps=24";
  const Golden before = run(*model, "llama_dense", line);
  // One element of layer 2's value projection: layer 2's attention output moves from the
  // first token on; layers 0 and 1 cannot see it.
  Tensor& w = model->weight("model.layers.2.self_attn.v_proj.weight");
  w.view().store(0, w.view().load(0) + 0.25f);
  const Golden after = run(*model, "llama_dense", line);
  const json r = diff(before, after);
  std::cout << diff_text(r);
  ASSERT_FALSE(r["first_divergence"].is_null());
  EXPECT_EQ(r["first_divergence"]["sequence"], 0);
  EXPECT_EQ(r["first_divergence"]["step"], 0);
  EXPECT_EQ(r["first_divergence"]["layer"], 2);
  const auto steps = r["sequences"][0]["steps_compared"].get<std::size_t>();
  for (std::size_t t = 0; t < steps; ++t) {
    EXPECT_EQ(rel(r, 0, t), 0.0) << "layer 0 step " << t;  // bit-identical upstream of the change
    EXPECT_EQ(rel(r, 1, t), 0.0) << "layer 1 step " << t;
  }
}

TEST(Localization, TheSlidingLayersRopeBaseShowsFirstAtPositionOneOnASlidingLayer) {
  json config = config_of("gemma4_small");
  auto unchanged = load("gemma4_small", config);
  config["rope_parameters"]["sliding_attention"]["rope_theta"] = 20000.0;
  auto changed = load("gemma4_small", config);  // same weights: they depend on id and seed only
  // A one-token prompt: step 0 attends position 0 to itself, where every rotation is the
  // identity, so no RoPE base can matter before step 1 (positions 0 and 1).
  const std::string line = "probe prompts=1 steps=8";
  const json r = diff(run(*unchanged, "gemma4_small", line), run(*changed, "gemma4_small", line));
  std::cout << diff_text(r);
  ASSERT_FALSE(r["first_divergence"].is_null());
  EXPECT_EQ(r["first_divergence"]["step"], 1);
  const auto layer = r["first_divergence"]["layer"].get<std::size_t>();
  EXPECT_EQ(unchanged->layers().at(layer).kind, LayerKind::sliding) << "layer " << layer;
  EXPECT_EQ(layer, 0u);
  for (std::size_t l = 0; l < unchanged->layers().size(); ++l) EXPECT_EQ(rel(r, l, 0), 0.0) << "layer " << l;
}

// Quantized against unquantized caches: reported, not failed (README, issue 18), beside
// the anchors of docs/quantization.md §A7: attention-output relative error of the
// quantizer at logit scale ~1/4: K8V8 0.7 % / 1.5 %, K4V4 g64 12 % / 24 %; model-level
// mean KLD <= 0.0015 for 8 bits (Llama-3-8B, llama.cpp#7412). What is asserted is what
// must hold exactly: steps before the cache is quantized are bit-identical, and the first
// moved step is the first call over a quantized cache. The quantized runs are teacher-
// forced with the plain run's tokens, so the KLD covers all 24 steps (not only those
// before the greedy streams part).
TEST(Localization, QuantizedCachesMoveFromTheFirstQuantizedStepWithKldReported) {
  auto model = load("llama_dense", config_of("llama_dense"));
  const Golden plain = run(*model, "llama_dense", "plain prompts=13 steps=24");
  for (const int bits : {8, 4}) {
    const Golden q = run(*model, "llama_dense",
                         cat("kv", bits, " prompts=13 steps=24 kv_bits=", bits, " kv_group_size=32 quantized_kv_start=16"),
                         &plain);
    const json r = diff(plain, q);
    std::cout << "kv_bits=" << bits << ": " << diff_line(r) << "\n";
    // Offsets after each call: 12 (prefill), 13 (step 0), 14, 15, 16 (step 3) — the
    // policy quantizes after the call that reaches 16, so step 4 reads codes first.
    for (std::size_t t = 0; t < 4; ++t) EXPECT_EQ(r["sequences"][0]["kld"][t].get<double>(), 0.0) << "step " << t;
    EXPECT_GT(r["sequences"][0]["kld"][4].get<double>(), 0.0);
    EXPECT_EQ(r["sequences"][0]["steps_compared"], 24);  // teacher-forced: every step compares
    std::cout << "  layer 0 attention relative error at step 4 (anchor K" << bits << "V" << bits << ": "
              << (bits == 8 ? "0.7-1.5 %" : "12-24 % at g64") << "): " << 100 * rel(r, 0, 4) << " %\n";
  }
}

}  // namespace
}  // namespace kvlab::golden
