// The cache command language (cache/cache_script.h): the verbs of the stateful commands
// (the quantization policy, a ring's prefix snapshot, the chunked front trim) and of the
// prefix scripts (w, i, g) parse, print canonically and run; the harness's cache-case
// tests cover the rest of it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cache/cache_script.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_cache_script {
namespace {

namespace cs = kvlab::cache_script;

class Quiet final : public cs::Observer {
 public:
  void attention(const cs::Step&, const DTensor&, const AttendResult&, const DTensor&) override {}
  void after_command(const Cache&) override {}
};

CacheSetup small(CacheKind kind) {
  CacheSetup s;
  s.kind = kind;
  s.hq = 2, s.hkv = 1, s.dim = 32;
  s.rope = false;
  s.spec = QuantSpec{QuantMode::affine, 4, 32};
  s.max_size = 4;
  s.chunk = 4;
  return s;
}

// Runs `word` over ramp inputs on the reference backend; returns the final cache.
std::unique_ptr<Cache> run(Backend& be, const CacheSetup& s, const std::string& word) {
  const cs::Script script = cs::parse_script(word);
  const cs::Plan plan = cs::plan_script(s, script);
  const auto ramp = [&](std::int64_t rows) {
    std::vector<float> v(static_cast<std::size_t>(rows * s.dim));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13) / 13.0f - 0.5f;
    return be.upload(Tensor::from_values(DType::f32, Shape{rows, s.dim}, v));
  };
  Quiet quiet;
  return cs::run_script(be, s, script, ramp(plan.q_rows), ramp(plan.kv_rows), ramp(plan.kv_rows), quiet);
}

TEST(CacheScript, StatefulVerbsParseAndPrintCanonically) {
  for (const char* word : {"p8.m4.d", "p8.e.d2", "p8.c.u2", "m0", "c.c", "e"})
    EXPECT_EQ(cs::script_str(cs::parse_script(word)), word);
  EXPECT_EQ(cs::parse_script("m0").front(), (cs::Command{cs::Verb::policy, 0, 0, {}}));
  EXPECT_EQ(cs::parse_script("m12").front().n, 12);
  EXPECT_EQ(cs::parse_script("e").front().verb, cs::Verb::extract);
  EXPECT_EQ(cs::parse_script("c").front().verb, cs::Verb::trim_front);
  for (const char* bad : {"e1", "c2", "m", "m01"}) {
    EXPECT_KVLAB_ERROR((void)cs::parse_script(bad), invalid_argument, "script '" + std::string(bad) + "'");
  }
}

TEST(CacheScript, PolicyConvertsAKvCacheOnceItsOffsetReachesTheStart) {
  const CacheSetup kv = small(CacheKind::kv);
  EXPECT_FALSE(cs::script_quantizes(kv, cs::parse_script("p4.m5")));
  EXPECT_TRUE(cs::script_quantizes(kv, cs::parse_script("p4.m4")));
  EXPECT_TRUE(cs::script_quantizes(kv, cs::parse_script("p4.m5.d.m5")));
  EXPECT_FALSE(cs::script_quantizes(kv, cs::parse_script("p8.t4.m5")));
  EXPECT_FALSE(cs::script_quantizes(small(CacheKind::rotating), cs::parse_script("p8.m0")));
  ReferenceBackend be;
  EXPECT_FALSE(run(be, kv, "p4.m5")->is_quantized());
  const auto converted = run(be, kv, "p4.m4.d");
  EXPECT_TRUE(converted->is_quantized());
  EXPECT_EQ(converted->offsets(), (std::vector<std::int32_t>{5}));
  // A ring stays plain (mlx-lm#1573); `q` after a converting `m` is a second conversion.
  EXPECT_EQ(run(be, small(CacheKind::rotating), "p6.m0")->class_name(), "RotatingKVCache");
  EXPECT_KVLAB_ERROR((void)cs::plan_script(kv, cs::parse_script("p4.m4.q")), invalid_argument, "already quantized");
}

TEST(CacheScript, ExtractIsTheRingsNewestTokens) {
  ReferenceBackend be;
  const auto snapshot = run(be, small(CacheKind::rotating), "p6.e");
  EXPECT_EQ(snapshot->class_name(), "RotatingKVCache");
  EXPECT_EQ(snapshot->offsets(), (std::vector<std::int32_t>{6}));
  EXPECT_EQ(snapshot->content().at(0).positions, (std::vector<std::int32_t>{2, 3, 4, 5}));
  EXPECT_KVLAB_ERROR((void)cs::plan_script(small(CacheKind::kv), cs::parse_script("p6.e")), invalid_argument,
                     "kind=rotating keep=0");
}

TEST(CacheScript, TrimFrontKeepsAChunkedCachesLastChunk) {
  ReferenceBackend be;
  // Six tokens through one update: the front trim before it saw an empty cache, `c` trims.
  const auto chunked = run(be, small(CacheKind::chunked), "u6.c");
  EXPECT_EQ(chunked->kv_length(), 4);
  EXPECT_EQ(run(be, small(CacheKind::kv), "u6.c")->kv_length(), 6);  // nothing to trim
}

// ---- prefix scripts: a prefix store and tokens named by id -------------------------------

// Row `row` of the ramp run() feeds (hkv = 1: token id t is row t of k and v).
std::vector<float> ramp_row(const CacheSetup& s, std::int64_t row) {
  std::vector<float> out;
  for (std::int64_t d = 0; d < s.dim; ++d) out.push_back(static_cast<float>((row * s.dim + d) % 13) / 13.0f - 0.5f);
  return out;
}
// The keys a plain cache holds, as rows of floats.
std::vector<std::vector<float>> held_keys(const Cache& cache) {
  const Tensor k = cache.backend().download(cache.content().at(0).part("keys"));
  std::vector<std::vector<float>> out;
  const std::int64_t n = k.dim(2), d = k.dim(3);
  for (std::int64_t j = 0; j < n; ++j) {
    std::vector<float> row;
    for (std::int64_t x = 0; x < d; ++x) row.push_back(k.view().load(j * d + x));
    out.push_back(row);
  }
  return out;
}

TEST(CacheScript, PrefixVerbsParseAndPrintCanonically) {
  for (const char* word : {"w1_2_3.i.g1_2_5.w5", "w0", "g7", "i", "w4_0.t1.s"})
    EXPECT_EQ(cs::script_str(cs::parse_script(word)), word);
  EXPECT_EQ(cs::parse_script("w4_0").front().ids, (std::vector<std::int32_t>{4, 0}));
  EXPECT_EQ(cs::parse_script("g9").front().verb, cs::Verb::get);
  EXPECT_EQ(cs::parse_script("w1.w2").size(), 2U);  // two updates, never merged
  for (const char* bad : {"w", "g", "w01", "i2", "w1__2", "g-1"})
    EXPECT_KVLAB_ERROR((void)cs::parse_script(bad), invalid_argument, "script '" + std::string(bad) + "'");
}

TEST(CacheScript, PrefixScriptsReadAnIdTableAndStandAlone) {
  CacheSetup kv = small(CacheKind::kv);
  kv.hkv = 2;
  const cs::Plan plan = cs::plan_script(kv, cs::parse_script("w1_2_3.i.g1_2"));
  EXPECT_EQ(plan.kv_rows, 8);  // ids 0..3, two heads each
  EXPECT_EQ(plan.q_rows, 0);
  ASSERT_EQ(plan.steps.size(), 1U);
  EXPECT_EQ(plan.steps[0].tokens, 4);
  EXPECT_EQ(plan.steps[0].kv_row, 0);
  EXPECT_KVLAB_ERROR((void)cs::plan_script(kv, cs::parse_script("p4.i")), invalid_argument, "'p4' cannot share");
  EXPECT_KVLAB_ERROR((void)cs::plan_script(small(CacheKind::batch_kv), cs::parse_script("w1")), invalid_argument,
                     "not batch_kv");
  EXPECT_KVLAB_ERROR((void)cs::plan_script(small(CacheKind::chunked), cs::parse_script("w1.i")), invalid_argument,
                     "not chunked");
}

TEST(CacheScript, GetReplacesTheCacheByTheStoresBestMatch) {
  ReferenceBackend be;
  const CacheSetup kv = small(CacheKind::kv);
  // Entry [1 2 3]; request [1 2 5] diverges after 2 tokens: a trimmed copy holding ids 1, 2.
  const auto lcp = run(be, kv, "w1_2_3.i.g1_2_5");
  EXPECT_EQ(lcp->offsets(), (std::vector<std::int32_t>{2}));
  EXPECT_EQ(held_keys(*lcp), (std::vector<std::vector<float>>{ramp_row(kv, 1), ramp_row(kv, 2)}));
  EXPECT_EQ(run(be, kv, "w1_2.i.g1_2")->offsets(), (std::vector<std::int32_t>{2}));  // exact
  EXPECT_EQ(run(be, kv, "w1_2.i.g3")->offsets(), (std::vector<std::int32_t>{0}));    // miss: an empty cache
  // The entry is a copy: the live cache trimmed and overwritten since does not show.
  const auto kept = run(be, kv, "w1_2.i.t1.w3.g1_2");
  EXPECT_EQ(held_keys(*kept), (std::vector<std::vector<float>>{ramp_row(kv, 1), ramp_row(kv, 2)}));
  // A trim shortens the log with the cache: the entry is [1 2], a prefix of the request.
  EXPECT_EQ(run(be, kv, "w1_2_3.t1.i.g1_2_3")->offsets(), (std::vector<std::int32_t>{2}));
  EXPECT_EQ(run(be, small(CacheKind::quantized), "w1_2_3.i.g1_2_5")->offsets(), (std::vector<std::int32_t>{2}));
  EXPECT_KVLAB_ERROR((void)run(be, kv, "i"), invalid_argument, "holds no token");
}

TEST(CacheScript, GetNeverTrimsAWrappedRing) {
  ReferenceBackend be;
  CacheSetup ring = small(CacheKind::rotating);
  ring.max_size = 2;
  // [1 2 3] wrapped a ring of 2: it cannot serve [1 2 4] by a trim (mlx-vlm#1715), only a
  // request it is a prefix of.
  EXPECT_EQ(run(be, ring, "w1_2_3.i.g1_2_4")->offsets(), (std::vector<std::int32_t>{0}));
  const auto longer = run(be, ring, "w1_2_3.i.g1_2_3_4");
  EXPECT_EQ(longer->offsets(), (std::vector<std::int32_t>{3}));
  // One update of three tokens keeps them all (a chunk is concatenated whole, as in
  // mlx-lm's RotatingKVCache): the hit is that ring, copied.
  EXPECT_EQ(held_keys(*longer),
            (std::vector<std::vector<float>>{ramp_row(ring, 1), ramp_row(ring, 2), ramp_row(ring, 3)}));
}

TEST(CacheScript, MergeRebuildsTheBatchFromItsRows) {
  ReferenceBackend be;
  CacheSetup s = small(CacheKind::batch_kv);
  s.batch = 2, s.lpad = 3;  // rows padded 0 and 3: after p4 they hold 4 and 1 tokens
  EXPECT_EQ(cs::script_str(cs::parse_script("p4.j.d")), "p4.j.d");
  const auto merged = run(be, s, "p4.j");
  EXPECT_EQ(merged->class_name(), "BatchKVCache");
  EXPECT_EQ(merged->offsets(), (std::vector<std::int32_t>{4, 1}));
  // One row of one token merged alone: a batch of one token, whatever padding it had.
  const auto alone = run(be, s, "p4.k1.j");
  EXPECT_EQ(alone->offsets(), (std::vector<std::int32_t>{1}));
  EXPECT_EQ(alone->kv_length(), 1);
  for (const CacheKind kind : {CacheKind::batch_rotating, CacheKind::batch_quantized}) {
    CacheSetup k = s;
    k.kind = kind;
    EXPECT_EQ(run(be, k, "p4.j.d")->offsets(), (std::vector<std::int32_t>{5, 2}));
  }
  EXPECT_KVLAB_ERROR((void)cs::plan_script(small(CacheKind::kv), cs::parse_script("p4.j")), invalid_argument,
                     "needs a batch kind");
  CacheSetup device = s;
  device.kind = CacheKind::device_batch_kv;
  EXPECT_KVLAB_ERROR((void)run(be, device, "p4.j"), misuse, "merge");
}

}  // namespace
}  // namespace test_cache_script
}  // namespace kvlab
