// SIMD rope vs the oracle on every attainable target, within the derived bound of
// kernels/simd/rope.cc: per output of pair (x1, x2),
//   |got − want| ≤ ulp_dtype(want) + 8·2^-24·(|x1| + |x2|)
// (the kernel's bound is 3·2^-24·(|x1| + |x2|) plus one storage rounding). Features past
// `dims` must be copied as bytes (NaN payloads too), non-finite values must come out as
// the oracle's, every target must give the same bits, and invalid input raises the
// oracle's errors. Long sequences cross the kernel's recurrence blocks (256 positions),
// its table windows and its exact-angle fallback beyond |θ| = 2^21; large outputs take
// its streaming stores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
namespace {

Tensor run_rope(Backend& be, const Tensor& x, const RopeParams& p, const Offsets& off_host,
                const std::optional<Tensor>& per_row) {
  const DTensor dx = be.upload(x);
  const DTensor out = be.allocate(x.dtype(), x.shape());
  be.fill(out, 0x7FC00001u);
  Offsets off = off_host;
  if (per_row) off.per_row = be.upload(*per_row);
  be.rope({dx, p, off, out});
  return be.download(out);
}

// The other feature of i's pair (i < dims).
std::int64_t partner(std::int64_t i, int dims, bool traditional) {
  if (traditional) return i ^ 1;
  const std::int64_t half = dims / 2;
  return i < half ? i + half : i - half;
}

// Rotated features within the bound; non-finite oracle outputs matched exactly (inf) or
// in kind (NaN); features past dims identical as bytes.
::testing::AssertionResult within_bound(const Tensor& x, const Tensor& got, const Tensor& want, int dims,
                                        bool traditional) {
  const std::int64_t d = x.dim(-1);
  const ConstTensorView vx = x.view(), vg = got.view(), vw = want.view();
  const double eps = dtype_epsilon(x.dtype());
  const double floor = x.dtype() == DType::f16 ? 0x1p-24 : 0.0;  // f16 subnormal spacing
  const std::size_t elem = dtype_size(x.dtype());
  for (std::int64_t r = 0; r < x.numel() / d; ++r) {
    for (std::int64_t i = 0; i < dims; ++i) {
      const std::int64_t at = r * d + i;
      const double g = vg.load(at), w = vw.load(at);
      const double pair = std::abs(double{vx.load(at)}) + std::abs(double{vx.load(r * d + partner(i, dims, traditional))});
      const bool ok = std::isfinite(w) ? std::abs(g - w) <= eps * std::abs(w) + 8 * 0x1p-24 * pair + floor
                                       : (std::isnan(w) ? std::isnan(g) : g == w);
      if (!ok) {
        return ::testing::AssertionFailure() << "row " << r << " feature " << i << ": got " << g << ", want " << w
                                             << ", |diff| " << std::abs(g - w) << ", |x1| + |x2| " << pair;
      }
    }
    const std::size_t tail = static_cast<std::size_t>(r * d + dims) * elem;
    if (std::memcmp(got.data() + tail, x.data() + tail, static_cast<std::size_t>(d - dims) * elem) != 0) {
      return ::testing::AssertionFailure() << "row " << r << ": features past dims are not copied bit for bit";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Problem {
  Shape shape;
  RopeParams params;
  Offsets offsets;
  std::optional<Tensor> per_row;
};

std::string describe(const Tensor& x, const Problem& c) {
  std::string s = std::string(dtype_name(x.dtype())) + " " + shape_str(c.shape) + " dims " +
                  std::to_string(c.params.dims) + (c.params.traditional ? " traditional" : "") + " scale " +
                  std::to_string(c.params.scale);
  if (c.per_row) s += " per-row offsets";
  else s += " offset " + std::to_string(c.offsets.scalar);
  return s;
}

// Every target within the bound of the oracle and bit-identical to the first target.
void expect_every_target_matches(const Tensor& x, const Problem& c) {
  ReferenceBackend ref;
  SimdBackend simd;
  SCOPED_TRACE(describe(x, c));
  const Tensor want = run_rope(ref, x, c.params, c.offsets, c.per_row);
  std::optional<Tensor> first;
  testing::for_each_simd_target([&](const std::string&) {
    const Tensor got = run_rope(simd, x, c.params, c.offsets, c.per_row);
    EXPECT_TRUE(within_bound(x, got, want, c.params.dims, c.params.traditional));
    if (!first) first = got;
    else EXPECT_TRUE(testing::bit_equal(got, *first)) << "differs from the first target";
  });
}

TEST(SimdRope, MatchesTheOracleWithinTheDerivedBoundOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 9001);
  struct Case {
    Shape shape;
    int dims;
  };
  // D not a multiple of any vector width (18, 80), dims < D (copied tail), rank 3 and 5,
  // one token (decode) and several.
  const std::vector<Case> cases = {{{1, 1, 1, 128}, 128}, {{2, 3, 5, 64}, 64},  {{3, 2, 4, 80}, 80},
                                   {{2, 1, 3, 18}, 18},   {{1, 4, 2, 96}, 64},  {{2, 7, 256}, 256},
                                   {{2, 2, 1, 3, 40}, 34}, {{1, 1, 6, 130}, 2}};
  int checked = 0;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const bool traditional : {false, true})
      for (std::size_t c = 0; c < cases.size(); ++c) {
        Problem k{cases[c].shape, {}, {}, std::nullopt};
        k.params.dims = cases[c].dims;
        k.params.traditional = traditional;
        k.params.base = c % 2 ? 500000.0f : 10000.0f;
        k.params.scale = c % 3 == 0 ? 0.25f : 1.0f;
        if (c == 5) {
          for (int i = 0; i < k.params.dims / 2; ++i) k.params.freqs.push_back(static_cast<float>(1.0 + 37.0 * i));
        }
        const Tensor x = testing::random_normal(rng, dtype, k.shape, 2.0);
        const std::int64_t B = k.shape[0];
        if (c % 2) {
          std::vector<std::int64_t> o;
          for (std::int64_t b = 0; b < B; ++b) o.push_back(rng.integer(-5, 200000));
          k.per_row = Tensor::from_ints(DType::i32, {B}, o);
        } else {
          k.offsets.scalar = static_cast<std::int32_t>(rng.integer(0, 70000));
        }
        expect_every_target_matches(x, k);
        ++checked;
      }
  EXPECT_EQ(checked, 3 * 2 * 8);
}

// Sequences longer than a recurrence block (256) and than a table window (the kernel's
// 1 MiB table holds 256 positions of 3 batch rows × 128 pairs), ending mid-block;
// positions from negative to 2^30 with inv_0 = 1, so |θ| crosses 2^21 inside a block
// range of one batch row (recurrence before, exact angles after); and |θ| near 2^42.
TEST(SimdRope, LongSequencesAndLargePositionsStayWithinTheBoundOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 4242);
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const bool traditional : {false, true}) {
      Problem k{{3, 1, 700, 258}, {}, {}, std::nullopt};
      k.params.dims = 256;
      k.params.traditional = traditional;
      k.params.base = 10000.0f;
      const std::vector<std::int64_t> offsets = {-37, (1 << 21) - 300, 1 << 30};
      k.per_row = Tensor::from_ints(DType::i32, {3}, offsets);
      expect_every_target_matches(testing::random_normal(rng, dtype, k.shape, 3.0), k);
      // A scalar offset and a fractional scale: every block on the recurrence path.
      Problem s{{1, 2, 333, 64}, {}, {}, std::nullopt};
      s.params.dims = 64;
      s.params.traditional = traditional;
      s.params.base = 500000.0f;
      s.params.scale = 0.125f;
      s.offsets.scalar = 123457;
      expect_every_target_matches(testing::random_normal(rng, dtype, s.shape, 3.0), s);
      // |θ| near 2^42: only libm on the oracle's own θ can match (a recurrence from an
      // exact start would drift from the oracle's rounded θ by ~2^42·2^-53 rad).
      Problem h{{2, 1, 130, 32}, {}, {}, std::nullopt};
      h.params.dims = 32;
      h.params.traditional = traditional;
      h.params.base = 10000.0f;
      h.params.scale = 4096.0f;
      const std::vector<std::int64_t> huge = {1 << 30, -(1 << 30) - 7};
      h.per_row = Tensor::from_ints(DType::i32, {2}, huge);
      expect_every_target_matches(testing::random_normal(rng, dtype, h.shape, 3.0), h);
    }
}

// Uniform values in [-4, 4), written as raw dtype bits (fast enough for 8M elements).
Tensor random_uniform_bits(testing::SeededRng& rng, DType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  const auto n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(rng.engine()() >> 40) * 0x1p-21f - 4.0f;
    if (dtype == DType::f32) {
      std::memcpy(t.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = dtype == DType::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
      std::memcpy(t.data() + 2 * i, &h, 2);
    }
  }
  return t;
}

// Outputs of 16 MiB and more take the kernel's streaming stores (rows of 130 features,
// so both aligned and unaligned vectors occur). The oracle checks the first and last
// head (rope is per row, so a head alone is a complete problem), and every target must
// give the same bits for the whole output.
TEST(SimdRope, LargeOutputsTakingStreamingStoresStayWithinTheBound) {
  KVLAB_SEEDED_RNG(rng, 2718);
  ReferenceBackend ref;
  SimdBackend simd;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const bool traditional : {false, true}) {
      const std::int64_t heads = dtype == DType::f32 ? 8 : 16, seq = 4096, d = 130;
      RopeParams p;
      p.dims = 128;
      p.traditional = traditional;
      p.base = 500000.0f;
      Offsets off;
      off.scalar = 77;
      const Tensor x = random_uniform_bits(rng, dtype, {1, heads, seq, d});
      ASSERT_GE(x.nbytes(), std::size_t{16} << 20);
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (traditional ? " traditional" : ""));
      std::optional<Tensor> first;
      testing::for_each_simd_target([&](const std::string&) {
        const Tensor got = run_rope(simd, x, p, off, std::nullopt);
        if (first) {
          EXPECT_EQ(std::memcmp(got.data(), first->data(), got.nbytes()), 0) << "differs from the first target";
          return;
        }
        first = got;
        const std::size_t head_bytes = static_cast<std::size_t>(seq * d) * dtype_size(dtype);
        for (const std::int64_t h : {std::int64_t{0}, heads - 1}) {
          Tensor xh(dtype, {1, 1, seq, d}), gh(dtype, {1, 1, seq, d});
          std::memcpy(xh.data(), x.data() + static_cast<std::size_t>(h) * head_bytes, head_bytes);
          std::memcpy(gh.data(), got.data() + static_cast<std::size_t>(h) * head_bytes, head_bytes);
          EXPECT_TRUE(within_bound(xh, gh, run_rope(ref, xh, p, off, std::nullopt), p.dims, traditional))
              << "head " << h;
        }
      });
    }
}

// So many batch rows that one position's table exceeds the kernel's window budget: the
// window shrinks to single positions.
TEST(SimdRope, ManyBatchRowsWithTinyWindowsStayWithinTheBound) {
  KVLAB_SEEDED_RNG(rng, 77);
  Problem k{{1100, 1, 3, 256}, {}, {}, std::nullopt};
  k.params.dims = 256;
  k.params.base = 10000.0f;
  std::vector<std::int64_t> o;
  for (int b = 0; b < 1100; ++b) o.push_back(rng.integer(-100, 100000));
  k.per_row = Tensor::from_ints(DType::i32, {1100}, o);
  expect_every_target_matches(testing::random_normal(rng, DType::bf16, k.shape, 1.0), k);
}

// NaN/inf inputs rotate to the oracle's NaN/inf; NaN/inf positions (scale) give NaN
// like the oracle's cos/sin; NaN payloads past dims are copied bit for bit.
TEST(SimdRope, NonFiniteValuesAndPositionsFollowTheOracle) {
  KVLAB_SEEDED_RNG(rng, 31337);
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const bool traditional : {false, true})
      for (const float scale : {1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        Problem k{{2, 2, 70, 40}, {}, {}, std::nullopt};
        k.params.dims = 32;
        k.params.traditional = traditional;
        k.params.scale = scale;
        k.offsets.scalar = 5;
        Tensor x = testing::random_normal(rng, dtype, k.shape, 1.0);
        const TensorView v = x.view();
        const float inf = std::numeric_limits<float>::infinity();
        for (std::int64_t r = 0; r < x.numel() / 40; r += 7) {
          v.store(r * 40 + 3, std::numeric_limits<float>::quiet_NaN());
          v.store(r * 40 + 11, r % 2 ? inf : -inf);
        }
        // Signalling-NaN-like payloads in the copied tail (f32: 0x7F800001, 16-bit: 0x7C01/0x7F81).
        for (std::int64_t r = 0; r < x.numel() / 40; ++r) {
          std::byte* tail = x.data() + static_cast<std::size_t>(r * 40 + 36) * dtype_size(dtype);
          if (dtype == DType::f32) {
            const std::uint32_t snan = 0x7F800001u;
            std::memcpy(tail, &snan, 4);
          } else {
            const std::uint16_t snan = dtype == DType::f16 ? 0x7C01u : 0x7F81u;
            std::memcpy(tail, &snan, 2);
          }
        }
        expect_every_target_matches(x, k);
      }
}

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
  for (const auto& [what, call] : bad) testing::expect_same_error([&] { call(ref); }, [&] { call(simd); }, what);
}

}  // namespace
}  // namespace kvlab
