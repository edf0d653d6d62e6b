// A VkBuffer with its own VkDeviceMemory (RAII): one allocation per buffer, usable as a
// storage buffer and as a transfer source/destination.
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>

#include "kernels/vulkan/runtime/device.h"

namespace kvlab::vk {

enum class MemoryKind {
  device_local,  // DEVICE_LOCAL, not mapped: reached through staging copies
  host_visible,  // HOST_VISIBLE | HOST_COHERENT, persistently mapped; DEVICE_LOCAL preferred
  staging,       // HOST_VISIBLE | HOST_COHERENT, persistently mapped; HOST_CACHED preferred (fast reads back)
};

class DeviceBuffer {
 public:
  // The allocation is rounded up to a multiple of 16 bytes (at least 16), so that a
  // binding may always be widened to whole 32-bit words. Throws Error(device) when the
  // memory cannot be had, naming the size, and Error(unsupported) when no memory type fits.
  DeviceBuffer(const Device& device, VkDeviceSize bytes, MemoryKind kind);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  VkBuffer handle() const { return buffer_; }
  VkDeviceSize size() const { return size_; }  // allocated bytes (>= the requested size)
  std::byte* mapped() const { return mapped_; }  // nullptr for device_local

 private:
  VkDevice device_;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  VkDeviceSize size_ = 0;
  std::byte* mapped_ = nullptr;
};

}  // namespace kvlab::vk
