// SIMD quantized_sdpa vs the oracle (reference/quantized_sdpa.h) on every attainable
// Highway target, within the harness's tolerance object (the derivation of
// attention_budget and of the quantized_sdpa override in harness/ops/sdpa_info.cc,
// restated below because unit tests do not link the harness).
//
// The fused decode path is covered over affine bits 2..8 × groups 32/64/128 × GQA R
// 1/2/4/8 × D 64/128 (and Dv != Dk with different K and V specs and scale dtypes) × q
// dtypes; chunking (one chunk, a tail chunk, many chunks, chunk sizes 1..512 through the
// test hook); causal masks with window and unequal paddings whose hidden keys carry
// NaN-poisoned scales; boolean and additive arrays; sinks; softcap; B > 1; fully masked
// rows under both policies; that the result does not depend on the threads that ran it.
// The fallback (fp modes, many query rows) is covered too, skipped while simd::sdpa
// is unsupported. Invalid input must raise the oracle's errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"
#include "kernels/simd/simd_backend.h"
#include "kernels/simd/simd_kernels.h"
#include "reference/affine_quantize.h"
#include "reference/bitpack.h"
#include "reference/fp_quantize.h"
#include "reference/mask.h"
#include "reference/quantized_sdpa.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/quantized_attention_inputs.h"
#include "tests/unit/test_util.h"

namespace kvlab {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using ref::QuantizedTensor;
using qchunk = simd::qdecode::ScopedChunkTokens;

using testing::affine;
using testing::quantize;
using testing::dv_of;
using testing::poison_hidden_keys;
using testing::random_inputs;
using testing::view_of;
using Inputs = testing::QuantizedAttentionInputs;
using Dims = testing::AttentionDims;

// Runs `kernel` (simd or ref quantized_sdpa) into an output poisoned with NaN, so an
// element it does not write fails.
template <class Kernel>
Tensor run(Kernel kernel, const Inputs& in) {
  Tensor out(in.q.dtype(), {in.q.dim(0), in.q.dim(1), in.q.dim(2), dv_of(in)});
  for (std::int64_t i = 0; i < out.numel(); ++i) out.view().store(i, kNaN);
  ConstTensorView mask, sinks;
  if (in.mask) mask = in.mask->view();
  if (in.sinks) sinks = in.sinks->view();
  kernel(in.q.view(), view_of(in.k), view_of(in.v), in.params, in.mask ? &mask : nullptr,
         in.sinks ? &sinks : nullptr, out.view());
  return out;
}
Tensor run_simd(const Inputs& in) { return run(simd::quantized_sdpa, in); }
Tensor run_ref(const Inputs& in) {
  return run(static_cast<void (*)(const ConstTensorView&, const ref::QuantizedView&, const ref::QuantizedView&,
                                  const AttentionParams&, const ConstTensorView*, const ConstTensorView*,
                                  const TensorView&)>(ref::quantized_sdpa),
             in);
}

// The tolerance of harness/ops/sdpa_info.cc (u = 2^-24, T = q's dtype):
//  attention_budget: logits |Δs| ≤ δ = (eps_T + (Dk+2)·u)·S + u·max|mask| with
//   S = max |scale|·Σ|q_d·k_d| over (row, key); weights move by e^{±2δ}: 2δ·max|v|;
//   exp, normalizer and the Lk-term sum: 2γ·max|v|, γ = (Lk+4)·u; P and out rounded
//   to T: 2·eps_T·max|v|; budget = max|v|·(2·eps_T + 2δ + 2γ) + denorm_T;
//  quantized_sdpa adds, for affine K (dequantized by one FMA), 3/(Dk+2) of that plus
//   2·max|v|·u·S_b with S_b = max |scale|·Σ_g |b_g|·Σ_{d∈g}|q_d| (K biases); for affine
//   V (applied factored), 2γ·max|b_V|.
//  The RMS error may not exceed half the budget.
double attention_budget(const Inputs& in) {
  constexpr double u = 0x1p-24;
  const DType t = in.q.dtype();
  const double eps = dtype_epsilon(t);
  const double denorm = t == DType::f32 ? 0x1p-149 : (t == DType::f16 ? 0x1p-24 : 0x1p-133);
  const Tensor k = ref::dequantize_to_f32(view_of(in.k)), v = ref::dequantize_to_f32(view_of(in.v));
  const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2), Dk = in.q.dim(3);
  const std::int64_t Hkv = k.dim(1), Lk = k.dim(2);
  const bool kb = in.k.spec.mode == QuantMode::affine, vb = in.v.spec.mode == QuantMode::affine;
  const std::int64_t kgs = in.k.spec.group_size, kgroups = Dk / kgs;
  const xt::xarray<float> q = in.q.to_f32(), kf = k.to_f32(), vf = v.to_f32();
  const xt::xarray<float> kbias = kb ? in.k.biases.to_f32() : xt::xarray<float>();
  double S = 0, Sb = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t j = 0; j < Lk; ++j) {
          const std::int64_t hk = h / (Hq / Hkv);
          double acc = 0, bias_acc = 0;
          for (std::int64_t d = 0; d < Dk; ++d) acc += std::abs(double{q(b, h, i, d)} * double{kf(b, hk, j, d)});
          for (std::int64_t g = 0; kb && g < kgroups; ++g) {
            double qabs = 0;
            for (std::int64_t d = g * kgs; d < (g + 1) * kgs; ++d) qabs += std::abs(double{q(b, h, i, d)});
            bias_acc += std::abs(double{kbias(b, hk, j, g)}) * qabs;
          }
          const double sc = std::abs(double{in.params.scale});
          if (std::isfinite(acc)) S = std::max(S, sc * acc);
          if (std::isfinite(bias_acc)) Sb = std::max(Sb, sc * bias_acc);
        }
  double max_v = 0, max_mask = 0, max_vbias = 0;
  for (const float x : vf) {
    if (std::isfinite(x)) max_v = std::max(max_v, std::abs(double{x}));
  }
  if (vb) {
    for (const float x : in.v.biases.to_f32()) {
      if (std::isfinite(x)) max_vbias = std::max(max_vbias, std::abs(double{x}));
    }
  }
  if (in.mask && in.mask->dtype() != DType::u8) {
    for (const float x : in.mask->to_f32()) {
      if (std::isfinite(x)) max_mask = std::max(max_mask, std::abs(double{x}));
    }
  }
  const double delta = (eps + static_cast<double>(Dk + 2) * u) * S + u * max_mask;
  const double gamma = static_cast<double>(Lk + 4) * u;
  const double base = max_v * (2 * eps + 2 * delta + 2 * gamma) + denorm;
  return base + (kb ? base * 3 / static_cast<double>(Dk + 2) + 2 * max_v * u * Sb : 0.0) +
         2 * gamma * max_vbias;
}

// Within the budget where the reference is finite (RMS within half of it); NaN exactly
// where the reference is NaN; ±inf exactly where it has them.
::testing::AssertionResult within_budget(const Tensor& got, const Tensor& want, double budget) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << "got " << dtype_name(got.dtype()) << shape_str(got.shape());
  }
  const ConstTensorView g = got.view(), w = want.view();
  double sum_sq = 0;
  std::int64_t finite = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double a = g.load(i), b = w.load(i);
    const bool ok = std::isnan(b) ? std::isnan(a) : std::isinf(b) ? a == b : std::abs(a - b) <= budget;
    if (!ok) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << a << ", want " << b << ", |diff| "
                                           << std::abs(a - b) << " > budget " << budget;
    }
    if (std::isfinite(b)) {
      sum_sq += (a - b) * (a - b);
      ++finite;
    }
  }
  if (finite > 0 && std::sqrt(sum_sq / static_cast<double>(finite)) > budget / 2) {
    return ::testing::AssertionFailure() << "RMS error " << std::sqrt(sum_sq / static_cast<double>(finite))
                                         << " > budget/2 " << budget / 2;
  }
  return ::testing::AssertionSuccess();
}


// The oracle once, then every attainable target within the budget.
void expect_matches(const Inputs& in, const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor want = run_ref(in);
  const double budget = attention_budget(in);
  testing::for_each_simd_target([&](const std::string&) { EXPECT_TRUE(within_budget(run_simd(in), want, budget)); });
}

DType nth_dtype(int n) { return n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16; }

TEST(SimdQuantizedSdpa, AffineBitsGroupsGqaHeadDimsAndDtypes) {
  KVLAB_SEEDED_RNG(rng, 20260);
  const qchunk chunk(16);  // Lk = 37: two full chunks and a tail
  int cases = 0;
  for (const int bits : {2, 3, 4, 5, 6, 8})
    for (const int group : {32, 64, 128})
      for (const std::int64_t R : {1, 2, 4, 8}) {
        const std::int64_t d = group == 128 || cases % 2 ? 128 : 64;
        const DType q_dtype = nth_dtype(cases), kv_dtype = nth_dtype(cases / 3);
        const Dims s{1, 2 * R, 2, cases % 4 == 0 ? 2 : 1, 37, d, d};
        Inputs in = random_inputs(rng, s, q_dtype, affine(bits, group), affine(bits, group), kv_dtype, kv_dtype);
        in.params.mask.kind = cases % 2 ? MaskKind::causal : MaskKind::none;
        expect_matches(in, cat("bits ", bits, " group ", group, " R ", R, " D ", d, " q ", dtype_name(q_dtype),
                               " scales ", dtype_name(kv_dtype), " Lq ", s.Lq));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 6 * 3 * 4);
}

TEST(SimdQuantizedSdpa, DifferentKAndVSpecsAndHeadDims) {
  KVLAB_SEEDED_RNG(rng, 31337);
  const qchunk chunk(8);
  struct Case {
    std::int64_t dk, dv;
    QuantSpec ks, vs;
    DType k_dtype, v_dtype;
  };
  const std::vector<Case> cases = {
      {128, 64, affine(4, 32), affine(8, 64), DType::f16, DType::bf16},
      {64, 128, affine(8, 64), affine(4, 128), DType::bf16, DType::f32},
      {96, 32, affine(3, 32), affine(6, 32), DType::f32, DType::f16},
      {256, 96, affine(4, 128), affine(2, 32), DType::f16, DType::f16},
      {32, 256, affine(5, 32), affine(8, 128), DType::bf16, DType::bf16},
      {64, 512, affine(4, 64), affine(4, 32), DType::f16, DType::f32},  // 16 V groups
  };
  int n = 0;
  for (const Case& c : cases) {
    for (const std::int64_t lq : {1, 3}) {
      const DType q_dtype = nth_dtype(n++);
      Inputs in = random_inputs(rng, {2, 8, 2, lq, 29, c.dk, c.dv}, q_dtype, c.ks, c.vs, c.k_dtype, c.v_dtype);
      in.params.mask.kind = MaskKind::causal;
      expect_matches(in, cat("Dk ", c.dk, " ", to_string(c.ks), " Dv ", c.dv, " ", to_string(c.vs), " Lq ", lq));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(SimdQuantizedSdpa, OneChunkTailChunksAndManyChunksAtEveryChunkSize) {
  KVLAB_SEEDED_RNG(rng, 4711);
  // Default chunk (512): S below one chunk, one chunk plus a tail, several chunks.
  for (const std::int64_t lk : {1, 100, 513, 1500}) {
    Inputs in = random_inputs(rng, {1, 8, 2, 1, lk, 128, 128}, DType::f16, affine(4, 64), affine(8, 64), DType::f16,
                              DType::f16);
    expect_matches(in, cat("default chunk, Lk ", lk));
    if (::testing::Test::HasFailure()) return;
  }
  // Small chunks through the test hook: every key its own chunk up to one chunk for all.
  Inputs in = random_inputs(rng, {2, 4, 2, 2, 61, 64, 64}, DType::f32, affine(8, 32), affine(4, 32), DType::f32,
                            DType::f32);
  in.params.mask.kind = MaskKind::causal;
  const Tensor want = run_ref(in);
  const double budget = attention_budget(in);
  // Chunks change the f32 summation order, so results across chunk sizes agree within
  // the budget, not bitwise; each one is held to the oracle.
  for (const std::int64_t tokens : {1, 2, 7, 16, 60, 61, 512}) {
    const qchunk chunk(tokens);
    SCOPED_TRACE(cat("chunk ", tokens));
    testing::for_each_simd_target([&](const std::string&) { EXPECT_TRUE(within_budget(run_simd(in), want, budget)); });
  }
  // Every chunk size >= Lk is the same single chunk: bit-identical.
  testing::for_each_simd_target([&](const std::string&) {
    Tensor one_chunk, larger;
    {
      const qchunk chunk(61);
      one_chunk = run_simd(in);
    }
    {
      const qchunk chunk(4096);
      larger = run_simd(in);
    }
    EXPECT_TRUE(testing::bit_equal(one_chunk, larger));
  });
}

TEST(SimdQuantizedSdpa, CausalWindowAndUnequalPaddingNeverReadPoisonedKeys) {
  KVLAB_SEEDED_RNG(rng, 8086);
  const qchunk chunk(8);  // chunks wholly hidden, partly hidden and visible
  int cases = 0, poisoned = 0;
  for (const int window : {0, 1, 5, 30})
    for (const bool pad : {false, true})
      for (const std::int64_t lq : {1, 3}) {
        Inputs in = random_inputs(rng, {4, 4, 2, lq, 45, 64, 64}, nth_dtype(cases), affine(cases % 2 ? 4 : 8, 32),
                                  affine(cases % 2 ? 8 : 4, 64), nth_dtype(cases + 1), nth_dtype(cases + 1));
        in.params.mask.kind = MaskKind::causal;
        in.params.mask.window = window;
        if (pad) {  // batch rows padded differently; row 3's paddings hide every key
          in.params.mask.left_padding = {0, 3, 17, 30};
          in.params.mask.right_padding = {2, 0, 9, 20};
        }
        poisoned += poison_hidden_keys(in);
        expect_matches(in, cat("window ", window, pad ? " padded" : "", " Lq ", lq));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 4 * 2 * 2);
  EXPECT_GT(poisoned, 100);  // the poison really sits where the mask hides keys
}

// A (mb, mh, Lq, Lk) array hiding ~30 % of the keys, at j ≡ 2 (mod 5) every key of the
// batch rows b ≡ 1 (mod 3) (poisoned later), and all of query row 0 of the first slice.
Tensor mask_array(testing::SeededRng& rng, MaskKind kind, DType dtype, std::int64_t mb, std::int64_t mh,
                  std::int64_t lq, std::int64_t lk) {
  Tensor m(kind == MaskKind::boolean ? DType::u8 : dtype, {mb, mh, lq, lk});
  for (std::int64_t at = 0; at < m.numel(); ++at) {
    const std::int64_t j = at % lk, b = at / (mh * lq * lk);
    bool keep = rng.uniform(0, 1) < 0.7;
    if ((b % 3 == 1 && j % 5 == 2) || at / lk == 0) keep = false;
    if (kind == MaskKind::boolean) m.view().store_int(at, keep ? 1 : 0);
    else m.view().store(at, keep ? static_cast<float>(rng.uniform(-2, 2)) : -kInf);
  }
  return m;
}

TEST(SimdQuantizedSdpa, BooleanAndAdditiveMaskArrays) {
  KVLAB_SEEDED_RNG(rng, 1984);
  const qchunk chunk(16);
  int cases = 0;
  for (const MaskKind kind : {MaskKind::boolean, MaskKind::additive})
    for (const auto& [mb, mh] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {3, 1}, {1, 8}, {3, 8}})
      for (const DType mask_dtype : {DType::f32, DType::f16, DType::bf16}) {
        if (kind == MaskKind::boolean && mask_dtype != DType::f32) continue;  // u8 either way
        Inputs in = random_inputs(rng, {3, 8, 2, 2, 40, 64, 64}, nth_dtype(cases), affine(4, 64), affine(4, 32),
                                  DType::bf16, DType::bf16);
        in.params.mask.kind = kind;
        in.mask = mask_array(rng, kind, mask_dtype, mb, mh, 2, 40);
        poison_hidden_keys(in);
        expect_matches(in, cat(kind == MaskKind::boolean ? "boolean" : "additive ", dtype_name(mask_dtype), " (", mb,
                               ", ", mh, ")"));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 4 + 4 * 3);
}

TEST(SimdQuantizedSdpa, SinksSoftcapAndLargeScores) {
  KVLAB_SEEDED_RNG(rng, 2718);
  const qchunk chunk(16);
  int cases = 0;
  for (const bool sinks : {false, true})
    for (const float softcap : {0.0f, 5.0f, 30.0f})
      for (const float scale : {0.125f, 4.0f}) {  // 4: logits of ±100s, the max must be subtracted
        Inputs in = random_inputs(rng, {2, 4, 1, 2, 50, 64, 64}, nth_dtype(cases), affine(8, 64), affine(4, 64),
                                  DType::f16, DType::f16);
        in.params.scale = scale;
        in.params.softcap = softcap;
        in.params.mask.kind = MaskKind::causal;
        if (sinks) {  // around the logits, so the sink sometimes holds the max
          in.sinks = testing::random_normal(rng, DType::f32, {4}, 3.0);
        }
        expect_matches(in, cat("sinks ", sinks, " softcap ", softcap, " scale ", scale));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 2 * 3 * 2);
}

TEST(SimdQuantizedSdpa, FullyMaskedRowsUnderBothPolicies) {
  KVLAB_SEEDED_RNG(rng, 404);
  const qchunk chunk(8);
  for (const FullyMaskedRow policy : {FullyMaskedRow::zero, FullyMaskedRow::mean_of_values})
    for (const bool sinks : {false, true}) {
      // Batch row 1's left padding hides every key; with Lq > Lk the first query row of
      // every batch row sees nothing either (position −1).
      Inputs in = random_inputs(rng, {2, 4, 2, 4, 3, 64, 64}, DType::f32, affine(4, 32), affine(8, 32), DType::f32,
                                DType::f32);
      in.params.mask.kind = MaskKind::causal;
      in.params.mask.left_padding = {0, 3};
      in.params.fully_masked = policy;
      if (sinks) in.sinks = testing::random_normal(rng, DType::f32, {4});
      // Poison only for the zero policy: the mean reads every key by definition.
      if (policy == FullyMaskedRow::zero) poison_hidden_keys(in);
      const Tensor want = run_ref(in);
      if (policy == FullyMaskedRow::zero) {  // the policy really applies: row (b 1) is 0
        EXPECT_EQ(want.view().load(((1 * 4 + 0) * 4 + 3) * 64), 0.0f);
      }
      expect_matches(in, cat(policy == FullyMaskedRow::zero ? "zero" : "mean_of_values", sinks ? " with sinks" : ""));
    }
}

// With one key its weight is exactly 1, so out = V dequantized (c·s + b in f32, both
// backends) rounded once to q's dtype: bit-exact, which pins the output conversion. V is
// chosen to hit bf16 and f16 rounding ties, f16 overflow to inf, and a NaN group.
TEST(SimdQuantizedSdpa, OneKeyGivesTheDequantizedValuesRoundedOnce) {
  KVLAB_SEEDED_RNG(rng, 7);
  const std::int64_t dv = 96;
  Inputs base = random_inputs(rng, {1, 2, 1, 1, 1, 64, dv}, DType::f32, affine(4, 64), affine(8, 32), DType::f32,
                              DType::f32);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(dv));
  for (std::size_t e = 0; e < codes.size(); ++e) codes[e] = static_cast<std::uint8_t>(e % 32 == 0 ? 0 : e * 7 % 256);
  ref::pack_codes(codes, 8, std::span<std::uint32_t>(base.v.wq.storage<std::uint32_t>().data(), dv / 4));
  // Group 0: 1 + 2^-8 + c·2^-20 (c = 0 is a bf16 tie); group 1: 65472 + c (ties and
  // overflow in f16); group 2: NaN scale.
  const float scales[3] = {0x1p-20f, 1.0f, kNaN}, biases[3] = {1.0f + 0x1p-8f, 65472.0f, 0.0f};
  for (int g = 0; g < 3; ++g) {
    base.v.scales.view().store(g, scales[g]);
    base.v.biases.view().store(g, biases[g]);
  }
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Inputs in = base;
    in.q = testing::random_normal(rng, dtype, {1, 2, 1, 64});
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor want = run_ref(in);
    testing::for_each_simd_target([&](const std::string&) { EXPECT_TRUE(testing::bit_equal(run_simd(in), want)); });
  }
}

TEST(SimdQuantizedSdpa, ResultDoesNotDependOnTheThreadsThatRanIt) {
  KVLAB_SEEDED_RNG(rng, 99);
  const qchunk chunk(32);
  Inputs in = random_inputs(rng, {2, 8, 2, 1, 700, 128, 128}, DType::f16, affine(4, 64), affine(8, 64), DType::f16,
                            DType::f16);
  in.params.mask.kind = MaskKind::causal;
  in.params.mask.left_padding = {5, 300};
  testing::for_each_simd_target([&](const std::string&) {
    const Tensor pooled = run_simd(in);
    // A call made inside a pool task runs its tasks serially on one thread (parallel.h).
    Tensor serial;
    simd::parallel_for(2, [&](std::int64_t i) {
      if (i == 0) serial = run_simd(in);
    });
    EXPECT_TRUE(testing::bit_equal(pooled, serial));
    EXPECT_TRUE(testing::bit_equal(pooled, run_simd(in)));
  });
}

TEST(SimdQuantizedSdpa, ThroughTheBackendInterface) {
  KVLAB_SEEDED_RNG(rng, 12);
  const Inputs in = random_inputs(rng, {1, 4, 2, 1, 64, 64, 64}, DType::bf16, affine(4, 64), affine(4, 64),
                                  DType::bf16, DType::bf16);
  const Tensor want = run_ref(in);
  const double budget = attention_budget(in);
  testing::for_each_simd_target([&](const std::string&) {
    SimdBackend be;
    auto side = [&](const QuantizedTensor& x) {
      return QuantizedDTensor{be.upload(x.wq), be.upload(x.scales), be.upload(x.biases), x.spec};
    };
    const DTensor out = be.allocate(DType::bf16, {1, 4, 1, 64});
    be.fill(out, 0x7FC1u);
    be.quantized_sdpa({be.upload(in.q), side(in.k), side(in.v), in.params, nullptr, nullptr, out});
    EXPECT_TRUE(within_budget(be.download(out), want, budget));
  });
}

// The softmax's e^x (x = s − max <= 0) is a trimmed copy of Highway's Exp on AVX3 (no
// sign handling, one vscalefps for 2^q); it must give Highway's bits for every x <= 0:
// a dense sweep of [−110, 0] (normal, subnormal and zero results, the −104 cut-off),
// ties of the q rounding (x·log2(e) near a half-integer), random values and specials.
TEST(SimdQuantizedSdpa, SoftmaxExpIsHighwaysExpForNonPositiveArguments) {
  KVLAB_SEEDED_RNG(rng, 2718);
  std::vector<float> x = {0.0f, -0.0f, -kInf, -1e-30f, -0x1p-149f, -104.0f, std::nextafter(-104.0f, 0.0f),
                          std::nextafter(-104.0f, -kInf), -87.33654f, -103.27893f, -150.0f, -1e30f};
  for (int i = 0; i <= 110 * 4096; ++i) x.push_back(static_cast<float>(-i) / 4096.0f);
  for (int k = 1; k <= 150; ++k) {  // x·log2(e) = k − 0.5 ± a few ulp
    const auto tie = static_cast<float>(-(k - 0.5) * 0.6931471805599453);
    for (float y = tie, n = 0; n < 4; ++n, y = std::nextafter(y, 0.0f)) x.push_back(y);
    for (float y = tie, n = 0; n < 4; ++n, y = std::nextafter(y, -kInf)) x.push_back(y);
  }
  for (int i = 0; i < 100000; ++i) x.push_back(static_cast<float>(-rng.uniform(0.0, 110.0)));
  std::vector<float> fast(x.size()), highway(x.size());
  testing::for_each_simd_target([&](const std::string&) {
    simd::qdecode::exp_nonpositive(x.data(), x.size(), fast.data(), false);
    simd::qdecode::exp_nonpositive(x.data(), x.size(), highway.data(), true);
    int mismatches = 0;
    for (std::size_t i = 0; i < x.size() && mismatches < 5; ++i) {
      if (std::bit_cast<std::uint32_t>(fast[i]) != std::bit_cast<std::uint32_t>(highway[i])) {
        ADD_FAILURE() << "e^" << x[i] << ": " << fast[i] << " instead of Highway's " << highway[i];
        ++mismatches;
      }
    }
    EXPECT_EQ(fast[0], 1.0f);    // e^0
    EXPECT_EQ(fast[2], 0.0f);    // e^−inf: hidden keys weigh exactly 0
    EXPECT_GT(fast[12 + 87 * 4096], 0.0f);  // e^−87 is still normal
  });
}

// The fallback (dequantize with the SIMD dequantizers, then simd::sdpa) runs once the
// SIMD sdpa and fp dequantizers exist; until then they throw unsupported.
bool fallback_unsupported(const Inputs& in) {
  const testing::Thrown t = testing::thrown_by([&] { run_simd(in); });
  return t.threw && t.kind == ErrorKind::unsupported;
}

TEST(SimdQuantizedSdpa, FallbackForFpModesAndLongQueryBlocks) {
  KVLAB_SEEDED_RNG(rng, 1337);
  std::vector<std::pair<Inputs, std::string>> cases;
  cases.emplace_back(random_inputs(rng, {2, 4, 4, 2, 40, 64, 64}, DType::f16, QuantSpec::make(QuantMode::mxfp4),
                                   QuantSpec::make(QuantMode::nvfp4), DType::f16, DType::f16),
                     "mxfp4 K, nvfp4 V");
  cases.emplace_back(random_inputs(rng, {1, 4, 2, 2, 30, 64, 80}, DType::bf16, affine(4, 64),
                                   QuantSpec::make(QuantMode::nvfp4), DType::bf16, DType::bf16),
                     "affine K, nvfp4 V with Dv 80");
  cases.emplace_back(random_inputs(rng, {1, 8, 1, 5, 40, 64, 64}, DType::f32, affine(8, 64), affine(4, 64),
                                   DType::f32, DType::f32),
                     "R·Lq = 40 query rows");
  for (auto& [in, what] : cases) {
    in.params.mask.kind = MaskKind::causal;
    if (fallback_unsupported(in)) GTEST_SKIP() << "simd::sdpa or an fp dequantizer is unsupported yet: " << what;
    expect_matches(in, what);
  }
  // The boundary: R·Lq = 32 still takes the fused path (it works without simd::sdpa).
  Inputs fused = random_inputs(rng, {1, 8, 1, 4, 40, 64, 64}, DType::f32, affine(8, 64), affine(4, 64), DType::f32,
                               DType::f32);
  expect_matches(fused, "R·Lq = 32 query rows");
}

// ---------------------------------------------------------------- invalid input

void expect_same_error(const Inputs& in, const std::string& what) {
  testing::expect_same_error([&] { run_ref(in); }, [&] { run_simd(in); }, what);
}

TEST(SimdQuantizedSdpa, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_SEEDED_RNG(rng, 500);
  const Inputs good = random_inputs(rng, {2, 4, 2, 1, 9, 64, 64}, DType::f16, affine(4, 32), affine(8, 64),
                                    DType::f16, DType::f16);
  std::vector<std::pair<std::string, std::function<void(Inputs&)>>> edits = {
      {"q rank 3", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 4, 64}); }},
      {"K bits 7", [](Inputs& in) { in.k.spec.bits = 7; }},
      {"V group 48", [](Inputs& in) { in.v.spec.group_size = 48; }},
      {"q head dim not a multiple of K's group", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 4, 1, 48}); }},
      {"K codes of the wrong width", [](Inputs& in) { in.k.wq = Tensor(DType::u32, {2, 2, 9, 9}); }},
      {"K codes not u32", [](Inputs& in) { in.k.wq = Tensor(DType::i32, {2, 2, 9, 8}); }},
      {"V scales of another Lk", [](Inputs& in) { in.v.scales = Tensor(DType::f16, {2, 2, 8, 1}); }},
      {"K biases missing", [](Inputs& in) { in.k.biases = Tensor(); }},
      {"V biases of another dtype", [](Inputs& in) { in.v.biases = Tensor(DType::bf16, {2, 2, 9, 1}); }},
      {"K scales not float", [](Inputs& in) { in.k.scales = Tensor(DType::u8, {2, 2, 9, 2}); }},
      {"fp mode with biases", [](Inputs& in) { in.k.spec = QuantSpec::make(QuantMode::mxfp4); }},
      {"Hq % Hkv", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 3, 1, 64}); }},
      {"K and V batch differ", [](Inputs& in) {
         in.v = quantize(Tensor(DType::f16, {1, 2, 9, 64}), affine(8, 64));
       }},
      {"scale NaN", [](Inputs& in) { in.params.scale = kNaN; }},
      {"softcap negative", [](Inputs& in) { in.params.softcap = -1; }},
      {"window on mask none", [](Inputs& in) { in.params.mask.window = 4; }},
      {"padding of the wrong length", [](Inputs& in) {
         in.params.mask.kind = MaskKind::causal;
         in.params.mask.left_padding = {1, 2, 3};
       }},
      {"boolean mask without an array", [](Inputs& in) { in.params.mask.kind = MaskKind::boolean; }},
      {"mask array with causal", [](Inputs& in) {
         in.params.mask.kind = MaskKind::causal;
         in.mask = Tensor(DType::u8, {1, 1, 1, 9});
       }},
      {"additive mask of the wrong Lk", [](Inputs& in) {
         in.params.mask.kind = MaskKind::additive;
         in.mask = Tensor(DType::f32, {1, 1, 1, 8});
       }},
      {"sinks of the wrong length", [](Inputs& in) { in.sinks = Tensor(DType::f32, {2}); }},
  };
  for (auto& [what, edit] : edits) {
    Inputs in = good;
    edit(in);
    SCOPED_TRACE(what);
    testing::for_each_simd_target([&](const std::string&) { expect_same_error(in, what); });
  }
  // The output view: wrong dtype, wrong shape.
  for (const auto& [dtype, shape] : std::vector<std::pair<DType, Shape>>{{DType::f32, {2, 4, 1, 64}},
                                                                          {DType::f16, {2, 4, 1, 32}}}) {
    Tensor out(dtype, shape);
    const ref::QuantizedView k = view_of(good.k), v = view_of(good.v);
    testing::expect_same_error(
        [&] { ref::quantized_sdpa(good.q.view(), k, v, good.params, nullptr, nullptr, out.view()); },
        [&] { simd::quantized_sdpa(good.q.view(), k, v, good.params, nullptr, nullptr, out.view()); },
        cat("out ", dtype_name(dtype), shape_str(shape)));
  }
}

}  // namespace
}  // namespace kvlab
