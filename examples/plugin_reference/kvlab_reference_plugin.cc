// A plugin that forwards every one of the 13 slots of include/kvlab/plugin.h to kvlab's
// own scalar oracle (reference/). It is the ABI's round-trip test: kvlab marshals its
// views into the C structs (harness/plugin_backend.cc), this file rebuilds kvlab views
// from them, and the oracle computes. Any field the ABI drops or garbles (a softcap, a
// padding vector, a global scale, the rounding flavour, a per-row offset) makes this
// backend differ from `--backend reference` on the case that uses it, so
// `kvlab check --backend plugin:<this>` over every op of the ci tier, the cache op and
// the stateful properties (KVLAB_PROP_BACKEND) all hold exactly when the ABI is lossless.
//
// It is also the template for a C++ engine that wants to reuse kvlab's oracle inside a
// plugin: link the installed kvlab::reference (built position-independent) into a MODULE.
#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <span>

#include "kvlab/error.h"
#include "kvlab/plugin.h"
#include "reference/kv_append.h"
#include "reference/kv_move.h"
#include "reference/quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/rope.h"
#include "reference/sdpa.h"
#include "reference/turboquant.h"

namespace {

using namespace kvlab;

// ---- the C structs -> kvlab views -------------------------------------------------

Shape shape_of(const kvlab_tensor& t) { return Shape(t.shape, t.shape + t.rank); }

ConstTensorView cview(const kvlab_tensor& t) {
  return {static_cast<const std::byte*>(t.data), static_cast<DType>(t.dtype), shape_of(t)};
}

TensorView mview(const kvlab_tensor& t) {
  TensorView v;
  v.data = static_cast<std::byte*>(t.data);
  v.dtype = static_cast<DType>(t.dtype);
  v.shape = shape_of(t);
  return v;
}

QuantSpec spec_of(const kvlab_quantized& q) {
  return QuantSpec{static_cast<QuantMode>(q.mode), q.bits, q.group_size};
}

std::optional<float> global_scale_of(const kvlab_quantized& q) {
  return q.has_global_scale != 0 ? std::optional<float>(q.global_scale) : std::nullopt;
}

QuantizedView cquantized(const kvlab_quantized& q) {
  return {cview(q.wq), cview(q.scales), cview(q.biases), spec_of(q), global_scale_of(q)};
}

QuantizedMutView mquantized(const kvlab_quantized& q) {
  return {mview(q.wq), mview(q.scales), mview(q.biases), spec_of(q), global_scale_of(q)};
}

template <class T>
std::vector<T> vec(const T* p, std::int64_t n) {
  return p != nullptr && n > 0 ? std::vector<T>(p, p + n) : std::vector<T>{};
}

AttentionParams attention_of(const kvlab_attention_params& c) {
  AttentionParams p;
  p.scale = c.scale;
  p.softcap = c.softcap;
  p.mask.kind = static_cast<MaskKind>(c.mask_kind);
  p.mask.window = c.window;
  p.mask.left_padding = vec(c.left_padding, c.left_padding_count);
  p.mask.right_padding = vec(c.right_padding, c.right_padding_count);
  p.fully_masked = static_cast<FullyMaskedRow>(c.fully_masked);
  return p;
}

TurboQuantCodec codec_of(const kvlab_turboquant_codec& c) {
  TurboQuantCodec codec;
  codec.dim = c.dim;
  codec.bits = c.bits;
  codec.signs = vec(c.signs, c.signs_count);
  codec.rotation = vec(c.rotation, c.rotation_count);
  codec.codebook = vec(c.codebook, c.codebook_count);
  codec.channels = vec(c.channels, c.channels_count);
  return codec;
}

// An optional operand: NULL stays absent.
const ConstTensorView* optional_view(const kvlab_tensor* t, ConstTensorView& storage) {
  if (t == nullptr) return nullptr;
  storage = cview(*t);
  return &storage;
}

// ---- kvlab::Error -> status and message ---------------------------------------------

void write_message(char* msg, std::size_t len, const char* text) {
  if (msg == nullptr || len == 0) return;
  const std::size_t n = std::min(len - 1, std::strlen(text));
  std::memcpy(msg, text, n);
  msg[n] = '\0';
}

std::int32_t status_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::unsupported: return KVLAB_PLUGIN_UNSUPPORTED;
    case ErrorKind::invalid_argument:
    case ErrorKind::shape_mismatch:
    case ErrorKind::dtype_mismatch: return KVLAB_PLUGIN_INVALID;
    default: return KVLAB_PLUGIN_INTERNAL;
  }
}

// No exception crosses the C boundary.
template <class Fn>
std::int32_t guarded(char* msg, std::size_t len, Fn&& fn) noexcept {
  try {
    fn();
    return KVLAB_PLUGIN_OK;
  } catch (const Error& e) {
    write_message(msg, len, e.message().c_str());
    return status_of(e.kind());
  } catch (const std::exception& e) {
    write_message(msg, len, e.what());
    return KVLAB_PLUGIN_INTERNAL;
  } catch (...) {
    write_message(msg, len, "unknown exception");
    return KVLAB_PLUGIN_INTERNAL;
  }
}

// ---- the 13 slots -----------------------------------------------------------------

std::int32_t quantize(const kvlab_quantize_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ref::quantize(cview(*a->x), static_cast<Rounding>(a->rounding), mquantized(*a->out));
  });
}

std::int32_t dequantize(const kvlab_dequantize_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ref::dequantize(cquantized(*a->in), mview(*a->out), static_cast<Rounding>(a->flavour));
  });
}

std::int32_t rope(const kvlab_rope_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    RopeParams p;
    p.dims = a->dims;
    p.traditional = a->traditional != 0;
    p.base = a->base;
    p.scale = a->scale;
    p.freqs = vec(a->freqs, a->freqs_count);
    p.mlx_arithmetic = a->mlx_arithmetic != 0;
    const std::optional<ConstTensorView> per_row =
        a->per_row_offsets != nullptr ? std::optional<ConstTensorView>(cview(*a->per_row_offsets)) : std::nullopt;
    ref::rope(cview(*a->x), p, a->offset, per_row, mview(*a->out));
  });
}

std::int32_t sdpa(const kvlab_sdpa_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ConstTensorView m, s;
    ref::sdpa(cview(*a->q), cview(*a->k), cview(*a->v), attention_of(*a->params), optional_view(a->mask, m),
              optional_view(a->sinks, s), mview(*a->out));
  });
}

std::int32_t quantized_sdpa(const kvlab_quantized_sdpa_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ConstTensorView m, s;
    ref::quantized_sdpa(cview(*a->q), cquantized(*a->k), cquantized(*a->v), attention_of(*a->params),
                        optional_view(a->mask, m), optional_view(a->sinks, s), mview(*a->out));
  });
}

std::int32_t turboquant_encode(const kvlab_turboquant_encode_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ref::turboquant_encode(cview(*a->x), codec_of(*a->codec), mview(*a->norms), mview(*a->indices));
  });
}

std::int32_t turboquant_decode(const kvlab_turboquant_decode_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ref::turboquant_decode(cview(*a->norms), cview(*a->indices), codec_of(*a->codec), mview(*a->out));
  });
}

std::int32_t kv_scatter(const kvlab_kv_scatter_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] { ref::kv_scatter(cview(*a->src), cview(*a->slots), mview(*a->dst)); });
}

std::int32_t kv_gather(const kvlab_kv_gather_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] { ref::kv_gather(cview(*a->src), cview(*a->batch_index), mview(*a->dst)); });
}

std::int32_t kv_copy_blocks(const kvlab_kv_copy_blocks_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    std::vector<SeqBlock> blocks;
    for (std::int64_t i = 0; i < a->block_count; ++i) {
      const kvlab_seq_block& b = a->blocks[i];
      blocks.push_back({b.src_batch, b.src_seq, b.dst_batch, b.dst_seq, b.length});
    }
    ref::kv_copy_blocks(cview(*a->src), blocks, mview(*a->dst));
  });
}

std::int32_t kv_roll(const kvlab_kv_roll_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] { ref::kv_roll(cview(*a->src), cview(*a->shifts), mview(*a->dst)); });
}

std::int32_t kv_append_advance(const kvlab_kv_append_advance_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] {
    ref::kv_append_advance(cview(*a->k), cview(*a->v), cview(*a->left_padding), mview(*a->offsets),
                           mview(*a->k_cache), mview(*a->v_cache));
  });
}

std::int32_t kv_snapshot(const kvlab_kv_snapshot_args* a, char* msg, std::size_t len) {
  return guarded(msg, len, [&] { ref::kv_snapshot(cview(*a->src), mview(*a->dst)); });
}

const kvlab_plugin_v1 table = {
    KVLAB_PLUGIN_ABI_VERSION, "reference-forwarding",
    quantize, dequantize, rope, sdpa, quantized_sdpa, turboquant_encode, turboquant_decode,
    kv_scatter, kv_gather, kv_copy_blocks, kv_roll, kv_append_advance, kv_snapshot,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kvlab_plugin_v1* kvlab_plugin_entry(void) { return &table; }
