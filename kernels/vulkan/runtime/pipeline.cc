#include "kernels/vulkan/runtime/pipeline.h"

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/vulkan/runtime/vk_error.h"
#include "kvlab/error.h"

namespace kvlab::vk {

ComputePipeline::ComputePipeline(const Device& device, std::string name, std::span<const std::uint32_t> spirv,
                                 std::uint32_t storage_buffers, std::uint32_t push_constant_bytes,
                                 std::span<const std::uint32_t> specialization)
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

    std::vector<VkSpecializationMapEntry> entries(specialization.size());
    for (std::uint32_t i = 0; i < entries.size(); ++i) {
      entries[i] = {.constantID = i, .offset = 4 * i, .size = 4};
    }
    const VkSpecializationInfo special{.mapEntryCount = static_cast<std::uint32_t>(entries.size()),
                                       .pMapEntries = entries.data(),
                                       .dataSize = specialization.size_bytes(),
                                       .pData = specialization.data()};
    const bool statistics = device.enabled().pipeline_statistics;
    const VkComputePipelineCreateInfo info{
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .flags = statistics ? VkPipelineCreateFlags{VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR} : 0u,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = module_,
                  .pName = "main",
                  .pSpecializationInfo = specialization.empty() ? nullptr : &special},
        .layout = layout_,
    };
    check(vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &info, nullptr, &pipeline_),
          cat("vkCreateComputePipelines (", name_, ")"));
    if (statistics) print_statistics();
  } catch (...) {
    cleanup();
    throw;
  }
}

// One line per statistic of each executable the driver reports (registers, spills,
// instruction counts: what a kernel costs beyond its source), for tuning on real GPUs.
void ComputePipeline::print_statistics() const {
  const auto properties = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device_, "vkGetPipelineExecutablePropertiesKHR"));
  const auto statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
  if (properties == nullptr || statistics == nullptr) return;
  const VkPipelineInfoKHR pipeline{.sType = VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, .pipeline = pipeline_};
  std::uint32_t count = 0;
  if (properties(device_, &pipeline, &count, nullptr) != VK_SUCCESS) return;
  std::vector<VkPipelineExecutablePropertiesKHR> exes(count, {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR});
  if (properties(device_, &pipeline, &count, exes.data()) != VK_SUCCESS) return;
  for (std::uint32_t e = 0; e < count; ++e) {
    const VkPipelineExecutableInfoKHR exe{.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                                          .pipeline = pipeline_,
                                          .executableIndex = e};
    std::uint32_t n = 0;
    if (statistics(device_, &exe, &n, nullptr) != VK_SUCCESS) continue;
    std::vector<VkPipelineExecutableStatisticKHR> stats(n, {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    if (statistics(device_, &exe, &n, stats.data()) != VK_SUCCESS) continue;
    std::string line = cat("kvlab vulkan pipeline ", name_, " / ", exes[e].name, " (subgroup ", exes[e].subgroupSize, "):");
    for (const VkPipelineExecutableStatisticKHR& st : stats) {
      line += cat(" ", st.name, "=");
      switch (st.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: line += st.value.b32 ? "true" : "false"; break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: line += cat(st.value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: line += cat(st.value.u64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: line += cat(st.value.f64); break;
        default: line += "?";
      }
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

ComputePipeline::~ComputePipeline() {
  vkDestroyPipeline(device_, pipeline_, nullptr);
  vkDestroyPipelineLayout(device_, layout_, nullptr);
  vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
  vkDestroyShaderModule(device_, module_, nullptr);
}

}  // namespace kvlab::vk
