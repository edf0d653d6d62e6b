// The embedded SPIR-V of the kernel shaders (kernels/vulkan/shaders/*.comp), each in its
// two storage builds (shaders/common.glsl).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

// X(id, stem): the shader ShaderId::id, compiled from shaders/<stem>.comp. The one list of
// shaders: the enum and names below, the SPIR-V table (shaders.cc) and the sources CMake
// compiles (kernels/vulkan/CMakeLists.txt reads this macro, one entry a line) all follow
// it, so a shader is added here and nowhere else.
//   sdpa_subgroup, quantized_sdpa_subgroup: the subgroup builds of sdpa / quantized_sdpa
//   (shaders/sdpa_core.glsl), used where the device has compute-stage subgroup arithmetic
//   (VulkanBackend::uses_subgroup_reductions).
//   quantized_sdpa_decode: the decode pass of quantized_sdpa for the shapes it
//   specializes on (kernels/vulkan/quantized_sdpa.cc decides).
#define KVLAB_VK_SHADERS(X)                                 \
  X(fill, fill)                                             \
  X(affine_quantize, affine_quantize)                       \
  X(affine_dequantize, affine_dequantize)                   \
  X(rope, rope)                                             \
  X(kv_move, kv_move)                                       \
  X(sdpa, sdpa)                                             \
  X(quantized_sdpa, quantized_sdpa)                         \
  X(sdpa_stage_q, sdpa_stage_q)                             \
  X(sdpa_combine, sdpa_combine)                             \
  X(kv_append_advance, kv_append_advance)                   \
  X(sdpa_subgroup, sdpa_subgroup)                           \
  X(quantized_sdpa_subgroup, sdpa_quantized_subgroup)       \
  X(quantized_sdpa_decode, sdpa_quantized_decode)

namespace kvlab::vulkan {

enum class ShaderId {
#define KVLAB_VK_SHADER_ID(id, stem) id,
  KVLAB_VK_SHADERS(KVLAB_VK_SHADER_ID)
#undef KVLAB_VK_SHADER_ID
};
#define KVLAB_VK_SHADER_ONE(id, stem) +1
inline constexpr int kShaderCount = 0 KVLAB_VK_SHADERS(KVLAB_VK_SHADER_ONE);
#undef KVLAB_VK_SHADER_ONE

std::string_view shader_name(ShaderId id);
std::span<const std::uint32_t> shader_spirv(ShaderId id, bool small_storage);

}  // namespace kvlab::vulkan
