// bench/vulkan_bench.h in a build without the Vulkan backend (-DKVLAB_WITH_VULKAN=OFF):
// every Vulkan backend is Error(unsupported) with that reason, so its rows are skipped.
#include "bench/vulkan_bench.h"
#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

constexpr const char* kNoVulkan = "kvlab_bench was built without the Vulkan backend (-DKVLAB_WITH_VULKAN=OFF)";

}  // namespace

std::unique_ptr<Backend> make_timed_vulkan_backend(std::string_view) { fail(ErrorKind::unsupported, kNoVulkan); }

VulkanDeviceProbe probe_vulkan_device(std::string_view) { return {"", kNoVulkan}; }

std::string vulkan_kernel_clock() { return "none (no Vulkan backend in this build)"; }

std::unique_ptr<DeviceClock> make_device_clock(Backend& backend, std::int64_t) {
  fail(ErrorKind::internal, cat("backend '", backend.name(), "' is not a Vulkan backend (", kNoVulkan, ")"));
}

std::unique_ptr<DeviceCopyBaseline> make_device_copy_baseline(std::string_view, std::int64_t) {
  fail(ErrorKind::unsupported, kNoVulkan);
}

}  // namespace kvlab::bench
