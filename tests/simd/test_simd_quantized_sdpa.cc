// SIMD quantized_sdpa: what the harness cannot state as a case line. Its comparisons with
// the oracle (affine widths and groups, GQA, head dims, mixed K/V specs and scale dtypes,
// chunk counts, windows and paddings over poisoned scales, mask arrays, sinks, softcap,
// fully masked rows, the fp modes decoded per chunk or unfused) are lines of harness/cases/quantized_sdpa/,
// run on every Highway target by the harness.check_ci_host test under the one
// tolerance object of harness/ops/sdpa_info.cc. Here, on every attainable target: the
// decode chunk size (a test hook, not a problem parameter) swept from one key per chunk
// to one chunk for all, through harness lines; one key giving the dequantized values
// rounded once (bit-exact, with rounding ties, f16 overflow and a NaN group); ggml blocks
// with an infinite scale; mxfp4's E2M1 bytes and its largest scales; the formats decoded a
// chunk at a time; the chunk rule;
// thread independence; the integer V side's
// certificate; the AMX K side against the vpdpbusd one; the softmax's exp against Highway's; the oracle's errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"
#include "kernels/simd/simd_backend.h"
#ifdef KVLAB_TEST_WITH_HARNESS
#include "harness/problem.h"
#include "harness/spine.h"
#endif
#include "kernels/simd/simd_kernels.h"
#include "reference/affine_quantize.h"
#include "reference/bitpack.h"
#include "reference/fp_quantize.h"
#include "reference/ggml_quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/reference_backend.h"
#include "tests/simd/simd_test_util.h"
#include "tests/unit/quantized_attention_inputs.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_simd_quantized_sdpa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using ref::QuantizedTensor;
using qchunk = simd::qdecode::ScopedChunkTokens;

using testing::affine;
using testing::quantize;
using testing::dv_of;
using testing::random_inputs;
using testing::view_of;
using Inputs = testing::QuantizedAttentionInputs;
using Dims = testing::AttentionDims;

// Runs `kernel` (simd or ref quantized_sdpa) into an output poisoned with NaN, so an
// element it does not write fails.
template <class Kernel>
Tensor run(Kernel kernel, const Inputs& in) {
  Tensor out(in.q.dtype(), {in.q.dim(0), in.q.dim(1), in.q.dim(2), dv_of(in)});
  for (std::int64_t i = 0; i < out.numel(); ++i) out.view().store(i, kNaN);
  ConstTensorView mask, sinks;
  if (in.mask) mask = in.mask->view();
  if (in.sinks) sinks = in.sinks->view();
  kernel(in.q.view(), view_of(in.k), view_of(in.v), in.params, in.mask ? &mask : nullptr,
         in.sinks ? &sinks : nullptr, out.view());
  return out;
}
Tensor run_simd(const Inputs& in) { return run(simd::quantized_sdpa, in); }

// got against want where some outputs are ±inf or NaN: those (on either side) must match
// exactly, NaN for NaN; the finite ones within 2^-8 relative.
void expect_same_nonfinite_and_close(const Tensor& got, const Tensor& want) {
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const float w = want.view().load(i), g = got.view().load(i);
    if (!std::isfinite(w) || !std::isfinite(g)) {
      EXPECT_TRUE((std::isnan(w) && std::isnan(g)) || w == g) << "element " << i << ": " << g << " vs " << w;
    } else {
      EXPECT_NEAR(g, w, 0x1p-8f * (1.0f + std::abs(w))) << "element " << i;
    }
  }
}
// The largest scale code of an mx side (E8M0, one byte each).
int max_scale_code(const ref::QuantizedTensor& x) {
  int high = 0;
  for (const std::uint8_t code : x.scales.storage<std::uint8_t>()) high = std::max<int>(high, code);
  return high;
}

Tensor run_ref(const Inputs& in) {
  return run(static_cast<void (*)(const ConstTensorView&, const ref::QuantizedView&, const ref::QuantizedView&,
                                  const AttentionParams&, const ConstTensorView*, const ConstTensorView*,
                                  const TensorView&)>(ref::quantized_sdpa),
             in);
}

// |got − want| at most 2^-8 of the largest |want| (the integer V side's tests: an f16
// output and a side whose rounding the certificate keeps within half the tolerance).
void expect_within_largest(const Tensor& got, const Tensor& want) {
  float largest = 0, worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    largest = std::max(largest, std::abs(want.view().load(i)));
    worst = std::max(worst, std::abs(got.view().load(i) - want.view().load(i)));
  }
  EXPECT_LE(worst, 0x1p-8f * largest) << "largest |out| " << largest;
}

#ifdef KVLAB_TEST_WITH_HARNESS
// The harness runs at the chunk its shapes give (chunk_tokens: 512 keys for its lines of
// Lk 1, 100, 513 and 1500, which cover below one chunk, a tail and several chunks; up to
// 4096 for its long decodes). Smaller chunks, down to one key
// each, run the same harness lines here, each held to the harness's tolerance object:
// chunks change the f32 summation order, so they agree within it, not bitwise.
TEST(SimdQuantizedSdpa, EveryChunkSizeMatchesTheOracleThroughTheHarnessCases) {
  const std::vector<std::string> lines = {
      "quantized_sdpa B=2 Hq=4 Hkv=2 Lq=2 Lk=61 Dk=64 Dv=64 dtype=f32 kbits=8 kgroup=32 vbits=4 vgroup=32 mask=causal",
      // chunks wholly hidden, partly hidden and visible; the last batch row sees nothing
      "quantized_sdpa B=4 Hq=4 Hkv=2 Lq=3 Lk=45 Dk=64 Dv=64 dtype=f16 kdtype=bf16 vdtype=bf16 kbits=4 kgroup=32 "
      "vbits=8 vgroup=64 mask=causal window=5 lpad=30 rpad=15 sinks=1",
      "quantized_sdpa B=3 Hq=8 Hkv=2 Lq=2 Lk=40 Dk=64 Dv=64 dtype=bf16 kbits=4 kgroup=64 vbits=4 vgroup=32 "
      "mask=additive mask_dims=BH mask_dtype=f16 softcap=5 fully_masked=zero,mean_of_values",
  };
  ReferenceBackend ref;
  SimdBackend simd;
  for (const std::int64_t tokens : {1, 2, 7, 8, 16, 60, 61, 512}) {
    const qchunk chunk(tokens);
    SCOPED_TRACE(cat("chunk ", tokens));
    testing::for_each_simd_target([&](const std::string&) {
      for (const std::string& line : lines) {
        for (const harness::Problem& p : harness::expand_line(line)) {
          const harness::CaseResult r = harness::run_case(p, simd, ref, {});
          EXPECT_EQ(r.status, harness::Status::passed) << harness::describe(r);
        }
      }
    });
  }
}

// Large plain decodes read their chunks as four interleaved key streams where the CPU
// takes that order (quarter_order_available: one Intel Xeon model) and in order elsewhere; each order,
// forced, is held to the harness's tolerance at the size that takes it (K and V of 16
// MiB, above kQuarterMinBytes), on the best target (the order exists on the AVX-512 ones:
// kQuarterOrder; elsewhere both runs read in order).
TEST(SimdQuantizedSdpa, EitherKeyOrderOfALargeDecodeMatchesTheOracle) {
  const std::string line = "sdpa B=1 Hq=4 Hkv=1 Lq=1 Lk=32768 Dk=128 Dv=128 dtype=f32,f16 mask=none";
  ReferenceBackend ref;
  SimdBackend simd;
  for (const bool quarters : {true, false}) {
    const simd::qdecode::ScopedQuarterOrder order(quarters);
    SCOPED_TRACE(quarters ? "quarters" : "in order");
    for (const harness::Problem& p : harness::expand_line(line)) {
      const harness::CaseResult r = harness::run_case(p, simd, ref, {});
      EXPECT_EQ(r.status, harness::Status::passed) << harness::describe(r);
    }
  }
}

#endif

// Every chunk size >= Lk is the same single chunk: bit-identical.
TEST(SimdQuantizedSdpa, ChunkSizesOfAtLeastLkGiveTheSameBits) {
  KVLAB_SEEDED_RNG(rng, 4711);
  Inputs in = random_inputs(rng, {2, 4, 2, 2, 61, 64, 64}, DType::f32, affine(8, 32), affine(4, 32), DType::f32,
                            DType::f32);
  in.params.mask.kind = MaskKind::causal;
  testing::for_each_simd_target([&](const std::string&) {
    Tensor one_chunk, larger;
    {
      const qchunk chunk(61);
      one_chunk = run_simd(in);
    }
    {
      const qchunk chunk(4096);
      larger = run_simd(in);
    }
    EXPECT_TRUE(testing::bit_equal(one_chunk, larger));
  });
}

// The chunk follows the shape (quantized_decode.h): doubled from 512 up to 4096 while the
// call keeps 64 tasks, a task's scores (rows · chunk) stay within 16384 floats and its V
// weights (rows · chunk · V groups) within 65536; a test's override wins over the shape.
TEST(SimdQuantizedSdpa, ChunksGrowWithTheCacheWhileTasksAndScoresAllow) {
  using simd::qdecode::chunk_tokens;
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 4), 4096);  // 8 chunks of 8 heads: 64 tasks
  EXPECT_EQ(chunk_tokens(1, 8, 65536, 4), 4096);  // the longest
  EXPECT_EQ(chunk_tokens(64, 8, 32768, 4), 4096);
  EXPECT_EQ(chunk_tokens(1, 8, 16384, 4), 2048);  // 4096 would leave 32 tasks
  EXPECT_EQ(chunk_tokens(1, 2, 32768, 4), 1024);
  EXPECT_EQ(chunk_tokens(1, 8, 4096, 4), 512);    // 1024 would leave 32 tasks
  EXPECT_EQ(chunk_tokens(1, 1, 100, 1), 512);     // never shorter than 512
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 8), 2048);  // 8 rows · 4096 keys: more than 16384 scores
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 32), 512);
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 4, 4), 4096);  // groups of 32 at Dv 128: 65536 weights
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 4, 8), 2048);  // nvfp4's 16
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 8, 8), 1024);
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 4, 16), 1024);
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 1, 8), 4096);
  const qchunk forced(7);
  EXPECT_EQ(chunk_tokens(1, 8, 32768, 4), 7);
}

// With one key its weight is exactly 1, so out = V dequantized (c·s + b in f32, both
// backends) rounded once to q's dtype: bit-exact, which pins the output conversion. V is
// chosen to hit bf16 and f16 rounding ties, f16 overflow to inf, and a NaN group.
TEST(SimdQuantizedSdpa, OneKeyGivesTheDequantizedValuesRoundedOnce) {
  KVLAB_SEEDED_RNG(rng, 7);
  const std::int64_t dv = 96;
  Inputs base = random_inputs(rng, {1, 2, 1, 1, 1, 64, dv}, DType::f32, affine(4, 64), affine(8, 32), DType::f32,
                              DType::f32);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(dv));
  for (std::size_t e = 0; e < codes.size(); ++e) codes[e] = static_cast<std::uint8_t>(e % 32 == 0 ? 0 : e * 7 % 256);
  ref::pack_codes(codes, 8, std::span<std::uint32_t>(base.v.wq.storage<std::uint32_t>().data(), dv / 4));
  // Group 0: 1 + 2^-8 + c·2^-20 (c = 0 is a bf16 tie); group 1: 65472 + c (ties and
  // overflow in f16); group 2: NaN scale.
  const float scales[3] = {0x1p-20f, 1.0f, kNaN}, biases[3] = {1.0f + 0x1p-8f, 65472.0f, 0.0f};
  for (int g = 0; g < 3; ++g) {
    base.v.scales.view().store(g, scales[g]);
    base.v.biases.view().store(g, biases[g]);
  }
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Inputs in = base;
    in.q = testing::random_normal(rng, dtype, {1, 2, 1, 64});
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor want = run_ref(in);
    testing::for_each_simd_target([&](const std::string&) { EXPECT_TRUE(testing::bit_equal(run_simd(in), want)); });
  }
}

// q4_0/q4_1 blocks reach the fused decode as affine groups (f32 scales d, biases −8d or m)
// only while every d and m is finite: with d = +inf, code·d + bias is inf − inf = NaN
// where the oracle's (c − 8)·d is ±inf. q8_0's signed bytes are read in place with d and
// no bias (PackedSide::s8), so q·d is the oracle's for any d. Two cases that show it:
// - K (q8_0): key 40's second group has d = +inf, negative codes, and every query is
//   positive there, so its logit is −inf in the oracle and the key drops out (a finite
//   output), where a NaN logit (from a bias −128d) would poison the rows;
// - V (q4_0): key 70's first group has d = +inf, so the outputs of that group are ±inf
//   (NaN only for the code 8) in the oracle, not NaN throughout.
TEST(SimdQuantizedSdpa, GgmlBlocksWithAnInfiniteScaleAgreeWithTheOracle) {
  KVLAB_SEEDED_RNG(rng, 3131);
  const Dims dims{1, 4, 2, 1, 96, 64, 64};
  const auto ggml = [&](QuantMode mode, std::int64_t d) {
    return ref::ggml_quantize(testing::random_normal(rng, DType::f32, {dims.B, dims.Hkv, dims.Lk, d}),
                              QuantSpec::make(mode, mode == QuantMode::q8_0 ? 8 : 4, 32));
  };
  for (const bool on_k : {true, false}) {
    Inputs in;
    in.q = testing::random_normal(rng, DType::f16, {dims.B, dims.Hq, dims.Lq, dims.Dk});
    in.params.scale = 0.125f;
    in.k = ggml(QuantMode::q8_0, dims.Dk);
    in.v = ggml(QuantMode::q4_0, dims.Dv);
    if (on_k) {
      for (std::int64_t i = 0; i < in.q.numel(); ++i) {
        if (i % dims.Dk >= 32) in.q.view().store(i, 0.25f + std::abs(in.q.view().load(i)));
      }
      std::uint32_t* words = in.k.wq.storage<std::uint32_t>().data();
      for (std::int64_t h = 0; h < dims.Hkv; ++h) {
        const std::int64_t row = h * dims.Lk + 40;
        for (std::int64_t w = 8; w < 16; ++w) words[row * 16 + w] = 0xF0F1F2F3u;  // int8 −16…−13
        in.k.scales.view().store(row * 2 + 1, kInf);
      }
    } else {
      in.v.scales.view().store(70 * 2, kInf);  // kv head 0
    }
    SCOPED_TRACE(on_k ? "q8_0 K, d = +inf" : "q4_0 V, d = +inf");
    const Tensor want = run_ref(in);
    int nonfinite = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) nonfinite += std::isfinite(want.view().load(i)) ? 0 : 1;
    if (on_k) EXPECT_EQ(nonfinite, 0) << "the −inf logit drops its key";
    else EXPECT_GT(nonfinite, 0) << "the inf values reach the output";
    testing::for_each_simd_target([&](const std::string&) {
      expect_same_nonfinite_and_close(run_simd(in), want);
    });
  }
}

// On targets below AVX3 mxfp4 reaches the fused decode as signed 8-bit codes: every
// packed byte's two E2M1 codes become the signed bytes 2v (v the oracle's value of the
// code), in stream order, on every target (AVX2's 32-byte steps, then a 16-byte one and a
// tail of 7 bytes).
TEST(SimdQuantizedSdpa, E2M1CodesUnpackToTwiceTheirValue) {
  std::vector<std::uint8_t> packed(256 + 16 + 7);
  for (std::size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<std::uint8_t>(i * 37 % 256);
  testing::for_each_simd_target([&](const std::string&) {
    std::vector<std::uint8_t> bytes(2 * packed.size(), 0xEE);
    simd::qdecode::e2m1_to_bytes(packed.data(), packed.size(), bytes.data());
    for (std::size_t e = 0; e < bytes.size(); ++e) {
      const auto code = static_cast<std::uint8_t>(e % 2 == 0 ? packed[e / 2] & 0x0F : packed[e / 2] >> 4);
      EXPECT_EQ(static_cast<float>(static_cast<std::int8_t>(bytes[e])), 2.0f * ref::e2m1_decode(code))
          << "element " << e;
    }
  });
}

// The scans that decide whether a tensor's metadata may be read in place (mxfp4's E8M0
// codes at most kLargestE8M0, q4_0/q4_1's f16 d and m all finite) see every element, in
// whole vectors and in the tail, on every target: one large value planted at each position
// of a buffer longer than four 64-byte vectors (the sign of an f16 never counts).
TEST(SimdQuantizedSdpa, MetadataScansSeeEveryElement) {
  constexpr std::size_t kBytes = 4 * 64 + 37;
  testing::for_each_simd_target([&](const std::string&) {
    for (std::size_t at = 0; at < kBytes; ++at) {
      std::vector<std::uint8_t> bytes(kBytes, 7);
      bytes[at] = 251;
      ASSERT_EQ(simd::qdecode::max_byte(bytes.data(), bytes.size()), 251) << "byte " << at;
      ASSERT_EQ(simd::qdecode::max_byte(bytes.data(), at), 7 * (at > 0 ? 1 : 0)) << "first " << at << " bytes";
    }
    constexpr std::size_t kHalves = kBytes / 2;
    for (const std::uint16_t planted : {std::uint16_t{0x7C00}, std::uint16_t{0xFC00}, std::uint16_t{0xFE01}}) {
      for (std::size_t at = 0; at < kHalves; ++at) {
        std::vector<std::uint16_t> halves(kHalves, 0xBC00);  // −1
        halves[at] = planted;
        ASSERT_EQ(simd::qdecode::max_f16_magnitude(halves.data(), halves.size()), planted & 0x7FFF)
            << "f16 bits " << planted << " at " << at;
      }
    }
    const std::vector<std::uint16_t> finite(kHalves, 0xFBFF);  // −65504
    EXPECT_EQ(simd::qdecode::max_f16_magnitude(finite.data(), finite.size()), 0x7BFF);
    // mxfp8's chunk test: every E8M0 code at most 134 or 255 ⟺ the largest c + 1 (mod 256)
    // is at most 135.
    for (const std::uint8_t planted : {std::uint8_t{134}, std::uint8_t{135}, std::uint8_t{254}, std::uint8_t{255}}) {
      for (std::size_t at = 0; at < kBytes; at += 7) {
        std::vector<std::uint8_t> codes(kBytes, 255);
        codes[at] = planted;
        const int want = planted == 255 ? 0 : planted + 1;
        ASSERT_EQ(simd::qdecode::max_byte(codes.data(), codes.size(), 1), want)
            << "code " << int{planted} << " at " << at;
      }
    }
  });
}

// mxfp8's E8M0 scale codes become the E4M3 kernel's factors 2^(c−7) (+inf for 255) in
// vectors and in the tail, on every target.
TEST(SimdQuantizedSdpa, E8M0CodesBecomeTheirFactors) {
  std::vector<std::uint8_t> codes;
  for (int round = 0; round < 3; ++round) {
    for (int c = 0; c <= 134; ++c) codes.push_back(static_cast<std::uint8_t>((c * 53 + round) % 135));
    codes.push_back(255);
  }
  testing::for_each_simd_target([&](const std::string&) {
    std::vector<float> factors(codes.size(), -1.0f);
    simd::qdecode::e8m0_factors(codes.data(), codes.size(), factors.data());
    for (std::size_t i = 0; i < codes.size(); ++i) {
      const float want = codes[i] == 255 ? kInf : std::ldexp(1.0f, int{codes[i]} - 7);
      ASSERT_EQ(factors[i], want) << "code " << int{codes[i]} << " at " << i;
    }
  });
}

// On AVX3 mxfp4 reaches the fused decode read in place by the E2M1 kernel: each nibble's
// code becomes 2v on the V side (v the oracle's value of the code) and, with the scale 1/2
// (an E8M0 scale of 1) and no bias, v itself on the K side, in the 4-bit lane order (per N
// bytes the low nibbles, then the high ones); that kernel is right on every target.
TEST(SimdQuantizedSdpa, E2M1KernelReadsNibblesAsTwiceTheirValue) {
  std::vector<std::uint8_t> packed(256);
  for (std::size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<std::uint8_t>(i * 37 % 256);
  testing::for_each_simd_target([&](const std::string&) {
    std::vector<float> codes(2 * packed.size(), -1.0f), values(2 * packed.size(), -1.0f);
    simd::qdecode::e2m1_codes_for_test(packed.data(), packed.size(), codes.data(), values.data());
    const std::size_t n = simd::qdecode::lanes();
    for (std::size_t pos = 0; pos < codes.size(); ++pos) {
      const auto e = static_cast<std::size_t>(simd::qdecode::lane_to_element(static_cast<std::int64_t>(pos), 4, n));
      const auto code = static_cast<std::uint8_t>(e % 2 == 0 ? packed[e / 2] & 0x0F : packed[e / 2] >> 4);
      EXPECT_EQ(codes[pos], 2.0f * ref::e2m1_decode(code)) << "element " << e;
      EXPECT_EQ(values[pos], ref::e2m1_decode(code)) << "element " << e;
    }
  });
}

// The fused decode takes an mxfp4 group's E8M0 scale s up to 2^123 (code 250; the integer
// K side's bias −6s must stay finite); above it the tensor is decoded (code 251) and at
// s = 2^127 (code 254) values of |v| >= 2 are ±inf, whose inf and NaN outputs must match
// the oracle's. V's key 70, group 0 of kv head 0 gets the code; the other values stay
// small, so a form that summed each group's bias apart from its codes (p·(12 + 2v)·s/2
// and p·(−6s), kvlab's own until this test) loses them to cancellation from code 200 on:
// outputs 0 and f16 infs where the oracle's are 0.03.
TEST(SimdQuantizedSdpa, Mxfp4GroupsWithTheLargestScalesAgreeWithTheOracle) {
  KVLAB_SEEDED_RNG(rng, 4242);
  const Dims dims{1, 4, 2, 1, 96, 64, 64};
  const QuantSpec mx = QuantSpec::make(QuantMode::mxfp4, 4, 32);
  for (const int code : {120, 200, 250, 251, 254}) {
    Inputs in = random_inputs(rng, dims, DType::f16, mx, mx, DType::f32, DType::f32);
    in.v.scales.storage<std::uint8_t>()[70 * 2] = static_cast<std::uint8_t>(code);
    SCOPED_TRACE("E8M0 code " + std::to_string(code));
    const Tensor want = run_ref(in);
    int nonfinite = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) nonfinite += std::isfinite(want.view().load(i)) ? 0 : 1;
    if (code == 254) {
      EXPECT_GT(nonfinite, 0) << "the inf values reach the output";
    }
    testing::for_each_simd_target([&](const std::string&) {
      expect_same_nonfinite_and_close(run_simd(in), want);
    });
  }
}

// mxfp4's smallest scales: the E8M0 codes 0 and 1 make the subnormal f32 scales 2^-128 and
// 2^-127 (s/2 of s = 2^-127, 2^-126), built from their bits per chunk; code 2 the smallest
// normal one. Every V group takes one of them, so the outputs are of that size and are
// compared relative to the largest.
TEST(SimdQuantizedSdpa, Mxfp4GroupsWithTheSmallestScalesAgreeWithTheOracle) {
  KVLAB_SEEDED_RNG(rng, 4343);
  const Dims dims{1, 4, 2, 1, 96, 64, 64};
  const QuantSpec mx = QuantSpec::make(QuantMode::mxfp4, 4, 32);
  Inputs in = random_inputs(rng, dims, DType::f32, mx, mx, DType::f32, DType::f32);
  auto& codes = in.v.scales.storage<std::uint8_t>();
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i % 3);
  const Tensor want = run_ref(in);
  float largest = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) largest = std::max(largest, std::abs(want.view().load(i)));
  ASSERT_GT(largest, 0.0f);
  ASSERT_LT(largest, 0x1p-120f);
  testing::for_each_simd_target([&](const std::string&) {
    const Tensor got = run_simd(in);
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      EXPECT_NEAR(got.view().load(i), want.view().load(i), 0x1p-12f * largest) << "element " << i;
    }
  });
}

// Formats the decode does not read as codes (ggml's q5_0, mxfp8 with a scale above 2^7,
// nvfp4 of a head dim not a multiple of 32) are dequantized one chunk at a time (PackedSide::decoded) and
// read as f32 rows: each key a query row sees is dequantized once per such side, the keys
// of chunks nobody sees never, a side read as codes not at all (mxfp8 of ordinary scales
// among them, nvfp4 without a global scale too), and a call that falls back (Dv = 80, not
// a multiple of 32) dequantizes whole tensors instead (counted 0). Every result against the
// oracle; Lk = 1100 spans three chunks of kDecodedChunkTokens.
TEST(SimdQuantizedSdpa, FormatsWithoutCodesAreDequantizedAChunkAtATime) {
  KVLAB_SEEDED_RNG(rng, 5150);
  const QuantSpec nv = QuantSpec::make(QuantMode::nvfp4, 4, 16), mx8 = QuantSpec::make(QuantMode::mxfp8, 8, 32);
  struct Case {
    const char* what;
    QuantSpec k, v;
    std::int64_t dv, window, decoded_per_key;  // decoded_per_key: Dk and/or Dv, or 0
    std::int64_t dk = 64;
  };
  const std::vector<Case> cases = {
      {"nvfp4 K, mxfp8 V", nv, mx8, 64, 0, 0},
      {"affine K, nvfp4 V", affine(4, 64), nv, 64, 0, 0},
      {"mxfp8 K, affine V", mx8, affine(8, 32), 64, 0, 0},
      {"nvfp4 K and V, a window of 100 keys", nv, nv, 64, 100, 0},
      {"nvfp4 V of 80 dims: the fallback", affine(4, 64), nv, 80, 0, 0},
      {"nvfp4 K of 48 dims (not whole slices of 32)", nv, affine(4, 64), 64, 0, 48, 48},
  };
  for (const Case& c : cases) {
    const Dims dims{2, 4, 2, 1, 1100, c.dk, c.dv};
    Inputs in = random_inputs(rng, dims, DType::f16, c.k, c.v, DType::f32, DType::f32);
    for (const ref::QuantizedTensor* side : {&in.k, &in.v}) {  // ordinary mxfp8 scales: read as E4M3 codes
      if (side->spec.mode == QuantMode::mxfp8) {
        ASSERT_LT(max_scale_code(*side), 135);
      }
    }
    if (c.window > 0) {
      in.params.mask.kind = MaskKind::causal;
      in.params.mask.window = static_cast<int>(c.window);
    }
    SCOPED_TRACE(c.what);
    const Tensor want = run_ref(in);
    const std::int64_t seen = c.window > 0 ? c.window : dims.Lk;
    testing::for_each_simd_target([&](const std::string&) {
      expect_same_nonfinite_and_close(run_simd(in), want);
      EXPECT_EQ(simd::last_attention_decoded_values(), dims.B * dims.Hkv * seen * c.decoded_per_key);
    });
  }
  Inputs in = random_inputs(rng, {1, 4, 2, 1, 600, 64, 64}, DType::bf16, affine(4, 64), affine(4, 64), DType::f32,
                            DType::f32);
  in.v = ref::ggml_quantize(testing::random_normal(rng, DType::f32, {1, 2, 600, 64}),
                            QuantSpec::make(QuantMode::q5_0, 5, 32));
  SCOPED_TRACE("q5_0 V");
  const Tensor want = run_ref(in);
  testing::for_each_simd_target([&](const std::string&) {
    expect_same_nonfinite_and_close(run_simd(in), want);
    EXPECT_EQ(simd::last_attention_decoded_values(), 2 * 600 * 64);
  });
}

// mxfp8 K and V are read as their E4M3 bytes (the kE4M3 kernel: a code as its value·2^-120,
// the E8M0 scale code c as the factor 2^(c−7)) wherever every scale of a chunk is at most
// 2^7 (code 134) or +inf (255); a chunk with a larger scale is dequantized instead. Every
// one of the 256 element codes (E4M3's subnormals, ±0, 0x7F read as 480) under scale codes
// from 0 (values down to 2^-136, f32 subnormals) to 134, against the oracle, with and
// without an infinite V scale, and with one V scale of code 135 or 254 in the second of
// three chunks: that chunk alone decoded. Then one key visible:
// the output is V's values, bit for bit.
TEST(SimdQuantizedSdpa, Mxfp8IsReadAsE4M3CodesUnderScalesF32Holds) {
  KVLAB_SEEDED_RNG(rng, 8088);
  const QuantSpec mx8 = QuantSpec::make(QuantMode::mxfp8, 8, 32);
  const std::int64_t lk = 1100, chunk = simd::qdecode::chunk_tokens(1, 1, lk, 2);
  struct Case {
    const char* what;
    int k_low, k_high, v_low, v_high;  // the scale codes, uniform in [low, high]
    int special;                       // one V scale code (key 700, group 0) or -1
    std::int64_t decoded_per_key;
  };
  // Where V holds an infinite value, K's scales keep the logits small, so that no weight
  // underflows: then every output is ±inf or NaN as the oracle's (p in double) is.
  const std::vector<Case> cases = {
      {"scale codes 0 to 12: subnormal products", 0, 12, 0, 12, -1, 0},
      {"scale codes 100 to 134", 100, 134, 100, 134, -1, 0},
      {"an infinite scale (255)", 100, 110, 110, 130, 255, 0},
      {"a scale of 2^8 (135)", 100, 110, 110, 130, 135, 64},
      {"a scale of 2^127 (254)", 100, 110, 110, 130, 254, 64},
  };
  for (const Case& c : cases) {
    const Dims dims{1, 2, 1, 1, lk, 64, 64};
    Inputs in = random_inputs(rng, dims, DType::f32, mx8, mx8, DType::f32, DType::f32);
    for (ref::QuantizedTensor* side : {&in.k, &in.v}) {
      auto* elements = reinterpret_cast<std::uint8_t*>(side->wq.storage<std::uint32_t>().data());
      for (std::int64_t e = 0; e < lk * 64; ++e) elements[e] = static_cast<std::uint8_t>(e * 7 % 256);
      const bool on_k = side == &in.k;
      for (std::uint8_t& code : side->scales.storage<std::uint8_t>()) {
        code = static_cast<std::uint8_t>(rng.integer(on_k ? c.k_low : c.v_low, on_k ? c.k_high : c.v_high));
      }
    }
    if (c.special >= 0) in.v.scales.storage<std::uint8_t>()[700 * 2] = static_cast<std::uint8_t>(c.special);
    SCOPED_TRACE(c.what);
    const Tensor want = run_ref(in);
    testing::for_each_simd_target([&](const std::string&) {
      expect_same_nonfinite_and_close(run_simd(in), want);
      EXPECT_EQ(simd::last_attention_decoded_values(), (700 / chunk == 1 ? chunk : 0) * c.decoded_per_key);
    });
  }
  // One key visible (a left padding of 1 and Lk 2): p = 1, out = V's key 1 exactly.
  for (const int code : {0, 2, 60, 134}) {
    Inputs in = random_inputs(rng, {1, 2, 1, 1, 2, 64, 64}, DType::f32, mx8, mx8, DType::f32, DType::f32);
    auto* elements = reinterpret_cast<std::uint8_t*>(in.v.wq.storage<std::uint32_t>().data());
    for (int e = 0; e < 64; ++e) elements[64 + e] = static_cast<std::uint8_t>(e * 4 + 1);
    in.v.scales.storage<std::uint8_t>()[2] = static_cast<std::uint8_t>(code);
    in.params.mask.kind = MaskKind::causal;
    in.params.mask.left_padding = {1};
    SCOPED_TRACE("E8M0 code " + std::to_string(code));
    const Tensor want = run_ref(in);
    testing::for_each_simd_target([&](const std::string&) {
      EXPECT_TRUE(testing::bit_equal(run_simd(in), want));
      EXPECT_EQ(simd::last_attention_decoded_values(), 0);
    });
  }
}

// A visible key whose weight p underflows to 0 in f32 (logit 120 below the row's largest:
// e^-120 < 2^-149, while the oracle's double p is e^-120 > 0) still carries a NaN or an
// infinite V scale into the output, as the oracle's p·v does: the weights zero only the
// keys the mask hides (score −inf), whose poison never counts. Affine 8-bit V: key 1's
// group 0 poisoned, with key 0's logit 120 above it. Without the fix the output was finite.
// An infinite scale gives NaN here where the oracle's tiny p times ∞ is ∞ (0·∞ in f32):
// non-finite where the oracle's is, NaN for NaN.
TEST(SimdQuantizedSdpa, AVisibleKeyWhoseWeightUnderflowsKeepsItsPoison) {
  KVLAB_SEEDED_RNG(rng, 120);
  for (const float poison : {kNaN, kInf}) {
    Inputs in = random_inputs(rng, {1, 1, 1, 1, 2, 64, 64}, DType::f32, affine(8, 64), affine(8, 32), DType::f32,
                              DType::f32);
    for (std::int64_t d = 0; d < 64; ++d) in.q.view().store(d, d == 0 ? 1.0f : 0.0f);
    in.params.scale = 1.0f;
    // K key 0 element 0 is 120 (code 255·scale + bias), key 1's 0: every other element 0.
    auto* k_words = in.k.wq.storage<std::uint32_t>().data();
    for (std::int64_t w = 0; w < 32; ++w) k_words[w] = w == 0 ? 0xFFu : 0u;  // 16 words a key
    in.k.scales.view().store(0, 120.0f / 255.0f);
    in.k.biases.view().store(0, 0.0f);
    in.k.scales.view().store(1, 1.0f);
    in.k.biases.view().store(1, 0.0f);
    in.v.scales.view().store(2, poison);  // key 1, group 0
    SCOPED_TRACE(std::isnan(poison) ? "NaN scale" : "inf scale");
    const Tensor want = run_ref(in);
    ASSERT_TRUE(std::isnan(want.view().load(0)) || std::isinf(want.view().load(0)));
    testing::for_each_simd_target([&](const std::string&) {
      const Tensor got = run_simd(in);
      for (std::int64_t i = 0; i < want.numel(); ++i) {
        const float w = want.view().load(i), g = got.view().load(i);
        if (std::isnan(w)) EXPECT_TRUE(std::isnan(g)) << "element " << i << ": " << g;
        else if (std::isinf(w)) EXPECT_FALSE(std::isfinite(g)) << "element " << i << ": " << g;
        else EXPECT_NEAR(g, w, 0x1p-8f * (1.0f + std::abs(w))) << "element " << i;
      }
    });
  }
}

// Decoded rows are bf16 only where every value is one exactly (decoded_dtype): mxfp8 with
// an E8M0 scale code below 3 has values with bits below bf16's smallest subnormal (2^-133),
// so those rows stay f32. One key: the output is V's values, bit for bit. Group 0 holds
// the E4M3 codes 1…32 (2^-9 up to 2^-6 + 7·2^-9: every low bit set somewhere); group 1's
// scale 2^73 (code 200) sends the key to the decoded rows (not read as E4M3 codes).
TEST(SimdQuantizedSdpa, DecodedRowsKeepBitsBelowBf16sRange) {
  KVLAB_SEEDED_RNG(rng, 6061);
  const QuantSpec mx8 = QuantSpec::make(QuantMode::mxfp8, 8, 32);
  for (const int code : {0, 2, 3, 127}) {
    Inputs in = random_inputs(rng, {1, 2, 1, 1, 1, 64, 64}, DType::f32, affine(4, 64), mx8, DType::f32, DType::f32);
    auto* elements = reinterpret_cast<std::uint8_t*>(in.v.wq.storage<std::uint32_t>().data());
    for (int e = 0; e < 32; ++e) elements[e] = static_cast<std::uint8_t>(e + 1);
    in.v.scales.storage<std::uint8_t>()[0] = static_cast<std::uint8_t>(code);
    in.v.scales.storage<std::uint8_t>()[1] = 200;
    SCOPED_TRACE("E8M0 code " + std::to_string(code));
    const Tensor want = run_ref(in);
    testing::for_each_simd_target([&](const std::string&) {
      EXPECT_TRUE(testing::bit_equal(run_simd(in), want));
      EXPECT_EQ(simd::last_attention_decoded_values(), 64);
    });
  }
}

TEST(SimdQuantizedSdpa, ResultDoesNotDependOnTheThreadsThatRanIt) {
  KVLAB_SEEDED_RNG(rng, 99);
  const qchunk chunk(32);
  Inputs in = random_inputs(rng, {2, 8, 2, 1, 700, 128, 128}, DType::f16, affine(4, 64), affine(8, 64), DType::f16,
                            DType::f16);
  in.params.mask.kind = MaskKind::causal;
  in.params.mask.left_padding = {5, 300};
  testing::for_each_simd_target([&](const std::string&) {
    const Tensor pooled = run_simd(in);
    // A call made inside a pool task runs its tasks serially on one thread (parallel.h).
    Tensor serial;
    simd::parallel_for(2, [&](std::int64_t i) {
      if (i == 0) serial = run_simd(in);
    });
    EXPECT_TRUE(testing::bit_equal(pooled, serial));
    EXPECT_TRUE(testing::bit_equal(pooled, run_simd(in)));
  });
}

// The AVX3_DL K side rounds q·scale per (row, group) to a multiple of σ = 2^-22 of the
// group's largest |q| (quantized_decode_vnni-inl.h) and keeps a chunk's scores only when
// its error bound is within the tolerance's allowance of the largest logit. Here the bound
// cannot hold: q's element 0 is huge where every key is exactly 0, and its other elements
// lie below σ/2, so the integer side would see q = 0 and give every key the logit 0,
// while the true logits (K up to 960) of the two kinds of key, each half of the 2048
// (the path's minimum), differ by ~0.3 and the output leans to one kind. The chunks must
// be scored again in f32 (with the certificate skipped the outputs are off by up to 0.15,
// against 2^-7·max|out| ≈ 0.015 allowed here).
TEST(SimdQuantizedSdpa, LogitsTheIntegerKSideCannotCertifyAreScoredInF32) {
  KVLAB_SEEDED_RNG(rng, 1234);
  const std::int64_t keys = 2048;
  for (const DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Inputs in = random_inputs(rng, {1, 4, 1, 1, keys, 128, 64}, dtype, affine(4, 64), affine(8, 64), DType::f32,
                              DType::f32);
    auto* words = in.k.wq.storage<std::uint32_t>().data();
    auto* v_words = in.v.wq.storage<std::uint32_t>().data();
    for (std::int64_t key = 0; key < keys; ++key) {
      const std::int64_t kind = key % 2;  // every key a copy of key 0 or key 1, K and V
      for (std::int64_t w = 0; w < 16; ++w) {
        words[key * 16 + w] = words[kind * 16 + w];
        v_words[key * 16 + w] = v_words[kind * 16 + w];
      }
      words[key * 16] &= ~0xFu;                  // element 0's code: 0
      in.k.scales.view().store(key * 2, 64.0f);  // group 0: k = 64·c, so element 0 is exactly 0
      in.k.biases.view().store(key * 2, 0.0f);
      in.k.scales.view().store(key * 2 + 1, in.k.scales.view().load(kind * 2 + 1));
      in.k.biases.view().store(key * 2 + 1, in.k.biases.view().load(kind * 2 + 1));
      in.v.scales.view().store(key, in.v.scales.view().load(kind));
      in.v.biases.view().store(key, in.v.biases.view().load(kind));
    }
    for (std::int64_t h = 0; h < 4; ++h) {
      for (std::int64_t d = 0; d < 128; ++d) {
        const float tiny = std::ldexp(rng.uniform(-1.0, 1.0) < 0 ? -1.0f : 1.0f, -12);
        in.q.view().store(h * 128 + d, d == 0 ? 30000.0f : d < 64 ? tiny : 0.0f);
      }
    }
    const Tensor want = run_ref(in);
    float largest_v = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) largest_v = std::max(largest_v, std::abs(want.view().load(i)));
    testing::for_each_simd_target([&](const std::string&) {
      const Tensor got = run_simd(in);
      float worst = 0;
      for (std::int64_t i = 0; i < want.numel(); ++i)
        worst = std::max(worst, std::abs(got.view().load(i) - want.view().load(i)));
      EXPECT_LE(worst, 0x1p-7f * largest_v) << "largest |out| " << largest_v;
    });
  }
}

// On an AMX CPU the AVX3_DL K side takes its integer sums from tile multiplies
// (quantized_decode_vnni-inl.h, AmxTile): exact like vpdpbusd's, so the outputs must be
// the vpdpbusd path's bit for bit, with its A tile resident (4 rows, two steps) or
// reloaded (8 rows; one step of 32 bytes; a group of 128 in two steps), over two chunks
// and a partial last tile. The mix shows which path ran: vpdpbusd lanes on one, none
// and no K-side FMAs on the other (the integer side, not the f32 fallback).
TEST(SimdQuantizedSdpa, TheAmxKSideGivesTheVpdpbusdSidesBits) {
  if (!simd::qdecode::amx_supported()) GTEST_SKIP() << "no AMX-INT8 granted to this process";
  KVLAB_SEEDED_RNG(rng, 2718);
  struct Shape {
    std::int64_t hq, dk;
    int group;
  };
  for (const Shape sh :
       {Shape{8, 128, 64}, Shape{16, 128, 64}, Shape{8, 64, 32}, Shape{8, 256, 128}, Shape{4, 128, 128}}) {
    const std::string what = cat("Hq ", sh.hq, " Dk ", sh.dk, " K group ", sh.group);
    const Dims s{1, sh.hq, 2, 1, 1000, sh.dk, 128};
    Inputs in = random_inputs(rng, s, DType::f16, affine(4, sh.group), affine(4, 64), DType::f16, DType::f16);
    in.params.mask.kind = MaskKind::causal;
    in.params.mask.left_padding = {7};
    testing::for_each_simd_target([&](const std::string& target) {
      if (target != "AVX3_DL") return;
      Tensor dots, tiles;
      simd::ArithmeticMix dot_mix, tile_mix;
      {
        const simd::qdecode::ScopedAmx off(false);
        dots = run_simd(in);
        dot_mix = simd::last_attention_mix();
      }
      {
        const simd::qdecode::ScopedAmx on(true);
        tiles = run_simd(in);
        tile_mix = simd::last_attention_mix();
      }
      EXPECT_GT(dot_mix.u8_dot, 0) << what << ": the vpdpbusd side did not run";
      EXPECT_EQ(tile_mix.u8_dot, 0) << what;
      EXPECT_EQ(dot_mix.amx_int8, 0) << what;
      EXPECT_GT(tile_mix.amx_int8, 0) << what << ": the tile side declared no tile multiplies";
      EXPECT_EQ(tile_mix.fma, dot_mix.fma) << what << ": the tile side fell back to f32 FMAs";
      EXPECT_EQ(tile_mix.s16_dot, dot_mix.s16_dot) << what << ": the V side differs";
      EXPECT_TRUE(testing::bit_equal(tiles, dots)) << what;
    });
  }
}

// Byte codes with at most 4 rows per kv head take the AMX layout with keys as A
// (quantized_decode_amx-inl.h, KeyRowsChunk): the same exact sums as keys as B, so the
// same bits, for 1 to 4 rows, a group per step or one over two steps, Dk 64 and 128,
// 8-bit and unpacked 3-bit codes, over two chunks and a partial last tile (1000 keys).
// Equal mixes: both ran the integer side, neither fell back to f32 FMAs.
TEST(SimdQuantizedSdpa, AmxKeysAsAGiveKeysAsBsBits) {
  if (!simd::qdecode::amx_supported()) GTEST_SKIP() << "no AMX-INT8 granted to this process";
  KVLAB_SEEDED_RNG(rng, 1414);
  struct Shape {
    std::int64_t rows, dk;
    int bits, group;
  };
  for (const Shape sh : {Shape{1, 128, 8, 64}, Shape{2, 128, 8, 128}, Shape{3, 64, 8, 64}, Shape{4, 128, 8, 64},
                         Shape{4, 128, 3, 64}}) {
    const std::string what = cat(sh.rows, " rows, Dk ", sh.dk, ", ", sh.bits, "-bit K, group ", sh.group);
    const Dims s{1, 2 * sh.rows, 2, 1, 1000, sh.dk, 128};
    Inputs in = random_inputs(rng, s, DType::f16, affine(sh.bits, sh.group), affine(4, 64), DType::f16, DType::f16);
    in.params.mask.kind = MaskKind::causal;
    in.params.mask.left_padding = {7};
    testing::for_each_simd_target([&](const std::string& target) {
      if (target != "AVX3_DL") return;
      const simd::qdecode::ScopedAmx amx(true);
      Tensor as_a, as_b;
      simd::ArithmeticMix a_mix, b_mix;
      {
        const simd::qdecode::ScopedAmxKeyRows keys_as_b(false);
        as_b = run_simd(in);
        b_mix = simd::last_attention_mix();
      }
      as_a = run_simd(in);
      a_mix = simd::last_attention_mix();
      EXPECT_GT(a_mix.amx_int8, 0) << what << ": no tile multiplies";
      EXPECT_EQ(a_mix.amx_int8, b_mix.amx_int8) << what;
      EXPECT_EQ(a_mix.fma, b_mix.fma) << what << ": one side fell back to f32 FMAs";
      EXPECT_TRUE(testing::bit_equal(as_a, as_b)) << what;
    });
  }
}

// K stored as bytes takes the integer side only with AMX (harness/cases/quantized_sdpa/ci
// holds its outputs to the tolerance): with it the decode spends no K-side FMAs but
// declares its tile multiplies, without it the f32 path spends Dk per key and row. The
// 4-bit V (f16 output), its integer side switched on, sums in vpdpwssd either way: no
// V-side FMAs, no vpdpbusd.
// 8- and 4-bit V with an f16/bf16 output sums in integers on AVX3_DL and AVX2
// (quantized_decode_int_values-inl.h) where its run-time bound holds, and in f32 where it
// does not: with one key of every 32 given a V scale far above the others' and codes 0
// (its values 0, so max|v| does not move), each block's rounded weights would keep that
// key's and round every other to 0. The mix shows which side ran (vpdpwssd or vpmaddwd
// lanes, or the V side's FMAs); either way the result agrees with the oracle.
TEST(SimdQuantizedSdpa, ValuesSumInIntegersOnlyWhereTheirBoundHolds) {
  KVLAB_SEEDED_RNG(rng, 3141);
  const Dims s{1, 8, 2, 1, 1001, 64, 128};  // chunks of 512 and 489 keys
  const std::int64_t heads = s.B * s.Hkv, R = s.Hq / s.Hkv, groups = s.Dv / 64;
  const std::int64_t chunk = simd::qdecode::chunk_tokens(s.B, s.Hkv, s.Lk, R * s.Lq);
  std::int64_t pairs = 0;
  for (std::int64_t j = 0; j < s.Lk; j += chunk) pairs += (std::min(chunk, s.Lk - j) + 1) / 2;
  // Packed 4-bit V takes the side only where packed_int_values_available(): both settings;
  // byte codes take it under either.
  for (const auto& setting : {std::pair{8, false}, std::pair{4, true}, std::pair{4, false}}) {
    const int bits = setting.first;  // named copies: a lambda below captures them
    const bool packed = setting.second;
    const simd::qdecode::ScopedPackedIntValues packed_setting(packed);
    for (const bool spiked : {false, true}) {
      SCOPED_TRACE(cat(bits, "-bit V", bits == 4 ? (packed ? " (packed side on)" : " (packed side off)") : "", ", ",
                       spiked ? "one key in 32 with a huge scale" : "random values"));
      Inputs in = random_inputs(rng, s, DType::f16, affine(8, 64), affine(bits, 64), DType::f16, DType::f16);
      if (spiked) {
        auto* codes = in.v.wq.storage<std::uint32_t>().data();
        const std::int64_t words = s.Dv * bits / 32;
        for (std::int64_t row = 1; row < heads * s.Lk; row += 32) {  // key 1 mod 32 of each kv head
          for (std::int64_t g = 0; g < groups; ++g) {
            in.v.scales.view().store(row * groups + g, 60000.0f);
            in.v.biases.view().store(row * groups + g, 0.0f);
          }
          for (std::int64_t w = 0; w < words; ++w) codes[row * words + w] = 0;
        }
      }
      const Tensor want = run_ref(in);
      testing::for_each_simd_target([&](const std::string& target) {
        expect_within_largest(run_simd(in), want);
        const simd::ArithmeticMix mix = simd::last_attention_mix();
        const bool integer = (target == "AVX3_DL" || target == "AVX2") && !spiked && (bits == 8 || packed);
        const std::int64_t lanes = integer ? heads * R * pairs * s.Dv : 0;
        EXPECT_EQ(mix.s16_dot, target == "AVX3_DL" ? lanes : 0);
        EXPECT_EQ(mix.s16_madd, target == "AVX2" ? lanes : 0);
        if (!simd::qdecode::amx_available()) {  // 8-bit K: f32 FMAs (tile multiplies with AMX)
          EXPECT_EQ(mix.fma, heads * R * s.Lk * (s.Dk + (integer ? 0 : s.Dv)));
        }
      });
    }
  }
}

// The AVX2 integer V side walks rows in stretches of 16 dims, so a Dv of 96 (no whole
// 64-dim slice of the AVX3_DL side) sums in integers there and in f32 on AVX3_DL.
TEST(SimdQuantizedSdpa, ValueRowsOfStretchesSumInIntegersOnAvx2) {
  KVLAB_SEEDED_RNG(rng, 2718);
  const Dims s{1, 8, 2, 1, 301, 64, 96};
  const std::int64_t R = s.Hq / s.Hkv;
  const std::int64_t chunk = simd::qdecode::chunk_tokens(s.B, s.Hkv, s.Lk, R * s.Lq);
  std::int64_t pairs = 0;
  for (std::int64_t j = 0; j < s.Lk; j += chunk) pairs += (std::min(chunk, s.Lk - j) + 1) / 2;
  for (const int bits : {8, 4}) {
    SCOPED_TRACE(cat(bits, "-bit V, Dv ", s.Dv));
    const simd::qdecode::ScopedPackedIntValues packed(true);
    const Inputs in = random_inputs(rng, s, DType::f16, affine(8, 32), affine(bits, 32), DType::f16, DType::f16);
    const Tensor want = run_ref(in);
    testing::for_each_simd_target([&](const std::string& target) {
      expect_within_largest(run_simd(in), want);
      const simd::ArithmeticMix mix = simd::last_attention_mix();
      EXPECT_EQ(mix.s16_madd, target == "AVX2" ? s.B * s.Hkv * R * pairs * s.Dv : 0);
      EXPECT_EQ(mix.s16_dot, 0);
    });
  }
}

TEST(SimdQuantizedSdpa, ByteCodedKTakesTheIntegerSideOnlyWithAmx) {
  if (!simd::qdecode::amx_supported()) GTEST_SKIP() << "no AMX-INT8 granted to this process";
  KVLAB_SEEDED_RNG(rng, 1618);
  for (const std::int64_t hq : {8, 4}) {  // 4 and 2 query rows per kv head
    const Dims s{1, hq, 2, 1, 1000, 128, 64};
    const Inputs in = random_inputs(rng, s, DType::f16, affine(8, 64), affine(4, 64), DType::f16, DType::f16);
    testing::for_each_simd_target([&](const std::string& target) {
      if (target != "AVX3_DL") return;
      const simd::qdecode::ScopedPackedIntValues packed_v(true);
      for (const bool amx : {false, true}) {
        const simd::qdecode::ScopedAmx use(amx);
        run_simd(in);
        const simd::ArithmeticMix mix = simd::last_attention_mix();
        const std::string what = cat(amx ? "AMX" : "no AMX", ", Hq ", hq);
        EXPECT_EQ(mix.fma, s.Hq * s.Lk * (amx ? 0 : s.Dk)) << what;
        EXPECT_EQ(mix.u8_dot, 0) << what;
        EXPECT_EQ(mix.s16_dot, s.Hq * 500 * s.Dv) << what << ": key pairs of the chunks of 512 and 488";
        // 1000 keys in 16-key tiles (512 + 496), a kv head's rows one block of 12 A rows
        // (4 rows × 3 q digits; 2 rows padded to the block), Dk/4 dwords per A row.
        EXPECT_EQ(mix.amx_int8, amx ? s.B * s.Hkv * 1008 * 12 * (s.Dk / 4) : 0) << what;
      }
    });
  }
}

// q8_0's signed K bytes c take the tile side as the unsigned bytes c + 128 with the
// biases −128·d (quantized_decode_vnni-inl.h, kS8Offset): the same integer sums and f32
// steps as an affine 8-bit group-32 K stored that way, so the same bits as that twin,
// with no K-side FMAs on either (the integer side ran, certified). A missing or wrong
// offset changes every logit.
TEST(SimdQuantizedSdpa, SignedByteKOnTilesGivesItsUnsignedTwinsBits) {
  if (!simd::qdecode::amx_supported()) GTEST_SKIP() << "no AMX-INT8 granted to this process";
  KVLAB_SEEDED_RNG(rng, 1732);
  const Dims s{1, 8, 2, 1, 1000, 128, 64};  // 4 rows per kv head, above vnni::kMinKeys
  Inputs q8 = random_inputs(rng, s, DType::f16, affine(4, 64), affine(4, 64), DType::f16, DType::f16);
  q8.k = ref::ggml_quantize(testing::random_normal(rng, DType::f32, {s.B, s.Hkv, s.Lk, s.Dk}),
                            QuantSpec::make(QuantMode::q8_0, 8, 32));
  Inputs twin = q8;
  twin.k.spec = affine(8, 32);
  twin.k.scales = Tensor(DType::f16, q8.k.scales.shape());
  twin.k.biases = Tensor(DType::f16, q8.k.scales.shape());
  for (std::int64_t i = 0; i < q8.k.scales.numel(); ++i) {
    const float d = q8.k.scales.view().load(i);
    ASSERT_LT(std::abs(d), 256.0f) << "−128·d must be an f16";
    twin.k.scales.view().store(i, d);
    twin.k.biases.view().store(i, -128.0f * d);
  }
  for (std::uint32_t& word : twin.k.wq.storage<std::uint32_t>()) word ^= 0x80808080u;
  testing::for_each_simd_target([&](const std::string& target) {
    if (target != "AVX3_DL") return;
    const simd::qdecode::ScopedAmx amx(true);
    const Tensor got = run_simd(q8);
    const simd::ArithmeticMix mix = simd::last_attention_mix();
    const Tensor want = run_simd(twin);
    const simd::ArithmeticMix twin_mix = simd::last_attention_mix();
    EXPECT_GT(mix.amx_int8, 0) << "q8_0 K took no tile multiplies";
    EXPECT_EQ(mix.amx_int8, twin_mix.amx_int8);
    EXPECT_EQ(mix.fma, twin_mix.fma) << "one K side fell back to f32 FMAs";
    EXPECT_TRUE(testing::bit_equal(got, want));
  });
}

// Asking for AMX where the process has none is an error, not a crash (SIGILL).
TEST(SimdQuantizedSdpa, AmxCannotBeForcedWhereAbsent) {
  if (simd::qdecode::amx_supported()) GTEST_SKIP() << "this process has AMX";
  EXPECT_THROW(simd::qdecode::ScopedAmx(true), Error);
  EXPECT_FALSE(simd::qdecode::amx_available());
}

// The softmax's e^x (x = s − max <= 0) is a trimmed copy of Highway's Exp on AVX3 (no
// sign handling, one vscalefps for 2^q); it must give Highway's bits for every x <= 0:
// a dense sweep of [−110, 0] (normal, subnormal and zero results, the −104 cut-off),
// ties of the q rounding (x·log2(e) near a half-integer), random values and specials.
TEST(SimdQuantizedSdpa, SoftmaxExpIsHighwaysExpForNonPositiveArguments) {
  KVLAB_SEEDED_RNG(rng, 2718);
  std::vector<float> x = {0.0f, -0.0f, -kInf, -1e-30f, -0x1p-149f, -104.0f, std::nextafter(-104.0f, 0.0f),
                          std::nextafter(-104.0f, -kInf), -87.33654f, -103.27893f, -150.0f, -1e30f};
  for (int i = 0; i <= 110 * 4096; ++i) x.push_back(static_cast<float>(-i) / 4096.0f);
  for (int k = 1; k <= 150; ++k) {  // x·log2(e) = k − 0.5 ± a few ulp
    const auto tie = static_cast<float>(-(k - 0.5) * 0.6931471805599453);
    for (float y = tie, n = 0; n < 4; ++n, y = std::nextafter(y, 0.0f)) x.push_back(y);
    for (float y = tie, n = 0; n < 4; ++n, y = std::nextafter(y, -kInf)) x.push_back(y);
  }
  for (int i = 0; i < 100000; ++i) x.push_back(static_cast<float>(-rng.uniform(0.0, 110.0)));
  std::vector<float> fast(x.size()), highway(x.size());
  testing::for_each_simd_target([&](const std::string&) {
    simd::qdecode::exp_nonpositive(x.data(), x.size(), fast.data(), false);
    simd::qdecode::exp_nonpositive(x.data(), x.size(), highway.data(), true);
    int mismatches = 0;
    for (std::size_t i = 0; i < x.size() && mismatches < 5; ++i) {
      if (std::bit_cast<std::uint32_t>(fast[i]) != std::bit_cast<std::uint32_t>(highway[i])) {
        ADD_FAILURE() << "e^" << x[i] << ": " << fast[i] << " instead of Highway's " << highway[i];
        ++mismatches;
      }
    }
    EXPECT_EQ(fast[0], 1.0f);    // e^0
    EXPECT_EQ(fast[2], 0.0f);    // e^−inf: hidden keys weigh exactly 0
    EXPECT_GT(fast[12 + 87 * 4096], 0.0f);  // e^−87 is still normal
  });
}

// ---------------------------------------------------------------- invalid input

void expect_same_error(const Inputs& in, const std::string& what) {
  testing::expect_same_error([&] { run_ref(in); }, [&] { run_simd(in); }, what);
}

TEST(SimdQuantizedSdpa, InvalidInputRaisesTheOraclesErrors) {
  KVLAB_SEEDED_RNG(rng, 500);
  const Inputs good = random_inputs(rng, {2, 4, 2, 1, 9, 64, 64}, DType::f16, affine(4, 32), affine(8, 64),
                                    DType::f16, DType::f16);
  std::vector<std::pair<std::string, std::function<void(Inputs&)>>> edits = {
      {"q rank 3", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 4, 64}); }},
      {"K bits 7", [](Inputs& in) { in.k.spec.bits = 7; }},
      {"V group 48", [](Inputs& in) { in.v.spec.group_size = 48; }},
      {"q head dim not a multiple of K's group", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 4, 1, 48}); }},
      {"K codes of the wrong width", [](Inputs& in) { in.k.wq = Tensor(DType::u32, {2, 2, 9, 9}); }},
      {"K codes not u32", [](Inputs& in) { in.k.wq = Tensor(DType::i32, {2, 2, 9, 8}); }},
      {"V scales of another Lk", [](Inputs& in) { in.v.scales = Tensor(DType::f16, {2, 2, 8, 1}); }},
      {"K biases missing", [](Inputs& in) { in.k.biases = Tensor(); }},
      {"V biases of another dtype", [](Inputs& in) { in.v.biases = Tensor(DType::bf16, {2, 2, 9, 1}); }},
      {"K scales not float", [](Inputs& in) { in.k.scales = Tensor(DType::u8, {2, 2, 9, 2}); }},
      {"fp mode with biases", [](Inputs& in) { in.k.spec = QuantSpec::make(QuantMode::mxfp4); }},
      {"Hq % Hkv", [](Inputs& in) { in.q = Tensor(DType::f16, {2, 3, 1, 64}); }},
      {"K and V batch differ", [](Inputs& in) {
         in.v = quantize(Tensor(DType::f16, {1, 2, 9, 64}), affine(8, 64));
       }},
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
  for (auto& [what, edit] : edits) {
    Inputs in = good;
    edit(in);
    SCOPED_TRACE(what);
    testing::for_each_simd_target([&, &what = what](const std::string&) { expect_same_error(in, what); });
  }
  // The output view: wrong dtype, wrong shape.
  for (const auto& [dtype, shape] : std::vector<std::pair<DType, Shape>>{{DType::f32, {2, 4, 1, 64}},
                                                                          {DType::f16, {2, 4, 1, 32}}}) {
    Tensor out(dtype, shape);
    const ref::QuantizedView k = view_of(good.k), v = view_of(good.v);
    testing::expect_same_error(
        [&] { ref::quantized_sdpa(good.q.view(), k, v, good.params, nullptr, nullptr, out.view()); },
        [&] { simd::quantized_sdpa(good.q.view(), k, v, good.params, nullptr, nullptr, out.view()); },
        cat("out ", dtype_name(dtype), shape_str(shape)));
  }
}

}  // namespace
}  // namespace test_simd_quantized_sdpa
}  // namespace kvlab
