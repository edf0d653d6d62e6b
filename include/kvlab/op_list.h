// The kernel ops, listed once. Each op has one argument struct (the call's operands, by
// reference: an argument struct lives for the duration of one call) and one entry in
// KVLAB_OPS. Backend (kvlab/backend.h) turns the list into one virtual per op whose
// default throws Error{unsupported} naming the backend and the op, so a backend
// overrides only what it implements; forwarding and memoizing backends are generated
// from the same list.
//
// Adding a kernel: its argument struct and list entry here, its contract and oracle in
// reference/<stem>.h, the override in reference/reference_backend.cc, its harness op
// (harness/ops/<stem>_info.cc, listed in harness/ops/ops.h) and harness/cases/<op>/
// (tests/test_op_list.cc checks that each of these exists). Contracts (shapes, layouts,
// what is invalid) are documented once, in the reference headers.
#pragma once

#include <span>
#include <vector>

#include "kvlab/dtensor.h"
#include "kvlab/ops.h"
#include "kvlab/quant_spec.h"

namespace kvlab {

// x (..., D) float -> out's codes, scales (and biases), in out.spec's format
// (reference/affine_quantize.h, reference/fp_quantize.h).
struct QuantizeArgs {
  const DTensor& x;
  Rounding rounding;
  const QuantizedDTensor& out;
  std::vector<const DTensor*> outputs() const { return {&out.wq, &out.scales, &out.biases}; }
};

// in's codes -> out (..., D) float, in the arithmetic of `flavour` (kvlab/quant_spec.h:
// only Rounding::mlx differs, for affine f16/bf16).
struct DequantizeArgs {
  const QuantizedDTensor& in;
  const DTensor& out;
  Rounding flavour = Rounding::mlx_cpu;
  std::vector<const DTensor*> outputs() const { return {&out}; }
};

// reference/rope.h
struct RopeArgs {
  const DTensor& x;
  const RopeParams& params;
  const Offsets& offsets;
  const DTensor& out;
  std::vector<const DTensor*> outputs() const { return {&out}; }
};

// reference/sdpa.h. mask: required for MaskKind::boolean/additive, ignored otherwise;
// sinks: optional (Hq,) float logits.
struct SdpaArgs {
  const DTensor &q, &k, &v;
  const AttentionParams& params;
  const DTensor* mask;
  const DTensor* sinks;
  const DTensor& out;
  std::vector<const DTensor*> outputs() const { return {&out}; }
};

// reference/quantized_sdpa.h
struct QuantizedSdpaArgs {
  const DTensor& q;
  const QuantizedDTensor &k, &v;
  const AttentionParams& params;
  const DTensor* mask;
  const DTensor* sinks;
  const DTensor& out;
  std::vector<const DTensor*> outputs() const { return {&out}; }
};

// reference/turboquant.h: x (..., D) float -> norms (...) f16 and indices
// (..., ceil(dim·bits/32)) u32.
struct TurboQuantEncodeArgs {
  const DTensor& x;
  const TurboQuantCodec& codec;
  const DTensor& norms;
  const DTensor& indices;
  std::vector<const DTensor*> outputs() const { return {&norms, &indices}; }
};

// Writes the decoded channels of out (..., D) (only `codec.channels` when given).
struct TurboQuantDecodeArgs {
  const DTensor& norms;
  const DTensor& indices;
  const TurboQuantCodec& codec;
  const DTensor& out;
  std::vector<const DTensor*> outputs() const { return {&out}; }
};

// Cache data movement (reference/kv_move.h). Index vectors (slots, batch_index, shifts)
// are computed by caches on the host and stay there: host int32 views, which a device
// backend copies into its command stream after validating them.
struct KvScatterArgs {
  const DTensor& src;
  ConstTensorView slots;
  const DTensor& dst;
  std::vector<const DTensor*> outputs() const { return {&dst}; }
};
struct KvGatherArgs {
  const DTensor& src;
  ConstTensorView batch_index;
  const DTensor& dst;
  std::vector<const DTensor*> outputs() const { return {&dst}; }
};
struct KvCopyBlocksArgs {
  const DTensor& src;
  std::span<const SeqBlock> blocks;
  const DTensor& dst;
  std::vector<const DTensor*> outputs() const { return {&dst}; }
};
struct KvRollArgs {
  const DTensor& src;
  ConstTensorView shifts;
  const DTensor& dst;
  std::vector<const DTensor*> outputs() const { return {&dst}; }
};

// Device-resident offsets (reference/kv_append.h): the append reads and advances an int32
// (B,) offsets tensor in backend memory, so a device cache never round-trips its offsets
// through the host; left_padding is host bookkeeping and stays a host view.
struct KvAppendAdvanceArgs {
  const DTensor &k, &v;
  ConstTensorView left_padding;
  const DTensor& offsets;  // read, then advanced by S in place
  const DTensor &k_cache, &v_cache;
  std::vector<const DTensor*> outputs() const { return {&k_cache, &v_cache, &offsets}; }
};
// dst = src, byte for byte: the offset snapshot taken before an append.
struct KvSnapshotArgs {
  const DTensor& src;
  const DTensor& dst;
  std::vector<const DTensor*> outputs() const { return {&dst}; }
};

// dst = src converted element-wise between float dtypes (reference/kv_cast.h): K/V of
// one dtype written into a cache of another.
struct KvCastArgs {
  const DTensor& src;
  const DTensor& dst;
  std::vector<const DTensor*> outputs() const { return {&dst}; }
};

// X(op, ArgumentStruct, reference stem)
#define KVLAB_OPS(X)                                       \
  X(quantize, QuantizeArgs, "quantize")                    \
  X(dequantize, DequantizeArgs, "quantize")                \
  X(rope, RopeArgs, "rope")                                \
  X(sdpa, SdpaArgs, "sdpa")                                \
  X(quantized_sdpa, QuantizedSdpaArgs, "quantized_sdpa")   \
  X(turboquant_encode, TurboQuantEncodeArgs, "turboquant") \
  X(turboquant_decode, TurboQuantDecodeArgs, "turboquant") \
  X(kv_scatter, KvScatterArgs, "kv_move")                  \
  X(kv_gather, KvGatherArgs, "kv_move")                    \
  X(kv_copy_blocks, KvCopyBlocksArgs, "kv_move")           \
  X(kv_roll, KvRollArgs, "kv_move")                        \
  X(kv_append_advance, KvAppendAdvanceArgs, "kv_append")   \
  X(kv_snapshot, KvSnapshotArgs, "kv_append")              \
  X(kv_cast, KvCastArgs, "kv_cast")

// Declares `void op(const Args&) override;` for every listed op (a backend that
// implements them all, e.g. the reference).
#define KVLAB_DECLARE_OP_OVERRIDE(op, Args, stem) void op(const Args& args) override;
#define KVLAB_OVERRIDE_ALL_OPS KVLAB_OPS(KVLAB_DECLARE_OP_OVERRIDE)

}  // namespace kvlab
