// SIMD sdpa vs the oracle on every attainable Highway target, within the harness's
// attention tolerance (the derivation of attention_budget in harness/ops/sdpa_info.cc,
// restated below because unit tests do not link the harness). Covers decode and prefill,
// GQA R 1/2/4/8, Dk 64/80/128/256 with Dv != Dk, every mask kind (causal with window and
// unequal paddings, boolean and additive arrays of every broadcast shape), sinks,
// softcap, fully masked rows under both policies, key splits (long decode), f16/bf16
// inf/NaN handling, and that hidden keys are never read: every key slot that no query of
// its kv head may see holds NaN, so reading it fails loudly.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_backend.h"
#include "kernels/simd/simd_kernels.h"
#include "reference/mask.h"
#include "reference/reference_backend.h"
#include "reference/sdpa.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
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

// attention_budget of harness/ops/sdpa_info.cc, same derivation (f32 accumulation):
//  logits |Δs| ≤ δ = (eps_T + (Dk+2)·u)·S + u·max|mask|, S = max |scale|·Σ|q_d·k_d|;
//  softmax weights move by e^{±2δ}: |Δo| ≤ 2δ·max|v|; exp, normalizer and the Lk-term
//  sum add γ = (Lk+4)·u relative each (2γ·max|v|); P and out rounded to T: 2·eps_T·max|v|.
//  budget = max|v|·(2·eps_T + 2δ + 2γ) + denorm_T (u = 2^-24), uniform over the output;
//  and the RMS error may not exceed half of it.
double attention_budget(const Inputs& in) {
  constexpr double u = 0x1p-24;
  const DType t = in.q.dtype();
  const double eps = dtype_epsilon(t);
  const double denorm = t == DType::f32 ? 0x1p-149 : (t == DType::f16 ? 0x1p-24 : 0x1p-133);
  const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2), Dk = in.q.dim(3);
  const std::int64_t Hkv = in.k.dim(1), Lk = in.k.dim(2);
  const xt::xarray<float> q = in.q.to_f32(), k = in.k.to_f32(), v = in.v.to_f32();
  const float* qd = q.data();
  const float* kd = k.data();
  double S = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t j = 0; j < Lk; ++j) {
          double acc = 0;
          const float* qr = qd + ((b * Hq + h) * Lq + i) * Dk;
          const float* kr = kd + ((b * Hkv + h / (Hq / Hkv)) * Lk + j) * Dk;
          for (std::int64_t d = 0; d < Dk; ++d) acc += std::abs(double{qr[d]} * double{kr[d]});
          if (std::isfinite(acc)) S = std::max(S, std::abs(double{in.params.scale}) * acc);
        }
  double max_v = 0, max_mask = 0;
  for (const float x : v) {
    if (std::isfinite(x)) max_v = std::max(max_v, std::abs(double{x}));
  }
  if (in.mask && in.mask->dtype() != DType::u8) {
    for (std::int64_t i = 0; i < in.mask->numel(); ++i) {
      const float m = in.mask->view().load(i);
      if (std::isfinite(m)) max_mask = std::max(max_mask, std::abs(double{m}));
    }
  }
  const double delta = (eps + static_cast<double>(Dk + 2) * u) * S + u * max_mask;
  const double gamma = static_cast<double>(Lk + 4) * u;
  return max_v * (2 * eps + 2 * delta + 2 * gamma) + denorm;
}

// Finite reference values within the budget (and RMS within half of it); NaN where the
// reference is NaN; ±inf exactly where the reference has it.
::testing::AssertionResult within_budget(const Tensor& got, const Tensor& want, double budget) {
  if (got.shape() != want.shape()) return ::testing::AssertionFailure() << "shape " << shape_str(got.shape());
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

struct Shape4 {
  std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
};

// Whether query (b, h, i) may see key j (the oracle's visibility rule).
bool visible(const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const MaskSpec& m = in.params.mask;
  const std::int64_t Lq = in.q.dim(2), Lk = in.k.dim(2);
  switch (m.kind) {
    case MaskKind::none: return true;
    case MaskKind::causal: return ref::causal_visible(m, b, i, j, Lq, Lk);
    case MaskKind::boolean:
    case MaskKind::additive: {
      const Tensor& a = *in.mask;
      const std::int64_t at = (((a.dim(0) == 1 ? 0 : b) * a.dim(1) + (a.dim(1) == 1 ? 0 : h)) * Lq + i) * Lk + j;
      if (m.kind == MaskKind::boolean) return a.view().load_int(at) != 0;
      const float x = a.view().load(at);
      return !(std::isinf(x) && x < 0);
    }
  }
  return true;
}

// NaN into every K and V row that no query of its kv head may see.
void poison_hidden_keys(Inputs& in) {
  const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2), Hkv = in.k.dim(1), Lk = in.k.dim(2);
  const std::int64_t R = Hq / Hkv, Dk = in.k.dim(3), Dv = in.v.dim(3);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (std::int64_t j = 0; j < Lk; ++j) {
        bool seen = false;
        for (std::int64_t h = kvh * R; h < (kvh + 1) * R && !seen; ++h)
          for (std::int64_t i = 0; i < Lq && !seen; ++i) seen = visible(in, b, h, i, j);
        if (seen) continue;
        const std::int64_t row = (b * Hkv + kvh) * Lk + j;
        for (std::int64_t d = 0; d < Dk; ++d) in.k.view().store(row * Dk + d, kNaN);
        for (std::int64_t d = 0; d < Dv; ++d) in.v.view().store(row * Dv + d, kNaN);
      }
}

Inputs random_inputs(testing::SeededRng& rng, DType dtype, const Shape4& s) {
  Inputs in{testing::random_normal(rng, dtype, {s.B, s.Hq, s.Lq, s.Dk}),
            testing::random_normal(rng, dtype, {s.B, s.Hkv, s.Lk, s.Dk}),
            testing::random_normal(rng, dtype, {s.B, s.Hkv, s.Lk, s.Dv}), {}, {}, {}};
  in.params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.Dk)));
  return in;
}

// A (mb, mh, Lq, Lk) array hiding ~30% of keys, every key hidden from every query for
// the batch rows b ≡ 1 (mod 3) at j ≡ 2 (mod 5) (so they can be poisoned), and one fully
// masked query row (row 0 of the first slice).
Tensor mask_array(testing::SeededRng& rng, MaskKind kind, DType dtype, std::int64_t mb, std::int64_t mh,
                  std::int64_t Lq, std::int64_t Lk) {
  Tensor m(kind == MaskKind::boolean ? DType::u8 : dtype, {mb, mh, Lq, Lk});
  for (std::int64_t at = 0; at < m.numel(); ++at) {
    const std::int64_t j = at % Lk, i = (at / Lk) % Lq, b = at / (mh * Lq * Lk);
    bool keep = rng.uniform(0, 1) < 0.7;
    if (b % 3 == 1 && j % 5 == 2) keep = false;
    if (at / Lk == 0) keep = false;
    (void)i;
    if (kind == MaskKind::boolean) m.view().store_int(at, keep ? 1 : 0);
    else m.view().store(at, keep ? static_cast<float>(rng.uniform(-2, 2)) : -kInf);
  }
  return m;
}

class SimdSdpa : public ::testing::Test {
 protected:
  // The oracle once, then every target within the budget.
  void expect_matches(const Inputs& in, const std::string& what) {
    SCOPED_TRACE(what);
    const Tensor want = run_sdpa(ref_, in);
    const double budget = attention_budget(in);
    testing::for_each_simd_target(
        [&](const std::string&) { EXPECT_TRUE(within_budget(run_sdpa(simd_, in), want, budget)); });
  }

  ReferenceBackend ref_;
  SimdBackend simd_;
};

TEST_F(SimdSdpa, ShapesGqaAndHeadDimsMatchTheOracle) {
  KVLAB_SEEDED_RNG(rng, 5150);
  // (Dk, Dv): the model head dims, and Dv below, above and far below Dk.
  const std::vector<std::pair<std::int64_t, std::int64_t>> head_dims = {
      {64, 64}, {80, 80}, {128, 128}, {256, 256}, {64, 32}, {80, 112}, {128, 24}};
  int cases = 0;
  for (const std::int64_t R : {1, 2, 4, 8})
    for (const auto& [dk, dv] : head_dims)
      for (const std::int64_t lq : {1, 6}) {
        const DType dtype = cases % 3 == 0 ? DType::f32 : cases % 3 == 1 ? DType::f16 : DType::bf16;
        const Shape4 s{cases % 2 ? 2 : 1, 2 * R, 2, lq, lq == 1 ? 150 : 70, dk, dv};
        Inputs in = random_inputs(rng, dtype, s);
        in.params.mask.kind = cases % 4 == 0 ? MaskKind::none : MaskKind::causal;
        expect_matches(in, cat(dtype_name(dtype), " R ", R, " Dk ", dk, " Dv ", dv, " Lq ", lq, " ",
                               cases % 4 == 0 ? "none" : "causal"));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 4 * 7 * 2);
}

TEST_F(SimdSdpa, CausalWindowAndUnequalPaddingNeverReadHiddenKeys) {
  KVLAB_SEEDED_RNG(rng, 4242);
  int cases = 0;
  for (const int window : {0, 1, 5, 40})
    for (const bool pad : {false, true})
      for (const std::int64_t lq : {1, 6, 50}) {
        const DType dtype = cases % 3 == 0 ? DType::f32 : cases % 3 == 1 ? DType::f16 : DType::bf16;
        const Shape4 s{4, 4, 2, lq, 50, 64, 48};
        Inputs in = random_inputs(rng, dtype, s);
        in.params.mask.kind = MaskKind::causal;
        in.params.mask.window = window;
        if (pad) {  // batch rows padded differently; row 3's paddings hide every key
          in.params.mask.left_padding = {0, 3, 17, 30};
          in.params.mask.right_padding = {2, 0, 9, 20};
        }
        poison_hidden_keys(in);
        expect_matches(in, cat(dtype_name(dtype), " window ", window, pad ? " padded" : "", " Lq ", lq));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 4 * 2 * 3);
}

TEST_F(SimdSdpa, BooleanAndAdditiveArraysOfEveryBroadcastShape) {
  KVLAB_SEEDED_RNG(rng, 777);
  int cases = 0;
  for (const MaskKind kind : {MaskKind::boolean, MaskKind::additive})
    for (const auto& [mb, mh] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {3, 1}, {1, 8}, {3, 8}})
      for (const DType mask_dtype : {DType::f32, DType::f16, DType::bf16}) {
        if (kind == MaskKind::boolean && mask_dtype != DType::f32) continue;  // u8 either way
        const DType dtype = cases % 2 ? DType::bf16 : DType::f32;
        const Shape4 s{3, 8, 2, 7, 90, 64, 64};
        Inputs in = random_inputs(rng, dtype, s);
        in.params.mask.kind = kind;
        in.mask = mask_array(rng, kind, mask_dtype, mb, mh, s.Lq, s.Lk);
        poison_hidden_keys(in);
        expect_matches(in, cat(kind == MaskKind::boolean ? "boolean" : "additive ", dtype_name(mask_dtype), " (", mb,
                               ", ", mh, ") on ", dtype_name(dtype)));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 4 + 4 * 3);
}

TEST_F(SimdSdpa, SinksSoftcapAndScale) {
  KVLAB_SEEDED_RNG(rng, 31337);
  int cases = 0;
  for (const bool sinks : {false, true})
    for (const float softcap : {0.0f, 5.0f, 30.0f})
      for (const float scale : {0.0f, 0.125f, 1.5f, -0.3f})
        for (const MaskKind kind : {MaskKind::additive, MaskKind::causal}) {
          const DType dtype = cases % 3 == 0 ? DType::f32 : cases % 3 == 1 ? DType::f16 : DType::bf16;
          const Shape4 s{2, 8, 2, 5, 77, 64, 64};
          Inputs in = random_inputs(rng, dtype, s);
          in.params.scale = scale;
          in.params.softcap = softcap;
          in.params.mask.kind = kind;  // additive: the mask is added after the softcap
          if (kind == MaskKind::additive) in.mask = mask_array(rng, kind, DType::f32, 1, 1, s.Lq, s.Lk);
          if (sinks) in.sinks = testing::random_normal(rng, DType::f32, {s.Hq}, 3.0);
          expect_matches(in, cat(sinks ? "sinks " : "", "softcap ", softcap, " scale ", scale, " ", dtype_name(dtype)));
          if (::testing::Test::HasFailure()) return;
          ++cases;
        }
  EXPECT_EQ(cases, 2 * 3 * 4 * 2);
}

// Lq > Lk (the first rows see no key), a batch row whose paddings hide every key, and
// array masks with a fully masked query row, with and without sinks, under both
// policies. The mean of values averages every key, so those cases are not poisoned.
TEST_F(SimdSdpa, FullyMaskedRowsFollowBothPolicies) {
  KVLAB_SEEDED_RNG(rng, 1001);
  int cases = 0;
  for (const FullyMaskedRow policy : {FullyMaskedRow::zero, FullyMaskedRow::mean_of_values})
    for (const bool sinks : {false, true})
      for (const int variant : {0, 1, 2, 3}) {
        const DType dtype = variant % 2 ? DType::f16 : DType::f32;
        const Shape4 s{2, 4, 2, variant == 0 ? 12 : 4, variant == 0 ? 5 : 30, 32, 40};
        Inputs in = random_inputs(rng, dtype, s);
        in.params.fully_masked = policy;
        in.params.mask.kind = variant == 2 ? MaskKind::boolean : variant == 3 ? MaskKind::additive : MaskKind::causal;
        if (variant == 1) {
          in.params.mask.left_padding = {0, 20};
          in.params.mask.right_padding = {0, 10};  // row 1 sees nothing
        }
        if (variant >= 2) in.mask = mask_array(rng, in.params.mask.kind, DType::f32, 2, 1, s.Lq, s.Lk);
        if (sinks) in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
        if (policy == FullyMaskedRow::zero) poison_hidden_keys(in);
        expect_matches(in, cat(policy == FullyMaskedRow::zero ? "zero" : "mean_of_values", sinks ? " sinks" : "",
                               " variant ", variant));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 2 * 2 * 4);
}

// Long decode: few (b, kv head) tasks, so the kernel also splits the keys and combines
// the splits; masks and sinks must survive the combination.
TEST_F(SimdSdpa, LongDecodeWithKeySplitsMatchesTheOracle) {
  KVLAB_SEEDED_RNG(rng, 8086);
  int cases = 0;
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const int variant : {0, 1, 2}) {
      const Shape4 s{1, 4, 2, variant == 2 ? 3 : 1, 3100, 64, 80};  // 3 key splits
      Inputs in = random_inputs(rng, dtype, s);
      if (variant == 1) {
        in.params.mask.kind = MaskKind::causal;
        in.params.mask.window = 1500;  // a window across split boundaries
        in.params.mask.left_padding = {1700};
        in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
        poison_hidden_keys(in);
      }
      if (variant == 2) {
        in.params.mask.kind = MaskKind::additive;
        in.mask = mask_array(rng, MaskKind::additive, DType::bf16, 1, 4, s.Lq, s.Lk);
        in.params.softcap = 20.0f;
      }
      expect_matches(in, cat(dtype_name(dtype), " variant ", variant));
      ++cases;
    }
  EXPECT_EQ(cases, 6);
}

// inf/NaN inputs give what the oracle gives: inf in a visible V element reaches the
// output (f16/bf16 inf must survive the conversion to f32), inf in K makes the row's
// scores ±inf (NaN rows for +inf, zero weight for −inf), softcap turns them finite, NaN
// in Q or in one visible key poisons the row (even with a sink, so a NaN score may not be
// dropped by a vector max), and inf in hidden keys never leaks.
TEST_F(SimdSdpa, InfAndNanInputsBehaveAsTheOracle) {
  KVLAB_SEEDED_RNG(rng, 6502);
  int cases = 0;
  for (const DType dtype : {DType::f16, DType::bf16, DType::f32})
    for (const int variant : {0, 1, 2, 3, 4, 5}) {
      const Shape4 s{1, 4, 2, 3, 40, 32, 32};
      Inputs in = random_inputs(rng, dtype, s);
      in.params.mask.kind = MaskKind::causal;
      if (variant == 0) {  // +inf and −inf in visible V rows, different columns
        in.v.view().store(5 * 32 + 3, kInf);
        in.v.view().store(40 * 32 + 9 * 32 + 4, -kInf);
      } else if (variant == 1 || variant == 2) {  // ±inf in element 0 of key 7 of kv head 0
        in.k.view().store(7 * 32, variant == 1 ? kInf : -kInf);
        in.q.view().store(0, 1.0f);  // query (head 0, row 0) scores it +inf / −inf
        in.params.softcap = variant == 2 ? 10.0f : 0.0f;
      } else if (variant == 3) {  // NaN in one query row
        in.q.view().store(2 * 32 + 5, kNaN);
      } else if (variant == 5) {  // NaN in one element of one visible key: NaN rows, sink or not
        in.k.view().store(7 * 32 + 4, kNaN);
        in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
      } else {  // inf in keys that no query sees (left padding)
        in.params.mask.left_padding = {6};
        for (std::int64_t j = 0; j < 6; ++j) {
          for (std::int64_t d = 0; d < 32; ++d) {
            in.k.view().store(j * 32 + d, kInf);
            in.v.view().store(j * 32 + d, -kInf);
          }
        }
      }
      const Tensor want = run_sdpa(ref_, in);
      bool non_finite = false;
      for (std::int64_t i = 0; i < want.numel(); ++i) non_finite = non_finite || !std::isfinite(want.view().load(i));
      EXPECT_EQ(non_finite, variant != 4 && variant != 2) << "variant " << variant << " should (not) reach the output";
      expect_matches(in, cat(dtype_name(dtype), " inf/NaN variant ", variant));
      ++cases;
    }
  EXPECT_EQ(cases, 18);
}

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
  for (const auto& [what, c] : bad) testing::expect_same_error([&] { c(ref_); }, [&] { c(simd_); }, what);

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

}  // namespace
}  // namespace kvlab
