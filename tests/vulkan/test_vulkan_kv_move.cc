// Vulkan kv_scatter / kv_gather / kv_copy_blocks / kv_roll: invalid input raises the
// oracle's errors, and a rejected call leaves dst untouched (neither is a harness case:
// the spine runs only problems the oracle accepts). The byte-for-byte comparisons with the
// oracle (rows of 1, 3, 5 u8 elements straddling 32-bit words, permuted and ring slots,
// int32-extreme shifts, empty axes, tensors at odd element offsets with guard bands) are
// lines of harness/cases/kv_*/ci, run on lavapipe by harness.check_lavapipe_vulkan and on
// the words+staging path by harness.check_lavapipe_vulkan_paths_moves (harness/cases/<op>/paths).
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
namespace test_vulkan_kv_move {
namespace {

Tensor ints(Shape shape, std::vector<std::int64_t> v) { return Tensor::from_ints(DType::i32, std::move(shape), v); }

TEST(VulkanKvMove, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  ReferenceBackend ref;
  using Call = std::function<void(Backend&)>;
  const std::vector<std::pair<const char*, Call>> bad = {
      {"slot out of range", [](Backend& b) {
         b.kv_scatter({b.allocate(DType::f32, {1, 1, 2, 4}), ints({1, 2}, {0, 5}).view(), b.allocate(DType::f32, {1, 1, 4, 4})});
       }},
      {"repeated slot", [](Backend& b) {
         b.kv_scatter({b.allocate(DType::f32, {1, 1, 2, 4}), ints({1, 2}, {3, 3}).view(), b.allocate(DType::f32, {1, 1, 4, 4})});
       }},
      {"dtype mismatch", [](Backend& b) {
         b.kv_scatter({b.allocate(DType::f32, {1, 1, 2, 4}), ints({1, 2}, {0, 1}).view(), b.allocate(DType::f16, {1, 1, 4, 4})});
       }},
      {"slots dtype", [](Backend& b) {
         b.kv_scatter({b.allocate(DType::f32, {1, 1, 2, 4}), Tensor(DType::u32, {1, 2}).view(), b.allocate(DType::f32, {1, 1, 4, 4})});
       }},
      {"width mismatch", [](Backend& b) {
         b.kv_gather({b.allocate(DType::f32, {2, 1, 4, 4}), ints({1}, {0}).view(), b.allocate(DType::f32, {1, 1, 4, 8})});
       }},
      {"gather index", [](Backend& b) {
         b.kv_gather({b.allocate(DType::f32, {2, 1, 4, 4}), ints({2}, {0, -1}).view(), b.allocate(DType::f32, {2, 1, 4, 4})});
       }},
      {"in place", [](Backend& b) {
         const DTensor t = b.allocate(DType::f32, {1, 1, 4, 4});
         b.kv_roll({t, ints({1}, {1}).view(), t});
       }},
      {"dst overlaps src in one buffer", [](Backend& b) {
         const BufferPtr buf = b.allocate(128);
         b.kv_roll({DTensor{buf, 0, DType::f32, {1, 1, 4, 4}}, ints({1}, {1}).view(), DTensor{buf, 32, DType::f32, {1, 1, 4, 4}}});
       }},
      {"roll shifts shape", [](Backend& b) {
         b.kv_roll({b.allocate(DType::f32, {2, 1, 4, 4}), ints({1}, {1}).view(), b.allocate(DType::f32, {2, 1, 4, 4})});
       }},
      {"rank", [](Backend& b) {
         b.kv_roll({b.allocate(DType::f32, {2, 4, 4}), ints({2}, {1, 1}).view(), b.allocate(DType::f32, {2, 4, 4})});
       }},
      {"misaligned tensor", [](Backend& b) {
         b.kv_roll({DTensor{b.allocate(80), 2, DType::f32, {1, 1, 4, 4}}, ints({1}, {1}).view(), b.allocate(DType::f32, {1, 1, 4, 4})});
       }},
  };
  for (const auto& [what, call] : bad)
    testing::expect_same_error([&, &call = call] { call(ref); }, [&, &call = call] { call(*be); }, what);
  const std::vector<std::pair<const char*, std::vector<SeqBlock>>> bad_blocks = {
      {"negative length", {{0, 0, 0, 0, -1}}},
      {"src batch", {{2, 0, 0, 0, 1}}},
      {"dst rows", {{0, 0, 0, 3, 2}}},
      {"overlapping destinations", {{0, 0, 0, 0, 2}, {0, 2, 0, 1, 2}}},
  };
  for (const auto& [what, blocks] : bad_blocks) {
    auto call = [&blocks = blocks](Backend& b) {
      b.kv_copy_blocks({b.allocate(DType::f32, {2, 1, 4, 4}), blocks, b.allocate(DType::f32, {1, 1, 4, 4})});
    };
    testing::expect_same_error([&] { call(ref); }, [&] { call(*be); }, what);
  }
}

TEST(VulkanKvMove, RejectedCallsLeaveDstUntouched) {
  // Validation (which reads the indices) completes before anything is dispatched.
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    const Tensor dst0 = Tensor::from_ints(DType::u32, {1, 1, 4, 2}, std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
    const DTensor d = be.upload(dst0);
    EXPECT_KVLAB_ERROR(be.kv_scatter({be.upload(Tensor(DType::u32, {1, 1, 2, 2})), ints({1, 2}, {1, 4}).view(), d}),
                       invalid_argument, "slot 4");
    EXPECT_TRUE(testing::bit_equal(be.download(d), dst0));
  });
}

}  // namespace
}  // namespace test_vulkan_kv_move
}  // namespace kvlab
