// SIMD kv_scatter / kv_gather / kv_copy_blocks / kv_roll == the oracle, byte for byte,
// including the untouched rows of dst, and the same errors. These kernels have no
// Highway dispatch (memcpy of row runs), so one pass covers every target; the test
// still runs under the best and the SCALAR target to pin that claim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
namespace {

// Random bytes (any dtype, NaN payloads included): the kernels are byte copies.
Tensor random_bytes(testing::SeededRng& rng, DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  auto* p = reinterpret_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng.integer(0, 255));
  return t;
}

Tensor ints(Shape shape, std::vector<std::int64_t> v) { return Tensor::from_ints(DType::i32, std::move(shape), v); }

// Runs `op` on both backends from the same src/dst contents; dst must match bytewise.
template <class Op>
void expect_same(const Tensor& src, const Tensor& dst0, Op op) {
  ReferenceBackend ref;
  SimdBackend simd;
  auto run = [&](Backend& be) {
    const DTensor s = be.upload(src), d = be.upload(dst0);
    op(be, s, d);
    return be.download(d);
  };
  const Tensor want = run(ref);
  for (const char* target : {"best", "SCALAR"}) {
    SCOPED_TRACE(target);
    std::optional<ScopedSimdTarget> force;
    if (std::string(target) == "SCALAR") force.emplace("SCALAR");
    EXPECT_TRUE(testing::bit_equal(run(simd), want));
  }
}

TEST(SimdKvMove, ScatterMatchesForRunsWrapsAndPermutations) {
  KVLAB_SEEDED_RNG(rng, 7001);
  for (const DType dtype : {DType::f32, DType::f16, DType::u32, DType::u8})
    for (const std::int64_t w : {1, 3, 64, 128})
      for (int trial = 0; trial < 4; ++trial) {
        const std::int64_t B = rng.integer(1, 3), H = rng.integer(1, 3), L = rng.integer(4, 17);
        const std::int64_t S = rng.integer(1, L);
        std::vector<std::int64_t> slots;
        for (std::int64_t b = 0; b < B; ++b) {
          std::vector<std::int64_t> row(static_cast<std::size_t>(L));
          std::iota(row.begin(), row.end(), 0);
          if (trial % 2 == 0) {  // a ring write: contiguous, wrapping past L
            const std::int64_t start = rng.integer(0, L - 1);
            for (auto& v : row) v = (v + start) % L;
          } else {
            std::shuffle(row.begin(), row.end(), rng.engine());
          }
          slots.insert(slots.end(), row.begin(), row.begin() + S);
        }
        const Tensor src = random_bytes(rng, dtype, {B, H, S, w}), dst = random_bytes(rng, dtype, {B, H, L, w});
        const Tensor sl = ints({B, S}, slots);
        expect_same(src, dst, [&](Backend& be, const DTensor& s, const DTensor& d) {
          be.kv_scatter({s, sl.view(), d});
        });
      }
}

TEST(SimdKvMove, GatherCopyBlocksAndRollMatch) {
  KVLAB_SEEDED_RNG(rng, 7002);
  for (const std::int64_t w : {1, 5, 128}) {
    const Tensor src = random_bytes(rng, DType::bf16, {3, 2, 9, w});
    const Tensor gi = ints({4}, {2, 0, 2, 1});
    expect_same(src, random_bytes(rng, DType::bf16, {4, 2, 9, w}), [&](Backend& be, const DTensor& s, const DTensor& d) {
      be.kv_gather({s, gi.view(), d});
    });
    const std::vector<SeqBlock> blocks = {{0, 0, 1, 3, 4}, {2, 5, 1, 0, 3}, {1, 2, 0, 0, 7}, {0, 8, 0, 7, 0}};
    expect_same(src, random_bytes(rng, DType::bf16, {2, 2, 11, w}), [&](Backend& be, const DTensor& s, const DTensor& d) {
      be.kv_copy_blocks({s, blocks, d});
    });
    const Tensor sh = ints({3}, {3, -2, 2147483647});
    expect_same(src, random_bytes(rng, DType::bf16, {3, 2, 9, w}), [&](Backend& be, const DTensor& s, const DTensor& d) {
      be.kv_roll({s, sh.view(), d});
    });
  }
  // Empty sequence axis: roll is a no-op, scatter of zero rows too.
  expect_same(Tensor(DType::f32, {2, 1, 0, 4}), Tensor(DType::f32, {2, 1, 0, 4}),
              [&](Backend& be, const DTensor& s, const DTensor& d) { be.kv_roll({s, ints({2}, {1, 2}).view(), d}); });
}

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
    testing::expect_same_error([&] { call(ref); }, [&] { call(simd); }, what);
  }
  const std::vector<std::pair<const char*, std::vector<SeqBlock>>> bad_blocks = {
      {"negative length", {{0, 0, 0, 0, -1}}},
      {"src batch", {{2, 0, 0, 0, 1}}},
      {"dst rows", {{0, 0, 0, 3, 2}}},
      {"overlapping destinations", {{0, 0, 0, 0, 2}, {0, 2, 0, 1, 2}}},
  };
  for (const auto& [what, blocks] : bad_blocks) {
    auto call = [&](Backend& be) {
      be.kv_copy_blocks({be.allocate(DType::f32, {2, 1, 4, 4}), blocks, be.allocate(DType::f32, {1, 1, 4, 4})});
    };
    testing::expect_same_error([&] { call(ref); }, [&] { call(simd); }, what);
  }
}

}  // namespace
}  // namespace kvlab
