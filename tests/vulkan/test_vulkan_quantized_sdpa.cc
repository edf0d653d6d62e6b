// Vulkan quantized_sdpa vs the oracle (reference/quantized_sdpa.h) within the harness's
// tolerance object (attention_budget and the quantized_sdpa additions of
// harness/ops/sdpa_info.cc, restated below because unit tests do not link the harness),
// on every path (16/8-bit storage, forced u32 words, forced staging) with every tensor
// at an odd element offset inside a guarded buffer. Covers affine bits 2..8 × groups
// 32/64/128, GQA, Dv != Dk with different K and V specs and scale dtypes, q dtypes,
// decode and several query rows, long decode split over many KV chunks, causal masks
// with window and unequal paddings whose hidden keys carry NaN-poisoned scales, boolean
// and additive arrays, sinks, softcap, fully masked rows under both policies; fp-mode
// K/V throw unsupported naming the spec; invalid input raises the oracle's errors. Both
// builds of the attention pass run every case: the subgroup build (default where the
// device supports it, as lavapipe does; its K codes are staged in slices of <= 16 words
// per key, so Dk 128 at 5, 6 and 8 bits spans several slices, with groups of 64/128
// carried across a slice boundary) and the forced shared-memory fallback.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/vulkan/vulkan_backend.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/mask.h"
#include "reference/quantized_sdpa.h"
#include "reference/reference_backend.h"
#include "tests/unit/quantized_attention_inputs.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using ref::QuantizedTensor;

using testing::affine;
using testing::dv_of;
using testing::poison_hidden_keys;
using testing::random_inputs;
using testing::view_of;
using Inputs = testing::QuantizedAttentionInputs;
using Dims = testing::AttentionDims;

// Every operand one element into a guarded buffer (odd offsets); out poisoned first.
Tensor run_on(Backend& be, const Inputs& in) {
  auto place = [&](const Tensor& t) {
    if (t.rank() == 0 || t.numel() == 0) return DTensor{};
    return testing::place(be, t.dtype(), t.shape(), 1, t.data());
  };
  auto side = [&](const QuantizedTensor& x) { return QuantizedDTensor{place(x.wq), place(x.scales), place(x.biases), x.spec}; };
  const DTensor q = place(in.q);
  std::optional<DTensor> mask, sinks;
  if (in.mask) mask = place(*in.mask);
  if (in.sinks) sinks = place(*in.sinks);
  const DTensor out = testing::place(be, in.q.dtype(), {in.q.dim(0), in.q.dim(1), in.q.dim(2), dv_of(in)}, 1, nullptr, 0xFF);
  be.quantized_sdpa({q, side(in.k), side(in.v), in.params, mask ? &*mask : nullptr, sinks ? &*sinks : nullptr, out});
  EXPECT_TRUE(testing::guards_intact(be, out));
  return be.download(out);
}

// The tolerance of harness/ops/sdpa_info.cc (u = 2^-24, T = q's dtype), over the
// dequantized K and V:
//  attention_budget: logits |Δs| ≤ δ = (eps_T + (Dk+2)·u)·S + u·max|mask| with
//   S = max |scale|·Σ|q_d·k_d| over (row, key); weights move by e^{±2δ}: 2δ·max|v|;
//   exp, normalizer and the Lk-term sum: 2γ·max|v|, γ = (Lk+4)·u; out rounded to T:
//   2·eps_T·max|v|; budget = max|v|·(2·eps_T + 2δ + 2γ) + denorm_T;
//  factored affine logits (q·k = s·Σq·c + b·Σq per group) add max|v|·4·(Dk+2)·u·S_b,
//   S_b = max |scale|·Σ_g |b_g|·Σ_{d∈g}|q_d|, and factored V biases 2γ·max|b_V|.
//  The RMS error may not exceed half the budget.
double attention_budget(const Inputs& in) {
  constexpr double u = 0x1p-24;
  const DType t = in.q.dtype();
  const double eps = dtype_epsilon(t);
  const double denorm = t == DType::f32 ? 0x1p-149 : (t == DType::f16 ? 0x1p-24 : 0x1p-133);
  const Tensor k = ref::dequantize_to_f32(view_of(in.k)), v = ref::dequantize_to_f32(view_of(in.v));
  const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2), Dk = in.q.dim(3);
  const std::int64_t Hkv = k.dim(1), Lk = k.dim(2), gs = in.k.spec.group_size;
  const xt::xarray<float> q = in.q.to_f32(), kf = k.to_f32(), vf = v.to_f32(), kb = in.k.biases.to_f32();
  const double scale = std::abs(double{in.params.scale});
  double S = 0, S_b = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t j = 0; j < Lk; ++j) {
          double acc = 0, acc_b = 0;
          for (std::int64_t d = 0; d < Dk; ++d) {
            acc += std::abs(double{q(b, h, i, d)} * double{kf(b, h / (Hq / Hkv), j, d)});
            acc_b += std::abs(double{kb(b, h / (Hq / Hkv), j, d / gs)} * double{q(b, h, i, d)});
          }
          if (std::isfinite(acc)) S = std::max(S, scale * acc);
          if (std::isfinite(acc_b)) S_b = std::max(S_b, scale * acc_b);
        }
  double max_v = 0, max_mask = 0, max_vbias = 0;
  for (const float x : vf) {
    if (std::isfinite(x)) max_v = std::max(max_v, std::abs(double{x}));
  }
  for (const float x : in.v.biases.to_f32()) {
    if (std::isfinite(x)) max_vbias = std::max(max_vbias, std::abs(double{x}));
  }
  if (in.mask && in.mask->dtype() != DType::u8) {
    for (const float x : in.mask->to_f32()) {
      if (std::isfinite(x)) max_mask = std::max(max_mask, std::abs(double{x}));
    }
  }
  const double delta = (eps + static_cast<double>(Dk + 2) * u) * S + u * max_mask;
  const double gamma = static_cast<double>(Lk + 4) * u;
  return max_v * (2 * eps + 2 * delta + 2 * gamma + 4 * static_cast<double>(Dk + 2) * u * S_b) +
         2 * gamma * max_vbias + denorm;
}

// Within the budget where the reference is finite (RMS within half of it); NaN exactly
// where the reference is NaN.
::testing::AssertionResult within_budget(const Tensor& got, const Tensor& want, double budget) {
  if (got.shape() != want.shape()) return ::testing::AssertionFailure() << "shape " << shape_str(got.shape());
  const ConstTensorView g = got.view(), w = want.view();
  double sum_sq = 0;
  std::int64_t finite = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double a = g.load(i), b = w.load(i);
    const bool ok = std::isnan(b) ? std::isnan(a) : std::abs(a - b) <= budget;
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


// One backend per path (plus the forced shared reductions), made once for the whole
// program (device creation and pipeline compilation dominate small problems on
// lavapipe). Empty, with `reason`, without a device.
const std::vector<std::unique_ptr<VulkanBackend>>& vulkan_paths(std::string& reason) {
  static std::string no_device;
  static const std::vector<std::unique_ptr<VulkanBackend>> backends = [] {
    std::vector<std::unique_ptr<VulkanBackend>> out;
    std::vector<VulkanOptions> options;  // the storage/memory paths, then the forced shared reductions
    for (const testing::VulkanPath& p : testing::vulkan_paths()) {
      options.push_back({});
      options.back().force_word_storage = p.words;
      options.back().force_staging = p.staging;
    }
    options.push_back({});
    options.back().force_shared_reductions = true;
    for (const VulkanOptions& o : options) {
      std::unique_ptr<VulkanBackend> be = testing::try_vulkan(o, no_device);
      if (!be) return std::vector<std::unique_ptr<VulkanBackend>>{};
      if (o.force_word_storage) {
        EXPECT_FALSE(be->uses_small_storage());
      }
      if (o.force_staging) {
        EXPECT_TRUE(be->uses_staging());
      }
      if (o.force_shared_reductions) {
        EXPECT_FALSE(be->uses_subgroup_reductions());
      }
      out.push_back(std::move(be));
    }
    return out;
  }();
  reason = no_device;
  return backends;
}

// The oracle once, then every Vulkan path within the budget.
void expect_matches(const Inputs& in, const std::string& what) {
  SCOPED_TRACE(what);
  std::string reason;
  const auto& paths = vulkan_paths(reason);
  if (paths.empty()) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  ReferenceBackend ref;
  const Tensor want = run_on(ref, in);
  const double budget = attention_budget(in);
  for (const auto& be : paths) {
    SCOPED_TRACE(be->name());
    EXPECT_TRUE(within_budget(run_on(*be, in), want, budget));
  }
}

DType dtype_of_case(int n) { return n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16; }

TEST(VulkanQuantizedSdpa, AffineBitsGroupsGqaAndDtypes) {
  KVLAB_SEEDED_RNG(rng, 2718);
  int cases = 0;
  for (const int bits : {2, 3, 4, 5, 6, 8})
    for (const int group : {32, 64, 128}) {
      const std::int64_t R = cases % 3 == 0 ? 1 : cases % 3 == 1 ? 4 : 8;
      const Dims s{1, R, 1, cases % 2 ? 1 : 3, 40, 128, 64};
      const DType dt = dtype_of_case(cases);
      Inputs in = random_inputs(rng, s, dt, affine(bits, group), affine(bits, group == 128 ? 64 : group), dt, dt);
      in.params.mask.kind = cases % 2 ? MaskKind::none : MaskKind::causal;
      expect_matches(in, cat(bits, "-bit group ", group, " R ", R, " ", dtype_name(dt)));
      if (::testing::Test::HasFailure()) return;
      ++cases;
    }
  EXPECT_EQ(cases, 6 * 3);
}

TEST(VulkanQuantizedSdpa, DifferentKAndVSpecsScaleDtypesAndHeadDims) {
  KVLAB_SEEDED_RNG(rng, 1618);
  const Dims s{2, 4, 2, 2, 40, 64, 96};
  Inputs in = random_inputs(rng, s, DType::bf16, affine(6, 32), affine(4, 32), DType::f32, DType::f16);
  expect_matches(in, "K 6-bit f32 scales, V 4-bit f16 scales, bf16 q, Dv 96");
  Inputs in2 = random_inputs(rng, s, DType::f32, affine(8, 64), affine(2, 32), DType::bf16, DType::f32);
  expect_matches(in2, "K 8-bit bf16 scales, V 2-bit f32 scales, f32 q");
}

// Long decode: one row per kv head, so the keys are split over many chunks that the
// combine pass merges, with a window across chunk edges, padding and sinks.
TEST(VulkanQuantizedSdpa, LongDecodeSplitOverChunks) {
  KVLAB_SEEDED_RNG(rng, 9001);
  for (const int variant : {0, 1}) {
    const Dims s{1, 8, 2, 1, 3000, 128, 128};
    Inputs in = random_inputs(rng, s, DType::f16, affine(4, 64), affine(8, 64), DType::f16, DType::f16);
    if (variant == 1) {
      in.params.mask.kind = MaskKind::causal;
      in.params.mask.window = 1200;
      in.params.mask.left_padding = {1500};
      in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
      EXPECT_GT(poison_hidden_keys(in), 0);
    }
    expect_matches(in, cat("variant ", variant));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(VulkanQuantizedSdpa, CausalWindowAndUnequalPaddingNeverReadPoisonedKeys) {
  KVLAB_SEEDED_RNG(rng, 4243);
  int cases = 0;
  for (const int window : {0, 1, 9})
    for (const std::int64_t lq : {1, 4}) {
      const Dims s{3, 8, 1, lq, 70, 64, 64};
      const DType dt = dtype_of_case(cases);
      Inputs in = random_inputs(rng, s, dt, affine(4, 64), affine(8, 32), dt, dt);
      in.params.mask = {MaskKind::causal, window, {0, 7, 70}, {3, 0, 0}};  // row 2 sees nothing
      in.params.softcap = cases % 2 ? 20.0f : 0.0f;
      if (cases % 2) in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
      EXPECT_GT(poison_hidden_keys(in), 0);
      expect_matches(in, cat("window ", window, " Lq ", lq, " ", dtype_name(dt)));
      if (::testing::Test::HasFailure()) return;
      ++cases;
    }
  EXPECT_EQ(cases, 3 * 2);
}

TEST(VulkanQuantizedSdpa, BooleanAndAdditiveMaskArraysAndFullyMaskedRows) {
  KVLAB_SEEDED_RNG(rng, 606);
  int cases = 0;
  for (const MaskKind kind : {MaskKind::boolean, MaskKind::additive})
    for (const FullyMaskedRow policy : {FullyMaskedRow::zero, FullyMaskedRow::mean_of_values}) {
      const Dims s{2, 4, 4, 2, 33, 128, 64};
      Inputs in = random_inputs(rng, s, DType::bf16, affine(8, 128), affine(6, 64), DType::bf16, DType::bf16);
      in.params.mask.kind = kind;
      in.params.fully_masked = policy;
      Tensor m(kind == MaskKind::boolean ? DType::u8 : DType::f16, {2, 4, s.Lq, s.Lk});
      for (std::int64_t at = 0; at < m.numel(); ++at) {
        const bool keep = at / s.Lk != 3 && rng.uniform(0, 1) < 0.75;  // query row 3 fully masked
        if (kind == MaskKind::boolean) m.view().store_int(at, keep ? 1 : 0);
        else m.view().store(at, keep ? static_cast<float>(rng.uniform(-0.5, 0.5)) : -kInf);
      }
      in.mask = std::move(m);
      if (policy == FullyMaskedRow::zero) poison_hidden_keys(in);  // the mean reads every key
      expect_matches(in, cat(kind == MaskKind::boolean ? "boolean" : "additive",
                             policy == FullyMaskedRow::zero ? " zero" : " mean_of_values"));
      if (::testing::Test::HasFailure()) return;
      ++cases;
    }
  EXPECT_EQ(cases, 4);
}

TEST(VulkanQuantizedSdpa, FpModesThrowUnsupportedNamingTheSpec) {
  std::string reason;
  const auto& paths = vulkan_paths(reason);
  if (paths.empty()) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  KVLAB_SEEDED_RNG(rng, 77);
  Inputs in = random_inputs(rng, {1, 2, 2, 1, 8, 64, 64}, DType::f16, affine(4, 64), affine(4, 64), DType::f16,
                            DType::f16);
  in.v = ref::fp_quantize(testing::random_normal(rng, DType::f16, {1, 2, 8, 64}), QuantSpec::make(QuantMode::mxfp4),
                          Rounding::mlx_cpu);
  EXPECT_KVLAB_ERROR(run_on(*paths[0], in), unsupported, "mxfp4");
}

TEST(VulkanQuantizedSdpa, InvalidInputRaisesTheOraclesErrors) {
  std::string reason;
  const auto& paths = vulkan_paths(reason);
  if (paths.empty()) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  KVLAB_SEEDED_RNG(rng, 99);
  const Inputs good = random_inputs(rng, {2, 4, 2, 1, 9, 64, 64}, DType::f16, affine(4, 32), affine(8, 64),
                                    DType::f16, DType::f16);
  const std::vector<std::pair<const char*, std::function<void(Inputs&)>>> edits = {
      {"K group does not divide D", [](Inputs& in) { in.k.spec = affine(4, 128); }},
      {"V codes of the wrong width", [](Inputs& in) { in.v.wq = Tensor(DType::u32, {2, 2, 9, 8}); }},
      {"K codes not u32", [](Inputs& in) { in.k.wq = Tensor(DType::i32, {2, 2, 9, 8}); }},
      {"K scales of the wrong shape", [](Inputs& in) { in.k.scales = Tensor(DType::f16, {2, 2, 9, 3}); }},
      {"V biases missing", [](Inputs& in) { in.v.biases = Tensor(); }},
      {"V biases of another dtype", [](Inputs& in) { in.v.biases = Tensor(DType::bf16, {2, 2, 9, 1}); }},
      {"K scales not float", [](Inputs& in) { in.k.scales = Tensor(DType::u8, {2, 2, 9, 2}); }},
      {"invalid spec", [](Inputs& in) { in.k.spec = QuantSpec{QuantMode::affine, 9, 64}; }},
      {"Hq % Hkv", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 3, 1, 64}); }},
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
  ReferenceBackend ref;
  for (auto& [what, edit] : edits) {
    Inputs in = good;
    edit(in);
    testing::expect_same_error([&] { run_on(ref, in); }, [&] { run_on(*paths[0], in); }, what);
  }
}

}  // namespace
}  // namespace kvlab
