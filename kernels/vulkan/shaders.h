// The embedded SPIR-V of the kernel shaders (kernels/vulkan/shaders/*.comp), each in its
// two storage builds (shaders/common.glsl).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kvlab::vulkan {

enum class ShaderId {
  fill,
  affine_quantize,
  affine_dequantize,
  rope,
  kv_move,
  sdpa,
  quantized_sdpa,
  sdpa_stage_q,
  sdpa_combine,
  kv_append_advance,
  // The subgroup builds of sdpa / quantized_sdpa (shaders/sdpa_core.glsl): used where the
  // device has compute-stage subgroup arithmetic (VulkanBackend::uses_subgroup_reductions).
  sdpa_subgroup,
  quantized_sdpa_subgroup,
  // The decode pass of quantized_sdpa for the shapes it specializes on
  // (shaders/sdpa_quantized_decode.comp; kernels/vulkan/quantized_sdpa.cc decides).
  quantized_sdpa_decode,
};
inline constexpr int kShaderCount = 13;

std::string_view shader_name(ShaderId id);
std::span<const std::uint32_t> shader_spirv(ShaderId id, bool small_storage);

}  // namespace kvlab::vulkan
