// Unit tests of the harness itself: problem lines, product syntax, case files, the
// counter RNG, comparisons, and the spine's checks (guard bands, poison, statuses,
// bitwise rerun).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unistd.h>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/rng.h"
#include "harness/forwarding_backend.h"
#include "kvlab/error.h"
#include "tests/unit/test_util.h"

namespace kvlab::harness {
namespace {

TEST(Problem, CanonicalLineNamesEveryParameterAndParsesBack) {
  const Problem p = parse_problem("  sdpa Lk=7   B=02 softcap=30.0 ");
  EXPECT_EQ(p.line(),
            "sdpa B=2 Hq=4 Hkv=4 Lq=4 Lk=7 Dk=64 Dv=64 dtype=f32 mask=none window=0 lpad=0 rpad=0 sinks=0 "
            "softcap=30 scale=0 fully_masked=zero mask_dims=B1 mask_dtype=f32 special=none seed=1");
  EXPECT_EQ(parse_problem(p.line()), p);
  EXPECT_EQ(p.with("Lk", "9").integer("Lk"), 9);
  for (const OpInfo* op : all_ops()) {
    const Problem d = parse_problem(std::string(op->name()));
    EXPECT_EQ(parse_problem(d.line()), d) << d.line();
  }
}

TEST(Problem, ProductSyntaxExpandsInLineOrder) {
  const std::vector<Problem> all = expand_line("affine_quantize group=32,64 bits=2,3,4");
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0].integer("group"), 32);
  EXPECT_EQ(all[0].integer("bits"), 2);
  EXPECT_EQ(all[1].integer("bits"), 3);  // the last listed key varies fastest
  EXPECT_EQ(all[3].integer("group"), 64);
  EXPECT_THROW(parse_problem("affine_quantize bits=2,3"), Error);  // repro wants one problem
}

TEST(Problem, BadLinesNameTheCulprit) {
  auto message = [](const char* line) {
    try {
      parse_problem(line);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("nosuchop B=1").find("nosuchop"), std::string::npos);
  EXPECT_NE(message("sdpa Q=1").find("'Q'"), std::string::npos);
  EXPECT_NE(message("sdpa mask=diagonal").find("diagonal"), std::string::npos);
  EXPECT_NE(message("sdpa B=1 B=2").find("twice"), std::string::npos);
  EXPECT_NE(message("sdpa B=1x").find("1x"), std::string::npos);
  EXPECT_NE(message("sdpa B").find("key=value"), std::string::npos);
}

TEST(CaseFiles, EveryTierFileParsesAndShardsPartition) {
  for (const char* tier : {"smoke", "ci", "lavapipe", "full"}) {
    CheckOptions o;
    o.tier = tier;
    const std::size_t total = collect_cases(o).size();
    EXPECT_GT(total, 0u) << tier;
    o.shard_count = 3;
    std::size_t sum = 0;
    for (int i = 0; i < 3; ++i) {
      o.shard_index = i;
      sum += collect_cases(o).size();
    }
    EXPECT_EQ(sum, total) << tier;
  }
  for (const OpInfo* op : all_ops()) {  // every op has cases in the smoke tier
    CheckOptions o;
    o.tier = "smoke";
    o.ops = {std::string(op->name())};
    EXPECT_GT(collect_cases(o).size(), 0u) << op->name();
  }
}

// The lavapipe tier is the ci tier wherever an op has no `lavapipe` file, and smaller
// where it has one (it exists to be smaller); both run every op.
TEST(CaseFiles, LavapipeTierIsTheCiTierOrASmallerStandIn) {
  for (const OpInfo* op : all_ops()) {
    CheckOptions ci, lava;
    ci.ops = lava.ops = {std::string(op->name())};
    lava.tier = "lavapipe";
    const std::size_t n_ci = collect_cases(ci).size(), n_lava = collect_cases(lava).size();
    EXPECT_GT(n_lava, 0u) << op->name();
    if (std::filesystem::exists(default_cases_dir() / op->name() / "lavapipe")) {
      EXPECT_LT(n_lava, n_ci) << op->name();
    } else {
      EXPECT_EQ(n_lava, n_ci) << op->name();
    }
  }
}

TEST(CaseFiles, CommentsAndErrorsWithFileAndLine) {
  const auto path = std::filesystem::temp_directory_path() / cat("kvlab_cases_", ::getpid());
  std::ofstream(path) << "# comment\n\nkv_roll L=4,8  # trailing comment\nkv_roll W=x\n";
  try {
    load_case_file(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":4:"), std::string::npos) << e.what();
  }
  std::ofstream(path) << "# comment\n\nkv_roll L=4,8  # trailing comment\n";
  EXPECT_EQ(load_case_file(path).size(), 2u);
  std::filesystem::remove(path);
}

// A line of exactly kMaxCaseLineBytes is read (here: a problem and a long comment); one
// byte more is refused by its file and line, before it is kept in memory.
TEST(CaseFiles, LineLengthHoldsAtItsLimit) {
  const auto path = std::filesystem::temp_directory_path() / cat("kvlab_cases_limit_", ::getpid());
  const std::string problem = "kv_roll L=4  #";
  std::ofstream(path) << problem << std::string(kMaxCaseLineBytes - problem.size(), 'x') << "\n";
  EXPECT_EQ(load_case_file(path).size(), 1u);
  std::ofstream(path) << problem << std::string(kMaxCaseLineBytes + 1 - problem.size(), 'x') << "\n";
  try {
    load_case_file(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":1: line longer than"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(CounterRng, ElementsDependOnlyOnLineNameAndIndex) {
  const CounterRng a("sdpa B=1 seed=1", "q"), b("sdpa B=1 seed=1", "q"), c("sdpa B=1 seed=2", "q"),
      d("sdpa B=1 seed=1", "k");
  // Reading backwards gives the same values as forwards: no hidden state.
  for (std::uint64_t i = 100; i-- > 0;) EXPECT_EQ(a.normal(i), b.normal(i));
  EXPECT_NE(a.bits(0), c.bits(0));
  EXPECT_NE(a.bits(0), d.bits(0));
  double sum = 0, sum_sq = 0;
  for (std::uint64_t i = 0; i < 20000; ++i) {
    sum += a.normal(i);
    sum_sq += a.normal(i) * a.normal(i);
  }
  EXPECT_NEAR(sum / 20000, 0.0, 0.05);
  EXPECT_NEAR(sum_sq / 20000, 1.0, 0.05);
}

// Large fills run on several threads (harness/op.cc for_ranges); every element must still
// be the counter RNG's value at its index, wherever a thread's range begins or ends.
TEST(CounterRng, LargeFillsAreTheSequentialValuesOnAnyNumberOfThreads) {
  const Problem p = parse_problem("sdpa B=1 seed=3");
  const std::int64_t n = 3 * (std::int64_t{1} << 18) + 5;
  const Tensor normal = random_normal(p, "k", DType::f32, {n}, 0.5);
  const Tensor bits = random_bits(p, "v", DType::u32, {n});
  const CounterRng k(p.line(), "k"), v(p.line(), "v");
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::uint64_t>(i);
    if (normal.view().load(i) != static_cast<float>(0.5 * k.normal(u))) ++wrong;
    if (bits.view().load_int(i) != static_cast<std::uint32_t>(v.bits(u))) ++wrong;
  }
  EXPECT_EQ(wrong, 0);
  // A store that throws on a worker thread reaches the caller as the kvlab::Error (a
  // float fill into an integer tensor), not as std::terminate.
  try {
    random_normal(p, "k", DType::u32, {n});
    ADD_FAILURE() << "a normal fill into u32 did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::dtype_mismatch) << e.what();
  }
}

TEST(Compare, NanFailsInfMustMatchBudgetIsPointwise) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> ref{1.0f, -inf, 3.0f, 0.0f};
  auto cmp = [&](std::vector<float> got, double budget) {
    return compare_values(Tensor::from_values(DType::f32, {4}, got), Tensor::from_values(DType::f32, {4}, ref),
                          Budget{{budget}, -1});
  };
  EXPECT_TRUE(cmp({1.0f, -inf, 3.0f, 0.0f}, 0).ok);
  EXPECT_TRUE(cmp({1.0f, -inf, 3.05f, 0.0f}, 0.1).ok);
  const Comparison over = cmp({1.0f, -inf, 3.5f, 0.0f}, 0.1);
  EXPECT_FALSE(over.ok);
  EXPECT_EQ(over.worst_index, 2);
  EXPECT_EQ(over.mismatches, 1);
  EXPECT_NE(cmp({std::nanf(""), -inf, 3.0f, 0.0f}, 1e9).reason.find("NaN"), std::string::npos);
  EXPECT_NE(cmp({1.0f, inf, 3.0f, 0.0f}, 1e9).reason.find("infinities"), std::string::npos);
  EXPECT_EQ(coords({2, 3, 4, 5}, 2 * 60 - 1 - 60), "(b=0, h=2, t=3, d=4)");
}

TEST(Compare, BitsReportTheFirstDifference) {
  const Tensor a = Tensor::from_ints(DType::u32, {3}, std::vector<std::int64_t>{1, 2, 3});
  const Tensor b = Tensor::from_ints(DType::u32, {3}, std::vector<std::int64_t>{1, 6, 7});
  const Comparison c = compare_bits(b, a);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.worst_index, 1);
  EXPECT_EQ(c.mismatches, 2);
}

// Misbehaving backends, one defect each.
class OverrunBackend final : public ForwardingBackend {
  void kv_gather(const KvGatherArgs& a) override {
    ref_.kv_gather(a);
    const DTensor& dst = a.dst;
    dst.buffer->host_data()[dst.offset + dst.nbytes()] = std::byte{0};  // one byte past the end
  }
};
class LazyRopeBackend final : public ForwardingBackend {
  void rope(const RopeArgs&) override {}  // writes nothing
};
class NoQuantBackend final : public ForwardingBackend {
  void quantize(const QuantizeArgs& a) override {
    if (a.out.spec.format().encoder == QuantEncoder::affine) return ref_.quantize(a);
    fail(ErrorKind::unsupported, "fp_quantize is not implemented here");
  }
};
class FlakyBackend final : public ForwardingBackend {
  void sdpa(const SdpaArgs& a) override {
    ref_.sdpa(a);
    host_view(a.out).as<std::uint32_t>()[0] ^= (calls_++ & 1u);  // one ulp, every other call
  }
  std::uint32_t calls_ = 0;
};
class ScribbleInputBackend final : public ForwardingBackend {
  void kv_roll(const KvRollArgs& a) override {
    ref_.kv_roll(a);
    host_view(a.src).as<std::uint8_t>()[0] ^= 1;
  }
};

CaseResult run(Backend& b, const char* line, RunOptions o = {}) {
  ReferenceBackend ref;
  return run_case(parse_problem(line), b, ref, o);
}

TEST(Spine, GuardBandOverrunFails) {
  OverrunBackend b;
  const CaseResult r = run(b, "kv_gather");
  EXPECT_EQ(r.status, Status::failed);
  EXPECT_NE(r.reason.find("guard band after the output overwritten at byte +0"), std::string::npos) << r.reason;
}

TEST(Spine, UnwrittenOutputIsNanPoisonAndFails) {
  LazyRopeBackend b;
  const CaseResult r = run(b, "rope");
  EXPECT_EQ(r.status, Status::failed);
  EXPECT_NE(r.reason.find("NaN"), std::string::npos) << r.reason;
}

TEST(Spine, StatusesForUnsupportedAndInvalid) {
  NoQuantBackend b;
  EXPECT_EQ(run(b, "fp_quantize").status, Status::unimplemented);
  EXPECT_EQ(run(b, "sdpa Hq=3 Hkv=2").status, Status::invalid);  // Hq % Hkv != 0
  EXPECT_EQ(run(b, "fp_quantize mode=mxfp4 global_scale=amax").status, Status::invalid);
  // sdpa is forwarded to the oracle: comparing it would compare the oracle with itself.
  const CaseResult forwarded = run(b, "sdpa");
  EXPECT_EQ(forwarded.status, Status::unimplemented) << describe(forwarded);
  EXPECT_NE(forwarded.reason.find("delegated to the reference: " + b.name() + " has no kernel of its own for sdpa"),
            std::string::npos)
      << forwarded.reason;
}

TEST(Spine, BitwiseRerunCatchesNondeterminism) {
  FlakyBackend b;
  EXPECT_EQ(run(b, "sdpa").status, Status::passed);  // one ulp is within budget
  const CaseResult r = run(b, "sdpa", RunOptions{true, 1ll << 28});
  EXPECT_EQ(r.status, Status::failed);
  EXPECT_NE(r.reason.find("rerun"), std::string::npos) << r.reason;
}

TEST(Spine, ModifiedInputFails) {
  ScribbleInputBackend b;
  const CaseResult r = run(b, "kv_roll");
  EXPECT_EQ(r.status, Status::failed);
  EXPECT_NE(r.reason.find("input 'src'"), std::string::npos) << r.reason;
}

TEST(Spine, PaddedKeysArePoisonedAndNeverRead) {
  // The reference passes with NaN in every padded K/V slot: poison reaches only kernels
  // that read keys the mask hides.
  ReferenceBackend b;
  const CaseResult r = run(b, "sdpa B=4 Lk=12 mask=causal lpad=5 rpad=3");
  EXPECT_EQ(r.status, Status::passed) << describe(r);
  const Problem p = parse_problem("sdpa B=2 Lk=12 mask=causal lpad=5");
  const Tensor k = find_op("sdpa").prepare(p).input("k");
  EXPECT_TRUE(std::isnan(k.view().load(5 * 64 * 12 + 0)));   // batch 1, slot 0: padded
  EXPECT_FALSE(std::isnan(k.view().load(0)));                // batch 0 has no padding
}

TEST(Backends, RegistryNamesUnknownBackends) {
  EXPECT_EQ(make_backend("reference")->name(), "reference");
  try {
    make_backend("tpu:v5");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    // The message names the unknown backend and lists the known ones.
    EXPECT_NE(std::string(e.what()).find("tpu"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reference"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(CheckRun, UnavailableBackendMakesEveryCaseUnimplemented) {
  // A backend whose factory reports Error(unsupported) (no Vulkan device, an ISA the CPU
  // lacks): every case is UNIMPLEMENTED with the reason, which the console shows; the run
  // fails unless allow_unavailable makes it a skip.
  register_backend({"absent", "test", "a factory that finds no device", [](std::string_view) -> std::unique_ptr<Backend> {
                      fail(ErrorKind::unsupported, "no device for the test backend 'absent'");
                    }});
  CheckOptions o;
  o.backend = "absent";
  o.tier = "smoke";
  o.ops = {"kv_roll"};
  std::ostringstream out;
  EXPECT_FALSE(run_check(o, out).ok);
  EXPECT_NE(out.str().find("backend absent is unavailable here: unsupported: no device"), std::string::npos)
      << out.str();
  o.allow_unavailable = true;
  const CheckSummary summary = run_check(o, out);
  EXPECT_TRUE(summary.ok) << out.str();
  ASSERT_FALSE(summary.results.empty());
  for (const CaseResult& r : summary.results) {
    EXPECT_EQ(r.status, Status::unimplemented);
    EXPECT_NE(r.reason.find("no device"), std::string::npos) << r.reason;
  }
  // Any other factory error is not a skip.
  register_backend({"broken", "test", "a factory that fails", [](std::string_view) -> std::unique_ptr<Backend> {
                      fail(ErrorKind::invalid_argument, "bad variant");
                    }});
  o.backend = "broken";
  EXPECT_THROW(run_check(o, out), Error);
}

namespace {
// RoPE one token late (mlx-lm#1097's symptom): a lane that must fail alone.
class LateRopeBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "late-rope"; }
  void rope(const RopeArgs& a) override {
    Offsets late{a.offsets.scalar + 1, a.offsets.per_row};
    ref_.rope({a.x, a.params, late, a.out});
  }
};

// status, reason and the worst output's error of each case, as one comparable string
std::vector<std::string> verdicts(const std::vector<CaseResult>& results) {
  std::vector<std::string> v;
  for (const CaseResult& r : results) {
    v.push_back(cat(r.line, " ", status_name(r.status), " ", r.reason, " ", r.cmp.max_abs_err, " ", r.cmp.nmse));
  }
  return v;
}
}  // namespace

TEST(CheckRun, SeveralBackendsShareEachCaseAndKeepTheirOwnResults) {
  register_backend({"late-rope", "test", "RoPE one position late", [](std::string_view) -> std::unique_ptr<Backend> {
                      return std::make_unique<LateRopeBackend>();
                    }});
  register_backend({"absent2", "test", "no device", [](std::string_view) -> std::unique_ptr<Backend> {
                      fail(ErrorKind::unsupported, "no device for 'absent2'");
                    }});
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / cat("kvlab_lanes_", ::getpid());
  std::filesystem::create_directories(dir);
  CheckOptions o;
  o.tier = "smoke";
  o.ops = {"rope", "sdpa", "quantized_sdpa"};
  o.shrink = false;
  o.allow_unavailable = true;
  // Single runs first: what each lane must reproduce exactly.
  std::vector<std::vector<std::string>> alone;
  const std::vector<std::string> lanes{"simd", "late-rope", "absent2", "simd:SCALAR", "reference"};
  std::ostringstream out;
  for (const std::string& b : lanes) {
    o.backend = b;
    alone.push_back(verdicts(run_check(o, out).results));
  }
  o.backend = lanes.front();
  o.more_backends.assign(lanes.begin() + 1, lanes.end());
  o.junit_path = (dir / "r.xml").string();
  out.str("");
  const CheckSummary all = run_check(o, out);
  EXPECT_FALSE(all.ok) << "the late-rope lane fails the run";
  const std::vector<std::string> together = verdicts(all.results);
  ASSERT_EQ(together.size(), alone.size() * alone.front().size());
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    const std::vector<std::string> lane(together.begin() + static_cast<std::ptrdiff_t>(i * alone[i].size()),
                                        together.begin() + static_cast<std::ptrdiff_t>((i + 1) * alone[i].size()));
    EXPECT_EQ(lane, alone[i]) << "lane " << lanes[i] << " differs from its run alone";
    EXPECT_TRUE(std::filesystem::exists(dir / cat("r.", i == 3 ? "simd_SCALAR" : lanes[i], ".xml"))) << lanes[i];
    EXPECT_NE(out.str().find(cat("kvlab check: backend ", lanes[i])), std::string::npos) << out.str();
  }
  // Each lane failed or passed on its own: only late-rope's rope cases failed.
  int late_failures = 0;
  for (const CaseResult& r : all.results) {
    if (r.status != Status::failed) continue;
    EXPECT_TRUE(r.backend == "late-rope" && r.op == "rope") << r.backend << " " << r.line;
    ++late_failures;
  }
  EXPECT_GT(late_failures, 0);
  EXPECT_NE(out.str().find("backend absent2 is unavailable here"), std::string::npos) << out.str();
  // A backend named twice is a usage error, not a run with twice the results.
  o.more_backends = {"reference", "simd:SCALAR"};
  o.backend = "simd:SCALAR";
  testing::expect_error([&] { run_check(o, out); }, ErrorKind::invalid_argument, {"'simd:SCALAR' is named twice"});
  std::filesystem::remove_all(dir);
}

}  // namespace kvlab::harness
