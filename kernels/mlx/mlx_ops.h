// The MLX backend's op entry points, one implementation file per kernel
// (kernels/mlx/<stem>.cc). Free functions rather than members so that only the .cc files
// see MLX's headers; mlx_backend.cc forwards its overrides here.
#pragma once

#include "kvlab/op_list.h"

namespace kvlab::mlxk {

// Whether MLX's CPU backend computes this rounding flavour. MLX computes one arithmetic;
// a quantize asked for another flavour is unsupported here rather than silently
// answered with MLX's (the comparison would then fail for the wrong reason).
bool mlx_computes(Rounding r);

void quantize(const QuantizeArgs& a);
void dequantize(const DequantizeArgs& a);
void rope(const RopeArgs& a);
void sdpa(const SdpaArgs& a);
void quantized_sdpa(const QuantizedSdpaArgs& a);
void kv_scatter(const KvScatterArgs& a);
void kv_gather(const KvGatherArgs& a);
void kv_copy_blocks(const KvCopyBlocksArgs& a);
void kv_roll(const KvRollArgs& a);
void kv_append_advance(const KvAppendAdvanceArgs& a);
void kv_snapshot(const KvSnapshotArgs& a);

}  // namespace kvlab::mlxk
