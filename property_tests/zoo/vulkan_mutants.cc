// v1.rope-q-reads-live-offsets: DeviceDecodeStep with its bug-zoo switch on, so the
// query RoPE of step (d) reads the live offsets that the append kernel has just advanced
// instead of the pre-append snapshot — queries roped S positions too far, the device
// form of the offset alias of mlx-lm#1097 / #1806 and vlm#966 (spec §5, §7 rows 1, 4, 5).
// Killer: the device-step property (tests/vulkan/device_step_property.h) comparing the
// step with BatchKVCache over the reference and host RoPE at the pre-update offsets.
#include "property_tests/zoo/vulkan_mutants.h"

#include <memory>

#include "property_tests/properties.h"
#include "tests/vulkan/device_step_property.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab::prop::zoo {

namespace {

// One backend (validation layer on where installed, every message a test failure) for
// every case of the run, created when the zoo reaches the mutant.
struct SharedDevice {
  std::unique_ptr<VulkanBackend> backend;
  std::string reason;
};

}  // namespace

std::vector<DeviceMutant> device_mutants() {
  auto device = std::make_shared<SharedDevice>();
  DeviceMutant live;
  live.id = "v1.rope-q-reads-live-offsets";
  live.upstream = "mlx-lm#1097 / #1806, vlm#966 (device offsets)";
  live.unavailable = [device] {
    if (!device->backend) device->backend = testing::try_vulkan(VulkanOptions{}, device->reason);
    return device->backend ? std::string() : "no usable Vulkan device: " + device->reason;
  };
  live.properties.emplace_back("V1.DeviceStepMatchesReference", [device] {
    testing::DeviceStepPropertyOptions options;
    options.rope_q_reads_live_offsets = true;
    options.on_failure = [](const std::vector<std::int64_t>& chunks) { record_case(chunks); };
    testing::device_step_matches_reference(*device->backend, options);
  });
  return {live};
}

}  // namespace kvlab::prop::zoo
