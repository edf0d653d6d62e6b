#include "kernels/vulkan/shaders.h"

namespace kvlab::vulkan {

namespace {

// glslc -mfmt=c output: a brace-enclosed word list (kernels/vulkan/cmake/KvlabSpirv.cmake).
const std::uint32_t kFillSmall[] =
#include "fill_small.spv.inc"
    ;
const std::uint32_t kFillWords[] =
#include "fill_words.spv.inc"
    ;
const std::uint32_t kAffineQuantizeSmall[] =
#include "affine_quantize_small.spv.inc"
    ;
const std::uint32_t kAffineQuantizeWords[] =
#include "affine_quantize_words.spv.inc"
    ;
const std::uint32_t kAffineDequantizeSmall[] =
#include "affine_dequantize_small.spv.inc"
    ;
const std::uint32_t kAffineDequantizeWords[] =
#include "affine_dequantize_words.spv.inc"
    ;
const std::uint32_t kRopeSmall[] =
#include "rope_small.spv.inc"
    ;
const std::uint32_t kRopeWords[] =
#include "rope_words.spv.inc"
    ;
const std::uint32_t kKvMoveSmall[] =
#include "kv_move_small.spv.inc"
    ;
const std::uint32_t kKvMoveWords[] =
#include "kv_move_words.spv.inc"
    ;
const std::uint32_t kSdpaSmall[] =
#include "sdpa_small.spv.inc"
    ;
const std::uint32_t kSdpaWords[] =
#include "sdpa_words.spv.inc"
    ;
const std::uint32_t kQuantizedSdpaSmall[] =
#include "quantized_sdpa_small.spv.inc"
    ;
const std::uint32_t kQuantizedSdpaWords[] =
#include "quantized_sdpa_words.spv.inc"
    ;
const std::uint32_t kSdpaStageQSmall[] =
#include "sdpa_stage_q_small.spv.inc"
    ;
const std::uint32_t kSdpaStageQWords[] =
#include "sdpa_stage_q_words.spv.inc"
    ;
const std::uint32_t kSdpaCombineSmall[] =
#include "sdpa_combine_small.spv.inc"
    ;
const std::uint32_t kSdpaCombineWords[] =
#include "sdpa_combine_words.spv.inc"
    ;
const std::uint32_t kKvAppendAdvanceSmall[] =
#include "kv_append_advance_small.spv.inc"
    ;
const std::uint32_t kKvAppendAdvanceWords[] =
#include "kv_append_advance_words.spv.inc"
    ;
const std::uint32_t kSdpaSubgroupSmall[] =
#include "sdpa_subgroup_small.spv.inc"
    ;
const std::uint32_t kSdpaSubgroupWords[] =
#include "sdpa_subgroup_words.spv.inc"
    ;
const std::uint32_t kQuantizedSdpaSubgroupSmall[] =
#include "sdpa_quantized_subgroup_small.spv.inc"
    ;
const std::uint32_t kQuantizedSdpaSubgroupWords[] =
#include "sdpa_quantized_subgroup_words.spv.inc"
    ;
const std::uint32_t kQuantizedSdpaDecodeSmall[] =
#include "sdpa_quantized_decode_small.spv.inc"
    ;
const std::uint32_t kQuantizedSdpaDecodeWords[] =
#include "sdpa_quantized_decode_words.spv.inc"
    ;

template <std::size_t Small, std::size_t Words>
std::span<const std::uint32_t> pick(bool small_storage, const std::uint32_t (&small)[Small],
                                    const std::uint32_t (&words)[Words]) {
  return small_storage ? std::span<const std::uint32_t>(small) : std::span<const std::uint32_t>(words);
}

}  // namespace

std::string_view shader_name(ShaderId id) {
  switch (id) {
    case ShaderId::fill: return "fill";
    case ShaderId::affine_quantize: return "affine_quantize";
    case ShaderId::affine_dequantize: return "affine_dequantize";
    case ShaderId::rope: return "rope";
    case ShaderId::kv_move: return "kv_move";
    case ShaderId::sdpa: return "sdpa";
    case ShaderId::quantized_sdpa: return "quantized_sdpa";
    case ShaderId::sdpa_stage_q: return "sdpa_stage_q";
    case ShaderId::sdpa_combine: return "sdpa_combine";
    case ShaderId::kv_append_advance: return "kv_append_advance";
    case ShaderId::sdpa_subgroup: return "sdpa_subgroup";
    case ShaderId::quantized_sdpa_subgroup: return "quantized_sdpa_subgroup";
    case ShaderId::quantized_sdpa_decode: return "quantized_sdpa_decode";
  }
  return "?";
}

std::span<const std::uint32_t> shader_spirv(ShaderId id, bool small_storage) {
  switch (id) {
    case ShaderId::fill: return pick(small_storage, kFillSmall, kFillWords);
    case ShaderId::affine_quantize: return pick(small_storage, kAffineQuantizeSmall, kAffineQuantizeWords);
    case ShaderId::affine_dequantize: return pick(small_storage, kAffineDequantizeSmall, kAffineDequantizeWords);
    case ShaderId::rope: return pick(small_storage, kRopeSmall, kRopeWords);
    case ShaderId::kv_move: return pick(small_storage, kKvMoveSmall, kKvMoveWords);
    case ShaderId::sdpa: return pick(small_storage, kSdpaSmall, kSdpaWords);
    case ShaderId::quantized_sdpa: return pick(small_storage, kQuantizedSdpaSmall, kQuantizedSdpaWords);
    case ShaderId::sdpa_stage_q: return pick(small_storage, kSdpaStageQSmall, kSdpaStageQWords);
    case ShaderId::sdpa_combine: return pick(small_storage, kSdpaCombineSmall, kSdpaCombineWords);
    case ShaderId::kv_append_advance: return pick(small_storage, kKvAppendAdvanceSmall, kKvAppendAdvanceWords);
    case ShaderId::sdpa_subgroup: return pick(small_storage, kSdpaSubgroupSmall, kSdpaSubgroupWords);
    case ShaderId::quantized_sdpa_subgroup:
      return pick(small_storage, kQuantizedSdpaSubgroupSmall, kQuantizedSdpaSubgroupWords);
    case ShaderId::quantized_sdpa_decode:
      return pick(small_storage, kQuantizedSdpaDecodeSmall, kQuantizedSdpaDecodeWords);
  }
  return {};
}

}  // namespace kvlab::vulkan
