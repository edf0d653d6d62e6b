// SIMD mxfp4 / mxfp8 / nvfp4 == the oracle, bit for bit (codes, scale codes, dequantized
// values), on every attainable Highway target, plus the oracle's errors for bad input.
//
// The special-value rows put an anchor element in each group that pins the group scale
// to 1 (amax 6 for fp4, 448 for fp8), so the other elements reach the element encoders
// unchanged: every E2M1 threshold and tie, every E4M3 code's value and the midpoints to
// its neighbours (the ties), ±1 ulp around each, zeros, f32 subnormals, saturation and
// NaN. Other groups vary the scale itself (tiny, huge, zero, non-finite amax),
// and nvfp4 runs with global scales that push (w·enc)/s to 2^40 (where the CPU argmin's
// f32 distances tie) and to subnormal scales. Random rows of many shapes and spreads, and
// an empty batch axis, are lines of harness/cases/fp_quantize/ci and fp_dequantize/ci (run
// on every target by harness.check_ci_host).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "kernels/simd/simd_backend.h"
#include "reference/fp_quantize.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_fp_quantize {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::array<DType, 3> kFloatDtypes = {DType::f32, DType::f16, DType::bf16};

struct Quantized {
  Tensor wq, scales;
};

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

Quantized quantize_on(Backend& be, const Tensor& x, const QuantSpec& spec, Rounding rounding,
                      std::optional<float> global_scale) {
  const std::int64_t d = x.dim(-1);
  const DTensor wq = be.allocate(DType::u32, with_last(x.shape(), spec.packed_words(d)));
  const DTensor sc = be.allocate(DType::u8, with_last(x.shape(), spec.groups(d)));
  be.fill(wq, 0xDEADBEEFu);  // poisoned, so an unwritten word cannot match by luck
  be.fill(sc, 0xA5u);
  be.quantize({be.upload(x), rounding, {wq, sc, {}, spec, global_scale}});
  return {be.download(wq), be.download(sc)};
}

Tensor dequantize_on(Backend& be, const Quantized& q, const QuantSpec& spec, std::optional<float> global_scale,
                     DType out_dtype) {
  const DTensor out = be.allocate(out_dtype, with_last(q.wq.shape(), q.wq.dim(-1) * 32 / spec.bits));
  be.fill(out, 0x7FC00001u);
  be.dequantize({{be.upload(q.wq), be.upload(q.scales), {}, spec, global_scale}, out});
  return be.download(out);
}

// The values whose encoding the special rows exercise, for scale 1: the exact
// representable values, the midpoints between neighbours (ties) and the floats on either
// side of each, plus zeros, f32 subnormals, saturation and non-finite values.
std::vector<float> probe_values(QuantMode mode) {
  std::vector<float> grid;
  if (mode == QuantMode::mxfp8) {
    for (int c = 0; c < 0x7F; ++c) grid.push_back(ref::e4m3_decode(static_cast<std::uint8_t>(c)));  // 0 … 448
    // Past the max (saturation), below 448·√2 so that the scale stays 1.
    for (const float v : {464.0f, 480.0f, 600.0f}) grid.push_back(v);
  } else {
    for (int c = 0; c < 8; ++c) grid.push_back(ref::e2m1_decode(static_cast<std::uint8_t>(c)));  // 0 … 6
    // Past the max (saturation), below the amax that would move the scale off 1:
    // 6·√2 for E8M0; 6·(1 + 1/16) for nvfp4's E4M3 scale.
    if (mode == QuantMode::mxfp4) grid.insert(grid.end(), {7.0f, 8.4f});
    else grid.insert(grid.end(), {6.25f, 6.3f});
  }
  std::vector<float> out;
  for (std::size_t i = 0; i < grid.size(); ++i) {
    std::vector<float> points = {grid[i]};
    if (i + 1 < grid.size()) points.push_back(0.5f * (grid[i] + grid[i + 1]));  // the tie
    for (const float p : points) {
      for (const float v : {p, std::nextafter(p, 0.0f), std::nextafter(p, kInf)}) {
        out.push_back(v);
        out.push_back(-v);
      }
    }
  }
  for (const float v : {0.0f, -0.0f, 1e-40f, -1e-40f, 0x1p-149f, 0x1p-126f, 1e-10f, 0x1p-10f, 0x1p-9f, 0x1p-7f,
                        kNaN, -kNaN}) {
    out.push_back(v);
  }
  return out;
}

// Rows of D values: groups whose first element is the anchor (scale 1) followed by probe
// values, then groups that move the scale: all zeros, tiny, huge, a NaN amongst normals,
// ±inf, a single subnormal, and random normals.
Tensor special_rows(testing::SeededRng& rng, DType dtype, QuantMode mode, std::int64_t rows, std::int64_t d) {
  const int gs = mode == QuantMode::nvfp4 ? 16 : 32;
  const float anchor = mode == QuantMode::mxfp8 ? 448.0f : 6.0f;
  const std::vector<float> probes = probe_values(mode);
  std::vector<float> values;
  std::size_t next_probe = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < d / gs; ++g) {
      const std::int64_t kind = (r * (d / gs) + g) % 12;
      for (int j = 0; j < gs; ++j) {
        const auto z = static_cast<float>(rng.normal());
        float v = z;
        if (kind < 5) {
          v = j == 0 ? anchor : probes[next_probe++ % probes.size()];
        } else if (kind == 5) {
          v = j % 2 ? 0.0f : -0.0f;
        } else if (kind == 6) {
          v = z * 1e-39f;  // amax in the subnormals: the smallest E8M0/E4M3 scales
        } else if (kind == 7) {
          v = z * 3e37f;  // amax near FLT_MAX: the largest scales, saturation
        } else if (kind == 8) {
          v = j == 7 ? kNaN : z;  // NaN is skipped by amax and encoded alone
        } else if (kind == 9) {
          v = j == 3 ? (r % 2 ? kInf : -kInf) : z;  // inf amax: mx scale 0xFF, nvfp4 448
        } else if (kind == 10) {
          v = j == 1 ? 0x1p-140f : 0.0f;
        }
        values.push_back(v);
      }
    }
  }
  return Tensor::from_values(dtype, {rows, d}, values);
}

class SimdFp : public ::testing::Test {
 protected:
  // Quantizes x on both backends and on every target; the codes, scale codes and the
  // dequantized values (in every float dtype) must be the oracle's bits.
  void expect_oracle_bits(const Tensor& x, const QuantSpec& spec, Rounding rounding, std::optional<float> gscale) {
    const Quantized want = quantize_on(ref_, x, spec, rounding, gscale);
    std::vector<Tensor> want_deq;
    for (const DType t : kFloatDtypes) want_deq.push_back(dequantize_on(ref_, want, spec, gscale, t));
    testing::for_each_simd_target([&](const std::string&) {
      const Quantized got = quantize_on(simd_, x, spec, rounding, gscale);
      EXPECT_TRUE(testing::bit_equal(got.wq, want.wq)) << "codes";
      EXPECT_TRUE(testing::bit_equal(got.scales, want.scales)) << "scale codes";
      for (std::size_t i = 0; i < kFloatDtypes.size(); ++i) {
        const Tensor got_deq = dequantize_on(simd_, want, spec, gscale, kFloatDtypes[i]);
        EXPECT_TRUE(testing::bit_equal(got_deq, want_deq[i])) << "dequantize to " << dtype_name(kFloatDtypes[i]);
      }
    });
  }

  ReferenceBackend ref_;
  SimdBackend simd_;
};

TEST_F(SimdFp, SpecialValuesMatchTheOracleBitForBitOnEveryTarget) {
  KVLAB_SEEDED_RNG(rng, 7311);
  int configs = 0;
  for (const QuantMode mode : {QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4})
    for (const Rounding rounding : {Rounding::mlx_cpu, Rounding::mlx_gpu})
      for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        const QuantSpec spec = QuantSpec::make(mode);
        // nvfp4: no global scale, MLX's (the tensor amax), and two that move enc·w/s
        // far from [−6, 6]: tiny (s saturates at 448, (w·enc)/s up to ~2^40) and huge
        // (subnormal E4M3 scales, or zero scales).
        std::vector<std::optional<float>> gscales = {std::nullopt};
        if (mode == QuantMode::nvfp4) gscales = {std::nullopt, 448.0f, 1e-9f, 3e30f, 0.0f};
        for (const std::optional<float> g : gscales) {
          const Tensor x = special_rows(rng, dtype, mode, 24, 256);
          SCOPED_TRACE(::testing::Message() << quant_mode_name(mode) << " " << rounding_name(rounding) << " "
                                            << dtype_name(dtype) << " global_scale " << (g ? *g : -1.0f));
          expect_oracle_bits(x, spec, rounding, g);
          if (::testing::Test::HasFailure()) return;  // one failing config is enough output
          ++configs;
        }
      }
  EXPECT_EQ(configs, (2 + 2 + 10) * 3);
}

// Every element code under every scale code: dequantize is a total function of the
// stored bits, so it is checked exhaustively (E8M0 0 → 2^-127 and 0xFF → inf included,
// E4M3 0x7F → 480, inf·0 → NaN), into every float dtype, with and without nvfp4's
// global scale.
TEST_F(SimdFp, DequantizeOfEveryCodeUnderEveryScaleMatchesTheOracle) {
  int configs = 0;
  for (const QuantMode mode : {QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4}) {
    const QuantSpec spec = QuantSpec::make(mode);
    const int codes = 1 << spec.bits;
    // Per scale code one row holding every element code (repeated to fill whole groups).
    const std::int64_t d = std::max(codes, spec.group_size);
    std::vector<std::int64_t> words, scale_codes;
    for (int s = 0; s < 256; ++s) {
      // Code of element i: (i + s) mod 2^bits, packed LSB first (reference/bitpack.h).
      const std::int64_t per_word = 32 / spec.bits;
      for (std::int64_t i = 0; i < d; i += per_word) {
        std::uint32_t w = 0;
        for (std::int64_t k = 0; k < per_word; ++k) {
          w |= static_cast<std::uint32_t>((i + k + s) % codes) << (k * spec.bits);
        }
        words.push_back(w);
      }
      for (std::int64_t g = 0; g < d / spec.group_size; ++g) scale_codes.push_back(s);
    }
    const Quantized q{Tensor::from_ints(DType::u32, {256, d * spec.bits / 32}, words),
                      Tensor::from_ints(DType::u8, {256, d / spec.group_size}, scale_codes)};
    std::vector<std::optional<float>> gscales = {std::nullopt};
    if (mode == QuantMode::nvfp4) gscales = {std::nullopt, 1.0f, 5e-3f, 7e4f};
    for (const std::optional<float> g : gscales)
      for (const DType t : {DType::f32, DType::f16, DType::bf16}) {
        SCOPED_TRACE(::testing::Message() << quant_mode_name(mode) << " to " << dtype_name(t));
        const Tensor want = dequantize_on(ref_, q, spec, g, t);
        testing::for_each_simd_target(
            [&](const std::string&) { EXPECT_TRUE(testing::bit_equal(dequantize_on(simd_, q, spec, g, t), want)); });
        ++configs;
      }
  }
  EXPECT_EQ(configs, (1 + 1 + 4) * 3);
}

// Outputs of 1 MiB or more take streaming stores (fp_quantize.cc kStreamBytes): every
// element code under 64 scale codes, the rows repeated to 1 MiB of bf16 (2 MiB of f32),
// bit for bit on every target.
TEST_F(SimdFp, LargeDequantizedOutputsAreStreamedBitForBit) {
  for (const QuantMode mode : {QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4}) {
    const QuantSpec spec = QuantSpec::make(mode);
    const int codes = 1 << spec.bits;
    const std::int64_t d = std::max(codes, spec.group_size), per_word = 32 / spec.bits;
    const std::int64_t rows = (std::int64_t{1} << 20) / (2 * d);
    std::vector<std::int64_t> words, scale_codes;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t s = 96 + r % 64;  // E8M0 2^-31 … 2^32; E4M3 scales 0.5 … 3.75
      for (std::int64_t i = 0; i < d; i += per_word) {
        std::uint32_t w = 0;
        for (std::int64_t k = 0; k < per_word; ++k) w |= static_cast<std::uint32_t>((i + k + r) % codes) << (k * spec.bits);
        words.push_back(w);
      }
      for (std::int64_t g = 0; g < d / spec.group_size; ++g) scale_codes.push_back(s);
    }
    const Quantized q{Tensor::from_ints(DType::u32, {rows, d * spec.bits / 32}, words),
                      Tensor::from_ints(DType::u8, {rows, d / spec.group_size}, scale_codes)};
    for (const DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(::testing::Message() << quant_mode_name(mode) << " to " << dtype_name(t));
      const Tensor want = dequantize_on(ref_, q, spec, std::nullopt, t);
      testing::for_each_simd_target([&](const std::string&) {
        EXPECT_TRUE(testing::bit_equal(dequantize_on(simd_, q, spec, std::nullopt, t), want));
      });
    }
  }
}

// Every bf16 pattern from 20 binades below a group's amax up to it (E4M3's subnormals
// included; both signs, and the subnormal bf16 patterns), under amaxes that put the group
// scale across the E8M0 range and its ends (nvfp4: every E4M3 scale), in groups led by
// that amax: the AVX2/SSE4 mx encoders that work on the stored bf16 bits (fp_quantize.cc
// E2M1CpuOfBF16, E4M3OfBF16) meet every threshold, tie, binade carry, E4M3 subnormal and
// exponent offset here, bit for bit with the oracle.
TEST_F(SimdFp, Bf16PatternsUnderScalesAcrossTheRangeMatchTheOracle) {
  const auto bf16_value = [](std::uint32_t pattern) { return std::bit_cast<float>(pattern << 16); };
  for (const QuantMode mode : {QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4}) {
    const QuantSpec spec = QuantSpec::make(mode);
    const auto gs = static_cast<std::size_t>(spec.group_size);
    std::vector<float> amaxes;
    if (mode == QuantMode::nvfp4) {
      for (int c = 1; c < 0x7F; ++c) amaxes.push_back(6.0f * ref::e4m3_decode(static_cast<std::uint8_t>(c)));
    } else {
      const float top = mode == QuantMode::mxfp8 ? 448.0f : 6.0f;
      for (int k = -134; k <= 127; ++k) {
        if (k > -118 && k < -4 && k % 16 != 0) continue;  // the middle of the range sampled
        if (k > 4 && k < 110 && k % 16 != 0) continue;
        const double a = std::ldexp(static_cast<double>(top), k);
        if (a < 0x1p-133 || a > 0x1.FEp127) continue;  // a bf16 value, subnormals included
        amaxes.push_back(static_cast<float>(a));
      }
    }
    std::vector<float> values;
    for (const float amax : amaxes) {
      const std::uint32_t top = std::bit_cast<std::uint32_t>(amax) >> 16;
      std::vector<float> probes;
      for (std::uint32_t p = 0; p <= top; ++p) {
        if (p > 0x100 && p + 20 * 128 < top) continue;
        probes.push_back(bf16_value(p));
        probes.push_back(-bf16_value(p));
      }
      for (std::size_t i = 0; i < probes.size(); i += gs - 1) {
        values.push_back(i / (gs - 1) % 2 ? -amax : amax);  // the group's amax, either sign
        for (std::size_t j = i; j < i + gs - 1; ++j) {
          values.push_back(j < probes.size() ? probes[j] : 0.0f);
        }
      }
    }
    const std::size_t d = 8 * gs;
    while (values.size() % d != 0) values.push_back(0.0f);
    const auto rows = static_cast<std::int64_t>(values.size() / d);
    const Tensor x = Tensor::from_values(DType::bf16, {rows, static_cast<std::int64_t>(d)}, values);
    SCOPED_TRACE(::testing::Message() << quant_mode_name(mode) << " mlx_cpu bf16, " << rows << " rows");
    expect_oracle_bits(x, spec, Rounding::mlx_cpu, std::nullopt);
    if (::testing::Test::HasFailure()) return;
  }
}

// Hand-derived pins of what the bulk tests cover (so the oracle itself is not the only
// witness): scale 1 groups, element codes read off the LUT by the contract's rules.
TEST_F(SimdFp, TiesFollowEachRoundingsRule) {
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;    // anchor: amax 6 → E8M0 127, scale 1
  x[1] = 0.75f;   // tie 0.5 | 1: gpu → 1.0 (even), cpu → 0.5 (lower index)
  x[2] = -0.1f;   // cpu → +0 (code 0), gpu → −0 (code 8)
  x[3] = 2.5f;    // tie 2 | 3: gpu → 2 (even code 4), cpu → 2 (lower index)
  x[4] = 5.0f;    // tie 4 | 6: gpu → 4 (code 6), cpu → 4
  x[5] = kNaN;    // gpu → 7, cpu → 0
  const Tensor t = Tensor::from_values(DType::f32, {1, 32}, x);
  const QuantSpec spec = QuantSpec::make(QuantMode::mxfp4);
  const std::vector<std::uint8_t> gpu = {7, 2, 8, 4, 6, 7}, cpu = {7, 1, 0, 4, 6, 0};
  testing::for_each_simd_target([&](const std::string&) {
    for (const Rounding rounding : {Rounding::mlx_gpu, Rounding::mlx_cpu}) {
      const Quantized got = quantize_on(simd_, t, spec, rounding, std::nullopt);
      const auto words = got.wq.to_ints();
      const auto& want = rounding == Rounding::mlx_gpu ? gpu : cpu;
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ((words[0] >> (4 * i)) & 0xF, want[i]) << rounding_name(rounding) << " element " << i;
      }
      EXPECT_EQ(got.scales.to_ints()[0], 127);
    }
  });
}

TEST_F(SimdFp, InvalidInputRaisesTheOraclesErrors) {
  const QuantSpec mx = QuantSpec::make(QuantMode::mxfp4), nv = QuantSpec::make(QuantMode::nvfp4);
  QuantSpec mx_bits8 = mx, mx_group64 = mx;
  mx_bits8.bits = 8;
  mx_group64.group_size = 64;
  const QuantSpec affine = QuantSpec::make(QuantMode::affine);
  struct Bad {
    const char* what;
    DType x_dtype;
    Shape x_shape;
    QuantSpec spec;
    std::optional<float> g;
    DType wq_dtype;
    Shape wq_shape;
    DType sc_dtype;
    Shape sc_shape;
  };
  const std::vector<Bad> bad = {
      {"affine spec", DType::f32, {2, 64}, affine, {}, DType::u32, {2, 8}, DType::u8, {2, 2}},
      {"mxfp4 bits 8", DType::f32, {2, 64}, mx_bits8, {}, DType::u32, {2, 16}, DType::u8, {2, 2}},
      {"mxfp4 group 64", DType::f32, {2, 64}, mx_group64, {}, DType::u32, {2, 8}, DType::u8, {2, 1}},
      {"global scale on mx", DType::f32, {2, 64}, mx, 1.0f, DType::u32, {2, 8}, DType::u8, {2, 2}},
      {"global scale inf", DType::f32, {2, 64}, nv, kInf, DType::u32, {2, 8}, DType::u8, {2, 4}},
      {"global scale NaN", DType::f32, {2, 64}, nv, kNaN, DType::u32, {2, 8}, DType::u8, {2, 4}},
      {"int x", DType::i32, {2, 64}, mx, {}, DType::u32, {2, 8}, DType::u8, {2, 2}},
      {"rank 0", DType::f32, {}, mx, {}, DType::u32, {}, DType::u8, {}},
      {"D % group", DType::f32, {2, 48}, mx, {}, DType::u32, {2, 6}, DType::u8, {2, 1}},
      {"D = 0", DType::f32, {2, 0}, mx, {}, DType::u32, {2, 0}, DType::u8, {2, 0}},
      {"wq dtype", DType::f32, {2, 64}, mx, {}, DType::i32, {2, 8}, DType::u8, {2, 2}},
      {"wq shape", DType::f32, {2, 64}, mx, {}, DType::u32, {2, 7}, DType::u8, {2, 2}},
      {"scales dtype", DType::f32, {2, 64}, mx, {}, DType::u32, {2, 8}, DType::f32, {2, 2}},
      {"scales shape", DType::f32, {2, 64}, mx, {}, DType::u32, {2, 8}, DType::u8, {2, 3}},
  };
  for (const Bad& b : bad) {
    auto call = [&](Backend& be) {
      be.quantize({be.allocate(b.x_dtype, b.x_shape), Rounding::mlx_cpu, {be.allocate(b.wq_dtype, b.wq_shape), be.allocate(b.sc_dtype, b.sc_shape), {}, b.spec, b.g}});
    };
    testing::expect_same_error([&] { call(ref_); }, [&] { call(simd_); }, b.what);
  }
  struct BadDq {
    const char* what;
    QuantSpec spec;
    std::optional<float> g;
    DType wq_dtype;
    Shape wq_shape;
    DType sc_dtype;
    Shape sc_shape;
    DType out_dtype;
    Shape out_shape;
  };
  const std::vector<BadDq> bad_dq = {
      {"affine spec", affine, {}, DType::u32, {2, 8}, DType::u8, {2, 2}, DType::f32, {2, 64}},
      {"global scale on mx", mx, 2.0f, DType::u32, {2, 8}, DType::u8, {2, 2}, DType::f32, {2, 64}},
      {"wq dtype", mx, {}, DType::i32, {2, 8}, DType::u8, {2, 2}, DType::f32, {2, 64}},
      {"scales dtype", mx, {}, DType::u32, {2, 8}, DType::f16, {2, 2}, DType::f32, {2, 64}},
      {"out dtype", mx, {}, DType::u32, {2, 8}, DType::u8, {2, 2}, DType::u8, {2, 64}},
      {"rank 0", mx, {}, DType::u32, {}, DType::u8, {}, DType::f32, {}},
      {"leading axes", mx, {}, DType::u32, {2, 8}, DType::u8, {3, 2}, DType::f32, {2, 64}},
      {"scales rank", mx, {}, DType::u32, {2, 8}, DType::u8, {2, 1, 2}, DType::f32, {2, 64}},
      {"words vs groups", mx, {}, DType::u32, {2, 8}, DType::u8, {2, 3}, DType::f32, {2, 64}},
      {"out shape", nv, {}, DType::u32, {2, 8}, DType::u8, {2, 4}, DType::f32, {2, 32}},
  };
  for (const BadDq& b : bad_dq) {
    auto call = [&](Backend& be) {
      be.dequantize({{be.allocate(b.wq_dtype, b.wq_shape), be.allocate(b.sc_dtype, b.sc_shape), {}, b.spec, b.g}, be.allocate(b.out_dtype, b.out_shape)});
    };
    testing::expect_same_error([&] { call(ref_); }, [&] { call(simd_); }, b.what);
  }
}

}  // namespace
}  // namespace test_simd_fp_quantize
}  // namespace kvlab
