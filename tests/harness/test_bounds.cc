// Bounded before allocated (issue 19): footprints, lazy products, case-file limits, and a
// spine that turns every exception into an INVALID case.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <set>
#include <string_view>

#include <malloc.h>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/ops/ops.h"
#include "harness/forwarding_backend.h"
#include "kvlab/error.h"

namespace kvlab::harness {
namespace {

std::uint64_t prepared_bytes(const Prepared& prep) {
  std::uint64_t bytes = 0;
  for (const Tensor& t : prep.inputs) bytes += t.nbytes();
  for (const OutputSlot& s : prep.outputs) bytes += shape_nbytes(s.shape, s.dtype);
  return bytes;
}

// The footprint decides SKIPPED before prepare() runs: it must bound what prepare()
// makes (else a case over the cap would allocate) and stay within a bounded factor of it
// (else the cap would skip cases that fit). The factor is large because a footprint also
// counts the f32 copies a tolerance object makes, 16 to 32 bytes per element of a K/V
// packed at 2 or 4 bits. Every case of the ci tier, every op.
TEST(Footprint, BoundsThePreparedTensorsOfEveryCiCase) {
  CheckOptions o;
  o.tier = "ci";
  std::size_t checked = 0;
  for (const Problem& p : collect_cases(o)) {
    const OpInfo& op = find_op(p.op());
    Prepared prep;
    try {
      prep = op.prepare(p);
    } catch (const Error&) {
      continue;  // INVALID by design (edge cases)
    }
    const std::uint64_t actual = prepared_bytes(prep), footprint = op.footprint(p);
    EXPECT_GE(footprint, actual) << p.line();
    EXPECT_LE(footprint, 64 * actual + (64u << 10)) << p.line();
    ++checked;
  }
  EXPECT_GT(checked, 1000u);
}

// The resident memory a whole run adds at its peak (prepare, the backend, the oracle, the
// check), in bytes: VmHWM after resetting it (clear_refs 5, Linux 4.0+), less VmRSS
// before, with malloc's free pages returned first so that reuse of earlier frees does not
// hide the run's own. nullopt where /proc cannot do that.
std::optional<std::uint64_t> run_peak_bytes(const Problem& p, Backend& backend, Backend& reference) {
  const auto kib = [](std::string_view key) -> std::optional<std::uint64_t> {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);)
      if (line.starts_with(key)) return std::stoull(line.substr(key.size()));
    return std::nullopt;
  };
  malloc_trim(0);
  const std::optional<std::uint64_t> before = kib("VmRSS:");
  std::ofstream reset("/proc/self/clear_refs");
  if (!before || !(reset << "5" << std::flush)) return std::nullopt;
  const CaseResult r = run_case(p, backend, reference, RunOptions{});
  EXPECT_TRUE(r.status == Status::passed || r.status == Status::unimplemented) << p.line() << ": " << r.reason;
  const std::optional<std::uint64_t> peak = kib("VmHWM:");
  if (!peak || *peak < *before) return std::nullopt;
  return (*peak - *before) << 10;
}

// The footprint is what the memory cap is checked against (kRunCopies times it), so it
// must be a bound of a run and not far above one: tested on cases of tens of MB (the ci
// cases' few KB are below what resident memory can resolve), in which each dimension
// in turn dominates (the ci cases' dimensions are close to each other, so a footprint
// that counts one tensor at another's width would still bound them), one per op. Each
// footprint must hold the prepared tensors, be at most twice what the run really holds at
// its peak (else the cap skips cases that fit), and the peak at most kRunCopies times the
// footprint (else the cap is not a bound). A footprint exceeds prepare()'s tensors by the
// f32 copies the check makes (up to 20x for 4-bit K/V), so the run's peak is the measure.
TEST(Footprint, BoundsWhatARunHoldsAndIsWithinTwiceItsPeak) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "resident memory under ASan includes its shadow and quarantine";
#endif
  const char* const lines[] = {
      "sdpa B=1 Hq=1 Hkv=1 Lq=1 Lk=2048 Dk=16 Dv=1024 dtype=f32 mask=none",   // Dv >> Dk
      "sdpa B=1 Hq=1 Hkv=1 Lq=1 Lk=2048 Dk=1024 Dv=16 dtype=f16 mask=none",   // Dk >> Dv
      "sdpa B=1 Hq=64 Hkv=1 Lq=256 Lk=4 Dk=32 Dv=32 dtype=bf16 mask=none",    // Hq·Lq >> Lk
      "sdpa B=64 Hq=2 Hkv=2 Lq=1 Lk=64 Dk=32 Dv=32 dtype=f32 mask=causal",    // B >> 1
      "sdpa B=1 Hq=1 Hkv=1 Lq=1024 Lk=1024 Dk=16 Dv=16 dtype=f32 mask=additive",  // the mask
      "quantized_sdpa B=1 Hq=1 Hkv=1 Lq=1 Lk=2048 Dk=32 Dv=1024 dtype=f16 kbits=8 kgroup=32 vbits=8 vgroup=32 "
      "mask=none",
      "quantized_sdpa B=1 Hq=1 Hkv=1 Lq=1 Lk=2048 Dk=1024 Dv=32 dtype=f16 kbits=4 kgroup=32 vbits=4 vgroup=32 "
      "mask=none",
      "rope T=8000",
      "kv_scatter B=2 H=4 S=1024 L=2048 W=128 dtype=f16",
      "kv_gather Bs=4 Bd=6 H=4 L=1024 W=128 dtype=f16",
      "kv_roll B=4 H=4 L=1024 W=128 dtype=f16",
      "kv_cast B=2 H=4 L=2048 W=128 src=f32 dst=f16",
      "kv_copy_blocks Bs=3 Bd=2 H=4 Ls=1024 Ld=1024 W=128 blocks=8 len=64 dtype=f16",
      "kv_append_advance B=2 H=4 S=512 C=2048 Dk=128 Dv=128 dtype=f16 start=0",
      "kv_snapshot N=1000000 dtype=f32",
      "cache kind=kv Hq=4 Hkv=4 D=64 script=p1024.d",
      "cache kind=quantized Hq=4 Hkv=4 D=64 rope=0 script=p1024.d",
      "affine_quantize B=1 H=4 T=4096 D=128 dtype=f16 bits=4 group=64",
      "affine_dequantize B=1 H=4 T=4096 D=128 dtype=f16 bits=4 group=64",
      "fp_quantize B=1 H=4 T=4096 D=128 mode=mxfp4",
      "fp_dequantize B=1 H=4 T=4096 D=128 dtype=f16 mode=nvfp4",
      "ggml_quantize B=1 H=4 T=4096 D=128 dtype=f16 mode=q4_0",
      "ggml_dequantize B=1 H=4 T=4096 D=128 dtype=f16 mode=q5_1",
  };
  auto reference = make_backend("reference");
  auto simd = make_backend("simd");
  std::set<std::string> ops;
  for (const char* line : lines) {
    const Problem p = parse_problem(line);
    const OpInfo& op = find_op(p.op());
    const std::uint64_t footprint = op.footprint(p);
    EXPECT_GE(footprint, prepared_bytes(op.prepare(p))) << p.line();
    const std::optional<std::uint64_t> peak = run_peak_bytes(p, simd ? *simd : *reference, *reference);
    if (!peak) GTEST_SKIP() << "/proc/self cannot reset and read the peak resident memory here";
    EXPECT_LE(footprint, 2 * *peak) << p.line() << ": footprint " << footprint << ", peak " << *peak;
    EXPECT_LE(*peak, kRunCopies * footprint) << p.line() << ": footprint " << footprint << ", peak " << *peak;
    ops.insert(std::string(p.op()));
  }
  for (const OpInfo* op : all_ops()) EXPECT_TRUE(ops.contains(std::string(op->name()))) << op->name() << " has no line here";
}

// The perf shapes (benchmarks, real GPUs) stay runnable on a 24 GiB machine: the
// default cap there is 12 GiB.
TEST(Footprint, NoCaseOfTheFullTierIsOverTwelveGiB) {
  CheckOptions o;
  o.tier = "full";
  for (const Problem& p : collect_cases(o)) {
    std::uint64_t footprint = 0;
    try {
      footprint = find_op(p.op()).footprint(p);
    } catch (const Error&) {
      continue;
    }
    EXPECT_LE(footprint * kRunCopies, std::uint64_t{12} << 30) << p.line();
  }
}

// Work: at least a pass over the tensors, no full-tier shape over the default cap, and
// quadratic where the op is (attention over Lk, a cache script's decode count).
TEST(Work, BoundsEveryFullTierCaseUnderTheDefaultCap) {
  CheckOptions o;
  o.tier = "full";
  for (const Problem& p : collect_cases(o)) {
    const OpInfo& op = find_op(p.op());
    try {
      EXPECT_GE(op.work(p), op.footprint(p)) << p.line();
      EXPECT_LE(op.work(p), kDefaultMaxWork) << p.line();
    } catch (const Error&) {
    }
  }
}

TEST(Work, GrowsWithTheSquareOfADecodeScriptAndOfAttentionLength) {
  const OpInfo& cache = find_op("cache");
  const auto w = [&](const char* script) {
    return static_cast<double>(cache.work(parse_problem(std::string("cache script=") + script)));
  };
  EXPECT_GT(w("p7.d1280") / w("p7.d640"), 3.0);
  EXPECT_GT(w("p7.d1282.t4.d"), 1e8);  // the fuzzed script of docs/ci.md §Test costs
  const OpInfo& sdpa = find_op("sdpa");
  const double a = static_cast<double>(sdpa.work(parse_problem("sdpa Lq=1000 Lk=1000")));
  const double b = static_cast<double>(sdpa.work(parse_problem("sdpa Lq=2000 Lk=2000")));
  EXPECT_GT(b / a, 3.5);
  auto ref = make_backend("reference");
  RunOptions run;
  run.max_work = 20'000'000;
  const CaseResult r = run_case(parse_problem("cache kind=turboquant rope=0 script=p7.d1282.t4.d"), *ref, *ref, run);
  EXPECT_EQ(r.status, Status::skipped);
  EXPECT_NE(r.reason.find("work cap"), std::string::npos) << r.reason;
}

TEST(Footprint, SaturatesInsteadOfOverflowing) {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(Footprint{}.add(DType::f32, {big, big, big}).bytes(), std::uint64_t{1} << 63);
  EXPECT_EQ(Footprint{}.add(DType::f32, {big}).add(DType::f32, {big}).bytes(), std::uint64_t{1} << 63);
  EXPECT_EQ(Footprint{}.add(DType::f32, {4, -1}).bytes(), 0u);  // prepare() rejects it
  EXPECT_EQ(Footprint{}.add(DType::f16, {3, 5}).add_bytes(2).bytes(), 32u);
}

TEST(Spine, AProblemOverTheMemoryCapIsSkippedBeforeAnythingIsAllocated) {
  auto ref = make_backend("reference");
  RunOptions run;
  run.max_bytes = 1 << 20;
  const CaseResult r = run_case(parse_problem("rope T=100000000000"), *ref, *ref, run);
  EXPECT_EQ(r.status, Status::skipped);
  EXPECT_NE(r.reason.find("memory cap"), std::string::npos) << r.reason;
  EXPECT_LT(r.seconds, 1.0);  // a guard against filling first, not a speed target
  EXPECT_EQ(run_case(parse_problem("rope T=4"), *ref, *ref, run).status, Status::passed);
}

// A kernel that throws something other than kvlab::Error: the case is INVALID, the run
// goes on (once, std::bad_alloc killed a whole `kvlab check`).
template <class E>
class ThrowingRope final : public ForwardingBackend {
 public:
  void rope(const RopeArgs&) override { throw E("boom"); }
};
class BadAllocRope final : public ForwardingBackend {
 public:
  void rope(const RopeArgs&) override { throw std::bad_alloc(); }
};

TEST(Spine, EveryExceptionOfABackendBecomesAFailedOrInvalidCase) {
  auto ref = make_backend("reference");
  const Problem p = parse_problem("rope T=4");
  BadAllocRope bad_alloc;
  ThrowingRope<std::runtime_error> runtime;
  for (Backend* b : std::initializer_list<Backend*>{&bad_alloc, &runtime}) {
    const CaseResult r = run_case(p, *b, *ref, {});
    EXPECT_TRUE(r.status == Status::failed || r.status == Status::invalid) << r.reason;
    EXPECT_FALSE(r.reason.empty());
  }
  // Thrown by the reference side: the case is not PASSED, with the reason.
  const CaseResult r = run_case(p, *ref, bad_alloc, {});
  EXPECT_TRUE(r.status == Status::failed || r.status == Status::invalid) << r.reason;
  EXPECT_NE(r.reason.find("bad_alloc"), std::string::npos) << r.reason;
}

TEST(LineExpansion, CountsAHugeProductWithoutExpandingIt) {
  std::string values;
  for (int i = 1; i <= 1000; ++i) values += (i > 1 ? "," : "") + std::to_string(i);
  const LineExpansion e("kv_roll B=" + values + " H=" + values + " L=" + values + " W=" + values);
  EXPECT_EQ(e.size(), 1000000000000u);
  EXPECT_EQ(e.at(0).integer("W"), 1);
  EXPECT_EQ(e.at(1).integer("W"), 2);  // the last listed key varies fastest
  EXPECT_EQ(e.at(999999999999u).integer("B"), 1000);
  EXPECT_THROW(expand_line("kv_roll B=" + values + " H=" + values), Error);  // 10^6 > the materialize cap
}

TEST(LineExpansion, SaturatesItsCount) {
  std::string values;
  for (int i = 1; i <= 100; ++i) values += (i > 1 ? "," : "") + std::to_string(i);
  std::string line = "sdpa";
  for (const char* k : {"B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv", "window", "lpad", "rpad", "sinks"}) {
    line += std::string(" ") + k + "=" + values;
  }
  EXPECT_EQ(LineExpansion(line).size(), std::numeric_limits<std::uint64_t>::max());
}

TEST(CaseSelection, RefusesMoreCasesThanTheCapBeforeRunning) {
  const auto path = std::filesystem::temp_directory_path() / "kvlab_test_cap_cases";
  std::ofstream(path) << "kv_roll B=1,2,3 H=1,2,3\nrope T=1,2\n";
  CheckOptions o;
  o.case_files = {path.string()};
  o.max_cases = 11;
  EXPECT_EQ(CaseSelection(o).size(), 11u);  // 9 + 2
  o.case_files.push_back(path.string());  // the same lines again: deduplicated, but counted first
  try {
    CaseSelection s(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 11 cases"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(CaseSelection, ShardsAndDeduplicatesLikeTheMaterializedList) {
  CheckOptions o;
  o.tier = "ci";
  o.ops = {"rope", "kv_roll"};
  const std::vector<Problem> all = collect_cases(o);
  o.shard_count = 3;
  std::size_t sum = 0;
  for (int i = 0; i < 3; ++i) {
    o.shard_index = i;
    const std::vector<Problem> shard = collect_cases(o);
    for (std::size_t k = 0; k < shard.size(); ++k) EXPECT_EQ(shard[k], all[3 * k + static_cast<std::size_t>(i)]);
    sum += shard.size();
  }
  EXPECT_EQ(sum, all.size());
}

}  // namespace
}  // namespace kvlab::harness
