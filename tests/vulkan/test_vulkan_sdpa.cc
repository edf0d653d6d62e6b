// Vulkan sdpa: what the harness cannot state as a case line. Its comparisons with the
// oracle (decode and prefill, GQA, Dv != Dk, dtypes, every mask kind and broadcast shape,
// sinks, softcap, scale, fully masked rows, long decode over many KV chunks, inf/NaN
// inputs, poisoned hidden keys) are lines of harness/cases/sdpa/ (the lavapipe file), run
// under the one tolerance object of harness/ops/sdpa_info.cc by the
// harness.check_lavapipe_vulkan* tests on the default, shared-memory (nosubgroup) and
// words+staging builds. Here: the subgroup build is the one in use where the device
// supports it, is deterministic and really differs from the fallback; invalid input
// raises the oracle's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

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
    testing::expect_same_error([&, &f = f] { f(ref); }, [&, &f = f] { f(*vulkan); }, what);
  }
}

}  // namespace
}  // namespace test_vulkan_sdpa
}  // namespace kvlab
