// Vulkan sdpa vs the oracle within the harness's attention tolerance (attention_budget
// of harness/ops/sdpa_info.cc, restated below because unit tests do not link the
// harness), on every path (16/8-bit storage, forced u32 words, forced staging), with
// every tensor at an odd element offset inside a guarded buffer. Covers decode and
// prefill, GQA, Dv != Dk, f32/f16/bf16, every mask kind (causal with window and unequal
// paddings, boolean and additive arrays of every broadcast shape and additive dtype),
// sinks, softcap, scale, fully masked rows under both policies, long decode split over
// many KV chunks, and that hidden keys are never read: every key slot that no query of
// its kv head may see holds NaN, so reading it fails loudly. Invalid input raises the
// oracle's errors. Both builds of the attention pass run every case: the subgroup build
// (the default where the device supports it; lavapipe does) and the forced shared-memory
// fallback; the subgroup build is shown to be the one in use, and deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "reference/mask.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Inputs {
  Tensor q, k, v;
  AttentionParams params;
  std::optional<Tensor> mask, sinks;
};

// Every operand one element into a guarded buffer (odd offsets), out poisoned first.
Tensor run_sdpa(Backend& be, const Inputs& in) {
  auto place = [&](const Tensor& t) { return testing::place(be, t.dtype(), t.shape(), 1, t.data()); };
  const DTensor q = place(in.q), k = place(in.k), v = place(in.v);
  std::optional<DTensor> mask, sinks;
  if (in.mask) mask = place(*in.mask);
  if (in.sinks) sinks = place(*in.sinks);
  const DTensor out =
      testing::place(be, in.q.dtype(), {in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)}, 1, nullptr, 0xFF);
  be.sdpa({q, k, v, in.params, mask ? &*mask : nullptr, sinks ? &*sinks : nullptr, out});
  EXPECT_TRUE(testing::guards_intact(be, out));
  return be.download(out);
}

// The tolerance of sdpa: attention_budget of harness/ops/sdpa_info.cc, same derivation
// (f32 accumulation):
//  logits |Δs| ≤ δ = (eps_T + (Dk+2)·u)·S + u·max|mask|, S = max |scale|·Σ|q_d·k_d|;
//  softmax weights move by e^{±2δ}: |Δo| ≤ 2δ·max|v|; exp, normalizer and the Lk-term
//  sum add γ = (Lk+4)·u relative each (2γ·max|v|); out rounded to T: 2·eps_T·max|v|.
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
  double S = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t j = 0; j < Lk; ++j) {
          double acc = 0;
          const float* qr = q.data() + ((b * Hq + h) * Lq + i) * Dk;
          const float* kr = k.data() + ((b * Hkv + h / (Hq / Hkv)) * Lk + j) * Dk;
          for (std::int64_t d = 0; d < Dk; ++d) acc += std::abs(double{qr[d]} * double{kr[d]});
          if (std::isfinite(acc)) S = std::max(S, std::abs(double{in.params.scale}) * acc);
        }
  double max_v = 0, max_mask = 0;
  for (const float x : v) {
    if (std::isfinite(x)) max_v = std::max(max_v, std::abs(double{x}));
  }
  if (in.mask && in.mask->dtype() != DType::u8) {
    for (const float x : in.mask->to_f32()) {
      if (std::isfinite(x)) max_mask = std::max(max_mask, std::abs(double{x}));
    }
  }
  const double delta = (eps + static_cast<double>(Dk + 2) * u) * S + u * max_mask;
  const double gamma = static_cast<double>(Lk + 4) * u;
  return max_v * (2 * eps + 2 * delta + 2 * gamma) + denorm;
}

// Finite reference values within the budget (and RMS within half of it); NaN where the
// reference is NaN.
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

// A (mb, mh, Lq, Lk) array hiding ~30% of keys, plus key j ≡ 2 (mod 5) of batch rows
// b ≡ 1 (mod 3) for every query (so those slots can be poisoned) and the whole first
// query row of the first slice (a fully masked row).
Tensor mask_array(testing::SeededRng& rng, MaskKind kind, DType dtype, std::int64_t mb, std::int64_t mh,
                  std::int64_t Lq, std::int64_t Lk) {
  Tensor m(kind == MaskKind::boolean ? DType::u8 : dtype, {mb, mh, Lq, Lk});
  for (std::int64_t at = 0; at < m.numel(); ++at) {
    const std::int64_t j = at % Lk, b = at / (mh * Lq * Lk);
    bool keep = rng.uniform(0, 1) < 0.7;
    if (b % 3 == 1 && j % 5 == 2) keep = false;
    if (at / Lk == 0) keep = false;
    if (kind == MaskKind::boolean) m.view().store_int(at, keep ? 1 : 0);
    else m.view().store(at, keep ? static_cast<float>(rng.uniform(-2, 2)) : -kInf);
  }
  return m;
}

// One backend per path (default, forced words, forced staging, and the default storage
// with the shared-memory reductions forced), made once for the whole program: creating
// a device and compiling the pipelines costs far more on lavapipe than a small attention
// problem. Empty, with `reason`, when no device is usable.
const std::vector<std::unique_ptr<VulkanBackend>>& vulkan_paths(std::string& reason) {
  static std::string no_device;
  static const std::vector<std::unique_ptr<VulkanBackend>> backends = [] {
    std::vector<std::unique_ptr<VulkanBackend>> out;
    std::vector<VulkanOptions> options;
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
  const Tensor want = run_sdpa(ref, in);
  const double budget = attention_budget(in);
  for (const auto& be : paths) {
    SCOPED_TRACE(be->name());
    EXPECT_TRUE(within_budget(run_sdpa(*be, in), want, budget));
  }
}

DType dtype_of_case(int n) { return n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16; }

TEST(VulkanSdpa, ShapesGqaHeadDimsAndDtypesMatchTheOracle) {
  KVLAB_SEEDED_RNG(rng, 5150);
  const std::vector<std::pair<std::int64_t, std::int64_t>> head_dims = {{64, 64}, {128, 128}, {64, 32}, {80, 112}};
  int cases = 0;
  for (const std::int64_t R : {1, 4, 7})
    for (const auto& [dk, dv] : head_dims)
      for (const std::int64_t lq : {1, 5}) {
        const Shape4 s{cases % 2 ? 2 : 1, R, 1, lq, lq == 1 ? 100 : 40, dk, dv};
        Inputs in = random_inputs(rng, dtype_of_case(cases), s);
        in.params.mask.kind = cases % 4 == 0 ? MaskKind::none : MaskKind::causal;
        expect_matches(in, cat(dtype_name(in.q.dtype()), " R ", R, " Dk ", dk, " Dv ", dv, " Lq ", lq));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 3 * 4 * 2);
}

TEST(VulkanSdpa, CausalWindowAndUnequalPaddingNeverReadHiddenKeys) {
  KVLAB_SEEDED_RNG(rng, 4242);
  int cases = 0;
  for (const int window : {0, 1, 40})
    for (const bool pad : {false, true})
      for (const std::int64_t lq : {1, 20}) {
        const Shape4 s{4, 4, 2, lq, 50, 32, 48};
        Inputs in = random_inputs(rng, dtype_of_case(cases), s);
        in.params.mask.kind = MaskKind::causal;
        in.params.mask.window = window;
        if (pad) {  // batch rows padded differently; row 3's paddings hide every key
          in.params.mask.left_padding = {0, 3, 17, 30};
          in.params.mask.right_padding = {2, 0, 9, 20};
        }
        poison_hidden_keys(in);
        expect_matches(in, cat(dtype_name(in.q.dtype()), " window ", window, pad ? " padded" : "", " Lq ", lq));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 3 * 2 * 2);
}

TEST(VulkanSdpa, BooleanAndAdditiveArraysOfEveryBroadcastShape) {
  KVLAB_SEEDED_RNG(rng, 777);
  int cases = 0;
  for (const MaskKind kind : {MaskKind::boolean, MaskKind::additive})
    for (const auto& [mb, mh] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {3, 1}, {1, 8}, {3, 8}})
      for (const DType mask_dtype : {DType::f32, DType::f16, DType::bf16}) {
        if (kind == MaskKind::boolean && mask_dtype != DType::f32) continue;  // u8 either way
        const Shape4 s{3, 8, 2, 3, 90, 32, 32};
        Inputs in = random_inputs(rng, cases % 2 ? DType::bf16 : DType::f32, s);
        in.params.mask.kind = kind;
        in.mask = mask_array(rng, kind, mask_dtype, mb, mh, s.Lq, s.Lk);
        poison_hidden_keys(in);
        expect_matches(in, cat(kind == MaskKind::boolean ? "boolean" : "additive ", dtype_name(mask_dtype), " (", mb,
                               ", ", mh, ")"));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 4 + 4 * 3);
}

TEST(VulkanSdpa, SinksSoftcapAndScale) {
  KVLAB_SEEDED_RNG(rng, 31337);
  int cases = 0;
  for (const bool sinks : {false, true})
    for (const float softcap : {0.0f, 5.0f, 30.0f})
      for (const float scale : {0.125f, 1.5f, -0.3f}) {
        const Shape4 s{2, 4, 2, 3, 77, 64, 64};
        Inputs in = random_inputs(rng, dtype_of_case(cases), s);
        in.params.scale = scale;
        in.params.softcap = softcap;
        in.params.mask.kind = cases % 2 ? MaskKind::causal : MaskKind::additive;  // added after the softcap
        if (in.params.mask.kind == MaskKind::additive) in.mask = mask_array(rng, MaskKind::additive, DType::f32, 1, 1, s.Lq, s.Lk);
        if (sinks) in.sinks = testing::random_normal(rng, cases % 2 ? DType::f32 : DType::bf16, {s.Hq}, 3.0);
        expect_matches(in, cat(sinks ? "sinks " : "", "softcap ", softcap, " scale ", scale));
        if (::testing::Test::HasFailure()) return;
        ++cases;
      }
  EXPECT_EQ(cases, 2 * 3 * 3);
}

// Lq > Lk (the first rows see no key), a batch row whose paddings hide every key, and
// array masks with a fully masked query row, with and without sinks, under both
// policies. The mean of values averages every key, so those cases are not poisoned.
TEST(VulkanSdpa, FullyMaskedRowsFollowBothPolicies) {
  KVLAB_SEEDED_RNG(rng, 1001);
  int cases = 0;
  for (const FullyMaskedRow policy : {FullyMaskedRow::zero, FullyMaskedRow::mean_of_values})
    for (const bool sinks : {false, true})
      for (const int variant : {0, 1, 2, 3}) {
        const Shape4 s{2, 4, 2, variant == 0 ? 12 : 4, variant == 0 ? 5 : 130, 32, 40};
        Inputs in = random_inputs(rng, variant % 2 ? DType::f16 : DType::f32, s);
        in.params.fully_masked = policy;
        in.params.mask.kind = variant == 2 ? MaskKind::boolean : variant == 3 ? MaskKind::additive : MaskKind::causal;
        if (variant == 1) {
          in.params.mask.left_padding = {0, 70};
          in.params.mask.right_padding = {0, 60};  // row 1 sees nothing
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

// Long decode: one row per kv head, so the KV length is split over many chunks that the
// combine pass merges; masks, windows across chunk edges and sinks must survive it.
TEST(VulkanSdpa, LongDecodeSplitOverChunksMatchesTheOracle) {
  KVLAB_SEEDED_RNG(rng, 8086);
  int cases = 0;
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const int variant : {0, 1}) {
      const Shape4 s{1, 4, 2, 1, 3000, 64, 80};
      Inputs in = random_inputs(rng, dtype, s);
      if (variant == 1) {
        in.params.mask.kind = MaskKind::causal;
        in.params.mask.window = 1000;  // a window across chunk boundaries
        in.params.mask.left_padding = {1700};
        in.sinks = testing::random_normal(rng, DType::f32, {s.Hq});
        poison_hidden_keys(in);
      }
      expect_matches(in, cat(dtype_name(dtype), " variant ", variant));
      if (::testing::Test::HasFailure()) return;
      ++cases;
    }
  EXPECT_EQ(cases, 4);
}

// What uses_subgroup_reductions() must say, from the device's own properties: compute
// stage subgroup arithmetic, and a subgroup size of 4..64 dividing the local size of 64
// (the shader keeps one value per subgroup in arrays of 16).
bool subgroup_build_expected(VulkanBackend& be) {
  VkPhysicalDeviceSubgroupProperties sg{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
  vkGetPhysicalDeviceProperties2(be.context().device().physical(), &props);
  const bool arithmetic = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                          (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0;
  return arithmetic && sg.subgroupSize >= 4 && sg.subgroupSize <= 64 && 64 % sg.subgroupSize == 0;
}

TEST(VulkanSdpa, SubgroupBuildIsUsedWhereSupportedAndIsDeterministic) {
  KVLAB_VULKAN_OR_SKIP(vulkan, VulkanOptions{});
  VulkanOptions forced;
  forced.force_shared_reductions = true;
  KVLAB_VULKAN_OR_SKIP(shared, forced);
  const bool expected = subgroup_build_expected(*vulkan);
  EXPECT_EQ(vulkan->uses_subgroup_reductions(), expected) << vulkan->name();
  EXPECT_FALSE(shared->uses_subgroup_reductions());
  EXPECT_NE(shared->name().find("[nosubgroup]"), std::string::npos) << shared->name();
  // The harness flag reaches the option.
  const std::unique_ptr<Backend> flagged = make_vulkan_backend(",nosubgroup");
  EXPECT_FALSE(dynamic_cast<VulkanBackend&>(*flagged).uses_subgroup_reductions());
  // lavapipe has subgroup arithmetic in compute (size 4/8/16 by vector width): the CI
  // tier runs the subgroup build by default, the fallback only when forced.
  if (vulkan->device().name.find("llvmpipe") != std::string::npos) {
    EXPECT_TRUE(expected) << "lavapipe is expected to support subgroup arithmetic in compute";
  }
  if (!expected) GTEST_SKIP() << "the device has no usable subgroup arithmetic: only the fallback runs";

  // The two builds really are different code: they sum each tile's softmax weights in a
  // different order (key by key vs subgroup partial sums), so over 4096 f32 keys and 8
  // heads at least one output bit differs; each build repeats itself bit for bit.
  KVLAB_SEEDED_RNG(rng, 6502);
  const Inputs in = random_inputs(rng, DType::f32, Shape4{1, 8, 2, 1, 4096, 64, 64});
  const Tensor a = run_sdpa(*vulkan, in), b = run_sdpa(*vulkan, in), c = run_sdpa(*shared, in);
  EXPECT_TRUE(testing::bit_equal(a, b)) << "the subgroup build is not deterministic";
  EXPECT_FALSE(testing::bit_equal(a, c)) << "the default and forced-fallback outputs are identical";
  ReferenceBackend ref;
  const Tensor want = run_sdpa(ref, in);
  EXPECT_TRUE(within_budget(a, want, attention_budget(in)));
  EXPECT_TRUE(within_budget(c, want, attention_budget(in)));
}

TEST(VulkanSdpa, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_VULKAN_OR_SKIP(vulkan, VulkanOptions{});
  ReferenceBackend ref;
  using Call = std::function<void(Backend&)>;
  auto make = [](Backend& be, Shape s, DType t = DType::f32) { return be.allocate(t, std::move(s)); };
  auto call = [&](Backend& be, Shape q, Shape k, Shape v, Shape out, AttentionParams p = {},
                  std::optional<std::pair<DType, Shape>> mask = {}, std::optional<std::pair<DType, Shape>> sinks = {},
                  DType dtype = DType::f32, DType kv_dtype = DType::f32) {
    const DTensor dm = mask ? make(be, mask->second, mask->first) : DTensor{};
    const DTensor ds = sinks ? make(be, sinks->second, sinks->first) : DTensor{};
    be.sdpa({make(be, q, dtype), make(be, k, kv_dtype), make(be, v, kv_dtype), p, mask ? &dm : nullptr,
            sinks ? &ds : nullptr, make(be, out, dtype)});
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
      {"window < 0",
       [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.mask = {MaskKind::causal, -1, {}, {}}; })); }},
      {"window on none", [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.mask.window = 4; })); }},
      {"padding length",
       [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.mask = {MaskKind::causal, 0, {0, 1}, {}}; })); }},
      {"negative padding",
       [&](Backend& be) { call(be, q, k, v, out, with([](AttentionParams& p) { p.mask = {MaskKind::causal, 0, {}, {-2}}; })); }},
      {"array on causal", [&](Backend& be) { call(be, q, k, v, out, causal, {{DType::u8, {1, 1, 2, 6}}}); }},
      {"boolean without array", [&](Backend& be) { call(be, q, k, v, out, boolean); }},
      {"boolean f32", [&](Backend& be) { call(be, q, k, v, out, boolean, {{DType::f32, {1, 1, 2, 6}}}); }},
      {"additive u8", [&](Backend& be) { call(be, q, k, v, out, additive, {{DType::u8, {1, 1, 2, 6}}}); }},
      {"mask heads", [&](Backend& be) { call(be, q, k, v, out, boolean, {{DType::u8, {1, 2, 2, 6}}}); }},
      {"mask Lk", [&](Backend& be) { call(be, q, k, v, out, additive, {{DType::f32, {1, 1, 2, 5}}}); }},
      {"sinks shape", [&](Backend& be) { call(be, q, k, v, out, {}, {}, {{DType::f32, {2}}}); }},
      {"sinks dtype", [&](Backend& be) { call(be, q, k, v, out, {}, {}, {{DType::i32, {4}}}); }},
  };
  for (const auto& [what, f] : bad) {
    testing::expect_same_error([&] { f(ref); }, [&] { f(*vulkan); }, what);
  }
}

}  // namespace
}  // namespace kvlab
