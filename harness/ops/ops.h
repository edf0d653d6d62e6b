// The kernel ops the harness covers, one OpInfo each (harness/ops/<stem>_info.cc), and
// the cache-level op `cache` (cache_info.cc). Each file carries the op's tolerance object
// with its derivation.
#pragma once

#include "harness/op.h"

namespace kvlab::harness::ops {

const OpInfo& affine_quantize();
const OpInfo& affine_dequantize();
const OpInfo& fp_quantize();
const OpInfo& fp_dequantize();
const OpInfo& rope();
const OpInfo& sdpa();
const OpInfo& quantized_sdpa();
const OpInfo& kv_scatter();
const OpInfo& kv_gather();
const OpInfo& kv_copy_blocks();
const OpInfo& kv_roll();
const OpInfo& cache();

}  // namespace kvlab::harness::ops
