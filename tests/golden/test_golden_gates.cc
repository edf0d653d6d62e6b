// The gates of the golden commands that must not pass by accident: paths that are not
// regular files are refused without opening them, a mistyped name is named with the
// nearest known one, a diff takes its tolerance from the checked-in scenarios (never from
// the goldens, and the same for A B as for B A) and refuses goldens of different weights,
// and a register of known golden divergences explains, or goes stale.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden/files/diff.h"
#include "golden/files/inputs.h"
#include "golden/files/known_goldens.h"
#include "tests/golden/scratch_dir.h"
#include "kvlab/error.h"

namespace kvlab::golden::test_golden_gates {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

fs::path scratch_file(const std::string& name) { return test::process_scratch_dir("kvlab_golden_files_test_") / name; }

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

// A one-sequence golden of model `sha` whose logits put `top` first.
Golden one_step(const std::string& sha, const std::string& scenario, float top, const std::string& line = "") {
  Golden g;
  g.meta = {{"model", "m"}, {"model_sha256", sha}, {"scenario", scenario}, {"scenario_line", line}};
  SequenceRecord s;
  s.prompt = {1};
  s.tokens = {0};
  s.logits = Tensor::from_values(DType::f32, Shape{1, 2}, std::vector<float>{top, 0.f});
  g.sequences.push_back(std::move(s));
  return g;
}

TEST(Inputs, SpecialFilesAreRefusedWithoutOpeningThem) {
  const fs::path fifo = scratch_file("gates.fifo"), dir = scratch_file("gates.dir"), file = scratch_file("gates.txt");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directories(dir);
  write_text(file, "x");
  // A FIFO without a writer would block an open() forever: the test would hang, not fail.
  EXPECT_THAT(error_message([&] { require_regular_file(fifo, "golden file"); }),
              HasSubstr("golden file '" + fifo.string() + "' is not a regular file (it is a FIFO)"));
  EXPECT_THAT(error_message([&] { require_regular_file(dir, "scenario file"); }), HasSubstr("(it is a directory)"));
  EXPECT_THAT(error_message([&] { require_regular_file("/dev/null", "model config"); }),
              HasSubstr("(it is a character device)"));
  EXPECT_THAT(error_message([&] { require_regular_file(scratch_file("absent"), "golden file"); }),
              HasSubstr("cannot open golden file"));
  EXPECT_EQ(error_message([&] { require_regular_file(file, "golden file"); }), "no error");
  EXPECT_THAT(error_message([&] { read_golden(fifo); }), HasSubstr("is not a regular file (it is a FIFO)"));
  EXPECT_THAT(error_message([&] { read_scenarios(fifo); }), HasSubstr("is not a regular file (it is a FIFO)"));
}

TEST(Inputs, TheNearestKnownNameIsOfferedOnlyWhenItLooksLikeATypo) {
  const std::vector<std::string> models = {"gemma4_small", "llama_dense", "llama_hybrid"};
  EXPECT_EQ(closest_name("llama_dens", models), "llama_dense");
  EXPECT_EQ(closest_name("llama_hybird", models), "llama_hybrid");  // a swap is one edit
  EXPECT_EQ(closest_name("nope", models), "");
  EXPECT_EQ(closest_name("plian", {"plain", "kv8", "kv4"}), "plain");
  EXPECT_EQ(closest_name("kv2", {"plain", "kv8", "kv4"}), "kv8");  // the first of equals
  EXPECT_EQ(unknown_name_message("model", "llama_dens", models),
            "unknown model 'llama_dens' (did you mean 'llama_dense'? models: gemma4_small, llama_dense, llama_hybrid)");
  EXPECT_EQ(unknown_name_message("scenario", "x", {}), "unknown scenario 'x' (scenarios: none)");
}

TEST(DiffGate, GoldensOfDifferentWeightsAreRefusedNamingBothHashes) {
  const Golden a = one_step("aaaa", "plain", 1), b = one_step("bbbb", "plain", 1);
  const std::string e = error_message([&] { diff_goldens({&a, "A"}, {&b, "B"}, {}); });
  EXPECT_THAT(e, HasSubstr("model_sha256 aaaa"));
  EXPECT_THAT(e, HasSubstr("model_sha256 bbbb"));
  EXPECT_EQ(error_message([&] { diff_goldens({&a, "A"}, {&a, "A"}, {}); }), "no error");
}

TEST(DiffGate, TheToleranceComesFromTheCheckedInScenarioWhateverTheGoldensSay) {
  const fs::path file = scratch_file("gates.scenarios");
  write_text(file, "plain prompts=1 steps=1\nloose prompts=1 steps=1 max_dlogit=0.5 min_top1=0.5\n");
  const auto from_file = [&](const Golden&) { return file; };
  // A golden claiming a loose line of its own is judged by the checked-in 'plain'.
  const Golden claims = one_step("s", "plain", 1, "plain prompts=1 steps=1 max_dlogit=100 min_top1=0");
  const Golden other = one_step("s", "plain", 1.2f);
  const ToleranceChoice t = scenario_tolerance(claims, other, from_file);
  EXPECT_EQ(t.tolerance.max_dlogit, 1e-3);
  EXPECT_EQ(t.tolerance.min_top1, 1.0);
  EXPECT_THAT(t.from, HasSubstr(file.string() + " 'plain'"));
  // Different scenarios: field by field the stricter, in either order.
  const Golden loose = one_step("s", "loose", 1);
  for (const auto& [x, y] : {std::pair{&loose, &other}, std::pair{&other, &loose}}) {
    const ToleranceChoice s = scenario_tolerance(*x, *y, from_file);
    EXPECT_EQ(s.tolerance.max_dlogit, 1e-3);
    EXPECT_EQ(s.tolerance.min_top1, 1.0);
  }
  // Found on one side only: that side's, whichever it is.
  const Golden unknown = one_step("s", "not_there", 1);
  EXPECT_EQ(scenario_tolerance(unknown, loose, from_file).tolerance.max_dlogit, 0.5);
  EXPECT_EQ(scenario_tolerance(loose, unknown, from_file).tolerance.max_dlogit, 0.5);
  // Found nowhere: the README defaults, and why.
  const ToleranceChoice d = scenario_tolerance(unknown, unknown, [](const Golden&) { return fs::path("/nonexistent"); });
  EXPECT_EQ(d.tolerance.max_dlogit, 1e-3);
  EXPECT_THAT(d.from, HasSubstr("the README defaults"));
}

TEST(KnownGoldens, ExplainsListedFailuresAndGoesStaleWhenTheyPass) {
  const fs::path file = scratch_file("gates.known");
  write_text(file,
             "# comment\n"
             "mlx | golden model=m1 scenario=kv4,kv8 raise~=unsupported.*rounding | representation | no rounding\n"
             "mlx | golden scenario=batch | representation | padding\n"
             "simd | golden | kvlab-bug | another backend's\n");
  KnownGoldens known(file);
  EXPECT_EQ(known.size(), 3u);
  const KnownGolden* e = known.judge("mlx", "m1", "kv4", true, "status 'error: unsupported: rounding=mlx'");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->where, file.string() + ":2");
  EXPECT_EQ(known.judge("mlx", "m1", "kv8", true, "max |dlogit| 0.2 > 0.001"), nullptr);  // raise~ does not match
  EXPECT_EQ(known.judge("mlx", "m2", "kv4", true, "unsupported rounding"), nullptr);      // model= does not
  EXPECT_EQ(known.judge("mlx:cpu", "m2", "plain", true, "x"), nullptr);                  // nothing names plain
  EXPECT_TRUE(known.stale().empty());
  EXPECT_EQ(known.judge("mlx", "m1", "batch", false, ""), nullptr);  // ran and passed
  ASSERT_EQ(known.stale().size(), 1u);
  EXPECT_EQ(known.stale()[0]->note, "padding");
}

TEST(KnownGoldens, MalformedEntriesAreErrorsNamingTheLine) {
  const fs::path file = scratch_file("gates.bad_known");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"mlx | golden | representation\n", ":1: an entry has 4 fields"},
      {"mlx | sdpa | representation | x\n", "the op of a golden register is 'golden', not 'sdpa'"},
      {"mlx | golden colour=red | representation | x\n", "unknown key 'colour'"},
      {"mlx | golden | harmless | x\n", "unknown class 'harmless'"},
      {"mlx | golden raise~=( | representation | x\n", "raise~=( is not a regex"},
  };
  for (const auto& [text, needle] : cases) {
    write_text(file, text);
    EXPECT_THAT(error_message([&] { KnownGoldens k(file); }), HasSubstr(needle)) << text;
  }
}

}  // namespace kvlab::golden::test_golden_gates
