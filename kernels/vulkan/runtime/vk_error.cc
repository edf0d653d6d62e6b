#include "kernels/vulkan/runtime/vk_error.h"

#include <string>

#include "kvlab/error.h"

namespace kvlab::vk {

std::string_view result_name(VkResult result) {
  switch (result) {
#define KVLAB_VK_RESULT(name) \
  case name: return #name;
    KVLAB_VK_RESULT(VK_SUCCESS)
    KVLAB_VK_RESULT(VK_NOT_READY)
    KVLAB_VK_RESULT(VK_TIMEOUT)
    KVLAB_VK_RESULT(VK_INCOMPLETE)
    KVLAB_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
    KVLAB_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    KVLAB_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
    KVLAB_VK_RESULT(VK_ERROR_DEVICE_LOST)
    KVLAB_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
    KVLAB_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
    KVLAB_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
    KVLAB_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
    KVLAB_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
    KVLAB_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
    KVLAB_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
    KVLAB_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
    KVLAB_VK_RESULT(VK_ERROR_UNKNOWN)
    KVLAB_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
    KVLAB_VK_RESULT(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    KVLAB_VK_RESULT(VK_ERROR_FRAGMENTATION)
    KVLAB_VK_RESULT(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
#undef KVLAB_VK_RESULT
    default: break;
  }
  return "VkResult(?)";
}

void check(VkResult result, std::string_view what) {
  if (result == VK_SUCCESS) return;
  std::string name(result_name(result));
  if (name == "VkResult(?)") name = cat("VkResult(", static_cast<int>(result), ")");
  fail(ErrorKind::device, cat(what, " failed: ", name));
}

}  // namespace kvlab::vk
