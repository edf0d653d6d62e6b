// The Vulkan instance (RAII), optionally with the Khronos validation layer and a
// VK_EXT_debug_utils messenger that hands every warning and error it reports to a sink
// (tests turn each one into a failure).
//
// One instance per process at a time is the intended use: tests run as parallel
// processes (ctest -j), never as threads sharing an instance.
#pragma once

#include <vulkan/vulkan.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvlab::vk {

using MessageSink = std::function<void(const std::string& message)>;

struct InstanceOptions {
  // Enable VK_LAYER_KHRONOS_validation; Error(unsupported) when it is not installed.
  bool validation = false;
  // Receives each validation warning/error as "<severity> <type>: <message>". Without a
  // sink the messages go to stderr.
  MessageSink on_message;
};

class Instance {
 public:
  // Throws Error(unsupported) when there is no Vulkan driver to create an instance with.
  explicit Instance(InstanceOptions options = {});
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  bool validation_enabled() const { return messenger_ != VK_NULL_HANDLE; }
  std::vector<VkPhysicalDevice> physical_devices() const;

  static bool validation_layer_available();

  // The messengers' user data (stable address, alive until vkDestroyInstance).
  struct MessageState {
    MessageSink sink;
    bool holding = true;  // during vkCreateInstance
    std::vector<std::string> held;
  };

 private:
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  std::unique_ptr<MessageState> messages_;
};

}  // namespace kvlab::vk
