// The RapidCheck property of DeviceBatchKVCache::rope_and_update
// (cache/device_batch_kv_cache.h) over any backend, shared by
// tests/vulkan/test_vulkan_device_step.cc (it passes on the reference and on Vulkan) and
// the bug zoo (property_tests/zoo/vulkan_mutants.cc, the killer of
// v1.rope-q-reads-live-offsets, which runs it over a wrapper of the Vulkan backend).
//
// One case: B 1..3 rows with left padding 0..3, H 1..2 KV heads, Hq = H·(1..2), a head
// shape (D, rope dims) from {(8, 8), (9, 8), (18, 16), (64, 64)} (odd D and a copied tail
// included), f32/f16/bf16, traditional or not, 1..5 chunks of 1..6 tokens (the first is
// the prefill). Each chunk runs through the cache's step and through the oracle
// (device_step_oracle.h: BatchKVCache over the reference, host RoPE at the pre-update
// offsets). After every chunk: offsets equal; cached V bit for bit; cached K and the
// roped Q at most one ulp from the oracle (the Vulkan rope tolerance). Sizes are small
// so that a run of ~50 cases stays within a few seconds on lavapipe.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab::testing {

struct DeviceStepPropertyOptions {
  // Called with the chunk lengths of a failing case before the failure propagates (the
  // zoo's kill matrix records steps and tokens).
  std::function<void(const std::vector<std::int64_t>& chunks)> on_failure;
};

// One RapidCheck case (generates with *gen, fails with RC_ASSERT / RC_FAIL); `be` is
// shared by every case of a run.
void device_step_matches_reference(Backend& be, const DeviceStepPropertyOptions& options = {});

}  // namespace kvlab::testing
