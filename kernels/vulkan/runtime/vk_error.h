// VkResult → kvlab::Error. Every failing Vulkan call of the runtime throws
// Error(device, "<call> failed: VK_ERROR_…"), except the ones that mean "nothing to run
// on" (no driver, no device, missing layer/extension), which the callers turn into
// Error(unsupported) so that tests skip and the harness reports UNIMPLEMENTED.
#pragma once

#include <vulkan/vulkan.h>

#include <string_view>

namespace kvlab::vk {

std::string_view result_name(VkResult result);  // "VK_ERROR_OUT_OF_DEVICE_MEMORY", or "VkResult(<n>)"

// Throws Error(device, "<what> failed: <result name>") unless result == VK_SUCCESS.
void check(VkResult result, std::string_view what);

}  // namespace kvlab::vk
