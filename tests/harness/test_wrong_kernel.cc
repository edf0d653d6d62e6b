// The harness's done-when: a deliberately wrong kernel is caught, located, and shrunk to
// a small line that `kvlab repro` accepts verbatim and that still fails.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/forwarding_backend.h"

namespace kvlab::harness {
namespace {

// Wrong in two kernels, only on problems above a size threshold, so shrinking has a
// floor to find: affine_quantize flips code bit 0 of the last word when T >= 5, and
// sdpa adds 1e-2 to the last output element when Lk > 17.
class WrongBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "wrong"; }
  void quantize(const QuantizeArgs& a) override {
    ref_.quantize(a);
    const DTensor& wq = a.out.wq;
    if (a.out.spec.format().encoder == QuantEncoder::affine && a.x.shape[2] >= 5) host_view(wq).as<std::uint32_t>()[wq.numel() - 1] ^= 1u;
  }
  void sdpa(const SdpaArgs& a) override {
    ref_.sdpa(a);
    if (a.k.shape[2] > 17) {
      const TensorView o = host_view(a.out);
      o.store(o.numel() - 1, o.load(o.numel() - 1) + 1e-2f);
    }
  }
};

class WrongKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    register_backend({"wrong", "test wrapper", "reference with two corrupted kernels",
                      [](std::string_view) -> std::unique_ptr<Backend> { return std::make_unique<WrongBackend>(); }});
  }
  WrongBackend wrong_;
  std::unique_ptr<Backend> reference_ = make_backend("reference");
};

TEST_F(WrongKernel, SdpaErrorIsCaughtLocatedAndShrunk) {
  const Problem p = parse_problem("sdpa B=2 Hq=8 Hkv=2 Lq=4 Lk=64 Dk=64 Dv=48 dtype=f32 mask=causal sinks=1 seed=3");
  const CaseResult r = run_case(p, wrong_, *reference_, {});
  ASSERT_EQ(r.status, Status::failed) << describe(r);
  EXPECT_EQ(r.output, "out");
  EXPECT_EQ(r.worst_coords, "(b=1, h=7, t=3, d=47)");
  EXPECT_EQ(r.cmp.mismatches, 1);
  EXPECT_NEAR(r.cmp.max_abs_err, 1e-2, 1e-6);
  EXPECT_LT(r.cmp.budget, 1e-3);  // the derived f32 budget is far below the injected error

  const ShrinkResult s = shrink(p, wrong_, *reference_, {});
  ASSERT_EQ(s.result.status, Status::failed);
  const Problem& small = s.smallest;
  EXPECT_EQ(small.integer("Lk"), 18);  // the corruption's threshold: the smallest failing Lk
  EXPECT_EQ(small.integer("B"), 1);
  EXPECT_EQ(small.integer("Hq"), 1);
  EXPECT_EQ(small.integer("Lq"), 1);
  EXPECT_EQ(small.word("mask"), "none");
  EXPECT_EQ(small.integer("sinks"), 0);
  EXPECT_EQ(s.result.worst_coords, cat("(b=0, h=0, t=0, d=", small.integer("Dv") - 1, ")"));

  // The printed line is accepted verbatim by `kvlab repro` and still fails there.
  EXPECT_EQ(parse_problem(small.line()), small);
  std::ostringstream out;
  EXPECT_FALSE(run_repro(small.line(), "wrong", false, {}, out));
  EXPECT_NE(out.str().find("FAILED [wrong] " + small.line()), std::string::npos) << out.str();
  std::ostringstream ok;
  EXPECT_TRUE(run_repro(small.line(), "reference", false, {}, ok)) << ok.str();
}

TEST_F(WrongKernel, FlippedCodeBitIsCaughtBitExactlyAndShrunk) {
  const Problem p = parse_problem("affine_quantize B=2 H=4 T=16 D=256 bits=4 group=64 dtype=bf16 seed=9");
  const CaseResult r = run_case(p, wrong_, *reference_, {});
  ASSERT_EQ(r.status, Status::failed) << describe(r);
  EXPECT_EQ(r.output, "wq");
  EXPECT_EQ(r.worst_coords, "(b=1, h=3, t=15, d=31)");  // 256·4/32 = 32 words per row
  EXPECT_EQ(r.cmp.mismatches, 1);

  const ShrinkResult s = shrink(p, wrong_, *reference_, {});
  ASSERT_EQ(s.result.status, Status::failed);
  EXPECT_EQ(s.smallest.integer("T"), 5);
  EXPECT_EQ(s.smallest.integer("B"), 1);
  EXPECT_EQ(s.smallest.integer("H"), 1);
  EXPECT_EQ(s.smallest.integer("D"), 64);  // one group: D may not go below group=64
  std::ostringstream out;
  EXPECT_FALSE(run_repro(s.smallest.line(), "wrong", false, {}, out));
}

TEST_F(WrongKernel, CheckReportsFailureWithShrunkReproInEveryReporter) {
  const auto dir = std::filesystem::temp_directory_path() / cat("kvlab_harness_", ::getpid());
  std::filesystem::create_directories(dir);
  const auto cases = dir / "cases";
  std::ofstream(cases) << "# two failing, one passing\n"
                       << "sdpa B=2 Hq=4 Hkv=2 Lq=2 Lk=24,8 Dk=32 Dv=32 mask=causal\n"
                       << "affine_quantize T=6 D=64 group=32\n";
  CheckOptions o;
  o.backend = "wrong";
  o.case_files = {cases.string()};
  o.json_path = (dir / "out.jsonl").string();
  o.junit_path = (dir / "out.xml").string();
  std::ostringstream out;
  const CheckSummary summary = run_check(o, out);
  std::cout << out.str();  // the reports a developer would see, kept in the test log
  EXPECT_FALSE(summary.ok);
  ASSERT_EQ(summary.results.size(), 3u);
  EXPECT_EQ(summary.results[0].status, Status::failed);
  EXPECT_EQ(summary.results[1].status, Status::passed);  // Lk = 8: below the corruption
  EXPECT_EQ(summary.results[2].status, Status::failed);
  for (const CaseResult& r : {summary.results[0], summary.results[2]}) {
    ASSERT_FALSE(r.shrunk_line.empty());
    EXPECT_NE(out.str().find("kvlab repro --backend wrong '" + r.shrunk_line + "'"), std::string::npos) << out.str();
    std::ostringstream repro;
    EXPECT_FALSE(run_repro(r.shrunk_line, "wrong", false, {}, repro)) << repro.str();
  }
  std::ifstream jsonl(o.json_path);
  std::string line;
  int records = 0, failed = 0;
  while (std::getline(jsonl, line)) {
    ++records;
    failed += line.find("\"status\":\"FAILED\"") != std::string::npos;
    EXPECT_NE(line.find("\"commit\":"), std::string::npos);
    EXPECT_NE(line.find("\"seed\":1"), std::string::npos);
  }
  EXPECT_EQ(records, 3);
  EXPECT_EQ(failed, 2);
  std::stringstream xml;
  xml << std::ifstream(o.junit_path).rdbuf();
  EXPECT_NE(xml.str().find("tests=\"3\" failures=\"2\""), std::string::npos) << xml.str();
  std::filesystem::remove_all(dir);
}

// A kernel that assumes its tensors start on a 64-byte boundary (it reads src from the
// offset rounded down, as an aligned vector load or an unadjusted binding would): every
// aligned case passes, place=odd must catch it.
class AlignedOnlyBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "aligned-only"; }
  void kv_roll(const KvRollArgs& a) override {
    DTensor src = a.src;
    src.offset -= src.offset % 64;
    ref_.kv_roll({src, a.shifts, a.dst});
  }
};

TEST(Placement, OddPlacementCatchesAKernelThatAssumesAlignment) {
  AlignedOnlyBackend wrong;
  std::unique_ptr<Backend> reference = make_backend("reference");
  const Problem aligned = parse_problem("kv_roll B=2 H=2 L=5 W=3 dtype=u8 seed=4");
  EXPECT_EQ(run_case(aligned, wrong, *reference, {}).status, Status::passed);
  const Problem odd = aligned.with("place", "odd");
  const CaseResult r = run_case(odd, wrong, *reference, {});
  EXPECT_EQ(r.status, Status::failed) << describe(r);
  // place is a quiet key: named only when it is not the default, so lines written
  // before it existed (and the fills keyed by them) are unchanged.
  EXPECT_EQ(aligned.line(), "kv_roll B=2 H=2 L=5 W=3 dtype=u8 shift=3 seed=4");
  EXPECT_EQ(odd.line(), "kv_roll B=2 H=2 L=5 W=3 dtype=u8 shift=3 place=odd seed=4");
  EXPECT_EQ(parse_problem(odd.line()), odd);
  EXPECT_EQ(parse_problem(aligned.line()), aligned);
}

}  // namespace
}  // namespace kvlab::harness
