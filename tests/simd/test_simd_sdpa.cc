// SIMD sdpa: what the harness cannot state as a case line. Its comparisons with the
// oracle (shapes, GQA, head dims, every mask kind and broadcast shape, sinks, softcap,
// scale, fully masked rows, key splits, inf/NaN inputs, poisoned hidden keys) are lines
// of harness/cases/sdpa/, run on every Highway target by the harness.check_ci_host
// test under the one tolerance object of harness/ops/sdpa_info.cc. Here: the output
// bits do not depend on the threads that run the tasks (a call from inside a pool task
// runs serially), invalid input raises the oracle's errors on every target, and the decode
// of one key gives its V row bit for bit whatever lane order a target reads rows in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"
#include "kernels/simd/simd_backend.h"
#include "kernels/simd/simd_kernels.h"
#include "reference/reference_backend.h"
#include "reference/sdpa.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Inputs {
  Tensor q, k, v;
  AttentionParams params;
  std::optional<Tensor> mask, sinks;
};

Tensor run_sdpa(Backend& be, const Inputs& in) {
  const DTensor q = be.upload(in.q), k = be.upload(in.k), v = be.upload(in.v);
  std::optional<DTensor> mask, sinks;
  if (in.mask) mask = be.upload(*in.mask);
  if (in.sinks) sinks = be.upload(*in.sinks);
  const DTensor out = be.allocate(in.q.dtype(), {in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)});
  be.fill(out, 0x7FC00001u);  // poisoned, so an unwritten element fails
  be.sdpa({q, k, v, in.params, mask ? &*mask : nullptr, sinks ? &*sinks : nullptr, out});
  return be.download(out);
}

struct Shape4 {
  std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
};

Inputs random_inputs(testing::SeededRng& rng, DType dtype, const Shape4& s) {
  Inputs in{testing::random_normal(rng, dtype, {s.B, s.Hq, s.Lq, s.Dk}),
            testing::random_normal(rng, dtype, {s.B, s.Hkv, s.Lk, s.Dk}),
            testing::random_normal(rng, dtype, {s.B, s.Hkv, s.Lk, s.Dv}), {}, {}, {}};
  in.params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.Dk)));
  return in;
}

class SimdSdpa : public ::testing::Test {
 protected:
  ReferenceBackend ref_;
  SimdBackend simd_;
};

// The task split is a function of the problem only, so the output bits cannot depend on
// which threads run the tasks. A call made inside a parallel_for task runs its tasks
// serially on that thread (parallel.h): that run must give the pooled run's bits, and
// two pooled runs must agree. (Different KVLAB_THREADS values were also compared by
// running this binary under KVLAB_THREADS=1 and =7: see the printed checksums.)
TEST_F(SimdSdpa, ResultsDoNotDependOnTheThreadsThatRunTheTasks) {
  KVLAB_SEEDED_RNG(rng, 2718);
  std::cout << "[ threads  ] worker_count() = " << simd::worker_count() << "\n";
  for (const std::int64_t lq : {1, 12}) {
    const Shape4 s{1, 8, 2, lq, 2100, 64, 64};  // key splits as well
    Inputs in = random_inputs(rng, DType::bf16, s);
    in.params.mask.kind = MaskKind::causal;
    in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
    testing::for_each_simd_target([&](const std::string& target) {
      const Tensor pooled = run_sdpa(simd_, in), again = run_sdpa(simd_, in);
      Tensor serial;
      simd::parallel_for(2, [&](std::int64_t t) {
        if (t == 0) serial = run_sdpa(simd_, in);
      });
      EXPECT_TRUE(testing::bit_equal(pooled, again));
      EXPECT_TRUE(testing::bit_equal(pooled, serial));
      std::uint64_t checksum = 1469598103934665603ull;  // FNV-1a of the output bytes
      for (std::size_t i = 0; i < pooled.nbytes(); ++i) {
        checksum = (checksum ^ static_cast<std::uint8_t>(pooled.data()[i])) * 1099511628211ull;
      }
      std::cout << "[ checksum ] " << target << " Lq " << lq << ": " << std::hex << checksum << std::dec << "\n";
    });
  }
}

TEST_F(SimdSdpa, InvalidInputRaisesTheOraclesErrors) {
  using Call = std::function<void(Backend&)>;
  auto f32 = [](Backend& be, Shape s, DType t = DType::f32) { return be.allocate(t, std::move(s)); };
  auto call = [&](Backend& be, Shape q, Shape k, Shape v, Shape out, AttentionParams p = {},
                  std::optional<std::pair<DType, Shape>> mask = {}, std::optional<std::pair<DType, Shape>> sinks = {},
                  DType dtype = DType::f32, DType kv_dtype = DType::f32) {
    const DTensor dm = mask ? f32(be, mask->second, mask->first) : DTensor{};
    const DTensor ds = sinks ? f32(be, sinks->second, sinks->first) : DTensor{};
    be.sdpa({f32(be, q, dtype), f32(be, k, kv_dtype), f32(be, v, kv_dtype), p, mask ? &dm : nullptr,
            sinks ? &ds : nullptr, f32(be, out, dtype)});
  };
  const Shape q{1, 4, 2, 8}, k{1, 2, 6, 8}, v{1, 2, 6, 8}, out{1, 4, 2, 8};
  auto with = [](auto change) {
    AttentionParams p;
    change(p);
    return p;
  };
  const AttentionParams causal = with([](AttentionParams& p) { p.mask.kind = MaskKind::causal; });
  const AttentionParams boolean = with([](AttentionParams& p) { p.mask.kind = MaskKind::boolean; });
  const AttentionParams additive = with([](AttentionParams& p) { p.mask.kind = MaskKind::additive; });
  const std::vector<std::pair<const char*, Call>> bad = {
      {"q rank 3", [&](Backend& be) { call(be, {4, 2, 8}, k, v, out); }},
      {"k dtype", [&](Backend& be) { call(be, q, k, v, out, {}, {}, {}, DType::f32, DType::f16); }},
      {"int dtype", [&](Backend& be) { call(be, q, k, v, out, {}, {}, {}, DType::i32, DType::i32); }},
      {"batch", [&](Backend& be) { call(be, q, {2, 2, 6, 8}, {2, 2, 6, 8}, out); }},
      {"v heads", [&](Backend& be) { call(be, q, k, {1, 1, 6, 8}, out); }},
      {"v length", [&](Backend& be) { call(be, q, k, {1, 2, 5, 8}, out); }},
      {"Dk", [&](Backend& be) { call(be, q, {1, 2, 6, 4}, v, out); }},
      {"Hq % Hkv", [&](Backend& be) { call(be, {1, 3, 2, 8}, k, v, {1, 3, 2, 8}); }},
      {"Lk 0", [&](Backend& be) { call(be, q, {1, 2, 0, 8}, {1, 2, 0, 8}, out); }},
      {"Lq 0", [&](Backend& be) { call(be, {1, 4, 0, 8}, k, v, {1, 4, 0, 8}); }},
      {"out shape", [&](Backend& be) { call(be, q, k, v, {1, 4, 2, 7}); }},
      {"scale inf", [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.scale = kInf; })); }},
      {"softcap < 0", [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.softcap = -1; })); }},
      {"softcap NaN", [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.softcap = kNaN; })); }},
      {"window < 0", [&](Backend& be) {
         call(be, q, k, v, out, with([](AttentionParams& p) { p.mask = {MaskKind::causal, -1, {}, {}}; }));
       }},
      {"window on none", [&](Backend& be) {
         call(be, q, k, v, out, with([](AttentionParams& p) { p.mask.window = 4; }));
       }},
      {"padding length", [&](Backend& be) {
         call(be, q, k, v, out, with([](AttentionParams& p) { p.mask = {MaskKind::causal, 0, {0, 1}, {}}; }));
       }},
      {"negative padding", [&](Backend& be) {
         call(be, q, k, v, out, with([](AttentionParams& p) { p.mask = {MaskKind::causal, 0, {}, {-2}}; }));
       }},
      {"array on causal", [&](Backend& be) { call(be, q, k, v, out, causal, {{DType::u8, {1, 1, 2, 6}}}); }},
      {"boolean without array", [&](Backend& be) { call(be, q, k, v, out, boolean); }},
      {"boolean f32", [&](Backend& be) { call(be, q, k, v, out, boolean, {{DType::f32, {1, 1, 2, 6}}}); }},
      {"additive u8", [&](Backend& be) { call(be, q, k, v, out, additive, {{DType::u8, {1, 1, 2, 6}}}); }},
      {"mask heads", [&](Backend& be) { call(be, q, k, v, out, boolean, {{DType::u8, {1, 2, 2, 6}}}); }},
      {"mask Lk", [&](Backend& be) { call(be, q, k, v, out, additive, {{DType::f32, {1, 1, 2, 5}}}); }},
      {"mask rank", [&](Backend& be) { call(be, q, k, v, out, additive, {{DType::f32, {2, 6}}}); }},
      {"sinks shape", [&](Backend& be) { call(be, q, k, v, out, {}, {}, {{DType::f32, {2}}}); }},
      {"sinks dtype", [&](Backend& be) { call(be, q, k, v, out, {}, {}, {{DType::i32, {4}}}); }},
  };
  for (const auto& [what, c] : bad)
    testing::expect_same_error([&, &c = c] { c(ref_); }, [&, &c = c] { c(simd_); }, what);

  // Views with no data (not reachable through a Backend): the oracle's view-level checks.
  Tensor tq(DType::f32, q), tk(DType::f32, k), tv(DType::f32, v), tout(DType::f32, out);
  const ConstTensorView vq = tq.view(), vk = tk.view(), vv = tv.view();
  const AttentionParams none;
  for (const int which : {0, 1, 2, 3}) {
    ConstTensorView a = vq, b = vk, c = vv;
    TensorView o = tout.view();
    if (which == 0) a.data = nullptr;
    if (which == 1) b.data = nullptr;
    if (which == 2) c.data = nullptr;
    if (which == 3) o.data = nullptr;
    testing::expect_same_error([&] { ref::sdpa(a, b, c, none, nullptr, nullptr, o); },
                               [&] { simd::sdpa(a, b, c, none, nullptr, nullptr, o); }, cat("no data ", which));
  }
}

// What a bf16 decode whose V side rounds P to bf16 computes, in double from the inputs:
// per chunk of `chunk` keys (the flash-decoding split, quantized_decode.h) p = e^(s − m_c)
// rounded to bf16 (through f32, RNE) with m_c the chunk's max, then scaled by
// e^(m_c − max); o = Σ p·v / Σ e^(s − max) (the sum of the unrounded p), rounded to bf16.
// Every key visible (mask none, or causal with Lq 1).
Tensor rounded_p_twin(const Inputs& in, std::int64_t chunk) {
  const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2), Dk = in.q.dim(3);
  const std::int64_t Hkv = in.k.dim(1), Lk = in.k.dim(2), Dv = in.v.dim(3);
  Tensor out(DType::bf16, {B, Hq, Lq, Dv});
  const ConstTensorView q = in.q.view(), k = in.k.view(), v = in.v.view();
  std::vector<double> s(static_cast<std::size_t>(Lk)), o(static_cast<std::size_t>(Dv));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kv = (b * Hkv + h / (Hq / Hkv)) * Lk;
      for (std::int64_t i = 0; i < Lq; ++i) {
        const std::int64_t row = (b * Hq + h) * Lq + i;
        double m = -INFINITY;
        for (std::int64_t j = 0; j < Lk; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < Dk; ++d) dot += double{q.load(row * Dk + d)} * double{k.load((kv + j) * Dk + d)};
          s[static_cast<std::size_t>(j)] = dot * in.params.scale;
          m = std::max(m, s[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (std::int64_t j = 0; j < Lk; ++j) {
          const auto first = s.begin() + j / chunk * chunk, last = s.begin() + std::min(Lk, (j / chunk + 1) * chunk);
          const double mc = *std::max_element(first, last), x = s[static_cast<std::size_t>(j)];
          const double pb = bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(std::exp(x - mc)))) * std::exp(mc - m);
          sum += std::exp(x - m);
          for (std::int64_t d = 0; d < Dv; ++d) o[static_cast<std::size_t>(d)] += pb * double{v.load((kv + j) * Dv + d)};
        }
        for (std::int64_t d = 0; d < Dv; ++d) {
          out.view().store(row * Dv + d, static_cast<float>(o[static_cast<std::size_t>(d)] / sum));
        }
      }
    }
  }
  return out;
}

// got within `ulps` bf16 ulps of want everywhere (|got − want| <= ulps·2^-7·|want|,
// plus `absolute`), and at most 2 % of the elements not identical.
void expect_within_ulps(const Tensor& got, const Tensor& want, const std::string& what, double absolute = 0,
                        int ulps = 1) {
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const float w = want.view().load(i), g = got.view().load(i);
    if (w == g) continue;
    ++differ;
    EXPECT_LE(std::abs(g - w), std::ldexp(double{std::abs(w)}, -7) * ulps + absolute) << what << ", element " << i;
  }
  EXPECT_LE(differ, want.numel() / 50) << what;
}

// bf16 decode on the vdpbf16ps path takes the dot product on the K side and on the V side
// with P rounded to bf16, and says so (attention_rounding); the f32 path does not. The
// CPU picks one by default (bf16_dot_available), so the harness runs only that one here;
// ScopedBf16Dot runs each on any AVX512_BF16 CPU. The
// f32 path against the oracle's bf16 output, the dot path against a twin that rounds P
// as it declares: every element within one bf16 ulp (two for the dot path), and at most
// 2 % not identical (f32 arithmetic in either order; the harness holds the f32 path to
// its rounding identity and the dot path to the precision ceiling with the P term,
// test_precision_ceiling.cc).
TEST_F(SimdSdpa, Bf16DecodeAgreesWithTheOracleOrItsRoundedPTwinOnEitherPath) {
  if (!simd::qdecode::bf16_dot_supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16: only the f32 path exists";
  KVLAB_SEEDED_RNG(rng, 4242);
  for (const std::int64_t dk : {64, 128}) {
    for (const std::int64_t lk : {2100, 2101}) {  // 5 chunks; an odd one pairs its last key with zeros
      const Shape4 s{1, 8, 2, 1, lk, dk, 128};
      Inputs in = random_inputs(rng, DType::bf16, s);
      in.params.mask.kind = MaskKind::causal;
      const std::string what = cat("Dk ", dk, " Lk ", lk);
      // An f32 sum rounds relative to its terms, not to its result: outputs near zero
      // (cancellation) get a few f32 ulps of max|v| besides the bf16 ulp of their own.
      float max_v = 0;
      for (std::int64_t i = 0; i < in.v.numel(); ++i) max_v = std::max(max_v, std::abs(in.v.view().load(i)));
      const double near_zero = 4 * 0x1p-24 * max_v;
      const Tensor dot = [&] {
        const simd::qdecode::ScopedBf16Dot on(true);
        return run_sdpa(simd_, in);
      }();
      EXPECT_TRUE(simd_.attention_rounding().probabilities) << what;
      expect_within_ulps(dot, rounded_p_twin(in, simd::qdecode::chunk_tokens(s.B, s.Hkv, s.Lk, s.Hq / s.Hkv * s.Lq)), cat("vdpbf16ps path, ", what), near_zero,
                         2);  // a p next to a bf16 rounding boundary may round the other way than the twin's
      const simd::qdecode::ScopedBf16Dot off(false);
      const Tensor plain = run_sdpa(simd_, in);
      EXPECT_FALSE(simd_.attention_rounding().probabilities) << what;
      expect_within_ulps(plain, run_sdpa(ref_, in), cat("f32 path, ", what), near_zero);
    }
  }
  // The declaration is per call: an f16 decode, or a bf16 call of 12 query positions (48
  // rows: the general kernel), right after a bf16 decode keeps P in f32 and says so.
  const simd::qdecode::ScopedBf16Dot on(true);
  for (const auto& [dtype, lq] : {std::pair{DType::f16, 1}, std::pair{DType::bf16, 12}}) {
    run_sdpa(simd_, random_inputs(rng, DType::bf16, {1, 8, 2, 1, 600, 64, 64}));
    ASSERT_TRUE(simd_.attention_rounding().probabilities);
    run_sdpa(simd_, random_inputs(rng, dtype, {1, 8, 2, lq, 600, 64, 64}));
    EXPECT_FALSE(simd_.attention_rounding().probabilities) << dtype_name(dtype) << " Lq " << lq;
  }
}

// Asking for the vdpbf16ps path on a CPU without the instruction is an error, not a crash.
TEST_F(SimdSdpa, Bf16DotPathCannotBeForcedWithoutTheInstruction) {
  if (simd::qdecode::bf16_dot_supported()) GTEST_SKIP() << "this CPU has AVX512_BF16";
  EXPECT_THROW(simd::qdecode::ScopedBf16Dot(true), Error);
  EXPECT_FALSE(simd::qdecode::bf16_dot_available());
}

// Below AVX-512 plain bf16 rows are read as pairs (even elements, then odd ones:
// PackedSide::bf16_pairs), the queries and outputs in that lane order. One visible key
// has the weight 1, so each output element must be its own V element, bit for bit, for
// values at every scale (subnormal to the format's largest binade) and each row block
// (Hq/Hkv 1, 4 and 5); the f16 rows (element order) beside them must also hold. Where the
// CPU has vdpbf16ps, its path (a weight of 1 is exact in bf16) is checked on normal values
// only: it flushes subnormal inputs, as Bf16DecodeKeepsTinyValuesOffTheFlushingDotPath says.
TEST_F(SimdSdpa, DecodeOfOneKeyGivesItsValuesInElementOrderOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 1717);
  std::vector<bool> dot_paths{false};
  if (simd::qdecode::bf16_dot_supported()) dot_paths.push_back(true);
  for (const bool dot : dot_paths) {
    const simd::qdecode::ScopedBf16Dot path(dot);
    for (const DType dtype : {DType::bf16, DType::f16}) {
      const int top = dtype == DType::bf16 ? 127 : 15;
      const int bottom = dtype == DType::f16 ? -24 : dot ? -126 : -133;
      for (const std::int64_t rows : {1, 4, 5}) {
        Inputs in = random_inputs(rng, dtype, {1, rows, 1, 1, 1, 32, 128});
        for (std::int64_t i = 0; i < in.v.numel(); ++i) {
          const int exponent = bottom + static_cast<int>(i * 7 % (top - bottom));
          in.v.view().store(i, std::ldexp(1.0f + static_cast<float>(i % 128) / 128.0f, exponent));
        }
        const Tensor want = run_sdpa(ref_, in);
        testing::for_each_simd_target([&](const std::string& target) {
          EXPECT_TRUE(testing::bit_equal(run_sdpa(simd_, in), want))
              << target << " " << dtype_name(dtype) << " Hq " << rows << (dot ? " vdpbf16ps" : " f32 path");
        });
      }
    }
  }
}

// vdpbf16ps treats subnormal inputs as zero and flushes subnormal sums; the V side takes
// it only where a sampled |v| reaches 2^-90 (ValueBlockBf16's argument), so a V of
// subnormals, or of normals below the floor, runs in f32 and keeps its tiny outputs
// (taking the dot path anyway would flush the first to zero), and a V above it does not.
TEST_F(SimdSdpa, Bf16DecodeKeepsTinyValuesOffTheFlushingDotPath) {
  if (!simd::qdecode::bf16_dot_supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16: only the f32 path exists";
  const simd::qdecode::ScopedBf16Dot on(true);
  KVLAB_SEEDED_RNG(rng, 77);
  for (const int exponent : {-128, -100, -80}) {
    Inputs in = random_inputs(rng, DType::bf16, {1, 4, 1, 1, 600, 64, 64});
    for (std::int64_t i = 0; i < in.v.numel(); ++i) in.v.view().store(i, std::ldexp(in.v.view().load(i), exponent));
    const Tensor got = run_sdpa(simd_, in);
    const bool dot = exponent > -90;
    EXPECT_EQ(simd_.attention_rounding().probabilities, dot) << "V scaled by 2^" << exponent;
    if (!dot) expect_within_ulps(got, run_sdpa(ref_, in), cat("V scaled by 2^", exponent), 0x1p-133);
  }
}

// The K side's vdpbf16ps treats a subnormal input as zero: a subnormal q element times a
// key element near bf16's largest finite value is a product of order 1, which it would drop.
// So a query with a subnormal element is scored in f32 (bf16_queries; the V side keeps
// vdpbf16ps): here eight of them meet 1.5·2^127 in key 0 (products 2.25 each, key 0's
// logit +2.25 at scale 1/8), and the output must be the rounded-P twin's within the dot
// path's two ulps. A query whose elements are all normal still scores K by vdpbf16ps (no
// f32 FMA lanes spent: simd::last_attention_mix).
TEST_F(SimdSdpa, Bf16DecodeKeepsSubnormalQueriesOffTheFlushingDotPath) {
  if (!simd::qdecode::bf16_dot_supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16: only the f32 path exists";
  const simd::qdecode::ScopedBf16Dot on(true);
  KVLAB_SEEDED_RNG(rng, 78);
  const Shape4 s{1, 4, 1, 1, 600, 64, 64};
  for (const bool subnormal : {true, false}) {
    Inputs in = random_inputs(rng, DType::bf16, s);
    for (std::int64_t d = 0; d < 8; ++d) {
      in.k.view().store(d, 0x1.8p127f);  // key 0 of the one kv head
      for (std::int64_t h = 0; h < 4; ++h) in.q.view().store(h * 64 + d, subnormal ? 0x1.8p-127f : 0x1p-100f);
    }
    const Tensor got = run_sdpa(simd_, in);
    const simd::ArithmeticMix mix = simd::last_attention_mix();
    EXPECT_EQ(mix.fma > 0, subnormal) << (subnormal ? "subnormal" : "normal") << " q: K side in f32 FMAs";
    if (subnormal) {
      expect_within_ulps(got, rounded_p_twin(in, simd::qdecode::chunk_tokens(s.B, s.Hkv, s.Lk, s.Hq / s.Hkv * s.Lq)),
                         "subnormal q elements", 0, 2);
    }
  }
}

}  // namespace
}  // namespace test_simd_sdpa
}  // namespace kvlab
