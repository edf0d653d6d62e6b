// The harness ops, listed once: each is an OpInfo (harness/ops/<stem>_info.cc, with its
// tolerance object and derivation) over one or more kernel ops of kvlab/op_list.h, plus
// the cache-level op `cache` (cache_info.cc). The list makes the declarations below and
// all_ops(); tests/test_op_list.cc checks that every kernel op is driven by one of them
// and that each has harness/cases/<name>/.
#pragma once

#include "harness/op.h"

// X(name): the OpInfo accessor kvlab::harness::ops::name().
#define KVLAB_HARNESS_OPS(X) \
  X(affine_quantize)         \
  X(affine_dequantize)       \
  X(fp_quantize)             \
  X(fp_dequantize)           \
  X(rope)                    \
  X(sdpa)                    \
  X(quantized_sdpa)          \
  X(kv_scatter)              \
  X(kv_gather)               \
  X(kv_copy_blocks)          \
  X(kv_roll)                 \
  X(kv_append_advance)       \
  X(kv_snapshot)             \
  X(cache)

namespace kvlab::harness::ops {

#define KVLAB_DECLARE_HARNESS_OP(name) const OpInfo& name();
KVLAB_HARNESS_OPS(KVLAB_DECLARE_HARNESS_OP)
#undef KVLAB_DECLARE_HARNESS_OP

// The (B, H, T, D) shape of the problem's keys B, H, T, D: the input of the quantize ops.
inline Shape bhtd_shape(const Problem& p) { return {p.integer("B"), p.integer("H"), p.integer("T"), p.integer("D")}; }

// The rope op's tolerance (its derivation is in rope_info.cc), per element of
// ref = rope(x) with batch row b at positions t + row_offsets[b]; for checks outside the
// harness that compare a backend's RoPE with the oracle's (the property suite).
std::vector<double> rope_budget(const Tensor& x, const RopeParams& rope, const std::vector<std::int32_t>& row_offsets,
                                const Tensor& ref);

}  // namespace kvlab::harness::ops
