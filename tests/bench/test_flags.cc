// kvlab_bench's own flags: parsed and removed, Google Benchmark's left in place, bad
// values named; the smoke tier's defaults.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/bench_suite.h"
#include "tests/unit/test_util.h"

namespace kvlab::bench {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (std::string& s : args) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(args.size());
  }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
  int argc = 0;
};

TEST(SuiteFlags, KvlabFlagsAreTakenAndTheRestIsLeftForGoogleBenchmark) {
  Argv a({"kvlab_bench", "--benchmark_repetitions=5", "--kvlab_ops=rope,kv_scatter", "--kvlab_flush_mib=0",
          "--benchmark_out=r.json", "--kvlab_backends=simd:AVX2", "--kvlab_min_time=0.3"});
  const SuiteOptions o = parse_suite_flags(a.argc, a.ptrs.data());
  ASSERT_EQ(a.argc, 3);
  EXPECT_EQ(std::string(a.ptrs[1]), "--benchmark_repetitions=5");
  EXPECT_EQ(std::string(a.ptrs[2]), "--benchmark_out=r.json");
  EXPECT_EQ(a.ptrs[3], nullptr);
  EXPECT_EQ(o.ops, (std::vector<std::string>{"rope", "kv_scatter"}));
  EXPECT_EQ(o.backends, (std::vector<std::string>{"simd:AVX2"}));
  EXPECT_EQ(o.flush_mib, 0);
  EXPECT_EQ(o.min_time, 0.3);
  EXPECT_EQ(o.tier, "perf");
  EXPECT_FALSE(o.smoke);
  EXPECT_EQ(o.baseline_mib, big_mib(256, largest_cache_bytes()));  // the issue's >= 256 MiB
  EXPECT_EQ(o.flush_mib, 0);
  Argv b({"kvlab_bench"});
  EXPECT_EQ(parse_suite_flags(b.argc, b.ptrs.data()).flush_mib, big_mib(128, largest_cache_bytes()));
}

// The default buffers outgrow every cache: twice the largest (rounded up to MiB), never
// below the fixed floors; an unknown cache size (0) leaves the floors.
TEST(SuiteFlags, DefaultBuffersAreTwiceTheLargestCache) {
  constexpr std::int64_t kMiB = 1 << 20;
  EXPECT_EQ(big_mib(256, 0), 256);
  EXPECT_EQ(big_mib(128, 32 * kMiB), 128);
  EXPECT_EQ(big_mib(128, 480 * kMiB), 960);
  EXPECT_EQ(big_mib(256, 480 * kMiB + 1), 962);
  EXPECT_EQ(big_mib(256, 96 * kMiB), 256);
}

TEST(SuiteFlags, TheSmokeTierIsOneIterationOverSmallBuffersUnlessToldOtherwise) {
  Argv a({"kvlab_bench", "--kvlab_tier=smoke"});
  const SuiteOptions o = parse_suite_flags(a.argc, a.ptrs.data());
  EXPECT_TRUE(o.smoke);
  EXPECT_EQ(o.baseline_mib, 16);
  EXPECT_EQ(o.flush_mib, 0);
  Argv b({"kvlab_bench", "--kvlab_tier=smoke", "--kvlab_baseline_mib=256", "--kvlab_flush_mib=64"});
  const SuiteOptions p = parse_suite_flags(b.argc, b.ptrs.data());
  EXPECT_EQ(p.baseline_mib, 256);
  EXPECT_EQ(p.flush_mib, 64);
}

TEST(SuiteFlags, AVulkanBackendKeepsItsOwnCommaFlags) {
  Argv a({"kvlab_bench", "--kvlab_backends=reference,vulkan:,words,staging,vulkan:1,simd:AVX3,vulkan,words"});
  const SuiteOptions o = parse_suite_flags(a.argc, a.ptrs.data());
  // "vulkan,words" is not a variant (that is "vulkan:,words"): two names, the second unknown.
  EXPECT_EQ(o.backends, (std::vector<std::string>{"reference", "vulkan:,words,staging", "vulkan:1", "simd:AVX3",
                                                  "vulkan", "words"}));
  // Any flag a later variant grammar adds stays with its variant too.
  Argv b({"kvlab_bench", "--kvlab_backends=vulkan:1,nosubgroup,reference"});
  EXPECT_EQ(parse_suite_flags(b.argc, b.ptrs.data()).backends,
            (std::vector<std::string>{"vulkan:1,nosubgroup", "reference"}));
}

TEST(SuiteFlags, TheFullTierAddsTheGpuShapesToThePerfFiles) {
  EXPECT_EQ(tier_roles("smoke"), (std::vector<std::string>{"smoke"}));
  EXPECT_EQ(tier_roles("perf"), (std::vector<std::string>{"perf"}));
  EXPECT_EQ(tier_roles("full"), (std::vector<std::string>{"perf", "perf_gpu"}));
  Argv a({"kvlab_bench", "--kvlab_tier=full"});
  const SuiteOptions o = parse_suite_flags(a.argc, a.ptrs.data());
  EXPECT_EQ(o.tier, "full");
  EXPECT_FALSE(o.smoke);
  EXPECT_EQ(o.baseline_mib, big_mib(256, largest_cache_bytes()));
}

TEST(SuiteFlags, BadFlagsAndValuesAreNamed) {
  Argv a({"kvlab_bench", "--kvlab_tire=smoke"});
  EXPECT_KVLAB_ERROR(parse_suite_flags(a.argc, a.ptrs.data()), invalid_argument, "kvlab_tire");
  Argv b({"kvlab_bench", "--kvlab_flush_mib=-1"});
  EXPECT_KVLAB_ERROR(parse_suite_flags(b.argc, b.ptrs.data()), invalid_argument, "--kvlab_flush_mib=-1");
  Argv c({"kvlab_bench", "--kvlab_min_time=fast"});
  EXPECT_KVLAB_ERROR(parse_suite_flags(c.argc, c.ptrs.data()), invalid_argument, "--kvlab_min_time=fast");
  Argv d({"kvlab_bench", "--kvlab_tier=ci"});
  EXPECT_KVLAB_ERROR(parse_suite_flags(d.argc, d.ptrs.data()), invalid_argument, "--kvlab_tier=ci");
}

}  // namespace
}  // namespace kvlab::bench
