// SIMD rope: what a harness case line cannot state. Its comparisons with the oracle
// (ranks 3 to 5, odd widths, partial dims, explicit wavelengths, long sequences across the
// kernel's recurrence blocks and table windows, |θ| past 2^21 and near 2^42, 1100 batch
// rows, NaN/inf inputs and positions, copied tails bit for bit, odd element offsets) are
// lines of harness/cases/rope/ci, run on every Highway target by harness.check_ci_host
// under the one tolerance object of harness/ops/rope_info.cc. Here: every target gives
// the same bits; outputs of 16 MiB and more (the kernel's streaming stores) meet that
// tolerance through harness lines, on the best target; and invalid input raises the
// oracle's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#ifdef KVLAB_TEST_WITH_HARNESS
#include "harness/op.h"
#include "harness/problem.h"
#include "harness/spine.h"
#endif
#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_rope {
namespace {

Tensor run_rope(Backend& be, const Tensor& x, const RopeParams& p, std::int32_t offset) {
  const DTensor dx = be.upload(x);
  const DTensor out = be.allocate(x.dtype(), x.shape());
  be.fill(out, 0x7FC00001u);
  Offsets off;
  off.scalar = offset;
  be.rope({dx, p, off, out});
  return be.download(out);
}

// The targets differ in vector width and in how their tails are handled, never in
// arithmetic: the same bits on every target, over vector-width-unfriendly shapes.
TEST(SimdRope, EveryTargetGivesTheSameBits) {
  KVLAB_SEEDED_RNG(rng, 9001);
  SimdBackend simd;
  struct Case {
    Shape shape;
    int dims;
  };
  const std::vector<Case> cases = {{{2, 3, 5, 64}, 64}, {{2, 1, 3, 18}, 18}, {{1, 4, 2, 96}, 64},
                                   {{2, 7, 256}, 256},  {{2, 2, 1, 3, 40}, 34}, {{1, 1, 300, 130}, 2}};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const bool traditional : {false, true})
      for (const Case& c : cases) {
        RopeParams p;
        p.dims = c.dims;
        p.traditional = traditional;
        p.base = 500000.0f;
        const Tensor x = testing::random_normal(rng, dtype, c.shape, 2.0);
        const auto offset = static_cast<std::int32_t>(rng.integer(0, 3000000));
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str(c.shape) << " dims " << c.dims
                                          << (traditional ? " traditional" : ""));
        std::optional<Tensor> first;
        testing::for_each_simd_target([&](const std::string&) {
          const Tensor got = run_rope(simd, x, p, offset);
          if (!first) first = got;
          else EXPECT_TRUE(testing::bit_equal(got, *first)) << "differs from the first target";
        });
      }
}

// NaN results are one pattern, the positive quiet NaN, on every target, whatever NaN the
// operands carried (x86 keeps the first operand's payload, and targets order commutative
// operands differently): inputs with NaNs of every sign and payload and ±inf (inf − inf
// makes the hardware's negative default NaN). NaN positions as the oracle's. Rows of 128
// features take the bf16 path that checks a whole row for NaN after the fact; 40 features
// leave tails.
TEST(SimdRope, NaNResultsAreTheCanonicalPatternOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 4242);
  ReferenceBackend ref;
  SimdBackend simd;
  const std::uint16_t specials16[] = {0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF, 0x7F80, 0xFF80};
  const std::uint16_t f16_specials[] = {0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF, 0xFFFF, 0x7C00, 0xFC00};
  const std::uint32_t specials32[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                                      0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F800000u, 0xFF800000u};
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (const bool traditional : {false, true})
      for (const std::int64_t d : {128, 40}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D " << d << (traditional ? " traditional" : ""));
        Tensor x = testing::random_normal(rng, dtype, {1, 3, 7, d}, 2.0);
        for (std::int64_t k = 0; k < x.numel(); k += rng.integer(1, 9)) {  // about one in five
          const auto pick = static_cast<std::size_t>(rng.integer(0, 7));
          const std::size_t at = static_cast<std::size_t>(k) * dtype_size(dtype);
          if (dtype == DType::f32) std::memcpy(x.data() + at, &specials32[pick], 4);
          else std::memcpy(x.data() + at, dtype == DType::bf16 ? &specials16[pick] : &f16_specials[pick], 2);
        }
        RopeParams p;
        p.dims = static_cast<int>(d);
        p.traditional = traditional;
        p.base = 500000.0f;
        const Tensor want = run_rope(ref, x, p, 11);
        testing::for_each_simd_target([&](const std::string& target) {
          const Tensor got = run_rope(simd, x, p, 11);
          std::int64_t nans = 0;
          for (std::int64_t k = 0; k < got.numel(); ++k) {
            const bool nan = std::isnan(got.view().load(k));
            ASSERT_EQ(nan, std::isnan(want.view().load(k))) << target << " element " << k;
            if (!nan) continue;
            ++nans;
            const std::size_t at = static_cast<std::size_t>(k) * dtype_size(dtype);
            if (dtype == DType::f32) {
              std::uint32_t bits = 0;
              std::memcpy(&bits, got.data() + at, 4);
              ASSERT_EQ(bits, 0x7FC00000u) << target << " element " << k;
            } else {
              std::uint16_t bits = 0;
              std::memcpy(&bits, got.data() + at, 2);
              ASSERT_EQ(bits, dtype == DType::bf16 ? 0x7FC0 : 0x7E00) << target << " element " << k;
            }
          }
          EXPECT_GT(nans, x.numel() / 10) << target;  // the case makes NaNs at all
        });
      }
}

#ifdef KVLAB_TEST_WITH_HARNESS
// Outputs of 16 MiB and more take the kernel's streaming stores (rows of 130 features, so
// aligned and unaligned vectors both occur). The best target is held to rope's tolerance
// through the harness; the other targets must give its bits (the oracle once is enough).
TEST(SimdRope, LargeOutputsTakingStreamingStoresMeetTheHarnessTolerance) {
  ReferenceBackend ref;
  SimdBackend simd;
  const std::vector<std::string> lines = {
      "rope B=1 H=8 T=4096 D=130 dims=128 base=500000 offset=77 dtype=f32 traditional=0,1",
      "rope B=1 H=16 T=4096 D=130 dims=128 base=500000 offset=77 dtype=f16 traditional=1",
      "rope B=1 H=16 T=4096 D=130 dims=128 base=500000 offset=77 dtype=bf16 traditional=0"};
  for (const std::string& line : lines) {
    for (const harness::Problem& p : harness::expand_line(line)) {
      ASSERT_GE(p.integer("H") * p.integer("T") * p.integer("D") * (p.word("dtype") == "f32" ? 4 : 2), 16 << 20);
      const harness::CaseResult r = harness::run_case(p, simd, ref, {});
      EXPECT_EQ(r.status, harness::Status::passed) << harness::describe(r);
      RopeParams rp;
      rp.dims = 128;
      rp.base = 500000.0f;
      rp.traditional = p.flag("traditional");
      const harness::Prepared prep = harness::find_op("rope").prepare(p);  // the case's own x
      const Tensor& x = prep.input("x");
      std::optional<Tensor> first;
      testing::for_each_simd_target([&](const std::string&) {
        const Tensor got = run_rope(simd, x, rp, 77);
        if (!first) first = got;
        else EXPECT_EQ(std::memcmp(got.data(), first->data(), got.nbytes()), 0) << "differs from the first target";
      });
    }
  }
}
#endif

TEST(SimdRope, InvalidInputRaisesTheOraclesErrors) {
  ReferenceBackend ref;
  SimdBackend simd;
  using Call = std::function<void(Backend&)>;
  auto params = [](int dims, float base = 10000.0f) {
    RopeParams p;
    p.dims = dims;
    p.base = base;
    return p;
  };
  const std::vector<std::pair<const char*, Call>> bad = {
      {"rank 2", [&](Backend& be) { be.rope({be.allocate(DType::f32, {2, 8}), params(8), {}, be.allocate(DType::f32, {2, 8})}); }},
      {"odd dims", [&](Backend& be) {
         be.rope({be.allocate(DType::f32, {1, 2, 8}), params(3), {}, be.allocate(DType::f32, {1, 2, 8})});
       }},
      {"dims > D", [&](Backend& be) {
         be.rope({be.allocate(DType::f32, {1, 2, 8}), params(10), {}, be.allocate(DType::f32, {1, 2, 8})});
       }},
      {"bad base", [&](Backend& be) {
         be.rope({be.allocate(DType::f32, {1, 2, 8}), params(8, -1.0f), {}, be.allocate(DType::f32, {1, 2, 8})});
       }},
      {"out dtype", [&](Backend& be) {
         be.rope({be.allocate(DType::f32, {1, 2, 8}), params(8), {}, be.allocate(DType::f16, {1, 2, 8})});
       }},
      {"in place", [&](Backend& be) {
         const DTensor t = be.allocate(DType::f32, {1, 2, 8});
         be.rope({t, params(8), {}, t});
       }},
      {"both offsets", [&](Backend& be) {
         Offsets o;
         o.scalar = 3;
         o.per_row = be.allocate(DType::i32, {1});
         be.rope({be.allocate(DType::f32, {1, 2, 8}), params(8), o, be.allocate(DType::f32, {1, 2, 8})});
       }},
      {"per-row shape", [&](Backend& be) {
         Offsets o;
         o.per_row = be.allocate(DType::i32, {2});
         be.rope({be.allocate(DType::f32, {1, 2, 8}), params(8), o, be.allocate(DType::f32, {1, 2, 8})});
       }},
  };
  for (const auto& [what, call] : bad)
    testing::expect_same_error([&, &call = call] { call(ref); }, [&, &call = call] { call(simd); }, what);
}

}  // namespace
}  // namespace test_simd_rope
}  // namespace kvlab
