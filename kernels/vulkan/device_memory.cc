// Buffers, tensor checks and bindings, and transfers of the Vulkan backend.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <span>

#include "kernels/vulkan/context.h"
#include "kvlab/error.h"

namespace kvlab {

namespace {

// Staging transfers move at most this much per submission, so a large upload does not
// need a second buffer of its own size.
constexpr std::size_t kStagingBytes = std::size_t{8} << 20;

VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize to) { return (v + to - 1) / to * to; }

}  // namespace

VulkanBuffer::VulkanBuffer(std::shared_ptr<VulkanRuntime> runtime, std::size_t bytes, vk::MemoryKind kind)
    : runtime_(std::move(runtime)), bytes_(bytes), memory_(*runtime_->device, bytes, kind) {
  if (memory_.mapped() != nullptr) return;
  // Address space only: pages are backed when an index tensor is copied in for the
  // validators (readable_view), never otherwise.
  shadow_bytes_ = std::max<std::size_t>(bytes, 1);
  void* p = mmap(nullptr, shadow_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  KVLAB_REQUIRE(p != MAP_FAILED, device, "reserving ", shadow_bytes_, " bytes of address space for a Vulkan buffer failed");
  shadow_ = static_cast<std::byte*>(p);
}

VulkanBuffer::~VulkanBuffer() {
  if (shadow_ != nullptr) munmap(shadow_, shadow_bytes_);
}

BufferPtr VulkanBackend::Context::allocate(std::size_t bytes) {
  return std::make_shared<VulkanBuffer>(runtime_, bytes, memory_kind_);
}

ConstTensorView VulkanBackend::Context::view(const DTensor& t) const {
  // The checks and messages of host_view() (core/host_buffer.cc), so that every backend
  // rejects a bad DTensor the same way.
  KVLAB_REQUIRE(t.buffer != nullptr, misuse, "tensor of shape ", shape_str(t.shape), " has no buffer");
  const auto* buffer = dynamic_cast<const VulkanBuffer*>(t.buffer.get());
  KVLAB_REQUIRE(buffer != nullptr && buffer->runtime() == runtime_.get(), misuse, "buffer of ", t.buffer->size(),
                " bytes was not allocated by this Vulkan backend");
  const std::size_t bytes = t.nbytes();  // throws instead of wrapping for huge shapes
  KVLAB_REQUIRE(t.offset <= buffer->size() && bytes <= buffer->size() - t.offset, shape_mismatch, "tensor ",
                shape_str(t.shape), " ", dtype_name(t.dtype), " (", bytes, " bytes) at byte offset ", t.offset,
                " overruns its buffer of ", buffer->size(), " bytes");
  KVLAB_REQUIRE(t.offset % dtype_size(t.dtype) == 0, invalid_argument, "tensor ", dtype_name(t.dtype),
                " at byte offset ", t.offset, " is not aligned to its ", dtype_size(t.dtype), "-byte elements");
  return ConstTensorView{buffer->address() + t.offset, t.dtype, t.shape};
}

ConstTensorView VulkanBackend::Context::readable_view(const DTensor& t) {
  const ConstTensorView v = view(t);
  const auto& buffer = static_cast<const VulkanBuffer&>(*t.buffer);
  if (buffer.memory().mapped() == nullptr && v.nbytes() != 0) {
    staged_copy(buffer, t.offset, v.nbytes(), nullptr, buffer.address() + t.offset);
  }
  return v;
}

BoundTensor VulkanBackend::Context::bind(const DTensor& t, std::size_t unit) const {
  const auto& buffer = static_cast<const VulkanBuffer&>(*t.buffer);
  const VkBuffer handle = buffer.memory().handle();
  const std::size_t bytes = t.nbytes();
  if (bytes == 0) return {{handle, 0, 4}, 0};  // nothing is accessed; any valid range will do
  const VkPhysicalDeviceLimits& limits = device().limits();
  const VkDeviceSize align = std::max<VkDeviceSize>(limits.minStorageBufferOffsetAlignment, 4);
  const VkDeviceSize start = t.offset / align * align;
  // Whole words: the allocation is a multiple of 16 bytes (runtime/buffer.h).
  const VkDeviceSize range = round_up(t.offset + bytes, 4) - start;
  KVLAB_REQUIRE(range <= limits.maxStorageBufferRange, unsupported, "tensor ", shape_str(t.shape), " ",
                dtype_name(t.dtype), " (", bytes, " bytes at byte offset ", t.offset, ") needs a storage binding of ",
                range, " bytes, over this device's maxStorageBufferRange of ", limits.maxStorageBufferRange, " bytes");
  return {{handle, start, range}, static_cast<std::uint32_t>((t.offset - start) / unit)};
}

void VulkanBackend::Context::upload(const DTensor& dst, const void* src) {
  const ConstTensorView v = view(dst);
  if (v.nbytes() == 0) return;
  const auto& buffer = static_cast<const VulkanBuffer&>(*dst.buffer);
  if (std::byte* mapped = buffer.memory().mapped()) {
    std::memcpy(mapped + dst.offset, src, v.nbytes());  // synchronous backend: nothing in flight
  } else {
    staged_copy(buffer, dst.offset, v.nbytes(), src, nullptr);
  }
}

void VulkanBackend::Context::update(const DTensor& dst, const void* src) {
  const ConstTensorView v = view(dst);
  if (v.nbytes() == 0) return;
  const VkBuffer handle = static_cast<const VulkanBuffer&>(*dst.buffer).memory().handle();
  const std::span<const std::byte> data(static_cast<const std::byte*>(src), v.nbytes());
  if (batching()) {
    stream_->update(handle, dst.offset, data);
    return;
  }
  stream_->begin();
  stream_->update(handle, dst.offset, data);
  stream_->submit_and_wait();
}

void VulkanBackend::Context::download(const DTensor& src, void* dst) {
  const ConstTensorView v = view(src);
  if (v.nbytes() == 0) return;
  const auto& buffer = static_cast<const VulkanBuffer&>(*src.buffer);
  if (const std::byte* mapped = buffer.memory().mapped()) {
    std::memcpy(dst, mapped + src.offset, v.nbytes());
  } else {
    staged_copy(buffer, src.offset, v.nbytes(), nullptr, dst);
  }
}

void VulkanBackend::Context::staged_copy(const VulkanBuffer& buffer, std::size_t offset, std::size_t bytes,
                                         const void* from, void* to) {
  if (!staging_) staging_ = std::make_unique<vk::DeviceBuffer>(device(), kStagingBytes, vk::MemoryKind::staging);
  const VkBuffer device_buffer = buffer.memory().handle(), staging = staging_->handle();
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(bytes - done, kStagingBytes);
    stream_->begin();
    if (from != nullptr) {
      std::memcpy(staging_->mapped(), static_cast<const std::byte*>(from) + done, n);
      stream_->copy(staging, 0, device_buffer, offset + done, n);
      stream_->submit_and_wait();
    } else {
      stream_->copy(device_buffer, offset + done, staging, 0, n);
      stream_->submit_and_wait();
      std::memcpy(static_cast<std::byte*>(to) + done, staging_->mapped(), n);
    }
    done += n;
  }
}

BoundTensor VulkanBackend::Context::bind_table(const void* data, std::size_t bytes) {
  const std::size_t need = std::max<std::size_t>(bytes, 16);
  if (!scratch_ || scratch_->size() < need) {
    scratch_.reset();
    scratch_ = std::make_unique<vk::DeviceBuffer>(device(), std::max<std::size_t>(need, 4096), vk::MemoryKind::staging);
  }
  if (bytes != 0) std::memcpy(scratch_->mapped(), data, bytes);
  return {{scratch_->handle(), 0, round_up(need, 16)}, 0};
}

}  // namespace kvlab
