// SIMD attention over quantized K and V (contract: reference/quantized_sdpa.h).
//
// Fast path (quantized_decode.h/.cc): affine K and V of any bits (4 and 8 read in place,
// 2/3/5/6 unpacked per chunk), any group, f32/f16/bf16 q and scales, every mask kind,
// sinks and softcap, when a kv head has at most kMaxFusedRows query rows (R·Lq: decode).
// ggml's q8_0/q4_0/q4_1 blocks and mxfp4 and nvfp4 groups reach it as affine groups
// (below); mxfp8's E4M3 bytes are read in place by a kernel of their own wherever a chunk's
// scales allow (qdecode::e4m3_codes_readable); every other format (nvfp4 with a global
// scale, ggml's other blocks) as f32 or bf16 rows its SIMD dequantizer writes per chunk
// (PackedSide::decoded).
// Longer query blocks (and decoded sides of odd head dims) fall back to dequantizing K and
// V to f32 with the SIMD dequantizers and running simd::sdpa over an f32 copy of q,
// rounding its f32 output once to q's dtype.
//
// Validation comes first and is the oracle's (ref::validate_quantized_sdpa).
#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#if defined(__linux__) && defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "reference/fp_quantize.h"
#include "reference/quantized_sdpa.h"

namespace kvlab::simd {

namespace qdecode {

namespace {
std::atomic<std::int64_t> g_chunk_tokens{0};  // 0: by shape; else a test's ScopedChunkTokens
}  // namespace

std::int64_t chunk_tokens(std::int64_t batch, std::int64_t hkv, std::int64_t lk, std::int64_t rows,
                          std::int64_t v_groups) {
  const std::int64_t forced = g_chunk_tokens.load();
  if (forced > 0) return forced;
  const auto tasks = [&](std::int64_t chunk) { return batch * hkv * ((lk + chunk - 1) / chunk); };
  std::int64_t chunk = kMinChunkTokens;
  while (chunk * 2 <= kMaxChunkTokens && tasks(chunk * 2) >= kMinChunkTasks && rows * chunk * 2 <= kMaxChunkScores &&
         rows * chunk * 2 * v_groups <= kMaxChunkWeights) {
    chunk *= 2;
  }
  return chunk;
}

namespace {
// -1: the CPU's default; 0 / 1: a test's ScopedBf16Dot.
std::atomic<int> g_bf16_dot{-1};
}  // namespace

bool bf16_dot_supported() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool cpu = __builtin_cpu_supports("avx512bf16") != 0;
  return cpu;
#else
  return false;
#endif
}

bool bf16_dot_available() {
  if (!bf16_dot_supported()) return false;
  const int forced = g_bf16_dot.load();
  if (forced >= 0) return forced == 1;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool fast = __builtin_cpu_is("amd") != 0;
  return fast;
#else
  return false;
#endif
}
namespace {
std::atomic<int> g_amx{-1};  // as g_bf16_dot
std::atomic<bool> g_amx_key_rows{true};

bool cpu_and_os_grant_amx() {
#if defined(__linux__) && defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool tile = (d >> 24) & 1u, int8 = (d >> 25) & 1u;
  if (!tile || !int8) return false;
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // asm/prctl.h, the XTILEDATA component
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}
}  // namespace

bool amx_supported() {
  static const bool granted = cpu_and_os_grant_amx();
  return granted;
}

bool amx_available() {
  const int forced = g_amx.load();
  return amx_supported() && forced != 0;
}

ScopedAmx::ScopedAmx(bool on) : previous_(g_amx.load()) {
  KVLAB_REQUIRE(!on || amx_supported(), invalid_argument,
                "the AMX K side needs AMX-TILE and AMX-INT8 granted by the OS, which this process lacks");
  g_amx.store(on ? 1 : 0);
}
ScopedAmx::~ScopedAmx() { g_amx.store(previous_); }

bool amx_key_rows() { return g_amx_key_rows.load(); }
ScopedAmxKeyRows::ScopedAmxKeyRows(bool on) : previous_(g_amx_key_rows.load()) { g_amx_key_rows.store(on); }
ScopedAmxKeyRows::~ScopedAmxKeyRows() { g_amx_key_rows.store(previous_); }

namespace {
thread_local bool t_rounded_probabilities = false;
thread_local ArithmeticMix t_mix;
thread_local std::int64_t t_decoded_values = 0;
}  // namespace

void note_decode(bool rounded_probabilities, const ArithmeticMix& mix, std::int64_t decoded_values) {
  t_rounded_probabilities = rounded_probabilities;
  t_mix = mix;
  t_decoded_values = decoded_values;
}

ScopedBf16Dot::ScopedBf16Dot(bool on) : previous_(g_bf16_dot.load()) {
  KVLAB_REQUIRE(!on || bf16_dot_supported(), invalid_argument,
                "the bf16 dot-product path needs AVX512_BF16, which this CPU lacks");
  g_bf16_dot.store(on ? 1 : 0);
}
ScopedBf16Dot::~ScopedBf16Dot() { g_bf16_dot.store(previous_); }

namespace {
std::atomic<int> g_quarter_order{-1};       // as g_bf16_dot
std::atomic<int> g_packed_int_values{-1};  // as g_bf16_dot

bool cpu_is_intel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool intel = __builtin_cpu_is("intel") != 0;
  return intel;
#else
  return false;
#endif
}

// The display model of a family-6 CPU (CPUID leaf 1: the extended model above the model);
// 0 elsewhere.
unsigned cpu_display_model() {
#if defined(__linux__) && defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || ((a >> 8) & 0xFu) != 6) return 0;
  return (((a >> 16) & 0xFu) << 4) | ((a >> 4) & 0xFu);
#else
  return 0;
#endif
}
}  // namespace

bool quarter_order_available() {
  const int forced = g_quarter_order.load();
  if (forced >= 0) return forced == 1;
  static const bool measured_faster = cpu_is_intel() && cpu_display_model() == 167;
  return measured_faster;
}

bool packed_int_values_available() {
  const int forced = g_packed_int_values.load();
  return forced >= 0 ? forced == 1 : !cpu_is_intel();
}

ScopedPackedIntValues::ScopedPackedIntValues(bool on) : previous_(g_packed_int_values.load()) {
  g_packed_int_values.store(on ? 1 : 0);
}
ScopedPackedIntValues::~ScopedPackedIntValues() { g_packed_int_values.store(previous_); }

ScopedQuarterOrder::ScopedQuarterOrder(bool on) : previous_(g_quarter_order.load()) {
  g_quarter_order.store(on ? 1 : 0);
}
ScopedQuarterOrder::~ScopedQuarterOrder() { g_quarter_order.store(previous_); }

ScopedChunkTokens::ScopedChunkTokens(std::int64_t tokens) : previous_(g_chunk_tokens.load()) {
  KVLAB_REQUIRE(tokens > 0, invalid_argument, "chunk size ", tokens, " must be positive");
  g_chunk_tokens.store(tokens);
}
ScopedChunkTokens::~ScopedChunkTokens() { g_chunk_tokens.store(previous_); }

PackedSide plain_side(const std::byte* data, DType dtype, std::int64_t d) {
  PackedSide side;
  side.plain = data;
  side.plain_dtype = dtype;
  side.bits = static_cast<int>(dtype_size(dtype) * 8);
  side.group = static_cast<int>(d);
  side.d = d;
  side.bf16_pairs = dtype == DType::bf16 && d % static_cast<std::int64_t>(2 * lanes()) == 0 && bf16_pairs_available();
  return side;
}

PackedSide decoded_side(const ref::QuantizedView& x, std::int64_t d) {
  PackedSide side = plain_side(nullptr, DType::f32, d);
  side.decoded = &x;
  return side;
}

void decoded_rows(const PackedSide& side, std::int64_t row0, std::size_t n, DType dtype, void* out) {
  const ref::QuantizedView& x = *side.decoded;
  const std::int64_t rows = x.wq.dim(0) * x.wq.dim(1) * x.wq.dim(2), count = static_cast<std::int64_t>(n);
  // Row r of each array (row-major, one K/V row per (b, head, key)) starts r times its
  // elements per row in.
  const auto rows_of = [&](const ConstTensorView& t) -> ConstTensorView {
    if (t.data == nullptr) return t;
    const std::int64_t per_row = t.numel() / rows;
    const auto offset = static_cast<std::size_t>(row0 * per_row) * dtype_size(t.dtype);
    return {t.data + offset, t.dtype, Shape{1, 1, count, per_row}};
  };
  const ref::QuantizedView part{rows_of(x.wq), rows_of(x.scales), rows_of(x.biases), x.spec, x.global_scale};
  dequantize(part, TensorView{static_cast<std::byte*>(out), dtype, Shape{1, 1, count, side.d}});
}

namespace {
// The scale codes (one byte each: mxfp8's E8M0) of rows [row0, row0 + n) of a view.
struct ScaleCodes {
  const std::uint8_t* first;
  std::size_t count;
};
ScaleCodes scale_codes(const ref::QuantizedView& x, std::int64_t row0, std::size_t n) {
  const std::int64_t rows = x.wq.dim(0) * x.wq.dim(1) * x.wq.dim(2), groups = x.scales.numel() / rows;
  return {x.scales.as<const std::uint8_t>() + row0 * groups, static_cast<std::size_t>(groups) * n};
}
}  // namespace

// The value of an element times its scale, both exact in f32: in bf16 (8 significant bits,
// f32's exponent range, subnormals down to 2^-133) exactly where it has few enough bits
// and no bit below 2^-133.
//  * mxfp4: an E2M1 value (2 significant bits, a multiple of 2^-1) times an E8M0 2^(c−127):
//    a multiple of 2^-128: always.
//  * nvfp4 without a global scale: an E2M1 value times an E4M3 scale (4 significant bits,
//    2^-9 to 448): 6 bits, 2^-10 to 2688: always. (A global scale multiplies by any f32.)
//  * mxfp8: an E4M3 value (4 bits, a multiple of 2^-9) times 2^(c−127): a multiple of
//    2^(c−136), so where every scale code c of the rows is at least 3 (255, NaN, stays NaN).
// Overflow is the same in both: a finite f32 value with at most 6 significant bits is at
// most 1.96875·2^127, below bf16's largest (1.9921875·2^127).
DType decoded_dtype(const PackedSide& side, std::int64_t row0, std::size_t n) {
  const ref::QuantizedView& x = *side.decoded;
  switch (x.spec.mode) {
    case QuantMode::mxfp4: return DType::bf16;
    case QuantMode::nvfp4: return x.global_scale ? DType::f32 : DType::bf16;
    case QuantMode::mxfp8: {
      const ScaleCodes codes = scale_codes(x, row0, n);
      return *std::min_element(codes.first, codes.first + codes.count) >= 3 ? DType::bf16 : DType::f32;
    }
    default: return DType::f32;
  }
}

bool e4m3_codes_readable(const PackedSide& side, std::int64_t row0, std::size_t n) {
  if (side.decoded == nullptr || side.decoded->spec.mode != QuantMode::mxfp8) return false;
  const ScaleCodes codes = scale_codes(*side.decoded, row0, n);
  // c + 1 modulo 256 maps 255 to 0 and 0..134 to 1..135: one scan in vectors (std::all_of
  // and the scalar factor loop below were a fifth of the mxfp8 decode's samples).
  return max_byte(codes.first, codes.count, 1) <= 135;
}

void e4m3_factors(const PackedSide& side, std::int64_t row0, std::size_t n, float* out) {
  // By the bits (a call to ldexp per group took more time than the kernels' arithmetic).
  const ScaleCodes codes = scale_codes(*side.decoded, row0, n);
  e8m0_factors(codes.first, codes.count, out);
}

namespace {
// s/2 = 2^(c−128) for an E8M0 code c <= kLargestE8M0 (2^-128 and 2^-127 subnormal, exact):
// the scale the fused decode gives mxfp4's codes (DecodeChunk's E2M1HalfScales).
float e2m1_half_scale(std::uint8_t code) { return std::ldexp(1.0f, static_cast<int>(code) - 128); }
}  // namespace

std::vector<double> mean_of_values(const DecodePlan& plan, std::int64_t bk) {
  const PackedSide& v = plan.v;
  if (v.decoded != nullptr) {  // a chunk's worth of rows at a time
    std::vector<double> mean(static_cast<std::size_t>(v.d), 0.0);
    std::vector<float> rows(static_cast<std::size_t>(kDecodedChunkTokens * v.d));
    for (std::int64_t j0 = 0; j0 < plan.lk; j0 += kDecodedChunkTokens) {
      const auto n = static_cast<std::size_t>(std::min(kDecodedChunkTokens, plan.lk - j0));
      decoded_rows(v, bk * plan.lk + j0, n, DType::f32, rows.data());
      for (std::size_t i = 0; i < n * static_cast<std::size_t>(v.d); ++i) {
        mean[i % static_cast<std::size_t>(v.d)] += static_cast<double>(rows[i]);
      }
    }
    for (double& m : mean) m /= static_cast<double>(plan.lk);
    return mean;
  }
  if (v.plain != nullptr) {
    const ConstTensorView rows{v.plain, v.plain_dtype, Shape{plan.batch * plan.hkv * plan.lk * v.d}};
    std::vector<double> mean(static_cast<std::size_t>(v.d), 0.0);
    for (std::int64_t j = 0; j < plan.lk; ++j) {
      for (std::int64_t e = 0; e < v.d; ++e) mean[static_cast<std::size_t>(e)] += rows.load((bk * plan.lk + j) * v.d + e);
    }
    for (double& m : mean) m /= static_cast<double>(plan.lk);
    return mean;
  }
  const std::int64_t words = v.d * v.bits / 32, groups = v.groups();
  const std::uint32_t mask = (1u << v.bits) - 1;
  const Shape meta_shape{plan.batch * plan.hkv * plan.lk * groups};
  const ConstTensorView scales{v.scales, v.meta_dtype, meta_shape};
  // q8_0 (s8), mxfp4 and nvfp4 (e2m1) and q4_0 (bias_factor) store no biases; mxfp4's
  // scales are E8M0 codes, nvfp4's E4M3 codes.
  const ConstTensorView biases = v.biases != nullptr ? ConstTensorView{v.biases, v.meta_dtype, meta_shape}
                                                     : ConstTensorView{};
  std::vector<double> mean(static_cast<std::size_t>(v.d), 0.0);
  for (std::int64_t j = 0; j < plan.lk; ++j) {
    const std::uint32_t* row = v.codes + (bk * plan.lk + j) * words;
    for (std::int64_t e = 0; e < v.d; ++e) {
      // Element e at stream bits [e·bits, e·bits + bits) (reference/bitpack.h).
      const std::int64_t bit = e * v.bits;
      std::uint64_t pair = row[bit / 32];
      if (bit % 32 + v.bits > 32) pair |= std::uint64_t{row[bit / 32 + 1]} << 32;
      const auto stored = static_cast<std::uint8_t>((pair >> (bit % 32)) & mask);
      // An mxfp4 side's code is the byte its E2M1 code becomes (PackedSide::e2m1); q8_0's
      // a signed byte (PackedSide::s8).
      const float code = v.e2m1 ? 2.0f * ref::e2m1_decode(stored)
                         : v.s8 ? static_cast<float>(static_cast<std::int8_t>(stored))
                                : static_cast<float>(stored);
      const std::int64_t meta = (bk * plan.lk + j) * groups + e / v.group;
      // The dequantizer's f32 value: multiply, then add (kvlab_simd builds with
      // -ffp-contract=off, so they are not fused).
      const float scale = v.e4m3_scales ? ref::e4m3_decode(scales.as<const std::uint8_t>()[meta]) / 2
                          : v.e2m1      ? e2m1_half_scale(scales.as<const std::uint8_t>()[meta])
                                        : scales.load(meta);
      const float product = code * scale;
      const float bias = v.s8 || v.e2m1 ? 0.0f : v.bias_factor != 0 ? v.bias_factor * scale : biases.load(meta);
      mean[static_cast<std::size_t>(e)] += static_cast<double>(product + bias);
    }
  }
  for (double& m : mean) m /= static_cast<double>(plan.lk);
  return mean;
}

}  // namespace qdecode

namespace {

using qdecode::DecodePlan;

// The fused decode reads affine codes (unsigned integers with a float scale and bias) as
// they lie; any other format goes through a decoded side (PackedSide::decoded): mxfp8's
// chunks read as E4M3 codes where they can be, the rest dequantized per chunk and read as
// plain f32 or bf16 rows, under simd::sdpa's conditions for those (Dk a multiple of 16, Dv of 32).
bool reads_codes(const ref::QuantizedView& x) { return x.spec.format().encoder == QuantEncoder::affine; }

bool fused_path_takes(const ConstTensorView& q, const ref::QuantizedView& k, const ref::QuantizedView& v,
                      const TensorView& out) {
  const std::int64_t rows = q.dim(1) / k.wq.dim(1) * q.dim(2);
  return rows <= qdecode::kMaxFusedRows && (reads_codes(k) || q.dim(3) % 16 == 0) &&
         (reads_codes(v) || out.dim(3) % 32 == 0);
}

// ---------------------------------------------------------------- ggml blocks

// ggml's q8_0, q4_0 and q4_1 blocks are affine groups of 32 under other names (docs/
// quantization.md §ggml block formats): q4_0's code c has the value (c − 8)·d, q4_1's
// c·d + m, q8_0's signed byte q the value q·d. So their codes go to the fused decode as
// they are with their f16 d (and m) as stored: q4_0's with the biases −8d made per chunk
// (PackedSide::bias_factor), q4_1's with m, q8_0's as signed bytes (PackedSide::s8) with no
// bias. Every value is then exact,
// as the oracle's q·d is (a code of at most 8 bits times an f16 d has at most 19
// significant bits; the bias is a power-of-two multiple of d, or m itself): only the
// attention's own summation order differs, under quantized_sdpa's tolerance. q4's only
// when every d (and m) is finite: a non-finite d would make code·d + bias NaN where the
// oracle's value is ±inf; q8_0's q·d + 0 is the oracle's for any d. (q8_0 used to take a
// flipped whole-tensor copy of its codes and f32 scales and biases −128d, q4's
// whole-tensor f32 scales and biases: passes over the cache and its metadata per call.)

// Whether any of n f16 values is ±inf or NaN (all exponent bits set), in vectors (a
// scalar loop here was a sixth of the q4_0 decode's time at 32 K keys on a Zen 4).
bool any_nonfinite_f16(const std::uint16_t* bits, std::size_t n) {
  return qdecode::max_f16_magnitude(bits, n) >= 0x7C00u;
}

// Whether ok(g0, g1) holds for every range of a tensor's n metadata groups, scanned once per
// call: tasks by a fixed count (not the pool's size), each a range of groups.
template <class Ok>
bool every_group_range(std::size_t n, const Ok& ok) {
  constexpr std::int64_t kTasks = 64;
  std::atomic<bool> all{true};
  parallel_for(kTasks, [&](std::int64_t t) {
    const std::size_t g0 = n * static_cast<std::size_t>(t) / kTasks;
    const std::size_t g1 = n * static_cast<std::size_t>(t + 1) / kTasks;
    if (!ok(g0, g1)) all = false;
  });
  return all.load();
}

std::optional<ref::QuantizedView> ggml_as_affine(const ref::QuantizedView& x) {
  const QuantMode mode = x.spec.mode;
  if (mode != QuantMode::q8_0 && mode != QuantMode::q4_0 && mode != QuantMode::q4_1) return std::nullopt;
  const ref::QuantizedView in_place{x.wq, x.scales, mode == QuantMode::q4_1 ? x.biases : ConstTensorView{},
                                    QuantSpec::make(QuantMode::affine, x.spec.bits, 32), std::nullopt};
  if (mode == QuantMode::q8_0) return in_place;  // PackedSide::s8: no biases
  // q4_0/q4_1: their f16 d (and m) read as stored, per chunk, q4_0's biases −8d from the
  // scales (PackedSide::bias_factor): only while every one is finite (above).
  const auto* d = x.scales.as<const std::uint16_t>();
  const auto* m = mode == QuantMode::q4_1 ? x.biases.as<const std::uint16_t>() : nullptr;
  const auto finite_range = [&](std::size_t g0, std::size_t g1) {
    return !any_nonfinite_f16(d + g0, g1 - g0) && (m == nullptr || !any_nonfinite_f16(m + g0, g1 - g0));
  };
  if (!every_group_range(static_cast<std::size_t>(x.scales.numel()), finite_range)) return std::nullopt;
  return in_place;
}

// mxfp4 groups as affine ones (docs/quantization.md §Microscaling formats): the E2M1 code
// of value v is read as the signed integer 2v (PackedSide::e2m1: in place by the E2M1
// kernel, or unpacked per decode chunk by e2m1_to_bytes), the group's E8M0 scale s (a
// power of two) as the f32 scale s/2 (made per chunk) with no bias, so code·scale = v·s
// exactly, the oracle's value. (An earlier form, the codes 12 + 2v with the bias −6s,
// summed p·(12 + 2v)·s/2 and p·(−6s) apart over the keys: a group of large scale beside
// small values then cancelled to noise, 0 or an f16 inf where the oracle's output was
// 0.03, Mxfp4GroupsWithTheLargestScalesAgreeWithTheOracle.) The integer K side alone
// reads 12 + 2v with the bias −6s (vpdpbusd's codes are unsigned), under its certificate.
// Only while the scales stay small enough for that bias: a scale above 2^123 (code >
// kLargestE8M0) sends the tensor to the decoded rows (PackedSide::decoded).
// The view keeps the nibbles (affine, 4 bits) and the E8M0 codes (u8) as its scales, no
// biases: no metadata is made per call beyond a chunk's (a whole-tensor f32 copy of the
// scales and biases wrote 16 bytes a group per call).
constexpr std::uint8_t kLargestE8M0 = 250;

std::optional<ref::QuantizedView> mxfp4_as_affine(const ref::QuantizedView& x) {
  if (x.spec.mode != QuantMode::mxfp4) return std::nullopt;
  const auto* codes = x.scales.as<const std::uint8_t>();
  const auto foldable_range = [&](std::size_t g0, std::size_t g1) {
    return qdecode::max_byte(codes + g0, g1 - g0) <= kLargestE8M0;
  };
  if (!every_group_range(static_cast<std::size_t>(x.scales.numel()), foldable_range)) return std::nullopt;
  return ref::QuantizedView{x.wq, x.scales, {}, QuantSpec::make(QuantMode::affine, 4, x.spec.group_size),
                            std::nullopt};
}

// nvfp4 groups likewise (the same E2M1 elements): the E4M3 scale s as the f32 s/2
// (PackedSide::e4m3_scales), so code·scale = v·s, exact (2 significant bits times 4). Any
// E4M3 code is a finite scale, so no scan. Groups of 16: on AVX-512 half of the E2M1
// nibble kernel's 32-code unit, so read in place by kE2M1Halves, a group per vector.
// (Attention's contract takes nvfp4 without a global scale, which no f32 scale could fold:
// the oracle rounds v·s, then ·global.) Only head dims of whole 32-element slices (the V side's, two groups each; an
// odd number of groups, D 80, goes to the decoded rows). QuantSpec is built whole, not made:
// affine groups of 16 are no format of their own.
std::optional<ref::QuantizedView> nvfp4_as_affine(const ref::QuantizedView& x) {
  const std::int64_t d = x.wq.dim(3) * 32 / x.spec.bits;
  if (x.spec.mode != QuantMode::nvfp4 || x.global_scale || d % 32 != 0) return std::nullopt;
  return ref::QuantizedView{x.wq, x.scales, {}, QuantSpec{QuantMode::affine, 4, x.spec.group_size}, std::nullopt};
}

// ---------------------------------------------------------------- fallback

Tensor dequantized(const ref::QuantizedView& x, std::int64_t d) {
  Tensor out(DType::f32, {x.wq.dim(0), x.wq.dim(1), x.wq.dim(2), d});
  dequantize(x, out.view());
  return out;
}

void fallback(const ConstTensorView& q, const ref::QuantizedView& k, const ref::QuantizedView& v,
              const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
              const TensorView& out) {
  const Tensor k32 = dequantized(k, q.dim(3)), v32 = dequantized(v, out.dim(3));
  if (q.dtype == DType::f32) {
    sdpa(q, k32.view(), v32.view(), params, mask_array, sinks, out);
    return;
  }
  // simd::sdpa wants one dtype for q, K, V and out: run it in f32 (q converts exactly)
  // and round its output once to out's dtype.
  Tensor q32(DType::f32, q.shape), out32(DType::f32, out.shape);
  qdecode::to_f32(q.data, q.dtype, static_cast<std::size_t>(q32.numel()), q32.view().as<float>());
  sdpa(q32.view(), k32.view(), v32.view(), params, mask_array, sinks, out32.view());
  for (std::int64_t i = 0; i < out32.numel(); ++i) out.store(i, out32.view().load(i));
}

// ---------------------------------------------------------------- fused path

qdecode::PackedSide packed_side(const ref::QuantizedView& x, std::int64_t d) {
  return {x.wq.as<const std::uint32_t>(), x.scales.data, x.biases.data, x.scales.dtype, x.spec.bits,
          x.spec.group_size, d};
}

// Per (b, row) visible key interval, and its union per b (MaskKind::none and array
// masks: every key; the array itself is applied per key by the kernel).
void plan_visibility(DecodePlan& plan, const MaskSpec& mask) {
  const auto cells = static_cast<std::size_t>(plan.batch * plan.rows);
  plan.row_lo.assign(cells, 0);
  plan.row_hi.assign(cells, plan.lk);
  plan.span_lo.assign(static_cast<std::size_t>(plan.batch), 0);
  plan.span_hi.assign(static_cast<std::size_t>(plan.batch), plan.lk);
  if (mask.kind != MaskKind::causal) return;
  for (std::int64_t b = 0; b < plan.batch; ++b) {
    const auto ub = static_cast<std::size_t>(b);
    const std::int64_t left = mask.left_padding.empty() ? 0 : mask.left_padding[ub];
    const std::int64_t right = mask.right_padding.empty() ? 0 : mask.right_padding[ub];
    std::int64_t span_lo = plan.lk, span_hi = 0;
    for (std::int64_t rho = 0; rho < plan.rows; ++rho) {
      // Key j is visible to query position p = i + Lk − Lq iff j <= p, p < j + W (W > 0),
      // j >= left and j < Lk − right (reference/mask.cc): an interval.
      const std::int64_t pos = rho % plan.lq + plan.lk - plan.lq;
      std::int64_t lo = std::max<std::int64_t>(left, 0), hi = std::min(pos + 1, plan.lk - right);
      if (mask.window > 0) lo = std::max(lo, pos - mask.window + 1);
      if (hi <= lo) lo = hi = 0;
      plan.row_lo[ub * static_cast<std::size_t>(plan.rows) + static_cast<std::size_t>(rho)] = lo;
      plan.row_hi[ub * static_cast<std::size_t>(plan.rows) + static_cast<std::size_t>(rho)] = hi;
      if (lo < hi) {
        span_lo = std::min(span_lo, lo);
        span_hi = std::max(span_hi, hi);
      }
    }
    plan.span_lo[ub] = span_lo;
    plan.span_hi[ub] = std::max(span_hi, span_lo);
  }
}

// q·scale in K's lane order, 64-byte aligned in `storage`.
const float* plan_queries(const ConstTensorView& q, const AttentionParams& params, const DecodePlan& plan,
                          std::vector<float>& storage) {
  const std::int64_t dk = plan.k.d, r_per_kv = plan.hq / plan.hkv;
  const int order_bits = plan.k.lane_order();
  const std::size_t n = qdecode::lanes();
  float* query = qdecode::aligned_floats(storage, static_cast<std::size_t>(plan.batch * plan.hkv * plan.rows * dk));
  // Lane position → element, once per call (lane_to_element is another TU's).
  std::vector<std::size_t> element(static_cast<std::size_t>(dk));
  for (std::int64_t pos = 0; pos < dk; ++pos) {
    element[static_cast<std::size_t>(pos)] = static_cast<std::size_t>(qdecode::lane_to_element(pos, order_bits, n));
  }
  std::vector<float> row(static_cast<std::size_t>(dk));
  for (std::int64_t b = 0; b < plan.batch; ++b) {
    for (std::int64_t kvh = 0; kvh < plan.hkv; ++kvh) {
      for (std::int64_t rho = 0; rho < plan.rows; ++rho) {
        const std::int64_t h = kvh * r_per_kv + rho / plan.lq, i = rho % plan.lq;
        const auto src = static_cast<std::size_t>(((b * plan.hq + h) * plan.lq + i) * dk);
        qdecode::to_f32(q.data + src * dtype_size(q.dtype), q.dtype, row.size(), row.data());
        float* dst = query + ((b * plan.hkv + kvh) * plan.rows + rho) * dk;
        for (std::size_t pos = 0; pos < row.size(); ++pos) dst[pos] = row[element[pos]] * params.scale;
      }
    }
  }
  return query;
}

// The stored bf16 queries for the vdpbf16ps K side (DecodePlan::query_bf16), or null
// where it does not apply: plain bf16 K, bf16 q, Dk a multiple of 32 (one vector of
// pairs), a CPU with AVX512_BF16, and a query whose elements keep the instruction's
// flushing of subnormal inputs harmless. A subnormal q element times a K element near
// bf16's largest is a product of order 1 (2^-127·2^127), which it would drop: such a
// query takes the f32 path. Otherwise only subnormal K elements are dropped, products
// below |q|·2^-126, so with |scale|·max|q| <= 2^64 the logits move by at most Dk·2^-62
// (absolute), nothing against any tolerance (its products are exact and its sums f32, as
// the f32 path's); its flushed subnormal sums are below 2^-126 each.
const std::uint16_t* bf16_queries(const ConstTensorView& q, const AttentionParams& params, const DecodePlan& plan) {
  if (plan.k.plain == nullptr || plan.k.plain_dtype != DType::bf16 || q.dtype != DType::bf16 || plan.k.d % 32 != 0 ||
      !qdecode::bf16_dot_available()) {
    return nullptr;
  }
  const auto* raw = reinterpret_cast<const std::uint16_t*>(q.data);
  const auto n = static_cast<std::size_t>(q.numel());
  // The largest |q| by its bits: a bf16 pattern without its sign orders like its
  // magnitude, infinity above every finite value and NaN above infinity, so a NaN cannot
  // slip past (std::max over floats skips it).
  std::uint16_t largest_bits = 0;
  bool subnormal = false;  // exponent bits 0, mantissa not
  for (std::size_t i = 0; i < n; ++i) {
    const auto magnitude = static_cast<std::uint16_t>(raw[i] & 0x7FFFu);
    largest_bits = std::max(largest_bits, magnitude);
    subnormal |= magnitude != 0 && magnitude < 0x0080u;
  }
  if (subnormal) return nullptr;
  const float largest = bf16_bits_to_f32(largest_bits);
  if (!(largest * std::abs(params.scale) <= 0x1p64f)) return nullptr;  // also NaN/inf: the f32 path
  // q is (B, Hq, Lq, Dk): the rows of (b, kvh) are heads kvh·R + r at positions i, row
  // ρ = r·Lq + i: q's own order, so its data is the [b][kvh][ρ][Dk] array as it lies.
  return raw;
}

// How the fused decode reads a side's codes: as affine codes, as mxfp4's E2M1 nibbles
// (mxfp4_as_affine, PackedSide::e2m1) or as q8_0's signed bytes (ggml_as_affine,
// PackedSide::s8).
enum class CodeForm { affine, e2m1, e2m1_e4m3_scales, s8, q4_0 };
void fused(const ConstTensorView& q, const ref::QuantizedView& k, const ref::QuantizedView& v, CodeForm k_form,
           CodeForm v_form, const AttentionParams& params, const ConstTensorView* mask_array,
           const ConstTensorView* sinks, const TensorView& out) {
  DecodePlan plan;
  plan.k = reads_codes(k) ? packed_side(k, q.dim(3)) : qdecode::decoded_side(k, q.dim(3));
  plan.v = reads_codes(v) ? packed_side(v, out.dim(3)) : qdecode::decoded_side(v, out.dim(3));
  plan.k.e4m3_scales = k_form == CodeForm::e2m1_e4m3_scales;
  plan.v.e4m3_scales = v_form == CodeForm::e2m1_e4m3_scales;
  plan.k.e2m1 = k_form == CodeForm::e2m1 || plan.k.e4m3_scales;
  plan.v.e2m1 = v_form == CodeForm::e2m1 || plan.v.e4m3_scales;
  plan.k.e2m1_nibbles = plan.v.e2m1_nibbles = qdecode::e2m1_nibbles_available();
  plan.k.s8 = k_form == CodeForm::s8;
  plan.v.s8 = v_form == CodeForm::s8;
  plan.k.bias_factor = k_form == CodeForm::q4_0 ? -8.0f : 0.0f;
  plan.v.bias_factor = v_form == CodeForm::q4_0 ? -8.0f : 0.0f;
  plan.hkv = k.wq.dim(1);
  plan.lk = k.wq.dim(2);
  const bool half_output = out.dtype == DType::f16 || out.dtype == DType::bf16;
  plan.score_slack = half_output ? static_cast<float>(dtype_epsilon(out.dtype)) : 0.0f;
  qdecode::run(plan, q, params, mask_array, sinks, out);
}

}  // namespace

namespace qdecode {

void run(DecodePlan& plan, const ConstTensorView& q, const AttentionParams& params,
         const ConstTensorView* mask_array, const ConstTensorView* sinks, const TensorView& out) {
  plan.batch = q.dim(0);
  plan.hq = q.dim(1);
  plan.lq = q.dim(2);
  plan.rows = plan.hq / plan.hkv * plan.lq;
  plan.softcap = params.softcap;
  static std::atomic<std::uint64_t> calls{0};
  plan.call = ++calls;
  // V groups of a key row as the kernels read them (KernelGroup): mxfp8's E4M3 codes by
  // their groups, other decoded rows and plain rows as one (their group is the row).
  const PackedSide& v = plan.v;
  const bool e4m3_v = v.decoded != nullptr && v.decoded->spec.mode == QuantMode::mxfp8;
  const std::int64_t v_groups = e4m3_v ? v.d / v.decoded->spec.group_size : v.groups();
  plan.chunk = chunk_tokens(plan.batch, plan.hkv, plan.lk, plan.rows, v_groups);
  // Dequantized rows stay in L2 in chunks of kDecodedChunkTokens; mxfp8's chunks, read as
  // E4M3 codes unless a scale is too large, keep the long chunks that read faster from DRAM.
  const auto dequantized = [](const PackedSide& side) {
    return side.decoded != nullptr && side.decoded->spec.mode != QuantMode::mxfp8;
  };
  if (dequantized(plan.k) || dequantized(plan.v)) plan.chunk = std::min(plan.chunk, kDecodedChunkTokens);
  plan.chunks = (plan.lk + plan.chunk - 1) / plan.chunk;
  plan.mask_kind = params.mask.kind;
  if (mask_array != nullptr) {
    plan.mask = mask_array->data;
    plan.mask_dtype = mask_array->dtype;
    plan.mask_b = mask_array->dim(0);
    plan.mask_h = mask_array->dim(1);
  }
  plan_visibility(plan, params.mask);

  // Per calling thread, reused across calls: no page faults on the partials each step.
  static thread_local std::vector<float> query, part_max, part_sum, part_out, sink_values;
  plan.query = plan_queries(q, params, plan, query);
  plan.query_bf16 = bf16_queries(q, params, plan);
  plan.query_scale = params.scale;
  plan.value_bf16 = plan.v.plain != nullptr && plan.v.plain_dtype == DType::bf16 && out.dtype == DType::bf16 &&
                    plan.v.d % 32 == 0 && plan.chunk <= kMaxBf16ValueChunk && qdecode::bf16_dot_available();
  plan.quarters = qdecode::quarter_order_available();
  plan.packed_int_values = qdecode::packed_int_values_available();
  const auto parts = static_cast<std::size_t>(plan.tasks() * plan.rows);
  plan.part_max = aligned_floats(part_max, parts);
  plan.part_sum = aligned_floats(part_sum, parts);
  plan.part_out = aligned_floats(part_out, parts * static_cast<std::size_t>(plan.v.d));

  std::atomic<bool> rounded_probabilities{false};
  plan.rounded_probabilities = &rounded_probabilities;
  DecodePlan::MixCounters mix;
  plan.mix = &mix;
  parallel_for(plan.tasks(), [&](std::int64_t task) { decode_chunk(plan, task); });
  note_decode(rounded_probabilities.load(),
              ArithmeticMix{mix.fma.load(), mix.bf16_dot.load(), mix.u8_dot.load(), mix.amx_int8.load(),
                            mix.s16_dot.load(), mix.s16_madd.load()},
              mix.decoded.load());

  CombineArgs args;
  args.plan = &plan;
  if (sinks != nullptr) {
    sink_values.resize(static_cast<std::size_t>(plan.hq));
    for (std::int64_t h = 0; h < plan.hq; ++h) sink_values[static_cast<std::size_t>(h)] = sinks->load(h);
    args.sinks = sink_values.data();
  }
  args.fully_masked = params.fully_masked;
  args.out = out.data;
  args.out_dtype = out.dtype;
  parallel_for(plan.batch * plan.hkv, [&](std::int64_t bk) { combine(args, bk); });
}

}  // namespace qdecode

bool last_attention_rounded_probabilities() { return qdecode::t_rounded_probabilities; }
ArithmeticMix last_attention_mix() { return qdecode::t_mix; }
std::int64_t last_attention_decoded_values() { return qdecode::t_decoded_values; }

void quantized_sdpa(const ConstTensorView& q, const ref::QuantizedView& k, const ref::QuantizedView& v,
                    const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
                    const TensorView& out) {
  qdecode::note_call_start();
  ref::validate_quantized_sdpa(q, k, v, params, mask_array, sinks, out);
  const auto as_affine = [](const ref::QuantizedView& x) {
    std::optional<ref::QuantizedView> affine = ggml_as_affine(x);
    if (!affine) affine = mxfp4_as_affine(x);
    return affine ? affine : nvfp4_as_affine(x);
  };
  const std::optional<ref::QuantizedView> k_affine = as_affine(k), v_affine = as_affine(v);
  const ref::QuantizedView& kf = k_affine ? *k_affine : k;
  const ref::QuantizedView& vf = v_affine ? *v_affine : v;
  const auto form = [](const ref::QuantizedView& x, const std::optional<ref::QuantizedView>& affine) {
    if (!affine) return CodeForm::affine;
    switch (x.spec.mode) {
      case QuantMode::mxfp4: return CodeForm::e2m1;
      case QuantMode::nvfp4: return CodeForm::e2m1_e4m3_scales;
      case QuantMode::q8_0: return CodeForm::s8;
      case QuantMode::q4_0: return CodeForm::q4_0;
      default: return CodeForm::affine;
    }
  };
  if (fused_path_takes(q, kf, vf, out)) {
    fused(q, kf, vf, form(k, k_affine), form(v, v_affine), params, mask_array, sinks, out);
  } else {
    fallback(q, k, v, params, mask_array, sinks, out);
  }
}

}  // namespace kvlab::simd
