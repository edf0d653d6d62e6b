// Internal to kernels/simd: the fused flash-decoding kernel behind simd::quantized_sdpa
// (affine K and V, few query rows) and simd::sdpa's decode (plain f16/bf16/f32 K and V:
// PackedSide::plain). quantized_sdpa.cc validates, builds a DecodePlan and runs its tasks
// (run()); quantized_decode.cc holds the per-target (Highway) code.
//
// Work split. The key axis is cut into chunks of a fixed number of tokens (chunk_tokens,
// never derived from the thread count). Task (b, kv head, chunk) computes, for every
// query row of that kv head's GQA group (rows = R·Lq, row ρ = r·Lq + i for query head
// kvh·R + r and query i), a flash partial over the chunk's keys: the running max m, the
// sum l of e^(s−m) and the unnormalized Σ e^(s−m)·v in f32. combine then merges the
// partials of one (b, kv head) in chunk order, so results do not depend on the number
// of threads that ran the tasks.
//
// Lane order. The per-target kernels read codes as they lie in memory, which for 4-bit
// puts elements 2i and 2i+1 of each 2N-element unit into two vectors (N = lanes). The
// plan's prepared queries and the partial outputs are kept in that "lane order";
// lane_to_element() maps back. Plain bf16 rows read as pairs (PackedSide::bf16_pairs)
// take the same order. 8-bit and pre-unpacked (2/3/5/6-bit) codes are in element order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvlab/dtype.h"
#include "kvlab/ops.h"
#include "kvlab/tensor.h"
#include "kernels/simd/simd_kernels.h"

namespace kvlab::simd::qdecode {

// Tokens per chunk (one task's keys), from the call's shape alone, so that no result
// depends on the thread count: kMinChunkTokens, doubled up to kMaxChunkTokens while the
// call still splits into at least kMinChunkTasks tasks, a task's scores (rows · chunk
// floats) stay within kMaxChunkScores and its V weights (rows · chunk · v_groups floats,
// v_groups the V groups a key row as the kernels read it) within kMaxChunkWeights. 512
// keeps a task's scratch (scores, weights, f32 scales/biases) within L2 and its partial
// (R·Lq·(Dv+2) floats) near 3 % of the bytes it reads at Dv = 128, and short caches still
// split into enough tasks for every core (64: four a core on a 16-core host). Long caches
// read faster from DRAM in long chunks (docs/benchmarks.md, "Measurements"; likely
// because each task starts its K and V streams cold). The weights' bound keeps nvfp4's 8
// groups a row (Dv 128) in chunks of 2048: at 4096 its 512 KiB of weights, written by the
// softmax and read back by the V side, left L2 (docs/benchmarks.md, "Measurements").
// batch, hkv, lk: the call's; rows: R·Lq.
constexpr std::int64_t kMinChunkTokens = 512;
constexpr std::int64_t kMaxChunkTokens = 4096;
constexpr std::int64_t kMinChunkTasks = 64;
constexpr std::int64_t kMaxChunkScores = 16384;
constexpr std::int64_t kMaxChunkWeights = 65536;
std::int64_t chunk_tokens(std::int64_t batch, std::int64_t hkv, std::int64_t lk, std::int64_t rows,
                          std::int64_t v_groups = 1);

// Test hook: chunk_tokens() returns `tokens` whatever the shape, for its lifetime
// (process-global, not thread-safe).
class ScopedChunkTokens {
 public:
  explicit ScopedChunkTokens(std::int64_t tokens);
  ~ScopedChunkTokens();
  ScopedChunkTokens(const ScopedChunkTokens&) = delete;
  ScopedChunkTokens& operator=(const ScopedChunkTokens&) = delete;

 private:
  std::int64_t previous_;
};

// Query rows of one kv head that the fused path takes (R·Lq); more goes to the fallback.
constexpr std::int64_t kMaxFusedRows = 32;

// Longest chunk the vdpbf16ps V side takes: its flush-to-zero error grows with the keys
// of a chunk (ValueBlockBf16's argument assumes at most 2^16).
constexpr std::int64_t kMaxBf16ValueChunk = std::int64_t{1} << 16;

// lane_to_element's order of nvfp4's nibbles read in place (kE2M1Halves).
constexpr int kHalvesOrder = 16;

// One operand, K or V, of shape (B, Hkv, Lk, D): packed affine codes, or plain rows.
struct PackedSide {
  const std::uint32_t* codes = nullptr;  // (B, Hkv, Lk, D·bits/32)
  const std::byte* scales = nullptr;     // (B, Hkv, Lk, D/group) in meta_dtype
  const std::byte* biases = nullptr;
  DType meta_dtype = DType::f32;
  int bits = 4;
  int group = 64;
  std::int64_t d = 0;
  // Plain rows (simd::sdpa's decode, plain_side()): the values themselves, (B, Hkv, Lk,
  // D) in plain_dtype (f32/f16/bf16); no codes, scales or biases, bits = the dtype's
  // width and one group of D, so the affine arithmetic is never applied.
  const std::byte* plain = nullptr;
  DType plain_dtype = DType::f32;
  // Plain bf16 rows read as pairs of values (bf16_pairs_available(), D a multiple of 2N):
  // even elements, then odd ones, per 2N values (lane order 4, as 4-bit codes).
  bool bf16_pairs = false;
  // mxfp4 codes (bits 4, stored as E2M1 nibbles) as the signed integers 2v of their values
  // v, with the scales s/2 and no biases: codes of magnitude at most 12 (code_bits 5 bounds
  // them, and the integer K side's 12 + 2v). Read in place in the 4-bit layout by the E2M1
  // kernel (quantized_decode_blocks-inl.h, kE2M1) where e2m1_nibbles
  // (e2m1_nibbles_available()), else unpacked per chunk to signed bytes (e2m1_to_bytes) and
  // read by the kS8 kernel.
  bool e2m1 = false;
  bool e2m1_nibbles = false;
  // nvfp4 without a global scale: e2m1 codes whose group (16) scales are E4M3 codes, read
  // as the f32 E4M3(c)/2 made per chunk (E4M3HalfScales), exact as mxfp4's. In place by
  // the kE2M1Halves kernel (a group per vector) where e2m1_nibbles, else as signed bytes.
  bool e4m3_scales = false;
  // ggml's q8_0 (bits 8, group 32): signed bytes read in place (kS8) with the f16 scales d
  // as stored and no biases (null): code·d + 0 = the oracle's value, exactly, whatever d.
  bool s8 = false;
  // ggml's q4_0: no biases stored; each is this (−8) times its scale d, made per chunk
  // (exact: a power of two times d). 0: biases as stored (or none, s8).
  float bias_factor = 0;
  // Rows of a format no kernel reads as codes (nvfp4, ggml's other blocks, mxfp4 with
  // scales too large to fold; mxfp8's chunks too, unless e4m3_codes_readable, then read as
  // E4M3 codes in place): each chunk's rows dequantized by simd::dequantize, the
  // fallback's own values, into the task's scratch (decoded_rows) and read there as plain
  // rows (f32, or bf16 where exact: decoded_dtype; bits 32, one group of D). The cache is
  // read once, a chunk at a time, instead of copied whole to f32 before the call.
  const ref::QuantizedView* decoded = nullptr;
  std::int64_t groups() const { return d / group; }
  bool plain_rows() const { return plain != nullptr || decoded != nullptr; }
  std::int64_t row_bytes() const { return d * bits / 8; }
  int code_bits() const { return e2m1 ? 5 : bits; }      // the codes' range, 2^code_bits − 1
  int kernel_bits() const { return e2m1 && !e2m1_nibbles ? 8 : bits; }  // the rows' layout as the kernels read them
  // The lane order of the rows as the kernels read them (lane_to_element's `bits`).
  int lane_order() const {
    return e4m3_scales && e2m1_nibbles ? kHalvesOrder : kernel_bits() == 4 || bf16_pairs ? 4 : 8;
  }
};

// The plain side over a (B, Hkv, Lk, d) tensor's data.
PackedSide plain_side(const std::byte* data, DType dtype, std::int64_t d);
// The decoded side over a quantized (B, Hkv, Lk, ·) view (PackedSide::decoded; `x` must
// outlive the plan), and rows [row0, row0 + n) of its (B·Hkv·Lk) rows as `dtype` (f32, or
// bf16 where decoded_dtype allows it) values.
PackedSide decoded_side(const ref::QuantizedView& x, std::int64_t d);
void decoded_rows(const PackedSide& side, std::int64_t row0, std::size_t n, DType dtype, void* out);
// bf16 where every value of those rows is a bf16 exactly (then the rows are half the bytes
// and the same arithmetic follows), else f32.
DType decoded_dtype(const PackedSide& side, std::int64_t row0, std::size_t n);
// Whether the kernels read rows [row0, row0 + n) of a decoded mxfp8 side as they lie (the
// E4M3 kernel, quantized_decode_blocks-inl.h kE4M3): where every E8M0 scale code c of those
// rows gives a factor 2^(c−7) that f32 holds, c <= 134, or is 255 (+inf, as the oracle's
// scale).
// Larger scales (values above 2^7·448) are decoded (decoded_rows).
bool e4m3_codes_readable(const PackedSide& side, std::int64_t row0, std::size_t n);
// The scale factors of those rows, [row][group]: 2^(c−7) for E8M0 code c, +inf for 255.
// The E4M3 kernel reads a code as its value·2^-120, so factor·code is the value·2^(c−127):
// both exact, and the product exact too (a multiple of 2^(c−136), at least 2^-136, within
// f32's subnormal range), so the kernels' values are the oracle's.
void e4m3_factors(const PackedSide& side, std::int64_t row0, std::size_t n, float* out);
// Those factors of n E8M0 codes (per-target, dispatched).
void e8m0_factors(const std::uint8_t* codes, std::size_t n, float* out);
// The largest of n bytes, each plus `add` modulo 256, 0 for none (per-target, dispatched).
std::uint8_t max_byte(const std::uint8_t* p, std::size_t n, std::uint8_t add = 0);
// The largest |x| of n f16 values as bits (sign cleared), 0 for none (per-target,
// dispatched): some value is ±inf or NaN exactly when it is at least 0x7C00.
std::uint16_t max_f16_magnitude(const std::uint16_t* bits, std::size_t n);
// Tokens per chunk with a decoded side: its rows (at most 4·D bytes a key and side) stay in L2.
constexpr std::int64_t kDecodedChunkTokens = 512;

struct DecodePlan {
  PackedSide k, v;
  std::int64_t batch = 0, hq = 0, hkv = 0, lq = 0, lk = 0;
  std::int64_t rows = 0;       // R·Lq query rows per kv head
  std::int64_t chunk = 0;      // tokens per chunk
  std::int64_t chunks = 0;     // ceil(Lk / chunk)
  float softcap = 0;
  // Visibility. Every (b, row) sees the keys [row_lo, row_hi) (causal: the intersection
  // of its causal, window and padding constraints; none and array masks: all keys).
  // span_lo/span_hi[b] bound the union over rows: keys outside it are never read.
  std::vector<std::int64_t> row_lo, row_hi;  // [b·rows + ρ]
  std::vector<std::int64_t> span_lo, span_hi;  // [b]
  // Array masks (boolean u8 / additive float), (1|B, 1|Hq, Lq, Lk); data == nullptr
  // for none and causal.
  MaskKind mask_kind = MaskKind::none;
  const std::byte* mask = nullptr;
  DType mask_dtype = DType::f32;
  std::int64_t mask_b = 1, mask_h = 1;
  // What the logits may lose to a reduced-precision K side, relative to the budget's S:
  // eps_T of an f16/bf16 output (harness/ops/sdpa_info.cc), 0 for f32 (f32 arithmetic
  // only; quantized_decode_vnni-inl.h).
  float score_slack = 0;
  // Unique per call (per-thread caches of per-call data key on it).
  std::uint64_t call = 0;
  // bf16 K and q (simd::sdpa's bf16 decode) on a CPU with AVX512_BF16: the queries
  // unscaled as stored, [b][kvh][ρ][Dk], for the vdpbf16ps K side
  // (quantized_decode_bf16-inl.h), which applies query_scale to the scores; null
  // otherwise.
  const std::uint16_t* query_bf16 = nullptr;
  float query_scale = 1;
  // Plain bf16 V, a bf16 output and a CPU with AVX512_BF16: the V side rounds the
  // weights p to bf16 (the tolerance's "P rounded to T") and sums p·v by vdpbf16ps
  // (quantized_decode_blocks-inl.h, ValueBlockBf16, with its precision argument).
  bool value_bf16 = false;
  // Whether chunks may be read in quarters (KeyOrder; quarter_order_available()).
  bool quarters = false;
  // Whether packed 4-bit V may sum in integers (packed_int_values_available()).
  bool packed_int_values = false;
  // Set by each task whose V side did so (run() reports it to the calling thread).
  std::atomic<bool>* rounded_probabilities = nullptr;
  // Each task adds the lanes of its multiply-adds (ArithmeticMix; run() reports the sums).
  struct MixCounters {
    std::atomic<std::int64_t> fma{0}, bf16_dot{0}, u8_dot{0}, amx_int8{0}, s16_dot{0}, s16_madd{0};
    std::atomic<std::int64_t> decoded{0};  // values dequantized per chunk (PackedSide::decoded)
  };
  MixCounters* mix = nullptr;
  // Queries scaled by params.scale, in K's lane order: [b][kvh][ρ][Dk].
  const float* query = nullptr;
  // Partials, task t = (b·Hkv + kvh)·chunks + c: max and sum [t][ρ], output [t][ρ][Dv]
  // in V's lane order. A chunk where row ρ sees no key has max −inf (its output unset);
  // a NaN score makes the max NaN. Each task writes only its own slots.
  float* part_max = nullptr;
  float* part_sum = nullptr;
  float* part_out = nullptr;

  std::int64_t tasks() const { return batch * hkv * chunks; }
};

// At least n floats of v, starting at a 64-byte boundary (v grows as needed; contents
// are not kept). Whole-vector loads and stores then never straddle a cache line: a split
// access costs two, and a split store does not forward to the load that reads it back.
inline float* aligned_floats(std::vector<float>& v, std::size_t n) {
  if (v.size() < n + 16) v.resize(n + 16);
  const auto address = reinterpret_cast<std::uintptr_t>(v.data());
  return v.data() + (64 - address % 64) % 64 / sizeof(float);
}

// Lanes of the f32 vectors the dispatched target uses.
std::size_t lanes();
// Element index of lane-order position `pos` of a row packed with `bits` (N = lanes()):
// 4, a unit of 2N codes as its low nibbles then its high ones; kHalvesOrder, each half
// of the unit so (kE2M1Halves); else element order.
// Inline: the integer K side maps every q element of a call with it.
inline std::int64_t lane_to_element(std::int64_t pos, int bits, std::size_t n) {
  if (bits != 4 && bits != kHalvesOrder) return pos;
  const auto unit = static_cast<std::int64_t>(2 * n);
  const std::int64_t base = pos / unit * unit, t = pos % unit, half = static_cast<std::int64_t>(n);
  if (bits == 4) return base + (t < half ? 2 * t : 2 * (t - half) + 1);
  const std::int64_t vector = t / half, lane = t % half, quarter = half / 2;
  return base + 2 * (vector * quarter + lane % quarter) + (lane < quarter ? 0 : 1);
}

// n f32/f16/bf16 values → f32, exactly (per-target, dispatched).
void to_f32(const std::byte* src, DType dtype, std::size_t n, float* dst);
// n bytes of packed E2M1 codes (two a byte, the low nibble first) → 2n bytes, code c of
// value v as the signed byte 2v (kernels/simd/fp_transcode.cc; per-target, dispatched).
void e2m1_to_bytes(const std::uint8_t* src, std::size_t n, std::uint8_t* dst);
// Whether the dispatched target reads mxfp4's nibbles in place (PackedSide::e2m1_nibbles):
// on AVX3, where a nibble becomes its code by one vpermps lookup; with AVX2 or less the
// arithmetic per nibble made the mxfp4 decode 51 % slower than unpacking each chunk to
// bytes (docs/benchmarks.md §Measurements behind kernel choices).
bool e2m1_nibbles_available();
// Whether the dispatched target reads plain bf16 rows as pairs (PackedSide::bf16_pairs).
bool bf16_pairs_available();
// The E2M1 kernel's reading of n packed bytes (two codes a byte, the low nibble first; n a
// multiple of lanes()), in its lane order (per N bytes the low nibbles, then the high
// ones): the V side's codes 2v into `codes`, the K side's values with the scale 1/2
// and bias 0 (v itself) into `values`, 2n floats each (per-target, dispatched; for tests).
void e2m1_codes_for_test(const std::uint8_t* src, std::size_t n, float* codes, float* values);
// Rows [0, n) of a (rows, groups) scale or bias array → f32 transposed to dst[g·ncp + j],
// zero padded to ncp (a multiple of lanes()); `convert` is scratch.
void meta_columns(const std::byte* src, DType dtype, std::size_t n, std::size_t groups, std::size_t ncp,
                  std::vector<float>& convert, float* dst);

// Records, for the calling thread, what its current attention call did: whether it
// rounded P (simd::last_attention_rounded_probabilities()) and its multiply-adds
// (simd::last_attention_mix()). Every entry point calls note_call_start() first.
// decoded_values: the values its decoded sides dequantized (simd::last_attention_decoded_values()).
void note_decode(bool rounded_probabilities, const ArithmeticMix& mix, std::int64_t decoded_values);
inline void note_call_start() { note_decode(false, ArithmeticMix{}, 0); }

// Runs a plan whose sides, shape, softcap and score_slack are set: visibility, queries,
// the tasks and the combine into `out` (B, Hq, Lq, Dv) (quantized_sdpa.cc).
void run(DecodePlan& plan, const ConstTensorView& q, const AttentionParams& params,
         const ConstTensorView* mask_array, const ConstTensorView* sinks, const TensorView& out);

// The bf16 dot-product path (vdpbf16ps on the K side, and on the V side where
// DecodePlan::value_bf16 allows): bf16_dot_supported() says the CPU has AVX512_BF16;
// bf16_dot_available() whether the decode takes it. By default it does where the
// instruction beats the f32 path it replaces: on AMD (Zen 4 retires one 512-bit
// vdpbf16ps, 32 products, per cycle beside one 16-lane FMA), not on Intel (Sapphire
// Rapids class: one per two cycles beside two FMAs, half the FMA's products, and the
// f32 path measured faster; docs/benchmarks.md §Measurements behind kernel choices).
// ScopedBf16Dot switches it for a test, so each path is tested on any CPU that has the
// instruction; asking for it on a CPU without it is an invalid_argument.
bool bf16_dot_supported();
bool bf16_dot_available();
class ScopedBf16Dot {
 public:
  explicit ScopedBf16Dot(bool on);
  ~ScopedBf16Dot();
  ScopedBf16Dot(const ScopedBf16Dot&) = delete;
  ScopedBf16Dot& operator=(const ScopedBf16Dot&) = delete;

 private:
  int previous_;
};

// AMX-INT8 for the integer K side (quantized_decode_vnni-inl.h): amx_supported() says
// the CPU has AMX-TILE and AMX-INT8 and Linux granted this process the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once); amx_available() whether the decode takes
// it (by default wherever supported). The tile multiply yields the same exact i32 sums
// as vpdpbusd, so the two paths' outputs are identical. ScopedAmx switches it for a test;
// asking for it where unsupported is an invalid_argument.
bool amx_supported();
bool amx_available();
class ScopedAmx {
 public:
  explicit ScopedAmx(bool on);
  ~ScopedAmx();
  ScopedAmx(const ScopedAmx&) = delete;
  ScopedAmx& operator=(const ScopedAmx&) = delete;

 private:
  int previous_;
};

// The decode's chunks of plain K and V read as four interleaved key streams (KeyOrder,
// quantized_decode_blocks-inl.h) where the call is large: by default only on the CPU where
// the order read faster from DRAM (the Intel Xeon of family 6 model 167), not on the Xeon
// of model 207 nor on Zen 4, where it read slower
// (docs/benchmarks.md §Measurements behind kernel choices). Either order sums the same
// terms; ScopedQuarterOrder switches it for a test, so each path is tested on any CPU.
bool quarter_order_available();
class ScopedQuarterOrder {
 public:
  explicit ScopedQuarterOrder(bool on);
  ~ScopedQuarterOrder();
  ScopedQuarterOrder(const ScopedQuarterOrder&) = delete;
  ScopedQuarterOrder& operator=(const ScopedQuarterOrder&) = delete;

 private:
  int previous_;
};

// Packed 4-bit V with an f16/bf16 output sums in integers on AVX3_DL
// (quantized_decode_int_values-inl.h, its nibbles split into bytes first) by default on
// AMD, where it read faster, and not on Intel, where 4/4-bit read slower
// (docs/benchmarks.md §Measurements behind kernel choices). Byte-coded V takes that side
// on either. Both sides stay under the tolerance; ScopedPackedIntValues switches it for a
// test, so each is tested on any CPU.
bool packed_int_values_available();
class ScopedPackedIntValues {
 public:
  explicit ScopedPackedIntValues(bool on);
  ~ScopedPackedIntValues();
  ScopedPackedIntValues(const ScopedPackedIntValues&) = delete;
  ScopedPackedIntValues& operator=(const ScopedPackedIntValues&) = delete;

 private:
  int previous_;
};

// Which AMX layout scores byte codes (quantized_decode_amx-inl.h): keys as A where it fits
// (the default), or keys as B everywhere. Both give vpdpbusd's exact sums, so the outputs
// are identical; ScopedAmxKeyRows(false) lets a test compare them.
bool amx_key_rows();
class ScopedAmxKeyRows {
 public:
  explicit ScopedAmxKeyRows(bool on);
  ~ScopedAmxKeyRows();
  ScopedAmxKeyRows(const ScopedAmxKeyRows&) = delete;
  ScopedAmxKeyRows& operator=(const ScopedAmxKeyRows&) = delete;

 private:
  bool previous_;
};

// Fills plan.part_* for one task (per-target, dispatched).
void decode_chunk(const DecodePlan& plan, std::int64_t task);
// Merges the partials of (b, kv head) = bk into out rows (B, Hq, Lq, Dv), applying the
// sinks and the fully-masked-row policy (per-target, dispatched).
struct CombineArgs {
  const DecodePlan* plan = nullptr;
  const float* sinks = nullptr;  // [Hq] in f32, or nullptr
  FullyMaskedRow fully_masked = FullyMaskedRow::zero;
  std::byte* out = nullptr;      // (B, Hq, Lq, Dv) in out_dtype
  DType out_dtype = DType::f32;
};
void combine(const CombineArgs& args, std::int64_t bk);

// Test hook: e^x of n values x <= 0 as the kernel's softmax computes it (per-target,
// dispatched), or by Highway's Exp (highway = true), which it must match bit for bit.
void exp_nonpositive(const float* x, std::size_t n, float* out, bool highway);

// Mean over all Lk keys of V dequantized to f32 for (b, kv head) = bk, in element order
// (FullyMaskedRow::mean_of_values; it reads every key by definition, poison included).
std::vector<double> mean_of_values(const DecodePlan& plan, std::int64_t bk);

}  // namespace kvlab::simd::qdecode
