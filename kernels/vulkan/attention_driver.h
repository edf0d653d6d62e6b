// The attention driver shared by the two Vulkan attention ops (sdpa.cc defines it,
// quantized_sdpa.cc uses it too): the parameter table's layout and the calls that fill
// the table and record the attention and combine passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "kernels/vulkan/context.h"
#include "reference/attention_core.h"

namespace kvlab {

namespace vulkan_attention {
// Indices of the parameter table: shaders/sdpa_params.glsl, same values.
enum Param : std::size_t {
  kQOff, kKOff, kVOff, kMaskOff, kSinksOff, kOutOff,
  kQDtype, kKDtype, kVDtype, kMaskDtype, kSinksDtype,
  kB, kHq, kHkv, kLq, kLk, kDk, kDv,
  kMaskKind, kMaskB, kMaskH, kWindow, kHasLpad, kHasRpad,
  kScale, kSoftcap, kChunkLen, kChunks, kMeanPolicy, kHasSinks,
  kKsOff, kKbOff, kVsOff, kVbOff, kKBits, kKGroup, kVBits, kVGroup, kQfBase, kPartialBase, kRBlock,
  kPaddings = 48,
};

// Defined in sdpa.cc (see there).
std::vector<std::uint32_t> base_table(const DTensor& q, const DTensor& out, std::int64_t hkv, std::int64_t lk,
                                      const AttentionParams& params, const DTensor* mask, const DTensor* sinks);
void run(VulkanBackend::Context& c, vulkan::ShaderId pass, std::vector<std::uint32_t> table, const DTensor& q,
         std::initializer_list<BoundTensor> operands, std::initializer_list<BoundTensor> meta, const DTensor* mask,
         const DTensor* sinks, const DTensor& out, std::span<const std::uint32_t> specialization);
std::int64_t heads_per_workgroup(std::int64_t group, std::int64_t dk);
}  // namespace vulkan_attention

}  // namespace kvlab
