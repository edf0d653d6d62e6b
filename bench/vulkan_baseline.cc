#include "bench/vulkan_baseline.h"

#include <algorithm>
#include <array>
#include <span>

#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kMinRetryBytes = 16 * kMiB;
// The fill goes through a staging buffer of this size, one submission per chunk.
constexpr std::uint64_t kFillChunk = 8 * kMiB;
// bench/shaders/copy_blocks.comp: 16-byte blocks, KVLAB_LOCAL_SIZE invocations a workgroup.
constexpr std::uint64_t kBlockBytes = 16, kShaderLocalSize = 64;
const std::uint32_t kCopyBlocksSpirv[] =
#include "copy_blocks_words.spv.inc"
    ;

}  // namespace

CopyLimits copy_limits_of(const vk::Device& device) {
  VkPhysicalDeviceMaintenance3Properties m3{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 props{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
  vkGetPhysicalDeviceProperties2(device.physical(), &props);
  CopyLimits limits;
  limits.max_allocation = m3.maxMemoryAllocationSize;
  const VkPhysicalDeviceMemoryProperties& memory = device.memory();
  for (std::uint32_t i = 0; i < memory.memoryHeapCount; ++i) {
    if (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      limits.device_heap = std::max<std::uint64_t>(limits.device_heap, memory.memoryHeaps[i].size);
    }
  }
  return limits;
}

CopySize choose_copy_bytes(std::uint64_t want, const CopyLimits& limits) {
  CopySize out{want, ""};
  if (limits.max_allocation != 0 && limits.max_allocation < out.bytes) {
    out = {limits.max_allocation, cat("maxMemoryAllocationSize ", limits.max_allocation, " bytes")};
  }
  if (limits.device_heap != 0 && limits.device_heap / 4 < out.bytes) {
    out = {limits.device_heap / 4, cat("a quarter of the ", limits.device_heap, "-byte device-local heap")};
  }
  out.bytes = out.bytes / kMiB * kMiB;
  KVLAB_REQUIRE(out.bytes >= kMiB, unsupported, "device buffer copy of ", want, " bytes: only ", out.bytes,
                " bytes are allowed (", out.limited_by, "), less than 1 MiB");
  return out;
}

std::uint8_t DeviceCopy::fill_pattern(std::uint64_t index) {
  return static_cast<std::uint8_t>(index ^ (index >> 8) ^ (index >> 20));
}

DeviceCopy::DeviceCopy(const vk::Device& device, std::uint64_t want)
    : stream_(device, true),
      shader_(device, "copy_blocks", kCopyBlocksSpirv, 2, sizeof(std::uint32_t)),
      // A piece: whole MiB within maxStorageBufferRange, and few enough 16-byte blocks
      // for the shader's 32-bit index.
      piece_bytes_(std::min<std::uint64_t>(device.limits().maxStorageBufferRange, std::uint64_t{1} << 35) / kMiB * kMiB),
      max_groups_(std::min<std::uint64_t>(device.limits().maxComputeWorkGroupCount[0], 65535)) {
  KVLAB_REQUIRE(piece_bytes_ >= kMiB, unsupported, "Vulkan device '", device.info().name,
                "': maxStorageBufferRange ", device.limits().maxStorageBufferRange,
                " is under 1 MiB, too small for the shader copy");
  KVLAB_REQUIRE(device.timestamp_valid_bits() != 0, unsupported, "Vulkan device '", device.info().name,
                "': its compute queue has no timestamps, so a copy cannot be timed on the device");
  const CopySize size = choose_copy_bytes(want, copy_limits_of(device));
  bytes_ = size.bytes;
  limited_by_ = size.limited_by;
  for (;;) {
    try {
      src_ = std::make_unique<vk::DeviceBuffer>(device, bytes_, vk::MemoryKind::device_local);
      dst_ = std::make_unique<vk::DeviceBuffer>(device, bytes_, vk::MemoryKind::device_local);
      break;
    } catch (const Error& e) {
      src_.reset();
      if (e.kind() != ErrorKind::device || bytes_ / 2 < kMinRetryBytes) throw;
      limited_by_ = cat("allocating 2 x ", bytes_ / kMiB, " MiB failed (", e.what(), ")");
      bytes_ /= 2;
    }
  }
  // Write the source (through staging memory: device-local memory need not be mapped),
  // then copy once so that the destination's pages exist too.
  const vk::DeviceBuffer staging(device, std::min(kFillChunk, bytes_), vk::MemoryKind::staging);
  for (std::uint64_t at = 0; at < bytes_; at += kFillChunk) {
    const std::uint64_t n = std::min(kFillChunk, bytes_ - at);
    for (std::uint64_t k = 0; k < n; ++k) staging.mapped()[k] = std::byte{fill_pattern(at + k)};
    stream_.begin();
    stream_.copy(staging.handle(), 0, src_->handle(), at, n);
    stream_.submit_and_wait();
  }
  copy();
}

double DeviceCopy::copy(DeviceCopyMethod method) {
  stream_.begin();
  if (method == DeviceCopyMethod::command) {
    stream_.copy(src_->handle(), 0, dst_->handle(), 0, bytes_);
  } else {
    // In pieces a storage binding can hold (whole MiB, so each piece's offset meets any
    // minStorageBufferOffsetAlignment), all in this one submission.
    for (std::uint64_t at = 0; at < bytes_; at += piece_bytes_) {
      const std::uint64_t n = std::min(piece_bytes_, bytes_ - at);
      const std::array<vk::BufferRange, 2> ranges{{{src_->handle(), at, n}, {dst_->handle(), at, n}}};
      const auto push = static_cast<std::uint32_t>(n / kBlockBytes);
      const auto groups = static_cast<std::uint32_t>(std::min((n / kBlockBytes + kShaderLocalSize - 1) / kShaderLocalSize,
                                                              max_groups_));
      stream_.dispatch(shader_, ranges, std::as_bytes(std::span(&push, 1)), groups);
    }
  }
  stream_.submit_and_wait();
  const std::optional<double> seconds = stream_.last_seconds();
  KVLAB_REQUIRE(seconds.has_value(), internal, "DeviceCopy: no timestamps after the copy");
  return *seconds;
}

}  // namespace kvlab::bench
