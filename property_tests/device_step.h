// The property of DeviceBatchKVCache's attention step (cache/device_batch_kv_cache.h):
// through attend() and a KV-shared layer's attend_shared(), a cache whose offsets live in
// backend memory behaves exactly as BatchKVCache, whose offsets live on the host, on the
// same kernels. The device cache takes its positions with kv_snapshot and never reads
// them back; BatchKVCache uploads them. Same kernels, same inputs: every output, cached
// row, offset and position must be bit for bit the same, so any difference is the offset
// bookkeeping (BatchKVCache itself is held to the model by the property suite).
//
// Run by tests/vulkan/test_vulkan_device_step.cc (reference and Vulkan) and by the bug zoo
// (property_tests/zoo/vulkan_mutants.cc: the killer of v1.shared-rope-reads-live-offsets,
// where `under_test` wraps the Vulkan backend `oracle` runs on).
//
// One case: B 1..3 rows with left padding 0..3, H 1..2 KV heads, Hq = H·(1..2), a head
// shape (D, rope dims) from {(8, 8), (9, 8), (18, 16), (64, 64)} (odd D and a copied tail
// included), f32/f16/bf16, traditional or not, 1..5 chunks of 1..6 tokens (the first is
// the prefill), each attended by a producer layer and a KV-shared layer. Sizes are small
// so that a run of ~50 cases stays within a few seconds on lavapipe.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab::prop {

struct DeviceStepOptions {
  // Called with the chunk lengths of a failing case before the failure propagates (the
  // zoo's kill matrix records steps and tokens).
  std::function<void(const std::vector<std::int64_t>& chunks)> on_failure;
};

// One RapidCheck case (generates with *gen, fails with RC_ASSERT / RC_FAIL). The device
// cache runs on `under_test`, BatchKVCache on `oracle`; both are shared by every case of a
// run and must run the same kernels (the same backend, or a wrapper and what it wraps).
void device_step_matches_batch_cache(Backend& under_test, Backend& oracle, const DeviceStepOptions& options = {});

}  // namespace kvlab::prop
