// The Vulkan device's copy ceiling, measured in the same process and run as the Vulkan
// kernels: one device-local buffer copied into another, timed by the device's timestamp
// queries around the copy alone (no submission or host overhead), two ways — the copy
// command (vkCmdCopyBuffer) and a compute shader (bench/shaders/copy_blocks.comp). On
// lavapipe both are CPU memcpy loops; on an NVIDIA H100 the shader cores moved far more
// than the command (bench/records/2026-11-26-nvidia-h100.md), so the bench table reads a
// kernel against the faster of the two: the rate at which the device itself can stream. Like the
// host memcpy baseline each is credited with read + written bytes. The same pair of buffers, copied
// untimed, evicts a kernel's data from the device caches between timed calls
// (bench/vulkan_bench.h).
//
// Only public runtime APIs (vk::Device, vk::DeviceBuffer, vk::CommandStream, vk::ComputePipeline).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/vulkan/runtime/buffer.h"
#include "kernels/vulkan/runtime/command.h"
#include "kernels/vulkan/runtime/device.h"
#include "kernels/vulkan/runtime/pipeline.h"
#include "bench/vulkan_bench.h"

namespace kvlab::bench {

// What a device allows for each of the two copy buffers (0: no such limit).
struct CopyLimits {
  std::uint64_t max_allocation = 0;  // VkPhysicalDeviceMaintenance3Properties::maxMemoryAllocationSize
  std::uint64_t device_heap = 0;     // the largest DEVICE_LOCAL heap
  // (maxBufferSize is Vulkan 1.3 and the runtime's instance asks for 1.2: a buffer is
  // bounded by its allocation here.)
};
CopyLimits copy_limits_of(const vk::Device& device);

// Bytes per buffer: `want`, unless a limit is lower — each buffer at most the allocation
// limit and a quarter of the heap (both buffers then take half of it, leaving
// the rest to the kernels' data) — rounded down to whole MiB. `limited_by` names the
// limit that decided ("" when `want` fits). Throws Error(unsupported) when less than
// 1 MiB is left.
struct CopySize {
  std::uint64_t bytes = 0;
  std::string limited_by;
};
CopySize choose_copy_bytes(std::uint64_t want, const CopyLimits& limits);

class DeviceCopy {
 public:
  // Two device-local buffers of choose_copy_bytes(want) bytes each; when the allocation
  // still fails (Error(device): out of device memory) the size is halved, down to 16 MiB,
  // and limited_by says so. The source is filled with fill_pattern() through a staging
  // buffer and copied once (untimed), so no timed copy reads never-written memory (on a
  // CPU device, untouched pages all map the zero page and read as if cached) or faults in
  // fresh pages. Throws Error(unsupported) when the queue has no timestamps: the copy
  // could not be timed on the device.
  DeviceCopy(const vk::Device& device, std::uint64_t want);

  std::uint64_t bytes() const { return bytes_; }  // per buffer: each copy reads and writes this many
  const std::string& limited_by() const { return limited_by_; }
  VkBuffer source() const { return src_->handle(); }
  VkBuffer destination() const { return dst_->handle(); }

  // One copy source -> destination; returns its device time in seconds.
  double copy(DeviceCopyMethod method = DeviceCopyMethod::command);

  // The source's byte at `index` (a pattern that differs from one MiB to the next).
  static std::uint8_t fill_pattern(std::uint64_t index);

 private:
  std::uint64_t bytes_ = 0;
  std::string limited_by_;
  std::unique_ptr<vk::DeviceBuffer> src_, dst_;
  vk::CommandStream stream_;
  vk::ComputePipeline shader_;
  std::uint64_t piece_bytes_;  // bytes per dispatch of the shader copy (one storage binding)
  std::uint64_t max_groups_;
};

}  // namespace kvlab::bench
