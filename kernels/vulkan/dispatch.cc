// The Vulkan backend's context: device choice, memory kind, pipelines and dispatch.
#include <algorithm>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kvlab/error.h"

namespace kvlab {

VulkanBackend::Context::Context(const VulkanOptions& options) : options_(options) {
  runtime_ = std::make_shared<VulkanRuntime>(vk::InstanceOptions{options.validation, options.on_validation_message});
  const std::vector<vk::PhysicalDeviceInfo> devices = vk::list_physical_devices(runtime_->instance);
  const vk::PhysicalDeviceInfo chosen = vk::select_physical_device(devices, options.device);
  runtime_->device = std::make_unique<vk::Device>(chosen, !options.force_word_storage);
  // A discrete GPU reads its own memory fastest: device-local buffers, staging transfers.
  // CPU and integrated devices share host memory: mapped buffers, memcpy transfers.
  const bool discrete = chosen.type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  const bool host_visible_exists =
      device().find_memory_type(~0u, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) >= 0;
  memory_kind_ = (discrete || options.force_staging || !host_visible_exists) ? vk::MemoryKind::device_local
                                                                             : vk::MemoryKind::host_visible;
  stream_ = std::make_unique<vk::CommandStream>(device(), options.timestamps);
}

VulkanBackend::Context::~Context() = default;

const vk::ComputePipeline& VulkanBackend::Context::pipeline(vulkan::ShaderId shader, std::uint32_t bindings,
                                                            std::uint32_t push_bytes,
                                                            std::span<const std::uint32_t> specialization) {
  std::unique_ptr<vk::ComputePipeline>& p =
      pipelines_[{shader, std::vector<std::uint32_t>(specialization.begin(), specialization.end())}];
  if (!p) {
    std::string name = cat(vulkan::shader_name(shader), small_storage() ? " (small)" : " (words)");
    for (std::size_t i = 0; i < specialization.size(); ++i) name += cat(i == 0 ? " {" : ",", specialization[i]);
    if (!specialization.empty()) name += "}";
    p = std::make_unique<vk::ComputePipeline>(device(), name, vulkan::shader_spirv(shader, small_storage()), bindings,
                                              push_bytes, specialization);
  }
  return *p;
}

void VulkanBackend::Context::dispatch(vulkan::ShaderId shader, std::initializer_list<BoundTensor> bindings,
                                      const void* push, std::size_t push_bytes, std::uint64_t items,
                                      std::span<const std::uint32_t> specialization) {
  if (items == 0) return;
  // The shaders index work items and elements with 32-bit unsigned integers and stride
  // by the dispatch size, so the count must stay clear of wrap-around.
  KVLAB_REQUIRE(items < (std::uint64_t{1} << 31), unsupported, "VulkanBackend: ", vulkan::shader_name(shader),
                " needs ", items, " work items, more than the 2^31 its 32-bit indexing allows");
  const vk::ComputePipeline& p = pipeline(shader, static_cast<std::uint32_t>(bindings.size()),
                                         static_cast<std::uint32_t>(push_bytes), specialization);
  std::vector<vk::BufferRange> ranges;
  for (const BoundTensor& b : bindings) ranges.push_back(b.range);
  constexpr std::uint64_t kLocalSize = 64;  // KVLAB_LOCAL_SIZE of shaders/common.glsl
  const std::uint64_t limit = std::min<std::uint64_t>(device().limits().maxComputeWorkGroupCount[0], 65535);
  const auto groups = static_cast<std::uint32_t>(std::min((items + kLocalSize - 1) / kLocalSize, limit));
  const std::span<const std::byte> push_block(static_cast<const std::byte*>(push), push_bytes);
  ++dispatch_counts_[shader];
  if (batching()) {
    stream_->dispatch(p, ranges, push_block, groups);
    return;
  }
  stream_->begin();
  stream_->dispatch(p, ranges, push_block, groups);
  stream_->submit_and_wait();
  note_submission();
}

void VulkanBackend::Context::copy(const DTensor& src, const DTensor& dst) {
  const ConstTensorView s = view(src), d = view(dst);
  KVLAB_REQUIRE(s.nbytes() == d.nbytes(), shape_mismatch, "VulkanBackend: copy of ", s.nbytes(), " bytes (",
                shape_str(src.shape), " ", dtype_name(src.dtype), ") into ", d.nbytes(), " bytes (",
                shape_str(dst.shape), " ", dtype_name(dst.dtype), ")");
  const std::size_t bytes = s.nbytes();
  if (bytes == 0) return;
  // vkCmdCopyBuffer's regions may not overlap within one buffer.
  KVLAB_REQUIRE(src.buffer != dst.buffer || src.offset + bytes <= dst.offset || dst.offset + bytes <= src.offset,
                invalid_argument, "VulkanBackend: copy of ", bytes, " bytes from byte offset ", src.offset,
                " to byte offset ", dst.offset, " of the same buffer overlaps");
  const VkBuffer from = static_cast<const VulkanBuffer&>(*src.buffer).memory().handle();
  const VkBuffer to = static_cast<const VulkanBuffer&>(*dst.buffer).memory().handle();
  if (batching()) {
    stream_->copy(from, src.offset, to, dst.offset, bytes);
    return;
  }
  stream_->begin();
  stream_->copy(from, src.offset, to, dst.offset, bytes);
  stream_->submit_and_wait();
  note_submission();
}

void VulkanBackend::Context::note_submission() {
  last_kernel_seconds_ = stream_->last_seconds();
  last_kernel_steps_.clear();
  for (const vk::CommandStream::Step& s : stream_->last_steps()) last_kernel_steps_.push_back({s.name, s.seconds});
}

void VulkanBackend::Context::begin_batch() {
  KVLAB_REQUIRE(!batching(), misuse, "VulkanBackend: begin_batch while a batch is open (batches do not nest)");
  stream_->begin(/*hold=*/true);
}

void VulkanBackend::Context::end_batch() {
  KVLAB_REQUIRE(batching(), misuse, "VulkanBackend: end_batch without begin_batch");
  stream_->submit_and_wait();
  note_submission();
}

void VulkanBackend::Context::abandon_batch() noexcept {
  if (batching()) stream_->abandon();
}

}  // namespace kvlab
