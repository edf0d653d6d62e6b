// The cache op (harness/ops/cache_info.cc): its script grammar and problem lines round-
// trip; its observables are the cache semantics of docs/semantics.md (hand-derived below);
// a backend whose data movement is off by one row is caught at the cache level and shrunk
// to a short script; an unsupported kernel reads UNIMPLEMENTED, a misuse line INVALID.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/ops/cache_script.h"
#include "harness/forwarding_backend.h"
#include "reference/reference_backend.h"
#include "reference/quantize.h"
#include "reference/sdpa.h"

namespace kvlab::harness {
namespace {

namespace cs = cache_script;

std::string invalid_reason(const std::string& line) {
  ReferenceBackend a, b;
  const CaseResult r = run_case(parse_problem(line), a, b, {});
  EXPECT_EQ(r.status, Status::invalid) << describe(r);
  return r.reason;
}

TEST(CacheScript, CanonicalWordsRoundTripAndOthersAreNamed) {
  for (const char* word : {"p37.d2.t3.a.d", "d", "d9", "u1", "u3.u2.d", "r6.s.f.d3", "p9.d2.k3_1_0.d.x2p6.d2", "k0.k0_0",
                           "p7.d2.q.d3"}) {
    EXPECT_EQ(cs::script_str(cs::parse_script(word)), word);
  }
  const cs::Script s = cs::parse_script("p37.d2.t3.a.x2p5");
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0], (cs::Command{cs::Verb::chunk, 37, 0, {}}));
  EXPECT_EQ(s[1], (cs::Command{cs::Verb::decode, 2, 0, {}}));
  EXPECT_EQ(s[2], (cs::Command{cs::Verb::trim, 3, 0, {}}));
  EXPECT_EQ(s[3].verb, cs::Verb::shared);
  EXPECT_EQ(s[4], (cs::Command{cs::Verb::extend, 5, 2, {}}));
  EXPECT_EQ(cs::parse_script("s").front().verb, cs::Verb::reload);
  EXPECT_EQ(cs::parse_script("u7").front(), (cs::Command{cs::Verb::update, 7, 0, {}}));
  EXPECT_EQ(cs::parse_script("k2_0").front().keep, (std::vector<std::int32_t>{2, 0}));
  auto message = [](const char* word) {
    try {
      cs::parse_script(word);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("p8.d.d").find("write 'p8.d2'"), std::string::npos);  // one problem, one line
  EXPECT_NE(message("p1").find("write 'd'"), std::string::npos);
  EXPECT_NE(message("d1").find("write 'd'"), std::string::npos);
  EXPECT_NE(message("p08").find("'p08'"), std::string::npos);
  EXPECT_NE(message("p8..d").find("is empty"), std::string::npos);
  EXPECT_NE(message("p8.z3").find("'z3' is unknown"), std::string::npos);
  EXPECT_NE(message("p8.q3").find("takes no argument"), std::string::npos);
  EXPECT_NE(message("x2").find("xRpN"), std::string::npos);
  EXPECT_NE(message("u").find("needs a count"), std::string::npos);  // u has no one-token shorthand
  EXPECT_NE(message("u0").find("needs a count"), std::string::npos);
  EXPECT_NE(message("t0").find("'t0'"), std::string::npos);
  EXPECT_NE(message("a3").find("takes no argument"), std::string::npos);
  EXPECT_NE(message("k1__2").find("row indices"), std::string::npos);
}

TEST(CacheScript, SimplerScriptsAreCanonicalAndShorter) {
  const std::vector<std::string> s = cs::simpler_scripts("p37.d2.t3.k1_0");
  // Drops first, in order; then counts cut to 1 (p1 → d merges with d2), halved, less one.
  const std::vector<std::string> want{"d2.t3.k1_0", "p37.t3.k1_0", "p37.d2.k1_0", "p37.d2.t3",
                                      "d3.t3.k1_0", "p37.d.t3.k1_0", "p37.d2.t1.k1_0", "p18.d2.t3.k1_0",
                                      "p36.d2.t3.k1_0", "p37.d2.t2.k1_0", "p37.d2.t3.k0", "p37.d2.t3.k1"};
  EXPECT_EQ(s, want);
}

TEST(CacheOp, LinesRoundTrip) {
  const Problem p = parse_problem("cache kind=batch_kv script=p9.d2.k3_1_0.d.x2p6.d2 B=4 lpad=5");
  EXPECT_EQ(p.line(),
            "cache kind=batch_kv B=4 Hq=4 Hkv=2 D=64 dtype=f32 rope=1 window=0 max=16 keep=0 chunk=16 "
            "qmode=affine bits=4 group=32 lpad=5 rpad=0 script=p9.d2.k3_1_0.d.x2p6.d2 seed=1");
  EXPECT_EQ(parse_problem(p.line()), p);
  EXPECT_EQ(p.with("script", "d").word("script"), "d");
  EXPECT_THROW(parse_problem("cache script=p8=d"), Error);  // '=' would make the line ambiguous
}

TEST(CacheOp, MisuseLinesAreInvalidAndNameTheCulprit) {
  EXPECT_NE(invalid_reason("cache kind=kv lpad=2").find("lpad"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv max=8").find("max"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=quantized").find("rope=0"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv script=p8.k0").find("batch kind"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv script=a.d").find("'a'"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv script=p8.d.d").find("p8.d2"), std::string::npos);
  EXPECT_NE(invalid_reason("cache Hq=4 Hkv=3").find("Hkv=3"), std::string::npos);
  // q: a plain KVCache, once, rope=0 (its codes are compared bit for bit).
  EXPECT_NE(invalid_reason("cache kind=rotating rope=0 script=p4.q").find("kind=kv"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv rope=0 script=p4.q.q").find("already quantized"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv script=p4.q").find("rope=0"), std::string::npos);
  EXPECT_NE(invalid_reason("cache kind=kv rope=0 bits=8 script=p4").find("bits"), std::string::npos);
  // The cache's own refusal: a filter row out of range (message from BatchLayout).
  EXPECT_NE(invalid_reason("cache kind=batch_kv B=2 script=p4.k5").find("5"), std::string::npos);
}

// The op's outputs over the reference backend, by slot name.
std::map<std::string, Tensor> outputs_of(const Problem& p, Prepared* prepared = nullptr) {
  const OpInfo& op = find_op("cache");
  Prepared prep = op.prepare(p);
  ReferenceBackend be;
  Bound in{&prep.input_names, {}};
  for (const Tensor& t : prep.inputs) in.tensors.push_back(be.upload(t));
  std::vector<std::string> names;
  Bound out{&names, {}};
  for (const OutputSlot& s : prep.outputs) {
    names.push_back(s.name);
    out.tensors.push_back(be.allocate(s.dtype, s.shape));
  }
  op.invoke(be, p, in, out);
  std::map<std::string, Tensor> result;
  for (std::size_t i = 0; i < names.size(); ++i) result[names[i]] = be.download(out.tensors[i]);
  if (prepared) *prepared = std::move(prep);
  return result;
}

std::vector<std::int64_t> ints(const Tensor& t) { return t.to_ints(); }

// Row r of a flat (rows, D) tensor equals row s of another, bit for bit.
bool same_row(const Tensor& a, std::int64_t r, const Tensor& b, std::int64_t s) {
  const std::size_t bytes = a.nbytes() / static_cast<std::size_t>(a.dim(0));
  return std::memcmp(a.data() + static_cast<std::size_t>(r) * bytes, b.data() + static_cast<std::size_t>(s) * bytes,
                     bytes) == 0;
}

// q turns the KVCache into a QuantizedKVCache holding the codes of the rows stored so far
// (mlx-lm's to_quantized), and later rows are quantized as they come: every stored key row
// is the oracle's quantization of its input row, and the offsets run on.
TEST(CacheOp, ToQuantizedMidwayStoresTheCodesOfEveryRow) {
  const Problem p = parse_problem("cache kind=kv B=1 Hq=1 Hkv=1 D=64 rope=0 bits=4 group=32 script=p3.q.d");
  Prepared prep;
  std::map<std::string, Tensor> out = outputs_of(p, &prep);
  EXPECT_EQ(ints(out.at("offsets")), (std::vector<std::int64_t>{3, 3, 4}));
  const Tensor& k = prep.input("k");  // the 4 stored key rows in order
  ASSERT_EQ(k.shape(), (Shape{4, 64}));
  const QuantSpec spec{QuantMode::affine, 4, 32};
  Tensor wq(DType::u32, {4, 8}), scales(DType::f32, {4, 2}), biases(DType::f32, {4, 2});
  ref::quantize(k.view(), Rounding::mlx_cpu, {wq.view(), scales.view(), biases.view(), spec, std::nullopt});
  ASSERT_EQ(out.at("keys.wq").shape(), wq.shape());
  for (std::int64_t r = 0; r < 4; ++r) {
    EXPECT_TRUE(same_row(out.at("keys.wq"), r, wq, r)) << "row " << r;
    EXPECT_TRUE(same_row(out.at("keys.scales"), r, scales, r)) << "row " << r;
  }
}

// uN stores its K/V through update() alone: no attention rows, keys kept unrotated, and
// the next attention reads them.
TEST(CacheOp, UpdateStoresWithoutAttending) {
  Prepared prep;
  const auto out = outputs_of(parse_problem("cache kind=kv B=1 Hq=2 Hkv=2 D=8 rope=1 script=u3.d"), &prep);
  EXPECT_EQ(out.at("attn").dim(0), 2);  // the decode's B·Hq rows only
  EXPECT_EQ(ints(out.at("offsets")), (std::vector<std::int64_t>{3, 4}));
  const Tensor& k = prep.input("k");  // rows (h, t): u3 first (6 rows), then the decode's 2
  const Tensor& keys = out.at("keys");  // content rows (h, t) over 4 tokens
  for (const auto& [content_row, input_row] : {std::pair{0, 0}, {1, 1}, {2, 2}, {4, 3}, {5, 4}, {6, 5}})
    EXPECT_TRUE(same_row(keys, content_row, k, input_row)) << "content row " << content_row;
  EXPECT_FALSE(same_row(keys, 3, k, 6));  // the decode's key is stored roped
  // Updates alone: no attention output at all, and still a clean case.
  ReferenceBackend a, b;
  EXPECT_EQ(run_case(parse_problem("cache kind=kv D=8 rope=1 script=u2.t1"), a, b, {}).status, Status::passed);
  EXPECT_EQ(cs::simpler_scripts("u4"), (std::vector<std::string>{"u1", "u2", "u3"}));
}

TEST(CacheOp, RotatingWrapKeepsTheLastWindowInTemporalOrder) {
  // max_size 8: after p6 and four decodes the ring has wrapped; kv_length is
  // min(stored, max_size) and offsets count every token (docs/semantics.md §Rotating cache).
  Prepared prep;
  const auto out = outputs_of(parse_problem("cache kind=rotating Hq=2 Hkv=2 max=8 script=p6.d4"), &prep);
  EXPECT_EQ(ints(out.at("kv_length")), (std::vector<std::int64_t>{6, 7, 8, 8, 8}));
  EXPECT_EQ(ints(out.at("offsets")), (std::vector<std::int64_t>{6, 7, 8, 9, 10}));
  // Content: tokens 2..9, per head, oldest first. Input value rows: the chunk holds
  // (h, t) at h·6 + t; decode i (token 6 + i) holds head h at 12 + 2i + h.
  const Tensor& values = out.at("values");
  const Tensor& v = prep.input("v");
  ASSERT_EQ(values.shape(), (Shape{16, 64}));
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t t = 0; t < 8; ++t) {
      const std::int64_t token = 2 + t;
      const std::int64_t row = token < 6 ? h * 6 + token : 12 + 2 * (token - 6) + h;
      EXPECT_TRUE(same_row(values, h * 8 + t, v, row)) << "head " << h << " slot " << t;
    }
  }
}

TEST(CacheOp, BatchFilterKeepsRowsInOrderWithTheirPadding) {
  // lpad 4 over B = 3 gives left padding (0, 2, 4); offsets = _idx − padding
  // (docs/semantics.md §Batch cache). The filter keeps rows 2 and 0 in that order; their padding
  // (4, 0) has minimum 0, so nothing shifts and _idx stays 7.
  Prepared prep;
  const auto out = outputs_of(parse_problem("cache kind=batch_kv B=3 Hq=2 Hkv=1 lpad=4 script=p6.d.k2_0"), &prep);
  EXPECT_EQ(ints(out.at("kv_length")), (std::vector<std::int64_t>{6, 7, 7}));
  EXPECT_EQ(ints(out.at("offsets")), (std::vector<std::int64_t>{6, 4, 2, 7, 5, 3, 3, 7}));
  // Content: old row 2's real tokens (columns 4..6), then old row 0's (columns 0..6).
  // Value rows of the input: chunk (b, t) at 6b + t; the decode's row b at 18 + b.
  const Tensor& values = out.at("values");
  const Tensor& v = prep.input("v");
  ASSERT_EQ(values.dim(0), 3 + 7);
  const std::vector<std::pair<std::int64_t, std::int64_t>> want{{2, 4}, {2, 5}, {2, 6}, {0, 0}, {0, 1},
                                                                {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto [b, col] = want[i];
    EXPECT_TRUE(same_row(values, static_cast<std::int64_t>(i), v, col < 6 ? 6 * b + col : 18 + b)) << i;
  }
}

TEST(CacheOp, AttentionOutputIsTheOraclesOverTheInputs) {
  // Without RoPE a single chunk into an empty cache is plain causal attention over the
  // chunk: the op's output equals reference sdpa on its own inputs.
  Prepared prep;
  const auto out = outputs_of(parse_problem("cache Hq=4 Hkv=2 D=32 rope=0 script=p5"), &prep);
  auto block = [&](const char* name, std::int64_t heads) {
    Tensor t(DType::f32, {1, heads, 5, 32});  // the flat (rows, D) input is (1, H, 5, D) row-major
    std::memcpy(t.data(), prep.input(name).data(), t.nbytes());
    return t;
  };
  AttentionParams a;
  a.scale = static_cast<float>(1 / std::sqrt(32.0));
  a.mask.kind = MaskKind::causal;
  const Tensor want = ref::sdpa(block("q", 4), block("k", 2), block("v", 2), a);
  ASSERT_EQ(want.nbytes(), out.at("attn").nbytes());
  EXPECT_EQ(std::memcmp(want.data(), out.at("attn").data(), want.nbytes()), 0);
}

// Block copies into a destination row >= 8 land one row late (when there is room): the
// write of new tokens at the cursor of a cache past 8 tokens skips a slot, which keeps
// its NaN poison. Below row 8 everything is right, so shrinking has a floor to find.
class LateWriteBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "late_write"; }
  void kv_copy_blocks(const KvCopyBlocksArgs& a) override {
    const auto& [src, blocks, dst] = a;
    std::vector<SeqBlock> late(blocks.begin(), blocks.end());
    for (SeqBlock& b : late) {
      if (b.dst_seq >= 8 && b.dst_seq + b.length < dst.shape[2]) ++b.dst_seq;
    }
    ref_.kv_copy_blocks({src, late, dst});
  }
};

class UnsupportedSdpaBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "no_sdpa"; }
  void sdpa(const SdpaArgs&) override {
    fail(ErrorKind::unsupported, "no_sdpa: sdpa is not implemented");
  }
};

TEST(CacheOp, LateWriteIsCaughtAndShrunkToAShortScript) {
  register_backend({"late_write", "test wrapper", "reference with block copies past row 8 one row late",
                    [](std::string_view) -> std::unique_ptr<Backend> { return std::make_unique<LateWriteBackend>(); }});
  LateWriteBackend wrong;
  ReferenceBackend reference;
  const Problem p = parse_problem("cache kind=kv B=2 Hq=4 Hkv=2 D=64 script=p37.d2.t3.a.d seed=5");
  const CaseResult r = run_case(p, wrong, reference, {});
  ASSERT_EQ(r.status, Status::failed) << describe(r);
  // The decode after the prefill reads the skipped slot 37: its attention is NaN.
  EXPECT_EQ(r.reason.rfind("attn: ", 0), 0u) << r.reason;
  EXPECT_NE(r.reason.find("NaN"), std::string::npos) << r.reason;

  const ShrinkResult s = shrink(p, wrong, reference, {});
  ASSERT_EQ(s.result.status, Status::failed);
  // Greedy descent: the decodes, trim and shared layer go, the prefill halves 37 → 18 → 9
  // and then loses one: p8 fills rows 0..7 (untouched), the decode writes row 8, the
  // first late one. Then one head, D halved to 2, B 1, RoPE off: still NaN.
  EXPECT_EQ(s.smallest.word("script"), "p8.d") << s.smallest.line();
  EXPECT_EQ(s.smallest.integer("B"), 1);
  EXPECT_EQ(s.smallest.integer("Hq"), 1);
  EXPECT_EQ(s.smallest.integer("Hkv"), 1);
  EXPECT_EQ(s.smallest.integer("D"), 2);
  EXPECT_EQ(s.smallest.integer("rope"), 0);
  // The printed line runs verbatim in `kvlab repro`: it fails there, and passes over the
  // reference.
  EXPECT_EQ(parse_problem(s.smallest.line()), s.smallest);
  std::ostringstream bad, good;
  EXPECT_FALSE(run_repro(s.smallest.line(), "late_write", false, {}, bad)) << bad.str();
  EXPECT_TRUE(run_repro(s.smallest.line(), "reference", false, {}, good)) << good.str();
}

// sdpa off by 1e-3 in the last output element of a decode (one query) over more than 16 keys.
class SlightlyOffSdpaBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "slightly_off"; }
  void sdpa(const SdpaArgs& a) override {
    ref_.sdpa(a);
    const auto& [q, k, v, p, m, s, out] = a;
    if (q.shape[2] == 1 && k.shape[2] > 16) {
      const TensorView o = host_view(out);
      o.store(o.numel() - 1, o.load(o.numel() - 1) + 1e-3f);
    }
  }
};

TEST(CacheOp, SmallAttentionErrorIsCaughtThroughRopeAndCache) {
  // The f32 budget with RoPE stays far below 1e-3 (rope slack ~ position·5u per element),
  // so the cache-level comparison is not vacuous: the decode after 20 tokens is caught.
  SlightlyOffSdpaBackend backend;
  ReferenceBackend reference;
  const CaseResult r = run_case(parse_problem("cache script=p20.d"), backend, reference, {});
  ASSERT_EQ(r.status, Status::failed) << describe(r);
  EXPECT_EQ(r.output, "attn");
  EXPECT_EQ(r.cmp.mismatches, 1);
  EXPECT_LT(r.cmp.budget, 1e-3);
  // attn rows: the prefill's 4 heads × 20 tokens, then the decode's 4: its last head.
  EXPECT_EQ(r.worst_coords, cat("[", 4 * 21 - 1, ", 63]"));
}

TEST(CacheOp, UnsupportedKernelIsUnimplementedNotFailed) {
  UnsupportedSdpaBackend backend;
  ReferenceBackend reference;
  const CaseResult r = run_case(parse_problem("cache kind=rotating max=8 script=p6.d4"), backend, reference, {});
  EXPECT_EQ(r.status, Status::unimplemented) << describe(r);
  EXPECT_NE(r.reason.find("no_sdpa"), std::string::npos);
}

TEST(CacheOp, CaseFilesCoverEveryKindAndTheListedFeatures) {
  CheckOptions o;
  o.tier = "ci";
  o.ops = {"cache"};
  std::set<std::string> kinds, bits_of_quantized;
  bool gqa = false, lpad = false, rpad = false, wrap = false, trim = false, filter = false, extend = false;
  bool prefix = false;
  for (const Problem& p : collect_cases(o)) {
    kinds.insert(p.word("kind"));
    const std::string& script = p.word("script");
    gqa |= p.integer("Hq") > p.integer("Hkv");
    lpad |= p.integer("lpad") > 0;
    rpad |= p.integer("rpad") > 0 && script.find('r') != std::string::npos;
    trim |= script.find('t') != std::string::npos;
    filter |= script.find('k') != std::string::npos;
    extend |= script.find('x') != std::string::npos;
    prefix |= cs::is_prefix_script(cs::parse_script(script));
    if (p.word("kind") == "quantized" || p.word("kind") == "batch_quantized") bits_of_quantized.insert(p.word("bits"));
    if (p.word("kind").find("rotating") != std::string::npos) {
      std::int64_t tokens = 0;  // tokens written to a single row, an upper bound for wrap-around
      for (const cs::Command& c : cs::parse_script(script)) {
        if (c.verb == cs::Verb::chunk || c.verb == cs::Verb::decode || c.verb == cs::Verb::right_chunk) tokens += c.n;
      }
      wrap |= tokens > p.integer("max");
    }
  }
  EXPECT_EQ(kinds.size(), cs::kind_names().size());
  EXPECT_TRUE(bits_of_quantized.count("4") && bits_of_quantized.count("8"));
  EXPECT_TRUE(gqa && lpad && rpad && wrap && trim && filter && extend && prefix);
}

}  // namespace
}  // namespace kvlab::harness
