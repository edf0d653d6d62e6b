#include "kernels/vulkan/runtime/buffer.h"

#include "kernels/vulkan/runtime/vk_error.h"
#include "kvlab/error.h"

namespace kvlab::vk {

DeviceBuffer::DeviceBuffer(const Device& device, VkDeviceSize bytes, MemoryKind kind) : device_(device.handle()) {
  KVLAB_REQUIRE(bytes <= VkDeviceSize{1} << 62, invalid_argument, "buffer of ", bytes, " bytes is too large");
  size_ = bytes == 0 ? 16 : (bytes + 15) / 16 * 16;
  const VkBufferCreateInfo info{
      .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
      .size = size_,
      .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
      .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
  };
  check(vkCreateBuffer(device_, &info, nullptr, &buffer_), cat("vkCreateBuffer (", bytes, " bytes)"));
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(device_, buffer_, &req);
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int type = -1;
  switch (kind) {
    case MemoryKind::device_local:
      type = device.find_memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
      break;
    case MemoryKind::host_visible:
      type = device.find_memory_type(req.memoryTypeBits, host, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
      break;
    case MemoryKind::staging:
      type = device.find_memory_type(req.memoryTypeBits, host, VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
      break;
  }
  if (type < 0) {
    vkDestroyBuffer(device_, buffer_, nullptr);
    fail(ErrorKind::unsupported, cat("no Vulkan memory type fits a buffer of ", bytes, " bytes (",
                                     kind == MemoryKind::device_local ? "device-local" : "host-visible", ")"));
  }
  const VkMemoryAllocateInfo alloc{.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                   .allocationSize = req.size,
                                   .memoryTypeIndex = static_cast<std::uint32_t>(type)};
  VkResult r = vkAllocateMemory(device_, &alloc, nullptr, &memory_);
  if (r == VK_SUCCESS) r = vkBindBufferMemory(device_, buffer_, memory_, 0);
  if (r == VK_SUCCESS && kind != MemoryKind::device_local) {
    void* p = nullptr;
    r = vkMapMemory(device_, memory_, 0, VK_WHOLE_SIZE, 0, &p);
    mapped_ = static_cast<std::byte*>(p);
  }
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(device_, buffer_, nullptr);
    if (memory_ != VK_NULL_HANDLE) vkFreeMemory(device_, memory_, nullptr);
    check(r, cat("allocating a Vulkan buffer of ", bytes, " bytes"));
  }
}

DeviceBuffer::~DeviceBuffer() {
  vkDestroyBuffer(device_, buffer_, nullptr);
  vkFreeMemory(device_, memory_, nullptr);  // also unmaps
}

}  // namespace kvlab::vk
