// The cache command language (cache/cache_script.h): the verbs of the stateful commands
// (the quantization policy, a ring's prefix snapshot, the chunked front trim) parse,
// print canonically and run; the harness's cache-case tests cover the rest of it.
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

}  // namespace
}  // namespace test_cache_script
}  // namespace kvlab
