// Arithmetic baseline (arith_baseline.h). The chain kernel is compiled per Highway target
// (foreach_target) and dispatched to the best one, like the SIMD kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/arith_baseline.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Twelve independent chains a = a·m + c: more than an FMA's latency (4-5 cycles) times
// the FMA pipes (2), so the loop is bound by FMA throughput, not by one chain's latency.
// Returns the lanes computed, and the chains' sum in `sink` so none is optimized away.
double FmaChains(std::int64_t rounds, float* sink) {
  const hn::ScalableTag<float> d;
  constexpr int kChains = 12;
  hn::Vec<decltype(d)> a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = hn::Set(d, 1.0f + static_cast<float>(k) * 1e-7f);
  const auto m = hn::Set(d, 0.9999999f), c = hn::Set(d, 1e-7f);
  for (std::int64_t i = 0; i < rounds; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) a[k] = hn::MulAdd(a[k], m, c);
  }
  auto total = hn::Zero(d);
  for (int k = 0; k < kChains; ++k) total = hn::Add(total, a[k]);
  *sink += hn::GetLane(hn::SumOfLanes(d, total));
  return static_cast<double>(rounds) * kChains * static_cast<double>(hn::Lanes(d));
}

}  // namespace kvlab::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <atomic>
#include <iterator>
#include <string>
#include <vector>

#include "bench/arith_baseline.h"
#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"
#include "kvlab/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVLAB_X86_DOTS 1
#endif

namespace kvlab::bench {

HWY_EXPORT(FmaChains);

namespace {

// chains(rounds, &sink) → lanes, on each worker of the pool or on the caller alone.
template <class Chains>
double over_workers(const Chains& chains, std::int64_t rounds, bool use_pool) {
  if (!use_pool) {
    float sink = 0;
    const double lanes = chains(rounds, &sink);
    return sink == 12345.0f ? lanes + 1 : lanes;  // the sink is read
  }
  const int workers = simd::worker_count();
  std::vector<float> sinks(static_cast<std::size_t>(workers), 0.0f);
  std::vector<double> lanes(static_cast<std::size_t>(workers), 0.0);
  simd::parallel_for(workers, [&](std::int64_t w) {
    const auto i = static_cast<std::size_t>(w);
    lanes[i] = chains(rounds, &sinks[i]);
  });
  double total = 0;
  for (std::size_t i = 0; i < lanes.size(); ++i) total += sinks[i] == 12345.0f ? lanes[i] + 1 : lanes[i];
  return total;
}

#ifdef KVLAB_X86_DOTS
// Twelve independent accumulators, as FmaChains: more than either instruction's latency
// (5-6 cycles) times its pipes. The operands stay in registers; an empty asm on one of
// them each round keeps the compiler from folding the chains.
__attribute__((target("avx512f,avx512bf16"))) double Bf16DotChains(std::int64_t rounds, float* sink) {
  constexpr int kChains = 12;
  __m512 a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm512_set1_ps(static_cast<float>(k) * 1e-7f);
  __m512i x = _mm512_set1_epi32(0x3F803F80);  // bf16 1.0 in both halves
  for (std::int64_t i = 0; i < rounds; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) {
      a[k] = _mm512_dpbf16_ps(a[k], reinterpret_cast<__m512bh>(x), reinterpret_cast<__m512bh>(x));
    }
    asm volatile("" : "+v"(x));
  }
  __m512 total = a[0];
  for (int k = 1; k < kChains; ++k) total = _mm512_add_ps(total, a[k]);
  *sink += _mm512_reduce_add_ps(total);
  return static_cast<double>(rounds) * kChains * 16;
}

// The two VNNI dot products, each lane's i32 accumulating four u8·s8 (vpdpbusd) or two
// s16·s16 products (vpdpwssd): 16 lanes an instruction either way.
template <bool kWords>
__attribute__((target("avx512f,avx512vnni"))) double VnniDotChains(std::int64_t rounds, float* sink) {
  constexpr int kChains = 12;
  __m512i a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm512_set1_epi32(k);
  __m512i x = _mm512_set1_epi32(kWords ? 0x00010001 : 0x01010101);
  for (std::int64_t i = 0; i < rounds; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) a[k] = kWords ? _mm512_dpwssd_epi32(a[k], x, x) : _mm512_dpbusd_epi32(a[k], x, x);
    asm volatile("" : "+v"(x));
  }
  __m512i total = a[0];
  for (int k = 1; k < kChains; ++k) total = _mm512_add_epi32(total, a[k]);
  *sink += static_cast<float>(_mm512_reduce_add_epi32(total));
  return static_cast<double>(rounds) * kChains * 16;
}

// The AVX2 form of an s16 dot product, for CPUs without VNNI: vpmaddwd (eight i32 lanes,
// each the sum of two s16·s16 products) and the vpaddd that accumulates it, the pair an
// integer K or V side would issue per 16 products. Six chains, each with its own
// multiplicand: the adds' latency (1 cycle) times the integer pipes (4) is below six;
// distinct multiplicands keep the compiler from computing one product for all chains,
// and the other operand, re-declared changed each round by an empty asm, from hoisting
// the products out of the loop.
__attribute__((target("avx2"))) double MaddChains(std::int64_t rounds, float* sink) {
  constexpr int kChains = 6;
  // Named, not arrays: with arrays GCC 12 kept the chains on the stack.
  __m256i a0 = _mm256_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  const __m256i x0 = _mm256_set1_epi32(0x00010001), x1 = _mm256_set1_epi32(0x00020002), x2 = _mm256_set1_epi32(0x00030003),
          x3 = _mm256_set1_epi32(0x00040004), x4 = _mm256_set1_epi32(0x00050005), x5 = _mm256_set1_epi32(0x00060006);
  __m256i y = _mm256_set1_epi32(0x00010001);
  for (std::int64_t i = 0; i < rounds; ++i) {
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(x0, y));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(x1, y));
    a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(x2, y));
    a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(x3, y));
    a4 = _mm256_add_epi32(a4, _mm256_madd_epi16(x4, y));
    a5 = _mm256_add_epi32(a5, _mm256_madd_epi16(x5, y));
    asm volatile("" : "+x"(y));
  }
  const __m256i total = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                         _mm256_add_epi32(a4, a5));
  *sink += static_cast<float>(_mm256_extract_epi32(total, 0));
  return static_cast<double>(rounds) * kChains * 8;
}

// Four independent C tiles (tmm0..tmm3, 16 rows of 16 i32) each += A (tmm4, 16 rows of 64
// bytes) · B (tmm5, 16 rows of 64 bytes) per round: four multiplies in flight cover
// tdpbsud's latency. Lanes per multiply: 16 × 16 elements of C times 16 dwords of A's row.
// Raw instructions, as the decode's (quantized_decode_vnni-inl.h): no target attribute.
double AmxInt8Chains(std::int64_t rounds, float* sink) {
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16};
  } config;
  alignas(64) std::uint8_t ones[16 * 64];
  std::fill(std::begin(ones), std::end(ones), std::uint8_t{1});
  alignas(64) std::int32_t c[16 * 16];
  const long stride = 64;
  asm volatile("ldtilecfg %0" ::"m"(config));
  asm volatile("tileloadd (%0,%1,1), %%tmm4" ::"r"(ones), "r"(stride) : "memory");
  asm volatile("tileloadd (%0,%1,1), %%tmm5" ::"r"(ones), "r"(stride) : "memory");
  asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::);
  for (std::int64_t i = 0; i < rounds; ++i) {
    asm volatile(
        "tdpbsud %%tmm5, %%tmm4, %%tmm0\n\ttdpbsud %%tmm5, %%tmm4, %%tmm1\n\t"
        "tdpbsud %%tmm5, %%tmm4, %%tmm2\n\ttdpbsud %%tmm5, %%tmm4, %%tmm3" ::);
  }
  asm volatile("tilestored %%tmm3, (%0,%1,1)" ::"r"(c), "r"(stride) : "memory");
  asm volatile("tilerelease" ::);
  *sink += static_cast<float>(c[0]);
  return static_cast<double>(rounds) * 4 * 16 * 16 * 16;
}
#endif

}  // namespace

double fma_lanes(std::int64_t rounds, bool use_pool) {
  return over_workers([](std::int64_t n, float* sink) { return HWY_DYNAMIC_DISPATCH(FmaChains)(n, sink); }, rounds,
                      use_pool);
}

std::string dot_unavailable(DotKind kind) {
#ifdef KVLAB_X86_DOTS
  switch (kind) {
    case DotKind::bf16: return __builtin_cpu_supports("avx512bf16") ? "" : "this CPU has no AVX512_BF16";
    case DotKind::u8:
    case DotKind::s16: return __builtin_cpu_supports("avx512vnni") ? "" : "this CPU has no AVX512_VNNI";
    case DotKind::amx_int8:
      return simd::qdecode::amx_supported() ? "" : "no AMX-TILE and AMX-INT8 granted to this process";
    case DotKind::s16_madd: return __builtin_cpu_supports("avx2") ? "" : "this CPU has no AVX2";
  }
  return "unknown instruction";
#else
  switch (kind) {
    case DotKind::bf16: return "vdpbf16ps is x86-64 only";
    case DotKind::u8: return "vpdpbusd is x86-64 only";
    case DotKind::amx_int8: return "tdpbsud is x86-64 only";
    case DotKind::s16: return "vpdpwssd is x86-64 only";
    case DotKind::s16_madd: return "vpmaddwd is x86-64 only";
  }
  return "unknown instruction";
#endif
}

double dot_lanes(DotKind kind, std::int64_t rounds, bool use_pool) {
  const std::string why = dot_unavailable(kind);
  KVLAB_REQUIRE(why.empty(), unsupported, why);
#ifdef KVLAB_X86_DOTS
  switch (kind) {
    case DotKind::bf16: return over_workers(Bf16DotChains, rounds, use_pool);
    case DotKind::u8: return over_workers(VnniDotChains<false>, rounds, use_pool);
    case DotKind::s16: return over_workers(VnniDotChains<true>, rounds, use_pool);
    case DotKind::amx_int8: return over_workers(AmxInt8Chains, rounds / 16, use_pool);  // ~16 cycles a round per tile
    case DotKind::s16_madd: return over_workers(MaddChains, rounds, use_pool);
  }
  return 0;
#else
  return 0;
#endif
}

}  // namespace kvlab::bench
#endif  // HWY_ONCE
