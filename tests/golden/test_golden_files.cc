// The file side of goldens: scenario lines, the prompt-token rule, golden files (round
// trip and strict reading) and the diff's statistics on hand-computed cases.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden/files/diff.h"
#include "golden/files/golden_file.h"
#include "golden/files/scenario.h"
#include "tests/golden/scratch_dir.h"
#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Scenario, ParsesEveryKey) {
  const Scenario s = parse_scenario(
      "batch prompts=13,6,9 steps=16 finish=1@6 join=7@8 seed=4 max_dlogit=0.01 attn_rel=1e-3 # comment", "t");
  EXPECT_EQ(s.name, "batch");
  EXPECT_EQ(s.prompts, (std::vector<int>{13, 6, 9}));
  EXPECT_EQ(s.steps, 16);
  EXPECT_EQ(s.seed, 4u);
  ASSERT_TRUE(s.finish && s.join);
  EXPECT_EQ(s.finish->request, 1);
  EXPECT_EQ(s.finish->after, 6);
  EXPECT_EQ(s.join->prompt, 7);
  EXPECT_EQ(s.join->after_step, 8);
  EXPECT_DOUBLE_EQ(s.tolerance.max_dlogit, 0.01);
  EXPECT_DOUBLE_EQ(s.tolerance.attn_rel, 1e-3);
  EXPECT_TRUE(s.is_batch());
  const Scenario q = parse_scenario("kv4 prompts=13 steps=24 kv_bits=4 kv_group_size=32 quantized_kv_start=16", "t");
  EXPECT_EQ(*q.kv_bits, 4);
  EXPECT_EQ(q.kv_group_size, 32);
  EXPECT_EQ(q.quantized_kv_start, 16);
  const Scenario p = parse_scenario("prefix prompts=14 steps=12 prefix=10 second=5", "t");
  EXPECT_EQ(p.prefix->shared, 10);
  EXPECT_EQ(p.prefix->fresh, 5);
  EXPECT_EQ(s.batch_cache, BatchCache::host);  // the default
  const Scenario d = parse_scenario("device_batch prompts=13,6,9 steps=16 batch_cache=device", "t");
  EXPECT_EQ(d.batch_cache, BatchCache::device);
  EXPECT_TRUE(d.is_batch());
  EXPECT_EQ(parse_scenario("b prompts=3,4 steps=4 finish=1@2 batch_cache=host", "t").batch_cache, BatchCache::host);
}

TEST(Scenario, RejectsBadLinesNamingTheCulprit) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x prompts=13 steps=24 colour=red", "unknown key 'colour'"},
      {"x prompts=13 steps=abc", "steps='abc' is not an integer"},
      {"x prompts=13,0 steps=4", "prompts=0 is outside"},
      {"x prompts=13 steps=4 kv_bits=7", "kv_bits=7"},
      {"x prompts=13 steps=4 kv_group_size=48", "kv_group_size=48"},
      {"x prompts=13 steps=4 steps=5", "key steps given twice"},
      {"x steps=4", "prompts= is required"},
      {"x prompts=3 steps=4 finish=2@1", "names request 2"},
      {"x prompts=3 steps=4 prefix=2", "prefix= and second= go together"},
      {"x prompts=3,4 steps=4 kv_bits=4", "combines more than one"},
      {"x prompts=3 steps=4 save_at=3", "save_at=3 must be < steps - 1"},
      {"x prompts=3 steps=4 max_dlogit=-1", "max_dlogit='-1'"},
      {"x prompts=3 steps=4 join=2", "not of the form A@B"},
      {"prompts=3 steps=4", "not a name"},
      {"x prompts=3,4 steps=4 batch_cache=gpu", "batch_cache='gpu' is not host or device"},
      {"x prompts=3 steps=4 batch_cache=device", "batch_cache= applies to a batch"},
      {"x prompts=3 steps=4 batch_cache=host", "batch_cache= applies to a batch"},
      {"x prompts=3,4 steps=4 finish=1@2 batch_cache=device", "batch_cache=device cannot run finish="},
      {"x prompts=3,4 steps=4 batch_cache=device join=2@1", "batch_cache=device cannot run join="},
  };
  for (const auto& [line, want] : cases)
    EXPECT_THAT(error_of([&line = line] { parse_scenario(line, "f:1"); }), HasSubstr(want)) << line;
}

// Every numeric key at its limits: the bounds themselves parse, one past either bound is
// an error naming the key (an off-by-one range check passes tests that try values far
// outside). `{}` in a line is where the value goes.
TEST(Scenario, EveryRangeHoldsAtItsLimits) {
  struct Range {
    const char* line;
    long long lo, hi;
    const char* named;  // in the error one past a bound
  };
  const std::vector<Range> ranges = {
      {"x prompts={} steps=4", 1, 4096, "prompts="},
      {"x prompts=3 steps={}", 1, 4096, "steps="},
      {"x prompts=3 steps=4 seed={}", 0, 1ll << 53, "seed="},
      {"x prompts=3 steps=4 quantized_kv_start={} kv_bits=4", 0, 1 << 30, "quantized_kv_start="},
      {"x prompts=3 steps=4 max_kv_size={}", 5, 1 << 20, "max_kv_size="},
      {"x prompts=4096 steps=4 prefix={} second=1", 1, 4096, "prefix="},
      {"x prompts=3 steps=4 prefix=1 second={}", 1, 4096, "second="},
      {"x prompts=3,4 steps=4096 finish=1@{}", 1, 4095, "finish="},
      {"x prompts=3 steps=4096 join=2@{}", 0, 4095, "join="},
      {"x prompts=3 steps=4096 save_at={}", 0, 4094, "save_at="},
  };
  const auto with = [](std::string line, long long v) { return line.replace(line.find("{}"), 2, std::to_string(v)); };
  for (const Range& r : ranges) {
    for (const long long ok : {r.lo, r.hi})
      EXPECT_EQ(error_of([&] { parse_scenario(with(r.line, ok), "f:1"); }), "no error") << with(r.line, ok);
    for (const long long bad : {r.lo - 1, r.hi + 1})
      EXPECT_THAT(error_of([&] { parse_scenario(with(r.line, bad), "f:1"); }), HasSubstr(r.named)) << with(r.line, bad);
  }
  // At most 16 requests, of at most 4096 tokens each; a line of at most 4096 bytes.
  std::string sixteen = "x prompts=1", seventeen;
  for (int i = 1; i < 16; ++i) sixteen += ",1";
  seventeen = sixteen + ",1";
  EXPECT_EQ(error_of([&] { parse_scenario(sixteen + " steps=4", "f:1"); }), "no error");
  EXPECT_THAT(error_of([&] { parse_scenario(seventeen + " steps=4", "f:1"); }), HasSubstr("more than 16 requests"));
  const std::string head = "x prompts=3 steps=4 min_top1=0.";
  EXPECT_EQ(error_of([&] { parse_scenario(head + std::string(4096 - head.size(), '5'), "f:1"); }), "no error");
  EXPECT_THAT(error_of([&] { parse_scenario(head + std::string(4097 - head.size(), '5'), "f:1"); }),
              HasSubstr("line of 4097 bytes"));
}

TEST(Scenario, CheckedInScenarioFilesParse) {
  for (const char* id : {"llama_dense", "llama_hybrid", "gemma4_small"}) {
    const auto all = read_scenarios(std::filesystem::path(KVLAB_GOLDEN_SOURCE_DIR) / "scenarios" / id);
    EXPECT_GE(all.size(), 8u) << id;
    // Each model runs a batch through DeviceBatchKVCache (tests/golden/test_device_batch.cc).
    EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const Scenario& s) {
      return s.name == "device_batch" && s.batch_cache == BatchCache::device;
    })) << id;
  }
}

TEST(Scenario, PromptTokensFollowTheReadmeRule) {
  // splitmix64(0) is the published first output of SplitMix64 seeded with 0:
  // 0xE220A8397B1DCDAF; mod 256 = 0xAF.
  EXPECT_EQ(prompt_tokens(0, 0, 1, 256), (std::vector<std::int32_t>{0xAF}));
  // Token j of prompt p is splitmix64(seed*1000003 + p*10007 + j): the same key twice
  // gives the same token (seed 0, prompt 1, j 0 == seed 0, prompt 0, j 10007).
  EXPECT_EQ(prompt_tokens(0, 1, 1, 1000)[0], prompt_tokens(0, 0, 10008, 1000)[10007]);
}

SequenceRecord record(std::vector<std::int32_t> tokens, const std::vector<std::vector<float>>& logits) {
  SequenceRecord s;
  s.prompt = {1, 2, 3};
  s.tokens = std::move(tokens);
  const auto vocab = static_cast<std::int64_t>(logits.empty() ? 2 : logits[0].size());
  std::vector<float> flat;
  for (const auto& row : logits) flat.insert(flat.end(), row.begin(), row.end());
  s.logits = Tensor::from_values(DType::f32, Shape{static_cast<std::int64_t>(logits.size()), vocab}, flat);
  return s;
}

// A file in this process's scratch directory (removed when the process exits).
std::filesystem::path temp(const std::string& name) {
  return test::process_scratch_dir("kvlab_golden_files_test_") / name;
}

TEST(GoldenFile, RoundTripsEveryField) {
  Golden g;
  g.meta = {{"model", "m"}, {"engine", "kvlab"}};
  SequenceRecord s = record({1, 0}, {{0.f, 1.f, 0.5f}, {2.f, 1.f, 0.f}});
  s.attention.push_back(Tensor::from_values(DType::f32, Shape{2, 2}, std::vector<float>{1, 2, 3, 4}));
  s.reused = 7;
  g.sequences.push_back(s);
  SequenceRecord e = record({}, {});
  e.logits = Tensor(DType::f32, Shape{0, 3});
  e.status = "error: NotImplementedError: RotatingKVCache Quantization NYI";
  g.sequences.push_back(e);
  write_golden(temp("rt.safetensors"), g);
  const Golden r = read_golden(temp("rt.safetensors"));
  EXPECT_EQ(r.get("model"), "m");
  ASSERT_EQ(r.sequences.size(), 2u);
  EXPECT_EQ(r.sequences[0].tokens, (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(r.sequences[0].logits.to_f32(), s.logits.to_f32());
  ASSERT_EQ(r.sequences[0].attention.size(), 1u);
  EXPECT_EQ(r.sequences[0].attention[0].to_f32(), s.attention[0].to_f32());
  EXPECT_EQ(*r.sequences[0].reused, 7);
  EXPECT_EQ(r.sequences[1].status, e.status);
  EXPECT_EQ(r.sequences[1].steps(), 0);
}

TEST(GoldenFile, RejectsInconsistentRecordsBeforeWriting) {
  Golden g;
  g.sequences.push_back(record({1, 0, 1}, {{0.f, 1.f}, {1.f, 0.f}}));  // 3 tokens, 2 rows
  EXPECT_THAT(error_of([&] { write_golden(temp("bad.safetensors"), g); }), HasSubstr("do not match 3 generated tokens"));
  EXPECT_FALSE(std::filesystem::exists(temp("bad.safetensors")));
}

// The writer holds the reader's caps: 4096 sequences and 1024 attention layers are
// written and read back, one more of either is refused before anything is written.
// (Before, write_golden checked neither: it wrote goldens read_golden then refused.)
TEST(GoldenFile, WriterAndReaderShareTheirCaps) {
  const auto golden_of = [](std::size_t sequences, std::size_t layers) {
    Golden g;
    SequenceRecord s = record({0}, {{1.f}});
    s.attention.assign(layers, Tensor::from_values(DType::f32, Shape{1, 1}, std::vector<float>{2}));
    g.sequences.assign(sequences, s);
    return g;
  };
  write_golden(temp("cap.safetensors"), golden_of(4096, 1));
  EXPECT_EQ(read_golden(temp("cap.safetensors")).sequences.size(), 4096u);
  write_golden(temp("cap.safetensors"), golden_of(1, 1024));
  EXPECT_EQ(read_golden(temp("cap.safetensors")).sequences[0].attention.size(), 1024u);
  EXPECT_THAT(error_of([&] { write_golden(temp("over.safetensors"), golden_of(4097, 1)); }),
              HasSubstr("at most 4096 sequences"));
  EXPECT_THAT(error_of([&] { write_golden(temp("over.safetensors"), golden_of(1, 1025)); }),
              HasSubstr("1025 attention layers"));
  EXPECT_FALSE(std::filesystem::exists(temp("over.safetensors")));
}

TEST(GoldenFile, ReadingIsStrict) {
  Golden g;
  g.sequences.push_back(record({1}, {{0.f, 1.f}}));
  write_golden(temp("ok.safetensors"), g);
  const auto bytes = [&] {
    std::ifstream in(temp("ok.safetensors"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(temp(name), std::ios::binary) << content;
    return temp(name);
  };
  EXPECT_THAT(error_of([&] { read_golden(write("short.safetensors", bytes.substr(0, bytes.size() - 3))); }),
              HasSubstr("corrupt"));
  std::string renamed = bytes;
  renamed.replace(renamed.find("seq.0.logits"), 12, "seq.0.lagits");
  EXPECT_THAT(error_of([&] { read_golden(write("name.safetensors", renamed)); }), HasSubstr("unknown tensor 'seq.0.lagits'"));
  std::string status = bytes;
  status.replace(status.find("\"ok\""), 4, "\"no\"");
  EXPECT_THAT(error_of([&] { read_golden(write("status.safetensors", status)); }), HasSubstr("status 'no'"));
  Golden far;
  far.sequences.push_back(record({1}, {{0.f, 1.f}}));
  far.sequences[0].tokens = {5};
  write_golden(temp("far.safetensors"), far);
  EXPECT_THAT(error_of([&] { read_golden(temp("far.safetensors")); }), HasSubstr("token 5 is outside the vocabulary of 2"));
  EXPECT_THAT(error_of([&] { read_golden(temp("missing.safetensors")); }), HasSubstr("cannot open"));
}

// The token range at its limits (issue: a reader whose check is off by one passed every
// test that tried a token far outside): vocab − 1 and 0 are read, vocab and −1 are not.
TEST(GoldenFile, TokensAreCheckedAtTheLimitsOfTheVocabulary) {
  const auto read_token = [&](std::int32_t token) {
    Golden g;
    g.sequences.push_back(record({1}, {{0.f, 1.f, 2.f}}));  // a vocabulary of 3
    g.sequences[0].tokens = {token};
    const std::string name = "limit" + std::to_string(token) + ".safetensors";
    write_golden(temp(name), g);
    return error_of([&] { read_golden(temp(name)); });
  };
  EXPECT_EQ(read_token(2), "no error");
  EXPECT_EQ(read_token(0), "no error");
  EXPECT_THAT(read_token(3), HasSubstr("token 3 is outside the vocabulary of 3"));
  EXPECT_THAT(read_token(-1), HasSubstr("token -1 is outside the vocabulary of 3"));
}

Golden golden_of(std::vector<SequenceRecord> s) {
  Golden g;
  g.sequences = std::move(s);
  return g;
}

nlohmann::json diff(const Golden& a, const Golden& b, Tolerance t = {}) {
  return diff_goldens({&a, "A"}, {&b, "B"}, t);
}

TEST(Diff, IdenticalGoldensPassWithZeroKld) {
  const Golden a = golden_of({record({1, 0}, {{0.f, 1.f}, {3.f, -1.f}})});
  const auto r = diff(a, a);
  EXPECT_TRUE(diff_passed(r));
  EXPECT_EQ(r["summary"]["kld"]["max"].get<double>(), 0.0);
  EXPECT_TRUE(r["first_divergence"].is_null());
}

TEST(Diff, KldMatchesTheHandComputedValue) {
  // p_a = (1/2, 1/2), p_b = (1/4, 3/4): KLD = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3).
  const Golden a = golden_of({record({0}, {{0.f, 0.f}})});
  const Golden b = golden_of({record({0}, {{0.f, static_cast<float>(std::log(3.0))}})});
  const auto r = diff(a, b);
  EXPECT_NEAR(r["summary"]["kld"]["mean"].get<double>(), 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(r["summary"]["rms_dp"].get<double>(), 0.25, 1e-7);  // p_a(top 0) - p_b(0)
  EXPECT_FALSE(diff_passed(r));
  EXPECT_EQ(r["first_divergence"]["step"], 0);
  // The same pair within a generous tolerance passes... except top-1, which changed.
  const auto loose = diff(a, b, Tolerance{10, 10, 0, 1});
  EXPECT_TRUE(diff_passed(loose)) << loose["reasons"].dump();
}

TEST(Diff, NamesTheFirstDivergentStepAndLayerAndStopsComparingAfterIt) {
  auto base = record({1, 1, 0, 0}, {{0, 1}, {0, 1}, {1, 0}, {1, 0}});
  auto moved = record({1, 1, 1, 0}, {{0, 1}, {0, 1}, {0.4f, 0.6f}, {1, 0}});
  for (auto* s : {&base, &moved}) {
    s->attention.push_back(Tensor::from_values(DType::f32, Shape{4, 1}, std::vector<float>{1, 1, 1, 1}));
    s->attention.push_back(Tensor::from_values(DType::f32, Shape{4, 1}, std::vector<float>{1, 1, 1, 1}));
  }
  moved.attention[1] = Tensor::from_values(DType::f32, Shape{4, 1}, std::vector<float>{1, 1, 2, 1});
  const auto r = diff(golden_of({base}), golden_of({moved}));
  EXPECT_FALSE(diff_passed(r));
  EXPECT_EQ(r["first_divergence"]["sequence"], 0);
  EXPECT_EQ(r["first_divergence"]["step"], 2);
  EXPECT_EQ(r["first_divergence"]["layer"], 1);
  EXPECT_EQ(r["sequences"][0]["steps_compared"], 3);  // the token stream parted at step 2
  EXPECT_EQ(r["sequences"][0]["first_token_divergence"], 2);
  EXPECT_NEAR(r["sequences"][0]["layer_rel"][1][2].get<double>(), 1.0, 1e-12);
  EXPECT_THAT(diff_line(r), HasSubstr("first divergence: seq 0 step 2 layer 1 (token 0 vs 1)"));
}

TEST(Diff, ATeacherForcedSideIsComparedPastTheFirstDifferentToken) {
  const auto a = record({1, 1, 0}, {{0, 1}, {0, 1}, {1, 0}});
  const auto b = record({0, 1, 0}, {{1, 0}, {0, 1}, {1, 0}});
  EXPECT_EQ(diff(golden_of({a}), golden_of({b}))["sequences"][0]["steps_compared"], 1);
  Golden forced = golden_of({b});
  forced.meta["teacher_forced"] = "1";
  const auto r = diff(golden_of({a}), forced);
  EXPECT_EQ(r["sequences"][0]["steps_compared"], 3);
  EXPECT_NEAR(r["summary"]["top1_agreement"].get<double>(), 2.0 / 3.0, 1e-12);
  EXPECT_EQ(r["first_divergence"]["step"], 0);
}

TEST(Diff, AStatusDifferenceFailsAtTheStepWhereOneSideStopped) {
  auto ok = record({1, 1, 0}, {{0, 1}, {0, 1}, {1, 0}});
  auto err = record({1}, {{0, 1}});
  err.status = "error: NotImplementedError: RotatingKVCache Quantization NYI";
  const auto r = diff(golden_of({ok}), golden_of({err}));
  EXPECT_FALSE(diff_passed(r));
  EXPECT_EQ(r["first_divergence"]["step"], 1);
  EXPECT_THAT(r["reasons"][0].get<std::string>(), HasSubstr("NotImplementedError"));
}

TEST(Diff, NanLogitsFailAndAreWrittenAsStrings) {
  const Golden a = golden_of({record({0}, {{0.f, 1.f}})});
  const Golden b = golden_of({record({0}, {{0.f, std::nanf("")}})});
  const auto r = diff(a, b);
  EXPECT_FALSE(diff_passed(r));
  EXPECT_EQ(r["summary"]["max_abs_dlogit"], "nan");
}

TEST(Diff, RefusesGoldensOfDifferentPrompts) {
  auto a = record({0}, {{0.f, 1.f}});
  auto b = a;
  b.prompt = {9};
  EXPECT_THAT(error_of([&] { diff(golden_of({a}), golden_of({b})); }), HasSubstr("different prompts"));
}

}  // namespace
}  // namespace kvlab::golden
