#include "kernels/vulkan/runtime/instance.h"

#include <dlfcn.h>

#include <cstring>
#include <iostream>
#include <vector>

#include "kernels/vulkan/runtime/vk_error.h"
#include "kvlab/error.h"

// GCC defines __SANITIZE_ADDRESS__; clang 14 only answers __has_feature
// (docs/toolchain.md §Sanitizers).
#if defined(__SANITIZE_ADDRESS__)
#define KVLAB_VK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLAB_VK_ASAN 1
#endif
#endif

namespace kvlab::vk {

namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

// Under ASan, LeakSanitizer reports a false 128-byte leak inside LLVM for every instance:
// the loader dlclose()s lavapipe at vkDestroyInstance, unmapping the LLVM static data
// that still points at the block. Suppressions cannot match the unloaded module, so the
// driver is pinned in memory instead (docs/toolchain.md §Sanitizers); harmless where it is absent.
void pin_lavapipe_under_asan() {
#ifdef KVLAB_VK_ASAN
  static void* const pinned = dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
  (void)pinned;
#endif
}

void deliver(const MessageSink& sink, const std::string& message) {
  if (sink) {
    sink(message);
  } else {
    std::cerr << "[vulkan] " << message << "\n";
  }
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                VkDebugUtilsMessageTypeFlagsEXT type,
                                                const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  const char* sev = (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) ? "error" : "warning";
  const char* kind = (type & VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT)    ? "validation"
                     : (type & VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT) ? "performance"
                                                                                : "general";
  const std::string message = std::string(sev) + " " + kind + ": " + (data && data->pMessage ? data->pMessage : "");
  auto* state = static_cast<Instance::MessageState*>(user);
  if (state->holding) {
    state->held.push_back(message);
  } else {
    deliver(state->sink, message);
  }
  return VK_FALSE;  // never abort the call: the sink decides what a message means
}

VkDebugUtilsMessengerCreateInfoEXT messenger_info(Instance::MessageState* state) {
  return VkDebugUtilsMessengerCreateInfoEXT{
      .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
      .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
      .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
      .pfnUserCallback = on_debug_message,
      .pUserData = state,
  };
}

}  // namespace

bool Instance::validation_layer_available() {
  std::uint32_t count = 0;
  if (vkEnumerateInstanceLayerProperties(&count, nullptr) != VK_SUCCESS) return false;
  std::vector<VkLayerProperties> layers(count);
  if (vkEnumerateInstanceLayerProperties(&count, layers.data()) != VK_SUCCESS) return false;
  for (const VkLayerProperties& l : layers) {
    if (std::strcmp(l.layerName, kValidationLayer) == 0) return true;
  }
  return false;
}

Instance::Instance(InstanceOptions options) : messages_(std::make_unique<MessageState>()) {
  messages_->sink = std::move(options.on_message);
  pin_lavapipe_under_asan();
  if (options.validation) {
    KVLAB_REQUIRE(validation_layer_available(), unsupported, "the Vulkan validation layer ", kValidationLayer,
                  " is not installed (Debian: vulkan-validationlayers)");
  }
  const VkApplicationInfo app{
      .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
      .pApplicationName = "kvlab",
      .applicationVersion = 1,
      .pEngineName = "kvlab",
      .engineVersion = 1,
      .apiVersion = VK_API_VERSION_1_2,
  };
  const char* layers[] = {kValidationLayer};
  const char* extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  // Chained into the create info too, so that instance creation (and destruction) is
  // validated. Messages are held back until the instance exists: when creation fails for
  // lack of a driver, the loader's complaints are the reason the Error already carries,
  // not misuse to report.
  VkDebugUtilsMessengerCreateInfoEXT messenger = messenger_info(messages_.get());
  const VkInstanceCreateInfo info{
      .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
      .pNext = options.validation ? &messenger : nullptr,
      .pApplicationInfo = &app,
      .enabledLayerCount = options.validation ? 1u : 0u,
      .ppEnabledLayerNames = layers,
      .enabledExtensionCount = options.validation ? 1u : 0u,
      .ppEnabledExtensionNames = extensions,
  };
  const VkResult r = vkCreateInstance(&info, nullptr, &instance_);
  KVLAB_REQUIRE(r != VK_ERROR_INCOMPATIBLE_DRIVER, unsupported,
                "no Vulkan driver is installed (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER)");
  check(r, "vkCreateInstance");
  messages_->holding = false;
  for (const std::string& m : messages_->held) deliver(messages_->sink, m);
  messages_->held.clear();
  if (options.validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create == nullptr) {
      vkDestroyInstance(instance_, nullptr);
      fail(ErrorKind::unsupported, "vkCreateDebugUtilsMessengerEXT is unavailable although validation is on");
    }
    const VkResult m = create(instance_, &messenger, nullptr, &messenger_);
    if (m != VK_SUCCESS) {
      vkDestroyInstance(instance_, nullptr);
      check(m, "vkCreateDebugUtilsMessengerEXT");
    }
  }
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy != nullptr) destroy(instance_, messenger_, nullptr);
  }
  vkDestroyInstance(instance_, nullptr);
}

std::vector<VkPhysicalDevice> Instance::physical_devices() const {
  std::uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance_, &count, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devices(count);
  if (count != 0) check(vkEnumeratePhysicalDevices(instance_, &count, devices.data()), "vkEnumeratePhysicalDevices");
  devices.resize(count);
  return devices;
}

}  // namespace kvlab::vk
