// Vulkan kv_scatter / kv_gather / kv_copy_blocks / kv_roll == the oracle, byte for byte,
// including the rows of dst that must stay untouched, for rows of every byte size
// (u8 rows of 1, 3, 5 bytes straddle 32-bit words), tensors at unaligned byte offsets in
// guarded buffers, on every path; and invalid input raises the oracle's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/vulkan/vulkan_backend.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
namespace {

// Random bytes (NaN payloads and all): the kernels are byte copies.
Tensor random_bytes(testing::SeededRng& rng, DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  auto* p = reinterpret_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng.integer(0, 255));
  return t;
}

Tensor ints(Shape shape, std::vector<std::int64_t> v) { return Tensor::from_ints(DType::i32, std::move(shape), v); }

using Op = std::function<void(Backend&, const DTensor& src, const DTensor& dst)>;

// Runs `op` on the oracle (plain buffers) and on `be` (src and dst `lead` elements into
// guarded buffers) from the same contents; dst must match byte for byte, and nothing
// outside src and dst may change.
void expect_same(VulkanBackend& be, const Tensor& src, const Tensor& dst0, std::size_t lead, const Op& op) {
  ReferenceBackend ref;
  const DTensor rs = ref.upload(src), rd = ref.upload(dst0);
  op(ref, rs, rd);
  const Tensor want = ref.download(rd);
  const DTensor s = testing::place(be, src.dtype(), src.shape(), lead, src.data());
  const DTensor d = testing::place(be, dst0.dtype(), dst0.shape(), lead + 1, dst0.data());
  op(be, s, d);
  EXPECT_TRUE(testing::bit_equal(be.download(d), want));
  EXPECT_TRUE(testing::bit_equal(be.download(s), src)) << "src was modified";
  EXPECT_TRUE(testing::guards_intact(be, s));
  EXPECT_TRUE(testing::guards_intact(be, d));
}

TEST(VulkanKvMove, ScatterMatchesForRunsWrapsAndPermutations) {
  KVLAB_SEEDED_RNG(rng, 7101);
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    for (const DType dtype : {DType::u8, DType::f16, DType::f32, DType::u32})
      for (const std::int64_t w : {1, 3, 5, 64})
        for (int trial = 0; trial < 3; ++trial) {
          const std::int64_t B = rng.integer(1, 3), H = rng.integer(1, 3), L = rng.integer(4, 17);
          const std::int64_t S = trial == 2 ? 1 : rng.integer(1, L);  // trial 2: a decode step
          std::vector<std::int64_t> slots;
          for (std::int64_t b = 0; b < B; ++b) {
            std::vector<std::int64_t> row(static_cast<std::size_t>(L));
            std::iota(row.begin(), row.end(), 0);
            if (trial % 2 == 0) {  // a ring write: contiguous from a start, wrapping past L
              const std::int64_t start = rng.integer(0, L - 1);
              for (auto& v : row) v = (v + start) % L;
            } else {
              std::shuffle(row.begin(), row.end(), rng.engine());
            }
            slots.insert(slots.end(), row.begin(), row.begin() + S);
          }
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " W " << w << " B " << B << " H " << H << " L " << L
                                            << " S " << S);
          const Tensor sl = ints({B, S}, slots);
          expect_same(be, random_bytes(rng, dtype, {B, H, S, w}), random_bytes(rng, dtype, {B, H, L, w}),
                      static_cast<std::size_t>(trial), [&](Backend& b, const DTensor& s, const DTensor& d) {
                        b.kv_scatter({s, sl.view(), d});
                      });
        }
  });
}

TEST(VulkanKvMove, GatherCopyBlocksAndRollMatch) {
  KVLAB_SEEDED_RNG(rng, 7102);
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    for (const DType dtype : {DType::u8, DType::bf16, DType::f32})
      for (const std::int64_t w : {1, 5, 128}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " W " << w);
        const Tensor src = random_bytes(rng, dtype, {3, 2, 9, w});
        const Tensor gi = ints({4}, {2, 0, 2, 1});  // repeats are legal for gather
        expect_same(be, src, random_bytes(rng, dtype, {4, 2, 9, w}), 1, [&](Backend& b, const DTensor& s, const DTensor& d) {
          b.kv_gather({s, gi.view(), d});
        });
        // Several blocks per destination row, overlapping sources, an empty block.
        const std::vector<SeqBlock> blocks = {{0, 0, 1, 3, 4}, {2, 5, 1, 0, 3}, {1, 2, 0, 0, 7}, {0, 8, 0, 7, 0}, {2, 1, 1, 8, 3}};
        expect_same(be, src, random_bytes(rng, dtype, {2, 2, 11, w}), 3, [&](Backend& b, const DTensor& s, const DTensor& d) {
          b.kv_copy_blocks({s, blocks, d});
        });
        // Right and left rolls, beyond L, zero, and the int32 extremes.
        const Tensor sh = ints({3}, {3, -2, 2147483647});
        expect_same(be, src, random_bytes(rng, dtype, {3, 2, 9, w}), 2, [&](Backend& b, const DTensor& s, const DTensor& d) {
          b.kv_roll({s, sh.view(), d});
        });
        const Tensor sh2 = ints({3}, {0, -2147483648LL, 9});
        expect_same(be, src, random_bytes(rng, dtype, {3, 2, 9, w}), 0, [&](Backend& b, const DTensor& s, const DTensor& d) {
          b.kv_roll({s, sh2.view(), d});
        });
      }
    // Empty sequence axis: roll is a no-op, and so is a scatter of zero rows.
    expect_same(be, Tensor(DType::f32, {2, 1, 0, 4}), Tensor(DType::f32, {2, 1, 0, 4}), 0,
                [&](Backend& b, const DTensor& s, const DTensor& d) { b.kv_roll({s, ints({2}, {1, 2}).view(), d}); });
    expect_same(be, Tensor(DType::f32, {2, 1, 0, 4}), random_bytes(rng, DType::f32, {2, 1, 5, 4}), 0,
                [&](Backend& b, const DTensor& s, const DTensor& d) { b.kv_scatter({s, Tensor(DType::i32, {2, 0}).view(), d}); });
  });
}

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
  for (const auto& [what, call] : bad) testing::expect_same_error([&] { call(ref); }, [&] { call(*be); }, what);
  const std::vector<std::pair<const char*, std::vector<SeqBlock>>> bad_blocks = {
      {"negative length", {{0, 0, 0, 0, -1}}},
      {"src batch", {{2, 0, 0, 0, 1}}},
      {"dst rows", {{0, 0, 0, 3, 2}}},
      {"overlapping destinations", {{0, 0, 0, 0, 2}, {0, 2, 0, 1, 2}}},
  };
  for (const auto& [what, blocks] : bad_blocks) {
    auto call = [&](Backend& b) {
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
}  // namespace kvlab
