// A bug-zoo mutant swapped in for a cache inside a whole model (issue 18): the golden
// diff must name the request and the step where the mutant's mechanism first bites.
//
// 41a.extend-keeps-left-padding (vlm#1110) keeps each row's old left padding through
// BatchKVCache.extend, so a joined row's offsets and mask are wrong from its first
// batched step on. In the batch scenario of llama_dense (golden/scenarios: prompts
// 13,6,9, request 1 leaves after 6 tokens, a 7-token request joins after step 8) the
// joiner is prefilled alone (its step 0 is right) and first decodes inside the batch at
// its step 1; the rows already there keep their padding, so they stay right.

#include <filesystem>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>

#include "golden/files/diff.h"
#include "golden/runner/runner.h"
#include "tests/golden/scratch_dir.h"
#include "harness/backends.h"
#include "property_tests/zoo/batch_mutants.h"

namespace kvlab::prop::zoo {
namespace {

namespace fs = std::filesystem;

TEST(GoldenZoo, TheDiffNamesTheRequestAndStepWhereTheExtendMutantBites) {
  std::ifstream in(fs::path(KVLAB_GOLDEN_SOURCE_DIR) / "models" / "llama_dense" / "config.json");
  const auto dir = golden::test::process_scratch_dir("kvlab_golden_zoo_") / "llama_dense";
  fs::create_directories(dir);
  golden::write_tiny_model(nlohmann::json::parse(in), "llama_dense", dir);
  const auto model = golden::Model::load(dir);
  const golden::Scenario scenario =
      golden::read_scenarios(fs::path(KVLAB_GOLDEN_SOURCE_DIR) / "scenarios" / "llama_dense").at(4);
  ASSERT_EQ(scenario.name, "batch");
  auto backend = harness::make_backend("reference");
  golden::RunContext ctx;
  ctx.backend = backend.get();
  ctx.model_id = "llama_dense";
  const golden::Golden good = golden::run_scenario(*model, scenario, ctx);

  const auto mutants = batch_lifecycle_mutants();
  const auto it = std::find_if(mutants.begin(), mutants.end(),
                               [](const BatchMutant& m) { return m.id == "41a.extend-keeps-left-padding"; });
  ASSERT_NE(it, mutants.end());
  const BatchMutant& mutant = *it;
  ctx.wrap_cache = [&mutant](std::unique_ptr<Cache> c, int) { return mutant.batch.wrap(std::move(c)); };
  const golden::Golden bad = golden::run_scenario(*model, scenario, ctx);

  const auto report = golden::diff_goldens({&good, "production"}, {&bad, it->id}, scenario.tolerance);
  std::cout << golden::diff_text(report);
  ASSERT_FALSE(golden::diff_passed(report));
  const auto& first = report["first_divergence"];
  EXPECT_EQ(first["sequence"], 3) << "the joiner is request 3";
  EXPECT_EQ(first["step"], 1) << "its first batched step";
  for (std::size_t seq : {0u, 1u, 2u}) EXPECT_TRUE(report["sequences"][seq]["first_token_divergence"].is_null()) << seq;
}

}  // namespace
}  // namespace kvlab::prop::zoo
