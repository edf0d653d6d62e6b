#include "kernels/vulkan/runtime/device.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/vulkan/runtime/vk_error.h"
#include "kvlab/error.h"

namespace kvlab::vk {

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Lower is preferred: discrete, integrated, virtual, CPU, other.
int type_rank(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

}  // namespace

std::string_view device_type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

std::vector<PhysicalDeviceInfo> list_physical_devices(const Instance& instance) {
  std::vector<PhysicalDeviceInfo> out;
  for (VkPhysicalDevice d : instance.physical_devices()) {
    VkPhysicalDeviceProperties p{};
    vkGetPhysicalDeviceProperties(d, &p);
    out.push_back({static_cast<int>(out.size()), d, p.deviceName, p.deviceType, p.apiVersion});
  }
  return out;
}

std::string describe_devices(const std::vector<PhysicalDeviceInfo>& devices) {
  if (devices.empty()) return "no devices";
  std::string s;
  for (const PhysicalDeviceInfo& d : devices) {
    s += cat(s.empty() ? "" : "; ", d.index, ": ", d.name, " [", device_type_name(d.type), "]");
  }
  return s;
}

PhysicalDeviceInfo select_physical_device(const std::vector<PhysicalDeviceInfo>& devices, std::string_view selector) {
  std::string chosen(selector);
  const char* source = "selector";
  if (chosen.empty()) {
    if (const char* env = std::getenv("KVLAB_VK_DEVICE"); env != nullptr && *env != '\0') {
      chosen = env;
      source = "KVLAB_VK_DEVICE";
    }
  }
  KVLAB_REQUIRE(!devices.empty(), unsupported, "no Vulkan device is available (the driver reports none)");
  if (chosen.empty()) {
    return *std::min_element(devices.begin(), devices.end(), [](const auto& a, const auto& b) {
      return type_rank(a.type) < type_rank(b.type);  // stable for ties: the first of the best type
    });
  }
  if (all_digits(chosen)) {
    const unsigned long index = chosen.size() > 9 ? devices.size() : std::stoul(chosen);
    // A device that does not exist is a usage error (exit 2 in the CLI), not an
    // unavailable backend: devices exist, the selector names none of them.
    KVLAB_REQUIRE(index < devices.size(), invalid_argument, "Vulkan device index ", chosen, " (", source,
                  ") is out of range; devices: ", describe_devices(devices));
    return devices[index];
  }
  for (const PhysicalDeviceInfo& d : devices) {
    if (d.name.find(chosen) != std::string::npos) return d;
  }
  fail(ErrorKind::invalid_argument, cat("no Vulkan device name contains '", chosen, "' (", source,
                                   "); devices: ", describe_devices(devices)));
}

Device::Device(const PhysicalDeviceInfo& physical, bool allow_small_storage) : info_(physical) {
  KVLAB_REQUIRE(VK_API_VERSION_MAJOR(info_.api_version) > 1 || VK_API_VERSION_MINOR(info_.api_version) >= 2,
                unsupported, "Vulkan device '", info_.name, "' supports API ", VK_API_VERSION_MAJOR(info_.api_version),
                ".", VK_API_VERSION_MINOR(info_.api_version), "; kvlab needs 1.2");
  VkPhysicalDeviceSubgroupProperties subgroup{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &subgroup};
  vkGetPhysicalDeviceProperties2(info_.handle, &props);
  limits_ = props.properties.limits;
  subgroup_size_ = subgroup.subgroupSize;
  vkGetPhysicalDeviceMemoryProperties(info_.handle, &memory_);

  std::uint32_t families = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(info_.handle, &families, nullptr);
  std::vector<VkQueueFamilyProperties> family(families);
  vkGetPhysicalDeviceQueueFamilyProperties(info_.handle, &families, family.data());
  bool found = false;
  for (std::uint32_t i = 0; i < families && !found; ++i) {
    if (family[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      queue_family_ = i;
      timestamp_bits_ = family[i].timestampValidBits;
      found = true;
    }
  }
  KVLAB_REQUIRE(found, unsupported, "Vulkan device '", info_.name, "' has no compute queue");

  std::uint32_t extension_count = 0;
  vkEnumerateDeviceExtensionProperties(info_.handle, nullptr, &extension_count, nullptr);
  std::vector<VkExtensionProperties> extensions(extension_count);
  vkEnumerateDeviceExtensionProperties(info_.handle, nullptr, &extension_count, extensions.data());
  const bool has_executable_properties =
      std::any_of(extensions.begin(), extensions.end(), [](const VkExtensionProperties& e) {
        return std::string_view(e.extensionName) == VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
      });
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fexe{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  VkPhysicalDeviceVulkan12Features f12{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                       .pNext = has_executable_properties ? &fexe : nullptr};
  VkPhysicalDeviceVulkan11Features f11{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, .pNext = &f12};
  VkPhysicalDeviceFeatures2 f2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
  vkGetPhysicalDeviceFeatures2(info_.handle, &f2);
  const bool subgroup_arithmetic = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                                   (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0;
  supported_ = {f11.storageBuffer16BitAccess == VK_TRUE, f12.storageBuffer8BitAccess == VK_TRUE,
                f2.features.shaderFloat64 == VK_TRUE, subgroup_arithmetic,
                has_executable_properties && fexe.pipelineExecutableInfo == VK_TRUE};
  // The `small` shader builds need both widths; the `words` builds need neither.
  const bool small = allow_small_storage && supported_.storage16 && supported_.storage8;
  const char* stats = std::getenv("KVLAB_VK_PIPELINE_STATS");
  const bool statistics = supported_.pipeline_statistics && stats != nullptr && *stats != '\0';
  enabled_ = {small, small, supported_.float64, subgroup_arithmetic, statistics};

  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR eexe{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
      .pipelineExecutableInfo = VK_TRUE};
  const char* const statistics_extension = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
  VkPhysicalDeviceVulkan12Features e12{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                       .pNext = statistics ? &eexe : nullptr,
                                       .storageBuffer8BitAccess = small ? VK_TRUE : VK_FALSE};
  VkPhysicalDeviceVulkan11Features e11{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                       .pNext = &e12,
                                       .storageBuffer16BitAccess = small ? VK_TRUE : VK_FALSE};
  VkPhysicalDeviceFeatures2 e2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &e11};
  e2.features.shaderFloat64 = enabled_.float64 ? VK_TRUE : VK_FALSE;

  const float priority = 1.0f;
  const VkDeviceQueueCreateInfo queue_info{.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                           .queueFamilyIndex = queue_family_,
                                           .queueCount = 1,
                                           .pQueuePriorities = &priority};
  const VkDeviceCreateInfo info{.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                .pNext = &e2,
                                .queueCreateInfoCount = 1,
                                .pQueueCreateInfos = &queue_info,
                                .enabledExtensionCount = statistics ? 1u : 0u,
                                .ppEnabledExtensionNames = statistics ? &statistics_extension : nullptr};
  check(vkCreateDevice(info_.handle, &info, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
}

Device::~Device() { vkDestroyDevice(device_, nullptr); }

int Device::find_memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required,
                             VkMemoryPropertyFlags preferred) const {
  int fallback = -1;
  for (std::uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
    if (!(type_bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = memory_.memoryTypes[i].propertyFlags;
    if ((f & required) != required) continue;
    if ((f & preferred) == preferred) return static_cast<int>(i);
    if (fallback < 0) fallback = static_cast<int>(i);
  }
  return fallback;
}

}  // namespace kvlab::vk
