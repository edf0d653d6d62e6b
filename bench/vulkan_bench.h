// The Vulkan rows of kvlab_bench (bench/bench_suite.h), behind an interface free of
// Vulkan headers: bench/vulkan_bench.cc implements it over kernels/vulkan, and in a build
// without the Vulkan backend (-DKVLAB_WITH_VULKAN=OFF) bench/vulkan_bench_off.cc makes
// every Vulkan backend Error(unsupported) with that reason, so its rows are skipped.
//
// Timing: a Vulkan kernel call is timed on the device, by timestamp queries
// (VulkanOptions::timestamps, last_kernel_seconds()), and handed to Google Benchmark as
// manual time, so the host's validation, submission and fence waits are not counted. A
// call of several submissions cannot be timed that way and is timed by the host's wall
// clock instead (DeviceClock::time; the row's device_timed counter is the fraction of
// calls timed on the device). Its GB/s is read against the same run's device buffer copy
// (bench/vulkan_baseline.h), row baseline_vkcopy/<device key>.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab::bench {

// "vulkan" or "vulkan:<variant>" (harness/backends.h).
inline bool is_vulkan_backend(std::string_view backend) {
  return backend == "vulkan" || backend.substr(0, 7) == "vulkan:";
}

// The device part of a Vulkan backend name, without the ",words"/",staging" flags:
// "vulkan:1,words" -> "vulkan:1", "vulkan:,staging" -> "vulkan". Rows with the same key
// run on the same device and share its copy baseline.
inline std::string vulkan_device_key(std::string_view backend) {
  const std::string_view device = backend.substr(0, backend.find(','));
  return std::string(device == "vulkan:" ? "vulkan" : device);
}

// The backend harness::make_backend(`backend`) would make, with timestamp queries on.
// Throws Error(unsupported) with the reason where no device is usable (or the build has
// no Vulkan), Error(invalid_argument) for an unknown flag.
std::unique_ptr<Backend> make_timed_vulkan_backend(std::string_view backend);

// The device a backend name selects, as "<name> [<type>]" (type: discrete, integrated,
// virtual, cpu, other), or why there is none.
struct VulkanDeviceProbe {
  std::string description;
  std::string unavailable;  // non-empty when there is no usable device
};
VulkanDeviceProbe probe_vulkan_device(std::string_view backend);

// Which clock times the kernel rows, for the result file's context.
std::string vulkan_kernel_clock();

struct DeviceTiming {
  double seconds = 0;
  bool on_device = false;  // false: the host's wall clock around the call
  // On the device: each command of the call and its seconds, named by its shader without
  // the build and specialization ("sdpa_combine"), or "copy" / "update" (empty where the
  // runtime has no per-command stamps). kvlab_bench reports their means as the row's
  // counters "us:<name>", the passes summed by name: which pass takes the time.
  std::vector<std::pair<std::string, double>> passes;
};

// Device-side timing of one kernel benchmark on a backend from make_timed_vulkan_backend().
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  // Evicts the previous call's data from the device's caches: an untimed device copy
  // touching the flush bytes (nothing when they are 0).
  virtual void flush_caches() = 0;
  // Runs `call` (one kernel call on the clock's backend, which returns when the device
  // is done) and returns the seconds it took: on the device when the call was one
  // submission, else (or where the runtime cannot count submissions) by the wall clock.
  virtual DeviceTiming time(const std::function<void()>& call) = 0;
};
// Throws Error(internal) when `backend` is not from make_timed_vulkan_backend().
std::unique_ptr<DeviceClock> make_device_clock(Backend& backend, std::int64_t flush_bytes);

// How a device copy moves its bytes: the copy command (vkCmdCopyBuffer), or a compute
// shader (bench/shaders/copy_blocks.comp). Rows baseline_vkcopy / baseline_vkshadercopy.
enum class DeviceCopyMethod { command, shader };

// The same-run device buffer copy on the device `backend` selects (an instance and
// device of its own: make it after the previous kernel's backend is gone).
class DeviceCopyBaseline {
 public:
  virtual ~DeviceCopyBaseline() = default;
  virtual double copy(DeviceCopyMethod method) = 0;           // device seconds of one copy
  virtual std::int64_t bytes() const = 0;                     // read by one copy (and written: 2x moved)
  virtual std::string describe(DeviceCopyMethod method) const = 0;  // how, device, size, why a smaller size
};
// Throws Error(unsupported) with the reason where no device is usable.
std::unique_ptr<DeviceCopyBaseline> make_device_copy_baseline(std::string_view backend, std::int64_t bytes);

}  // namespace kvlab::bench
