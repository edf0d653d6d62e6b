// kvlab's cell-cache oracle (Model::forward_cells over cache/cell_kv_cache.h, driven by
// golden/runner/cell_run.h) against invariants that hold in exact arithmetic, each between
// two different computations: RoPE's relativity (a whole-sequence shift changes no
// output), sequence isolation (another sequence in the pool changes nothing), a fork by
// seq_cp equals continuing the source, and the checked-in plain golden (recorded through
// kvlab's caches and attend()) equals the same request run as a cell script.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "golden/files/golden_file.h"
#include "golden/runner/cell_run.h"
#include "tests/golden/scratch_dir.h"

namespace kvlab::cells {
namespace test_cells {

namespace fs = std::filesystem;
const fs::path kGolden = KVLAB_GOLDEN_SOURCE_DIR;

const golden::Model& model(const std::string& id) {
  static std::map<std::string, std::unique_ptr<golden::Model>> loaded;
  auto& m = loaded[id];
  if (!m) {
    std::ifstream in(kGolden / "models" / id / "config.json");
    const fs::path dir = golden::test::process_scratch_dir("kvlab_golden_cells_") / id;
    fs::create_directories(dir);
    golden::write_tiny_model(nlohmann::json::parse(in), id, dir);
    m = golden::Model::load(dir);
  }
  return *m;
}

cells::Run run(const std::string& id, const std::string& script, std::uint64_t seed = 1) {
  OracleEngine e(model(id));
  cells::Run r = run_script(e, cell_script::parse(script), seed);
  EXPECT_EQ(r.error, "") << script;
  return r;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

class Cells : public ::testing::TestWithParam<std::string> {};

// Keys and queries rotated at positions 5 further: every score is the same in exact
// arithmetic; f32 rounding of the rotated vectors moves logits by ~1e-6.
TEST_P(Cells, AShiftOfTheWholeSequenceChangesNoOutput) {
  const cells::Run plain = run(GetParam(), "p0:6.d0.d0");
  const cells::Run shifted = run(GetParam(), "p0:6.add0:-:5.d0.d0");
  ASSERT_EQ(plain.outputs.size(), 3U);
  ASSERT_EQ(shifted.outputs.size(), 3U);
  EXPECT_EQ(shifted.outputs[1].pos, 11);  // the next position follows the shifted maximum
  for (std::size_t i = 1; i < 3; ++i) EXPECT_LT(max_diff(plain.outputs[i].out.logits, shifted.outputs[i].out.logits), 1e-4);
}

// Sequence 1's cells are never visible to sequence 0: bit for bit.
TEST_P(Cells, AnotherSequenceInThePoolChangesNothing) {
  const cells::Run alone = run(GetParam(), "p0:6.d0");
  const cells::Run shared = run(GetParam(), "p0:6.p1:4.d0_1.d0");
  ASSERT_EQ(shared.outputs.size(), 5U);  // p0, p1, d0_1 (two), d0
  EXPECT_EQ(shared.outputs[2].seq, 0);
  EXPECT_EQ(alone.outputs[1].out.logits, shared.outputs[2].out.logits);
}

// A fork (empty the target, copy every cell) continued by the second prompt equals the
// source continued by it: the same K/V at the same positions.
TEST_P(Cells, AForkBySeqCpEqualsContinuingTheSource) {
  const cells::Run fork = run(GetParam(), "p0:8.rm1:-.cp0_1:-.p1:3");
  const cells::Run same = run(GetParam(), "p0:8.p0:3");
  EXPECT_EQ(fork.outputs.back().pos, 10);
  EXPECT_EQ(fork.outputs.back().out.logits, same.outputs.back().out.logits);
}

// The checked-in plain golden (kvlab's caches, attend(), generate_step's calls) against
// the same request as a cell script: prompt 0 of seed 1 (13 tokens) in one call, then 23
// decodes. Golden tolerance (scenario.h: 1e-3 for two correct f32 engines).
TEST_P(Cells, ThePlainGoldenIsTheSameRequestAsACellScript) {
  const golden::Golden g = golden::read_golden(kGolden / "data" / (GetParam() + ".plain.kvlab.safetensors"));
  ASSERT_EQ(g.sequences.size(), 1U);
  const auto& seq = g.sequences[0];
  std::string script = "p0:13";
  for (std::int64_t s = 1; s < seq.steps(); ++s) script += ".d0";
  const cells::Run r = run(GetParam(), script);
  ASSERT_EQ(static_cast<std::int64_t>(r.outputs.size()), seq.steps());
  const auto vocab = seq.logits.dim(1);
  const auto* golden_logits = reinterpret_cast<const float*>(seq.logits.data());
  double worst = 0;
  for (std::int64_t s = 0; s < seq.steps(); ++s) {
    const std::vector<float> row(golden_logits + s * vocab, golden_logits + (s + 1) * vocab);
    worst = std::max(worst, max_diff(r.outputs[static_cast<std::size_t>(s)].out.logits, row));
    if (s + 1 < seq.steps()) {  // step s's greedy token is what d number s + 1 fed
      EXPECT_EQ(r.fed.at(static_cast<std::size_t>(s)), seq.tokens[static_cast<std::size_t>(s)]) << "step " << s;
    }
  }
  EXPECT_LT(worst, 1e-3);
}

TEST_P(Cells, RandomScriptsAreDeterministicAndValid) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const std::string s = random_script(seed, 3, 14);
    EXPECT_EQ(s, random_script(seed, 3, 14));
    const cells::Run r = run(GetParam(), s, seed);  // the oracle accepts every command
    EXPECT_FALSE(r.outputs.empty()) << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Cells, ::testing::Values("llama_dense", "llama_hybrid"));

}  // namespace test_cells
}  // namespace kvlab::cells
