// Vulkan rope: invalid input raises the oracle's errors (not a harness case: the spine
// runs only problems the oracle accepts). The comparisons with the oracle (ranks 3 to 5,
// odd widths, partial dims, explicit wavelengths, per-row offsets read from the device,
// angles past the exact reduction, NaN/inf, copied tails bit for bit, odd element
// offsets) are lines of harness/cases/rope/ci under rope's one tolerance object
// (harness/ops/rope_info.cc), run on lavapipe by harness.check_lavapipe_vulkan and on the
// words+staging path by harness.check_lavapipe_vulkan_paths_moves (harness/cases/<op>/paths).
#include <gtest/gtest.h>

#include <functional>
#include <utility>
#include <vector>

#include "kernels/vulkan/vulkan_backend.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_rope {
namespace {

TEST(VulkanRope, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  ReferenceBackend ref;
  using Call = std::function<void(Backend&)>;
  auto params = [](int dims, float base = 10000.0f) {
    RopeParams p;
    p.dims = dims;
    p.base = base;
    return p;
  };
  const std::vector<std::pair<const char*, Call>> bad = {
      {"rank 2", [&](Backend& b) { b.rope({b.allocate(DType::f32, {2, 8}), params(8), {}, b.allocate(DType::f32, {2, 8})}); }},
      {"odd dims", [&](Backend& b) { b.rope({b.allocate(DType::f32, {1, 2, 8}), params(3), {}, b.allocate(DType::f32, {1, 2, 8})}); }},
      {"dims > D", [&](Backend& b) { b.rope({b.allocate(DType::f32, {1, 2, 8}), params(10), {}, b.allocate(DType::f32, {1, 2, 8})}); }},
      {"bad base", [&](Backend& b) {
         b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8, -1.0f), {}, b.allocate(DType::f32, {1, 2, 8})});
       }},
      {"integer x", [&](Backend& b) { b.rope({b.allocate(DType::u32, {1, 2, 8}), params(8), {}, b.allocate(DType::u32, {1, 2, 8})}); }},
      {"out dtype", [&](Backend& b) { b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8), {}, b.allocate(DType::f16, {1, 2, 8})}); }},
      {"in place", [&](Backend& b) {
         const DTensor t = b.allocate(DType::f32, {1, 2, 8});
         b.rope({t, params(8), {}, t});
       }},
      {"out overlaps x in one buffer", [&](Backend& b) {
         const BufferPtr buf = b.allocate(256);
         b.rope({DTensor{buf, 0, DType::f32, {1, 2, 8}}, params(8), {}, DTensor{buf, 32, DType::f32, {1, 2, 8}}});
       }},
      {"both offsets", [&](Backend& b) {
         Offsets o;
         o.scalar = 3;
         o.per_row = b.allocate(DType::i32, {1});
         b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8), o, b.allocate(DType::f32, {1, 2, 8})});
       }},
      {"per-row shape", [&](Backend& b) {
         Offsets o;
         o.per_row = b.allocate(DType::i32, {2});
         b.rope({b.allocate(DType::f32, {1, 2, 8}), params(8), o, b.allocate(DType::f32, {1, 2, 8})});
       }},
      {"freqs count", [&](Backend& b) {
         RopeParams p = params(8);
         p.freqs = {1.0f, 2.0f};
         b.rope({b.allocate(DType::f32, {1, 2, 8}), p, {}, b.allocate(DType::f32, {1, 2, 8})});
       }},
  };
  for (const auto& [what, call] : bad)
    testing::expect_same_error([&, &call = call] { call(ref); }, [&, &call = call] { call(*be); }, what);
}

}  // namespace
}  // namespace test_vulkan_rope
}  // namespace kvlab
