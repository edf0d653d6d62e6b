// A compute pipeline (RAII) over embedded SPIR-V: shader module, a descriptor set layout
// of `storage_buffers` storage buffers at bindings 0..n-1, a push-constant range, the
// pipeline layout and the pipeline. `specialization[i]` is the 32-bit value of the
// shader's specialization constant `constant_id = i` (none: the shader's defaults).
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <span>
#include <string>

#include "kernels/vulkan/runtime/device.h"

namespace kvlab::vk {

class ComputePipeline {
 public:
  ComputePipeline(const Device& device, std::string name, std::span<const std::uint32_t> spirv,
                  std::uint32_t storage_buffers, std::uint32_t push_constant_bytes,
                  std::span<const std::uint32_t> specialization = {});
  ~ComputePipeline();
  ComputePipeline(const ComputePipeline&) = delete;
  ComputePipeline& operator=(const ComputePipeline&) = delete;

  const std::string& name() const { return name_; }
  VkPipeline handle() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }
  std::uint32_t storage_buffers() const { return storage_buffers_; }
  std::uint32_t push_constant_bytes() const { return push_bytes_; }

 private:
  void print_statistics() const;

  VkDevice device_;
  std::string name_;
  std::uint32_t storage_buffers_, push_bytes_;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
};

}  // namespace kvlab::vk
