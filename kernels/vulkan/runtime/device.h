// Physical device discovery and selection, and the logical device (RAII) with one
// compute queue.
//
// Selection (select_physical_device): a selector of digits is an index into the
// instance's device list; any other non-empty selector picks the first device whose
// name contains it; an empty selector means KVLAB_VK_DEVICE from the environment, and
// when that is unset too, the first discrete GPU, else integrated, else virtual, else
// CPU (lavapipe). No match throws Error(unsupported) naming the selector and listing
// the devices, so tests skip and the harness reports UNIMPLEMENTED with the reason.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/vulkan/runtime/instance.h"

namespace kvlab::vk {

struct PhysicalDeviceInfo {
  int index = 0;
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  std::uint32_t api_version = 0;
};

std::string_view device_type_name(VkPhysicalDeviceType type);  // "discrete", "integrated", "cpu", …
std::vector<PhysicalDeviceInfo> list_physical_devices(const Instance& instance);
std::string describe_devices(const std::vector<PhysicalDeviceInfo>& devices);  // "0: llvmpipe (…) [cpu]; …"
PhysicalDeviceInfo select_physical_device(const std::vector<PhysicalDeviceInfo>& devices, std::string_view selector);

// Optional capabilities the kernels use.
struct DeviceFeatures {
  bool storage16 = false;  // storageBuffer16BitAccess: f16/bf16 elements loaded/stored directly
  bool storage8 = false;   // storageBuffer8BitAccess: u8 elements stored directly
  bool float64 = false;    // shaderFloat64: RoPE angles, sin/cos and rotation in double
  // VkPhysicalDeviceSubgroupProperties: supportedStages has COMPUTE and supportedOperations
  // has ARITHMETIC (a property of Vulkan 1.1, nothing to enable): the attention shaders'
  // subgroup builds. Always "enabled" where supported.
  bool subgroup_arithmetic = false;
  // VK_KHR_pipeline_executable_properties: the driver's compiler statistics of each
  // pipeline (registers, spills, instruction counts), printed to stderr when
  // KVLAB_VK_PIPELINE_STATS is set (runtime/pipeline.cc); enabled only then.
  bool pipeline_statistics = false;
};

class Device {
 public:
  // Creates the logical device with every optional feature the device supports, except
  // 16/8-bit storage when `allow_small_storage` is false (the forced fallback path).
  // Throws Error(unsupported) for a device below Vulkan 1.2 or without a compute queue.
  Device(const PhysicalDeviceInfo& physical, bool allow_small_storage);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical() const { return info_.handle; }
  const PhysicalDeviceInfo& info() const { return info_; }
  VkQueue queue() const { return queue_; }
  std::uint32_t queue_family() const { return queue_family_; }
  const DeviceFeatures& supported() const { return supported_; }
  const DeviceFeatures& enabled() const { return enabled_; }
  const VkPhysicalDeviceLimits& limits() const { return limits_; }
  const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
  std::uint32_t timestamp_valid_bits() const { return timestamp_bits_; }
  std::uint32_t subgroup_size() const { return subgroup_size_; }  // the device's default subgroup size

  // A memory type allowed by `type_bits` with every `required` flag, preferring one that
  // also has every `preferred` flag; -1 when none qualifies.
  int find_memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required,
                       VkMemoryPropertyFlags preferred = 0) const;

 private:
  PhysicalDeviceInfo info_;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::uint32_t queue_family_ = 0;
  std::uint32_t timestamp_bits_ = 0;
  std::uint32_t subgroup_size_ = 0;
  DeviceFeatures supported_, enabled_;
  VkPhysicalDeviceLimits limits_{};
  VkPhysicalDeviceMemoryProperties memory_{};
};

}  // namespace kvlab::vk
