// What the SIMD attention kernels declare about their arithmetic per call
// (simd::last_attention_mix): the dense multiply-adds of the decode kernel by the
// instruction that carried them, which the benchmarks' arithmetic floor divides by the
// same run's rate of each instruction (tools/bench_table.py). Expected lanes come from the
// shape and the documented path choice of each target (kernels/simd/quantized_decode.cc):
// q·k needs R·Dk products per key and p·v R·Dv (R query rows per kv head); an f32 FMA lane
// does one, a vdpbf16ps lane two (the V side pairs keys within a chunk, an odd chunk's
// last key with zeros), a vpdpbusd lane four for each of the integer K side's three q
// digits (keys in tiles of 16), a vpdpwssd lane two (the integer V side's key pairs). A
// wrong declaration misplaces a row's roofline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/simd/quantized_decode.h"
#include "kernels/simd/simd_kernels.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/quantized_attention_inputs.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_attention_mix {
namespace {

using testing::AttentionDims;

std::string describe(const simd::ArithmeticMix& m) {
  return cat("fma ", m.fma, ", bf16 dot ", m.bf16_dot, ", u8 dot ", m.u8_dot, ", amx int8 ", m.amx_int8, ", s16 dot ",
             m.s16_dot, ", s16 madd ", m.s16_madd);
}

void expect_mix(const simd::ArithmeticMix& want, const std::string& what) {
  const simd::ArithmeticMix got = simd::last_attention_mix();
  EXPECT_TRUE(got.fma == want.fma && got.bf16_dot == want.bf16_dot && got.u8_dot == want.u8_dot &&
              got.amx_int8 == want.amx_int8 && got.s16_dot == want.s16_dot &&
              got.s16_madd == want.s16_madd)
      << what << ": declared " << describe(got) << ", expected " << describe(want);
}

void run_sdpa(testing::SeededRng& rng, DType dtype, const AttentionDims& s) {
  const Tensor q = testing::random_normal(rng, dtype, {s.B, s.Hq, s.Lq, s.Dk});
  const Tensor k = testing::random_normal(rng, dtype, {s.B, s.Hkv, s.Lk, s.Dk});
  const Tensor v = testing::random_normal(rng, dtype, {s.B, s.Hkv, s.Lk, s.Dv});
  Tensor out(dtype, {s.B, s.Hq, s.Lq, s.Dv});
  AttentionParams params;
  params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.Dk)));
  simd::sdpa(q.view(), k.view(), v.view(), params, nullptr, nullptr, out.view());
}

// Σ over the chunks of the decode of s of ⌈keys/n⌉·n (n = 2: the bf16 V side's key pairs;
// 16: the integer K side's tiles).
std::int64_t padded_keys(const AttentionDims& s, std::int64_t n) {
  const std::int64_t chunk = simd::qdecode::chunk_tokens(s.B, s.Hkv, s.Lk, s.Hq / s.Hkv * s.Lq);
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < s.Lk; j += chunk) total += (std::min(chunk, s.Lk - j) + n - 1) / n * n;
  return total;
}

class SimdAttentionMix : public ::testing::Test {};

TEST_F(SimdAttentionMix, DecodeDeclaresItsMultiplyAddsByInstructionPerCall) {
  KVLAB_SEEDED_RNG(rng, 5150);
  // 2 kv heads of 4 query rows; Lk 1001 = chunks of 512 and 489 keys (an odd one).
  const AttentionDims s{1, 8, 2, 1, 1001, 64, 128};
  const std::int64_t heads = s.B * s.Hkv, R = s.Hq / s.Hkv;
  const simd::ArithmeticMix all_fma{heads * R * s.Lk * (s.Dk + s.Dv), 0, 0};
  testing::for_each_simd_target([&](const std::string& target) {
    const bool avx512 = target == "AVX3" || target == "AVX3_DL";
    run_sdpa(rng, DType::f16, s);
    expect_mix(all_fma, "f16 decode");
    // bf16 q, K and V with a bf16 output: vdpbf16ps on both sides where the CPU has it.
    const simd::ArithmeticMix bf16_dots{0, heads * R * (s.Lk * s.Dk / 2 + padded_keys(s, 2) / 2 * s.Dv), 0};
    const bool dots = avx512 && simd::qdecode::bf16_dot_available();
    run_sdpa(rng, DType::bf16, s);
    expect_mix(dots ? bf16_dots : all_fma, "bf16 decode, the CPU's default path");
    if (simd::qdecode::bf16_dot_supported()) {
      for (const bool on : {false, true}) {
        const simd::qdecode::ScopedBf16Dot forced(on);
        run_sdpa(rng, DType::bf16, s);
        expect_mix(on && avx512 ? bf16_dots : all_fma, on ? "bf16 decode, dot path" : "bf16 decode, f32 path");
      }
    }
    // 12 query positions (48 rows per kv head): the general kernel, which declares nothing
    // (its floor counts the op's products as FMAs); the previous call's mix is gone.
    run_sdpa(rng, DType::f16, {1, 8, 2, 12, 600, 64, 64});
    expect_mix({}, "general kernel after a decode");

    // 4-bit K and V, f16 output: the integer K side on AVX3_DL (Lk >= 768) and the integer
    // V side on AVX3_DL and AVX2 (groups of 64; switched on, as by default on AMD), f32
    // elsewhere.
    const simd::qdecode::ScopedPackedIntValues packed_v(true);
    testing::QuantizedAttentionInputs in = testing::random_inputs(
        rng, s, DType::f16, testing::affine(4, 64), testing::affine(4, 64), DType::f16, DType::f16);
    Tensor out(DType::f16, {s.B, s.Hq, s.Lq, s.Dv});
    simd::quantized_sdpa(in.q.view(), testing::view_of(in.k), testing::view_of(in.v), in.params, nullptr, nullptr,
                         out.view());
    // The V side in integers too there (vpdpwssd: Dv lanes a key pair).
    const std::int64_t v_pairs = heads * R * padded_keys(s, 2) / 2 * s.Dv;
    const simd::ArithmeticMix integer_k{0, 0, heads * R * padded_keys(s, 16) * 3 * s.Dk / 4, 0, v_pairs};
    // With AMX the K side's products are tile multiplies: per key of the 16-key tiles,
    // each block of 4 rows' 12 A rows (row, q digit) times Dk/4 dwords.
    const simd::ArithmeticMix tile_k{0, 0, 0, heads * padded_keys(s, 16) * ((R + 3) / 4) * 12 * (s.Dk / 4),
                                     v_pairs};
    // AVX2: the K side in f32, the V side by vpmaddwd + vpaddd (the same lanes).
    simd::ArithmeticMix madd_v{heads * R * s.Lk * s.Dk, 0, 0};
    madd_v.s16_madd = v_pairs;
    const bool avx3_dl = target == "AVX3_DL";
    expect_mix(avx3_dl            ? (simd::qdecode::amx_available() ? tile_k : integer_k)
               : target == "AVX2" ? madd_v
                                  : all_fma,
               "4-bit quantized decode");
  });
}

// The vdpbf16ps K side multiplies the stored bf16 queries and scales the scores after;
// a query holding a NaN or an infinity (or one whose product with the scale could
// overflow) takes the f32 K side instead, whose NaN/inf semantics the oracle's are
// (quantized_sdpa.cc bf16_queries). The choice shows in the K side's declared lanes.
TEST_F(SimdAttentionMix, Bf16DecodeWithANonFiniteQueryScoresInF32) {
  if (!simd::qdecode::bf16_dot_available()) GTEST_SKIP() << "the CPU's default bf16 decode is the f32 path";
  KVLAB_SEEDED_RNG(rng, 5151);
  const AttentionDims s{1, 8, 2, 1, 600, 64, 64};
  const std::int64_t k_side = s.B * s.Hq * s.Lq * s.Lk * s.Dk;  // f32 FMA lanes of an f32 K side
  for (const float special : {0.5f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    const Tensor k = testing::random_normal(rng, DType::bf16, {s.B, s.Hkv, s.Lk, s.Dk});
    const Tensor v = testing::random_normal(rng, DType::bf16, {s.B, s.Hkv, s.Lk, s.Dv});
    Tensor q = testing::random_normal(rng, DType::bf16, {s.B, s.Hq, s.Lq, s.Dk});
    q.view().store(3 * s.Dk + 17, special);  // one element of query head 3
    Tensor out(DType::bf16, {s.B, s.Hq, s.Lq, s.Dv});
    AttentionParams params;
    params.scale = 0.125f;
    simd::sdpa(q.view(), k.view(), v.view(), params, nullptr, nullptr, out.view());
    const bool finite = std::isfinite(special);
    EXPECT_EQ(simd::last_attention_mix().fma, finite ? 0 : k_side) << "one query element " << special;
  }
}

}  // namespace
}  // namespace test_simd_attention_mix
}  // namespace kvlab
