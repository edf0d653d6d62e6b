// The ggml backend's op entry points, one implementation file per kernel
// (kernels/ggml/<stem>.cc), each over the backend's Engine (threads); ggml_backend.cc
// forwards its overrides here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ggml/ggml_engine.h"
#include "kvlab/backend.h"
#include "kvlab/op_list.h"
#include "kvlab/quantized_view.h"

namespace kvlab::ggmlk {

// The ggml type of a ggml block format (q8_0 … iq4_nl); Error(unsupported) for another.
ggml_type block_type(QuantMode mode);

// What an attention call computed with, for Backend::accumulation/attention_rounding
// (kernels/ggml/attention.h derives it from the path ggml's CPU flash attention takes).
struct Arithmetic {
  DType accumulation = DType::f32;
  Backend::AttentionRounding rounding = Backend::AttentionRounding::none();
};

// K or V of a quantized_sdpa call laid out as ggml's blocks, with the identity of the
// buffers it came from (addresses, shape, format, and a fingerprint of the first and last
// bytes, so that memory freed and reused for other K/V is not taken for the same): the
// static_kv variant keeps the last few across calls (a benchmark's own K/V and its
// verification's).
struct BlockCopy {
  const void *wq = nullptr, *scales = nullptr, *biases = nullptr;
  Shape shape;
  QuantMode mode = QuantMode::q8_0;
  std::uint64_t fingerprint = 0;
  std::shared_ptr<const std::vector<std::uint8_t>> blocks;  // shared: a call holds its own while others are evicted
};
struct StaticKv {
  static constexpr std::size_t kKept = 4;
  std::vector<BlockCopy> kept;  // most recent last
};

// Row r of a tensor in kvlab's packed layout of a ggml block format (a codes bitstream
// per row, f16 d and m beside it: reference/ggml_quantize.h) as ggml's block structs at
// dst, D/32 of them; `codes` is scratch (resized to D).
void row_to_blocks(const QuantizedView& t, std::int64_t r, std::uint8_t* dst, std::vector<std::uint8_t>& codes);

void quantize(const QuantizeArgs& a);
void dequantize(const DequantizeArgs& a);
Arithmetic sdpa(Engine& e, const SdpaArgs& a);
// keep: null converts K/V on every call; else the conversions are reused while the same
// buffers come back (ggml_backend.h, static_kv).
Arithmetic quantized_sdpa(Engine& e, const QuantizedSdpaArgs& a, StaticKv* keep);
void rope(Engine& e, const RopeArgs& a);
// kernels/ggml/kv_move.cc: ggml_set_rows, ggml_get_rows, ggml_cpy.
void kv_scatter(Engine& e, const KvScatterArgs& a);
void kv_gather(Engine& e, const KvGatherArgs& a);
void kv_cast(Engine& e, const KvCastArgs& a);

}  // namespace kvlab::ggmlk
