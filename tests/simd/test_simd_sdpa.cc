// SIMD sdpa: what the harness cannot state as a case line. Its comparisons with the
// oracle (shapes, GQA, head dims, every mask kind and broadcast shape, sinks, softcap,
// scale, fully masked rows, key splits, inf/NaN inputs, poisoned hidden keys) are lines
// of harness/cases/sdpa/, run on every Highway target by the harness.check_ci_host
// test under the one tolerance object of harness/ops/sdpa_info.cc. Here: the output
// bits do not depend on the threads that run the tasks (a call from inside a pool task
// runs serially), and invalid input raises the oracle's errors on every target.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
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

// bf16 decode on an AVX512_BF16 CPU takes the vdpbf16ps K side; AVX-512 CPUs without it
// take the f32 path, which the harness then never runs here. Both against the oracle's
// bf16 output: every element within one bf16 ulp, and at most 2 % not identical (f32
// arithmetic in either order; the harness' rounding identity holds the dot path to what
// an f32 twin allows, test_precision_ceiling.cc).
TEST_F(SimdSdpa, Bf16DecodeAgreesWithTheOracleWithAndWithoutTheDotProductKSide) {
  if (!simd::qdecode::bf16_dot_available()) GTEST_SKIP() << "this CPU has no AVX512_BF16: only the f32 path exists";
  KVLAB_SEEDED_RNG(rng, 4242);
  for (const std::int64_t dk : {64, 128}) {
    const Shape4 s{1, 8, 2, 1, 2100, dk, 128};
    Inputs in = random_inputs(rng, DType::bf16, s);
    in.params.mask.kind = MaskKind::causal;
    const Tensor want = run_sdpa(ref_, in);
    const Tensor dot = run_sdpa(simd_, in);
    Tensor plain;
    {
      const simd::qdecode::ScopedNoBf16Dot no_dot;
      plain = run_sdpa(simd_, in);
    }
    for (const Tensor* got : {&dot, static_cast<const Tensor*>(&plain)}) {
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < want.numel(); ++i) {
        const float w = want.view().load(i), g = got->view().load(i);
        if (w == g) continue;
        ++differ;
        EXPECT_LE(std::abs(g - w), std::ldexp(std::abs(w), -7)) << "element " << i << " Dk " << dk;
      }
      EXPECT_LE(differ, want.numel() / 50) << (got == &dot ? "vdpbf16ps" : "f32") << " path, Dk " << dk;
    }
  }
}

}  // namespace
}  // namespace test_simd_sdpa
}  // namespace kvlab
