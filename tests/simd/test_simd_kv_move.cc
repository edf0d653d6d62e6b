// SIMD kv_scatter / kv_gather / kv_copy_blocks / kv_roll: invalid input raises the
// oracle's errors (a rejected call is not a harness case: the spine runs only problems the
// oracle accepts). Their byte-for-byte comparisons with the oracle (ring and permuted slots,
// repeated gather indices, overlapping blocks, int32-extreme shifts, rows of 1 to 128
// elements, empty axes, odd element offsets, scatters of over 1 MiB that take the
// non-temporal stores) are lines of harness/cases/kv_*/ci, run on
// every Highway target, SCALAR included, by harness.check_ci_host.
#include <gtest/gtest.h>

#include <functional>
#include <utility>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_kv_move {
namespace {

Tensor ints(Shape shape, std::vector<std::int64_t> v) { return Tensor::from_ints(DType::i32, std::move(shape), v); }

TEST(SimdKvMove, InvalidInputRaisesTheOraclesErrors) {
  ReferenceBackend ref;
  SimdBackend simd;
  using Call = std::function<void(Backend&)>;
  const std::vector<std::pair<const char*, Call>> bad = {
      {"slot out of range", [](Backend& be) {
         be.kv_scatter({be.allocate(DType::f32, {1, 1, 2, 4}), ints({1, 2}, {0, 5}).view(),
                       be.allocate(DType::f32, {1, 1, 4, 4})});
       }},
      {"repeated slot", [](Backend& be) {
         be.kv_scatter({be.allocate(DType::f32, {1, 1, 2, 4}), ints({1, 2}, {3, 3}).view(),
                       be.allocate(DType::f32, {1, 1, 4, 4})});
       }},
      {"dtype mismatch", [](Backend& be) {
         be.kv_scatter({be.allocate(DType::f32, {1, 1, 2, 4}), ints({1, 2}, {0, 1}).view(),
                       be.allocate(DType::f16, {1, 1, 4, 4})});
       }},
      {"width mismatch", [](Backend& be) {
         be.kv_gather({be.allocate(DType::f32, {2, 1, 4, 4}), ints({1}, {0}).view(),
                      be.allocate(DType::f32, {1, 1, 4, 8})});
       }},
      {"gather index", [](Backend& be) {
         be.kv_gather({be.allocate(DType::f32, {2, 1, 4, 4}), ints({2}, {0, -1}).view(),
                      be.allocate(DType::f32, {2, 1, 4, 4})});
       }},
      {"in place", [](Backend& be) {
         const DTensor t = be.allocate(DType::f32, {1, 1, 4, 4});
         be.kv_roll({t, ints({1}, {1}).view(), t});
       }},
      {"roll shifts shape", [](Backend& be) {
         be.kv_roll({be.allocate(DType::f32, {2, 1, 4, 4}), ints({1}, {1}).view(),
                    be.allocate(DType::f32, {2, 1, 4, 4})});
       }},
      {"rank", [](Backend& be) {
         be.kv_roll({be.allocate(DType::f32, {2, 4, 4}), ints({2}, {1, 1}).view(), be.allocate(DType::f32, {2, 4, 4})});
       }},
  };
  for (const auto& [what, call] : bad) {
    testing::expect_same_error([&, &call = call] { call(ref); }, [&, &call = call] { call(simd); }, what);
  }
  const std::vector<std::pair<const char*, std::vector<SeqBlock>>> bad_blocks = {
      {"negative length", {{0, 0, 0, 0, -1}}},
      {"src batch", {{2, 0, 0, 0, 1}}},
      {"dst rows", {{0, 0, 0, 3, 2}}},
      {"overlapping destinations", {{0, 0, 0, 0, 2}, {0, 2, 0, 1, 2}}},
  };
  for (const auto& [what, blocks] : bad_blocks) {
    auto call = [&blocks = blocks](Backend& be) {
      be.kv_copy_blocks({be.allocate(DType::f32, {2, 1, 4, 4}), blocks, be.allocate(DType::f32, {1, 1, 4, 4})});
    };
    testing::expect_same_error([&] { call(ref); }, [&] { call(simd); }, what);
  }
}

}  // namespace
}  // namespace test_simd_kv_move
}  // namespace kvlab
