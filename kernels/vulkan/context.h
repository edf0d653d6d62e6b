// The Vulkan backend's runtime context (private to kernels/vulkan and its tests): the
// instance and device, buffers, tensor checks and bindings, pipelines and dispatch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kernels/vulkan/runtime/buffer.h"
#include "kernels/vulkan/runtime/command.h"
#include "kernels/vulkan/runtime/device.h"
#include "kernels/vulkan/runtime/instance.h"
#include "kernels/vulkan/runtime/pipeline.h"
#include "kernels/vulkan/shaders.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "kvlab/tensor.h"

namespace kvlab {

// A size, offset or count for a shader's u32 field, bounded by a binding's range.
inline std::uint32_t u32(std::int64_t v) { return static_cast<std::uint32_t>(v); }

// Instance and device, shared by the context and every buffer it hands out, so a buffer
// that outlives its backend still frees its memory on a live device.
struct VulkanRuntime {
  vk::Instance instance;
  std::unique_ptr<vk::Device> device;
  explicit VulkanRuntime(vk::InstanceOptions options) : instance(std::move(options)) {}
};

// One allocate(): a VkBuffer of its own. The validation address (address()) is what the
// oracle's validators see as the tensor's data pointer: the persistent mapping for
// host-visible memory, else a reserved, lazily backed host range of the same size (so
// overlap checks compare like with like, and an index tensor can be copied there to be
// read by the validator).
class VulkanBuffer final : public Buffer {
 public:
  VulkanBuffer(std::shared_ptr<VulkanRuntime> runtime, std::size_t bytes, vk::MemoryKind kind);
  ~VulkanBuffer() override;
  VulkanBuffer(const VulkanBuffer&) = delete;
  VulkanBuffer& operator=(const VulkanBuffer&) = delete;

  std::size_t size() const override { return bytes_; }
  std::byte* host_data() override { return nullptr; }  // device memory: use upload/download
  const vk::DeviceBuffer& memory() const { return memory_; }
  std::byte* address() const { return memory_.mapped() != nullptr ? memory_.mapped() : shadow_; }
  const VulkanRuntime* runtime() const { return runtime_.get(); }

 private:
  std::shared_ptr<VulkanRuntime> runtime_;
  std::size_t bytes_;
  vk::DeviceBuffer memory_;
  std::byte* shadow_ = nullptr;
  std::size_t shadow_bytes_ = 0;
};

// A tensor as a shader sees it: a binding and the tensor's offset inside it, in units
// of the element size the shader indexes with (1 for byte access, 4 for words, …).
struct BoundTensor {
  vk::BufferRange range;
  std::uint32_t offset = 0;
};

class VulkanBackend::Context {
 public:
  explicit Context(const VulkanOptions& options);
  ~Context();

  const VulkanOptions& options() const { return options_; }
  const vk::Device& device() const { return *runtime_->device; }
  bool validation_enabled() const { return runtime_->instance.validation_enabled(); }
  bool small_storage() const { return device().enabled().storage16; }
  bool staging() const { return memory_kind_ == vk::MemoryKind::device_local; }
  std::optional<double> last_kernel_seconds() const { return last_kernel_seconds_; }
  const std::vector<VulkanKernelStep>& last_kernel_steps() const { return last_kernel_steps_; }

  BufferPtr allocate(std::size_t bytes);
  // host_view()'s checks (plus: the buffer is this backend's), as a view whose data
  // pointer is the validation address: for shape and overlap checks, not for reading.
  ConstTensorView view(const DTensor& t) const;
  // As view(), with the tensor's current bytes readable at that address (index tensors
  // that the oracle's validators load).
  ConstTensorView readable_view(const DTensor& t);
  // Binds the tensor's range, widened to whole words and aligned down to
  // minStorageBufferOffsetAlignment; `unit` (1, 2 or 4) is what BoundTensor::offset
  // counts. Throws Error(unsupported) naming the sizes when the range exceeds
  // maxStorageBufferRange. The tensor must have passed view().
  BoundTensor bind(const DTensor& t, std::size_t unit) const;
  // Copies a small host table into the scratch buffer and binds it (offset 0); valid
  // until the next bind_table().
  BoundTensor bind_table(const void* data, std::size_t bytes);

  void upload(const DTensor& dst, const void* src);
  // Writes a small host table (whole words, word-aligned) into dst from the command
  // buffer (vkCmdUpdateBuffer): recorded into an open batch, so the batch stays one
  // submission on device-local memory too; outside a batch, submits and waits.
  void update(const DTensor& dst, const void* src);
  void download(const DTensor& src, void* dst);

  // Records one dispatch of `shader` over `items` work items (the shader's invocations
  // stride over them), submits it and waits. `push` is the shader's push-constant block;
  // `specialization` the values of its specialization constants 0..n-1 (one pipeline is
  // built and kept per distinct list). Inside a batch it is only recorded.
  void dispatch(vulkan::ShaderId shader, std::initializer_list<BoundTensor> bindings, const void* push,
                std::size_t push_bytes, std::uint64_t items, std::span<const std::uint32_t> specialization = {});
  // Copies src's bytes into dst (same byte size, not overlapping) on the device
  // (vkCmdCopyBuffer): submits and waits, or is only recorded inside a batch.
  void copy(const DTensor& src, const DTensor& dst);

  // Batches: between begin_batch() and end_batch(), dispatch() and copy() record into one
  // command buffer, with a full barrier after each command (runtime/command.h), and
  // end_batch() submits it and waits once. VulkanBackend's public calls never batch, so
  // each stays synchronous. Inside a batch, transfers that need a submission of their
  // own (upload/download/readable_view of device-local memory) raise Error(internal)
  // (CommandStream refuses to discard a held recording), and bind_table() may be used at
  // most once: a second table would overwrite the scratch buffer before the device has
  // read the first. Prefer Batch, which abandons the recording when an exception leaves
  // its scope.
  void begin_batch();
  void end_batch();
  void abandon_batch() noexcept;
  bool batching() const { return stream_->held(); }
  class Batch {
   public:
    explicit Batch(Context& c) : c_(c) { c_.begin_batch(); }
    ~Batch() {
      if (!submitted_) c_.abandon_batch();
    }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    void submit() {
      submitted_ = true;  // end_batch() ends the recording even when the submission throws
      c_.end_batch();
    }

   private:
    Context& c_;
    bool submitted_ = false;
  };
  // Submissions to the queue so far (tests: a batch is one submission).
  std::uint64_t submissions() const { return stream_->submissions(); }
  // Dispatches of `shader` recorded so far (tests: which pass a call took).
  std::uint64_t dispatches(vulkan::ShaderId shader) const {
    const auto it = dispatch_counts_.find(shader);
    return it == dispatch_counts_.end() ? 0 : it->second;
  }

 private:
  const vk::ComputePipeline& pipeline(vulkan::ShaderId shader, std::uint32_t bindings, std::uint32_t push_bytes,
                                      std::span<const std::uint32_t> specialization);
  // After a submission: its device time and each command's (timestamps on).
  void note_submission();
  // Copies through the staging buffer (device-local memory) in bounded chunks.
  void staged_copy(const VulkanBuffer& buffer, std::size_t offset, std::size_t bytes, const void* from, void* to);

  VulkanOptions options_;
  std::shared_ptr<VulkanRuntime> runtime_;
  vk::MemoryKind memory_kind_ = vk::MemoryKind::host_visible;
  std::unique_ptr<vk::CommandStream> stream_;
  std::map<std::pair<vulkan::ShaderId, std::vector<std::uint32_t>>, std::unique_ptr<vk::ComputePipeline>> pipelines_;
  std::unique_ptr<vk::DeviceBuffer> staging_, scratch_;
  std::optional<double> last_kernel_seconds_;
  std::vector<VulkanKernelStep> last_kernel_steps_;
  std::map<vulkan::ShaderId, std::uint64_t> dispatch_counts_;
};

}  // namespace kvlab
