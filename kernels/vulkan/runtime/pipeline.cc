#include "kernels/vulkan/runtime/pipeline.h"

#include <vector>

#include "kernels/vulkan/runtime/vk_error.h"
#include "kvlab/error.h"

namespace kvlab::vk {

ComputePipeline::ComputePipeline(const Device& device, std::string name, std::span<const std::uint32_t> spirv,
                                 std::uint32_t storage_buffers, std::uint32_t push_constant_bytes)
    : device_(device.handle()), name_(std::move(name)), storage_buffers_(storage_buffers),
      push_bytes_(push_constant_bytes) {
  KVLAB_REQUIRE(push_constant_bytes <= device.limits().maxPushConstantsSize, unsupported, "pipeline ", name_, " needs ",
                push_constant_bytes, " bytes of push constants; the device allows ",
                device.limits().maxPushConstantsSize);
  // Members are released by the destructor only once construction completed, so each
  // failure below cleans up what was already created.
  auto cleanup = [&] {
    if (pipeline_) vkDestroyPipeline(device_, pipeline_, nullptr);
    if (layout_) vkDestroyPipelineLayout(device_, layout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
    if (module_) vkDestroyShaderModule(device_, module_, nullptr);
  };
  try {
    const VkShaderModuleCreateInfo module_info{.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                               .codeSize = spirv.size_bytes(),
                                               .pCode = spirv.data()};
    check(vkCreateShaderModule(device_, &module_info, nullptr, &module_), cat("vkCreateShaderModule (", name_, ")"));

    std::vector<VkDescriptorSetLayoutBinding> bindings(storage_buffers);
    for (std::uint32_t i = 0; i < storage_buffers; ++i) {
      bindings[i] = {.binding = i,
                     .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                     .descriptorCount = 1,
                     .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    }
    const VkDescriptorSetLayoutCreateInfo set_info{.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                                   .bindingCount = storage_buffers,
                                                   .pBindings = bindings.data()};
    check(vkCreateDescriptorSetLayout(device_, &set_info, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");

    const VkPushConstantRange push{.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = push_constant_bytes};
    const VkPipelineLayoutCreateInfo layout_info{.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                                 .setLayoutCount = 1,
                                                 .pSetLayouts = &set_layout_,
                                                 .pushConstantRangeCount = push_constant_bytes ? 1u : 0u,
                                                 .pPushConstantRanges = &push};
    check(vkCreatePipelineLayout(device_, &layout_info, nullptr, &layout_), "vkCreatePipelineLayout");

    const VkComputePipelineCreateInfo info{
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = module_,
                  .pName = "main"},
        .layout = layout_,
    };
    check(vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &info, nullptr, &pipeline_),
          cat("vkCreateComputePipelines (", name_, ")"));
  } catch (...) {
    cleanup();
    throw;
  }
}

ComputePipeline::~ComputePipeline() {
  vkDestroyPipeline(device_, pipeline_, nullptr);
  vkDestroyPipelineLayout(device_, layout_, nullptr);
  vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
  vkDestroyShaderModule(device_, module_, nullptr);
}

}  // namespace kvlab::vk
