#include "bench/bytes_model.h"

#include <string>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "kvlab/quant_spec.h"

namespace kvlab::bench {

namespace {

using harness::Problem;

std::int64_t size_of(const Problem& p, const char* key = "dtype") {
  return static_cast<std::int64_t>(dtype_size(dtype_from_name(p.word(key))));
}

// Elements of x (B, H, T, D) for the quantizers and rope.
std::int64_t x_numel(const Problem& p) {
  return p.integer("B") * p.integer("H") * p.integer("T") * p.integer("D");
}

// Packed storage of n elements under `spec` for data of element size `es`:
//   codes  n·bits/8 bytes (u32 words, D·bits/32 per row),
//   scales n/group · (es for affine, 1 byte — E8M0/E4M3 — for the fp modes),
//   biases n/group · es (affine only).
std::int64_t packed_bytes(const QuantSpec& spec, std::int64_t n, std::int64_t es) {
  const std::int64_t groups = n / spec.group_size;
  const std::int64_t scale_size = spec.format().scale == ScaleEncoding::input_dtype ? es : 1;
  return n * spec.bits / 8 + groups * scale_size * (spec.has_biases() ? 2 : 1);
}

QuantSpec affine_spec(const Problem& p) { return {QuantMode::affine, p.int32("bits"), p.int32("group")}; }
QuantSpec fp_spec(const Problem& p) { return QuantSpec::make(quant_mode_from_name(p.word("mode"))); }

// affine_quantize: reads x (n·es); writes the codes, scales and biases. 2 flops per
// element: (x − bias) / scale (the group min/max scan and the rounding are compares).
Traffic affine_quantize(const Problem& p) {
  const std::int64_t n = x_numel(p), es = size_of(p);
  return {n * es, packed_bytes(affine_spec(p), n, es), 2 * n};
}

// affine_dequantize: the mirror image; 2 flops per element: code·scale + bias.
Traffic affine_dequantize(const Problem& p) {
  const std::int64_t n = x_numel(p), es = size_of(p);
  return {packed_bytes(affine_spec(p), n, es), n * es, 2 * n};
}

// fp_quantize: reads x; writes fp4/fp8 codes and u8 scale codes. 1 flop per element
// (x / scale; the code is a table search), +1 with nvfp4's global scale.
Traffic fp_quantize(const Problem& p) {
  const std::int64_t n = x_numel(p), es = size_of(p);
  const std::int64_t per = p.word("global_scale") == "none" ? 1 : 2;
  return {n * es, packed_bytes(fp_spec(p), n, es), per * n};
}

// fp_dequantize: codes + scale codes in, values out; lut(code)·scale (·global).
Traffic fp_dequantize(const Problem& p) {
  const std::int64_t n = x_numel(p), es = size_of(p);
  const std::int64_t per = p.word("global_scale") == "none" ? 1 : 2;
  return {packed_bytes(fp_spec(p), n, es), n * es, per * n};
}

// rope: reads x, writes out (same size; per-row offsets, B·4 bytes, when given). The
// first `dims` features of a row are rotated in pairs, 3 flops per rotated element
// (x1·c − x2·s: two products and a sum); cos/sin are per (position, pair), shared by
// the heads, and not counted.
Traffic rope(const Problem& p) {
  const std::int64_t n = x_numel(p), es = size_of(p);
  const std::int64_t offsets = p.flag("per_row") ? p.integer("B") * 4 : 0;
  return {n * es + offsets, n * es, 3 * (n / p.integer("D")) * p.integer("dims")};
}

// The part of attention shared by sdpa and quantized_sdpa: q read, out written, the
// mask array (bool: 1 byte, additive: f32 per (b, query, key)) and the sinks (Hq f32)
// read when present. Flops: 2·Dk per logit (q·k) and 2·Dv per weighted value (p·v) for
// every (b, query head, query, key) — the dense count, also under a causal mask;
// softmax's exp and the normalization are not counted.
Traffic attention_common(const Problem& p) {
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Lq = p.integer("Lq"), Lk = p.integer("Lk");
  const std::int64_t Dk = p.integer("Dk"), Dv = p.integer("Dv"), es = size_of(p);
  const std::string& mask = p.word("mask");
  const std::int64_t mask_bytes = mask == "bool" ? B * Lq * Lk : (mask == "additive" ? B * Lq * Lk * 4 : 0);
  const std::int64_t sink_bytes = p.flag("sinks") ? Hq * 4 : 0;
  return {B * Hq * Lq * Dk * es + mask_bytes + sink_bytes, B * Hq * Lq * Dv * es, 2 * B * Hq * Lq * Lk * (Dk + Dv)};
}

// sdpa: plus K (B, Hkv, Lk, Dk) and V (B, Hkv, Lk, Dv) in `dtype`, each read once.
Traffic sdpa(const Problem& p) {
  Traffic t = attention_common(p);
  const std::int64_t rows = p.integer("B") * p.integer("Hkv") * p.integer("Lk");
  t.read_bytes += rows * (p.integer("Dk") + p.integer("Dv")) * size_of(p);
  return t;
}

// quantized_sdpa: plus packed K and V (codes, scales, biases per side's spec), each read
// once — the point of a fused kernel: the dequantized K/V never exist in memory.
Traffic quantized_sdpa(const Problem& p) {
  Traffic t = attention_common(p);
  const std::int64_t rows = p.integer("B") * p.integer("Hkv") * p.integer("Lk"), es = size_of(p);
  for (const char* side : {"k", "v"}) {
    const std::string s(side);
    const QuantSpec spec{quant_mode_from_name(p.word(s + "mode")), p.int32(s + "bits"), p.int32(s + "group")};
    t.read_bytes += packed_bytes(spec, rows * p.integer(s == "k" ? "Dk" : "Dv"), es);
  }
  return t;
}

// kv_scatter (the cache append): the B·H·S moved rows of W elements are read from src and
// written into dst (the rest of dst is not touched, so it is not credited); the slot
// indices (B, S) i32 are read.
Traffic kv_scatter(const Problem& p) {
  const std::int64_t moved = p.integer("B") * p.integer("H") * p.integer("S") * p.integer("W") * size_of(p);
  return {moved + p.integer("B") * p.integer("S") * 4, moved, 0};
}

// kv_gather: every dst row (Bd, H, L, W) is read from src and written; Bd i32 indices.
Traffic kv_gather(const Problem& p) {
  const std::int64_t moved = p.integer("Bd") * p.integer("H") * p.integer("L") * p.integer("W") * size_of(p);
  return {moved + p.integer("Bd") * 4, moved, 0};
}

// kv_copy_blocks: `blocks` blocks of len rows per head are read and written.
Traffic kv_copy_blocks(const Problem& p) {
  const std::int64_t moved =
      p.integer("blocks") * p.integer("H") * p.integer("len") * p.integer("W") * size_of(p);
  return {moved, moved, 0};
}

// kv_roll: the whole (B, H, L, W) tensor is read and written; B i32 shifts.
Traffic kv_roll(const Problem& p) {
  const std::int64_t moved = p.integer("B") * p.integer("H") * p.integer("L") * p.integer("W") * size_of(p);
  return {moved + p.integer("B") * 4, moved, 0};
}

// kv_append_advance (the device-offset cache append): the B·H·S new K and V rows are read
// and written into the caches; B offsets are read and written, B left paddings read.
Traffic kv_append_advance(const Problem& p) {
  const std::int64_t rows = p.integer("B") * p.integer("H") * p.integer("S");
  const std::int64_t moved = rows * (p.integer("Dk") + p.integer("Dv")) * size_of(p);
  return {moved + p.integer("B") * 8, moved + p.integer("B") * 4, 0};
}

// kv_snapshot: N elements read and written.
Traffic kv_snapshot(const Problem& p) {
  const std::int64_t moved = p.integer("N") * size_of(p);
  return {moved, moved, 0};
}

using Model = Traffic (*)(const Problem&);

Model model_of(const std::string& op) {
  if (op == "affine_quantize") return affine_quantize;
  if (op == "affine_dequantize") return affine_dequantize;
  if (op == "fp_quantize") return fp_quantize;
  if (op == "fp_dequantize") return fp_dequantize;
  if (op == "rope") return rope;
  if (op == "sdpa") return sdpa;
  if (op == "quantized_sdpa") return quantized_sdpa;
  if (op == "kv_scatter") return kv_scatter;
  if (op == "kv_gather") return kv_gather;
  if (op == "kv_copy_blocks") return kv_copy_blocks;
  if (op == "kv_roll") return kv_roll;
  if (op == "kv_append_advance") return kv_append_advance;
  if (op == "kv_snapshot") return kv_snapshot;
  return nullptr;
}

}  // namespace

bool has_traffic_model(const std::string& op) { return model_of(op) != nullptr; }

Traffic traffic_of(const Problem& p) {
  const Model m = model_of(p.op());
  KVLAB_REQUIRE(m != nullptr, invalid_argument, "no bytes model for op '", p.op(), "' (bench/bytes_model.cc)");
  return m(p);
}

}  // namespace kvlab::bench
