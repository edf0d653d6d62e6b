// Vulkan quantized_sdpa: what the harness cannot state as a case line. Its comparisons
// with the oracle (affine widths and groups, GQA, Dv != Dk, mixed K/V specs and scale
// dtypes, long decode over many KV chunks, windows and paddings over poisoned scales, mask
// arrays, sinks, softcap, fully masked rows) are lines of harness/cases/quantized_sdpa/
// (the lavapipe file), run under the one tolerance object of harness/ops/sdpa_info.cc by
// the harness.check_lavapipe_vulkan* tests on the default (the decode pass where it
// applies), general, shared-memory (nosubgroup) and words+staging (many tiles a chunk)
// builds. Here, on every path: fp-mode K/V throw unsupported naming the
// spec, and invalid input raises the oracle's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/reference_backend.h"
#include "tests/unit/quantized_attention_inputs.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_quantized_sdpa {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using ref::QuantizedTensor;

using testing::affine;
using testing::dv_of;
using testing::random_inputs;
using testing::view_of;
using Inputs = testing::QuantizedAttentionInputs;
using Dims = testing::AttentionDims;

// Every operand one element into a guarded buffer (odd offsets); out poisoned first.
// `submissions`, when given, gets the queue submissions of the attention call alone.
Tensor run_on(Backend& be, const Inputs& in, std::uint64_t* submissions = nullptr) {
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
  const QuantizedDTensor k = side(in.k), v = side(in.v);
  auto* vulkan = dynamic_cast<VulkanBackend*>(&be);
  const std::uint64_t before = vulkan ? vulkan->context().submissions() : 0;
  be.quantized_sdpa({q, k, v, in.params, mask ? &*mask : nullptr, sinks ? &*sinks : nullptr, out});
  if (submissions != nullptr && vulkan != nullptr) *submissions = vulkan->context().submissions() - before;
  EXPECT_TRUE(testing::guards_intact(be, out));
  return be.download(out);
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

// kvlab_bench times a Vulkan call on the device only when it is one submission. On
// device-local memory (a discrete GPU; ',staging' here) the work table once went up by a
// staged upload, a submission of its own, so on the H100 every attention row fell back
// to the host's wall clock; now the command buffer writes it (Context::update).
TEST(VulkanQuantizedSdpa, IsOneSubmissionOnEveryMemoryPath) {
  std::string reason;
  const auto& paths = vulkan_paths(reason);
  if (paths.empty()) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  KVLAB_SEEDED_RNG(rng, 5);
  const Inputs in = random_inputs(rng, {1, 4, 2, 1, 300, 64, 64}, DType::f16, affine(4, 64), affine(8, 32),
                                  DType::f16, DType::f16);
  for (const auto& be : paths) {
    std::uint64_t submissions = 0;
    run_on(*be, in, &submissions);
    EXPECT_EQ(submissions, 1u) << (be->uses_staging() ? "device-local memory" : "host-visible memory");
  }
}

// The decode pass (shaders/sdpa_quantized_decode.comp) is what makes a GPU decode step
// fast, and nothing in its output tells it apart from the general pass: the harness would
// stay green if the host stopped choosing it. Here: it runs for the serving shape (also at
// bf16 scales, 2-bit V and a GQA ratio of 3) wherever subgroup arithmetic is used, not with
// ',general', and never for what it does not cover (3-bit K, a mask array).
TEST(VulkanQuantizedSdpa, TakesTheDecodePassExactlyWhereItApplies) {
  std::string reason;
  VulkanOptions general_options;
  general_options.force_general_attention = true;
  const std::unique_ptr<VulkanBackend> general = testing::try_vulkan(general_options, reason);
  const auto& paths = vulkan_paths(reason);
  if (paths.empty() || !general) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  KVLAB_SEEDED_RNG(rng, 21);
  const auto passes = [](VulkanBackend& be, const Inputs& in) {
    using vulkan::ShaderId;
    const auto count = [&] {
      return std::array<std::uint64_t, 3>{be.context().dispatches(ShaderId::quantized_sdpa_decode),
                                          be.context().dispatches(ShaderId::quantized_sdpa_subgroup),
                                          be.context().dispatches(ShaderId::quantized_sdpa)};
    };
    const auto before = count();
    run_on(be, in);
    const auto after = count();
    return std::array<std::uint64_t, 3>{after[0] - before[0], after[1] - before[1], after[2] - before[2]};
  };
  using Passes = std::array<std::uint64_t, 3>;  // decode, general (subgroup build), general (shared build)
  const std::vector<Inputs> decode_shapes = {
      random_inputs(rng, {1, 8, 2, 1, 300, 128, 128}, DType::f16, affine(4, 64), affine(4, 64), DType::f16, DType::f16),
      random_inputs(rng, {2, 6, 2, 1, 70, 64, 64}, DType::bf16, affine(8, 32), affine(2, 64), DType::bf16, DType::bf16)};
  // The default path and the forced shared reductions (the storage paths choose alike;
  // each pipeline takes lavapipe long to compile: docs/toolchain.md §Shaders and Vulkan).
  const std::vector<VulkanBackend*> backends = {paths.front().get(), paths.back().get()};
  for (const Inputs& in : decode_shapes) {
    for (VulkanBackend* be : backends) {
      const Passes expected = be->uses_subgroup_reductions() ? Passes{1, 0, 0} : Passes{0, 0, 1};
      EXPECT_EQ(passes(*be, in), expected) << be->name();
    }
    if (general->uses_subgroup_reductions()) {
      EXPECT_EQ(passes(*general, in), (Passes{0, 1, 0}));
    }
  }
  Inputs odd_bits =
      random_inputs(rng, {1, 4, 2, 1, 70, 64, 64}, DType::f16, affine(3, 32), affine(4, 64), DType::f16, DType::f16);
  Inputs masked = decode_shapes[0];
  masked.params.mask.kind = MaskKind::boolean;
  masked.mask = Tensor(DType::u8, {1, 1, 1, 300});
  std::fill_n(masked.mask->data(), 300, std::byte{1});
  for (const Inputs* in : {&odd_bits, &masked}) {
    for (VulkanBackend* be : backends) {
      const Passes expected = be->uses_subgroup_reductions() ? Passes{0, 1, 0} : Passes{0, 0, 1};
      EXPECT_EQ(passes(*be, *in), expected) << be->name();
    }
  }
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
}  // namespace test_vulkan_quantized_sdpa
}  // namespace kvlab
