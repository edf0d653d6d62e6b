#include "kernels/vulkan/runtime/command.h"

#include <algorithm>
#include <vector>

#include "kernels/vulkan/runtime/vk_error.h"
#include "kvlab/error.h"

namespace kvlab::vk {

namespace {

// Descriptor sets per submission: the kernels record at most a few dispatches each.
constexpr std::uint32_t kMaxSets = 32;
constexpr std::uint32_t kMaxBindingsPerSet = 8;

}  // namespace

TimestampQueries::TimestampQueries(const Device& device, bool enabled) : device_(device.handle()) {
  const std::uint32_t bits = device.timestamp_valid_bits();
  if (!enabled || bits == 0) return;
  period_ns_ = static_cast<double>(device.limits().timestampPeriod);
  if (bits < 64) mask_ = (std::uint64_t{1} << bits) - 1;
  const VkQueryPoolCreateInfo info{.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                   .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                   .queryCount = kMaxStamps};
  check(vkCreateQueryPool(device_, &info, nullptr, &pool_), "vkCreateQueryPool");
}

TimestampQueries::~TimestampQueries() {
  if (pool_ != VK_NULL_HANDLE) vkDestroyQueryPool(device_, pool_, nullptr);
}

void TimestampQueries::reset(VkCommandBuffer cmd) const {
  if (available()) vkCmdResetQueryPool(cmd, pool_, 0, kMaxStamps);
}

void TimestampQueries::write(VkCommandBuffer cmd, std::uint32_t query, VkPipelineStageFlagBits stage) const {
  if (available()) vkCmdWriteTimestamp(cmd, stage, pool_, query);
}

std::vector<double> TimestampQueries::read(std::uint32_t count) const {
  if (!available() || count < 2 || count > kMaxStamps) return {};
  std::vector<std::uint64_t> t(count);
  check(vkGetQueryPoolResults(device_, pool_, 0, count, count * sizeof(std::uint64_t), t.data(),
                              sizeof(std::uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  std::vector<double> seconds;
  for (std::uint32_t i = 1; i < count; ++i) {
    const std::uint64_t ticks = ((t[i] & mask_) - (t[0] & mask_)) & mask_;  // wraps within the valid bits
    seconds.push_back(static_cast<double>(ticks) * period_ns_ * 1e-9);
  }
  return seconds;
}

CommandStream::CommandStream(const Device& device, bool timestamps)
    : device_(device), timestamps_(device, timestamps) {
  const VkDevice d = device.handle();
  const VkCommandPoolCreateInfo pool_info{.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                          .queueFamilyIndex = device.queue_family()};
  check(vkCreateCommandPool(d, &pool_info, nullptr, &pool_), "vkCreateCommandPool");
  try {
    const VkCommandBufferAllocateInfo alloc{.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                           .commandPool = pool_,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                           .commandBufferCount = 1};
    check(vkAllocateCommandBuffers(d, &alloc, &cmd_), "vkAllocateCommandBuffers");
    const VkFenceCreateInfo fence_info{.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(vkCreateFence(d, &fence_info, nullptr, &fence_), "vkCreateFence");
    const VkDescriptorPoolSize size{.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                    .descriptorCount = kMaxSets * kMaxBindingsPerSet};
    const VkDescriptorPoolCreateInfo desc_info{.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                               .maxSets = kMaxSets,
                                               .poolSizeCount = 1,
                                               .pPoolSizes = &size};
    check(vkCreateDescriptorPool(d, &desc_info, nullptr, &descriptors_), "vkCreateDescriptorPool");
  } catch (...) {
    if (fence_) vkDestroyFence(d, fence_, nullptr);
    vkDestroyCommandPool(d, pool_, nullptr);
    throw;
  }
}

CommandStream::~CommandStream() {
  const VkDevice d = device_.handle();
  vkDestroyDescriptorPool(d, descriptors_, nullptr);
  vkDestroyFence(d, fence_, nullptr);
  vkDestroyCommandPool(d, pool_, nullptr);  // frees the command buffer
}

void CommandStream::begin(bool hold) {
  KVLAB_REQUIRE(!held_, internal,
                "CommandStream::begin while a batch is being recorded (a transfer that needs its own submission "
                "inside Context::begin_batch()/end_batch()?)");
  const VkDevice d = device_.handle();
  check(vkResetCommandPool(d, pool_, 0), "vkResetCommandPool");
  check(vkResetDescriptorPool(d, descriptors_, 0), "vkResetDescriptorPool");
  sets_used_ = 0;
  const VkCommandBufferBeginInfo info{.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                      .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
  check(vkBeginCommandBuffer(cmd_, &info), "vkBeginCommandBuffer");
  recording_ = true;
  held_ = hold;
  step_names_.clear();
  timestamps_.reset(cmd_);
  timestamps_.write(cmd_, 0, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT);
}

void CommandStream::abandon() noexcept {
  // The next begin() resets the pool, which discards the half-recorded buffer.
  recording_ = false;
  held_ = false;
}

void CommandStream::end_command(std::string_view name) {
  const VkMemoryBarrier b{.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                                           VK_ACCESS_HOST_READ_BIT};
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                           VK_PIPELINE_STAGE_HOST_BIT,
                       0, 1, &b, 0, nullptr, 0, nullptr);
  if (!timestamps_.available()) return;  // no stamps: no per-command names to keep either
  // Stamps 1..kMaxStamps-2 follow commands; the last one is kept for the end.
  const auto stamp = static_cast<std::uint32_t>(step_names_.size()) + 1;
  if (stamp < TimestampQueries::kMaxStamps - 1) timestamps_.write(cmd_, stamp, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT);
  step_names_.emplace_back(name);
}

void CommandStream::dispatch(const ComputePipeline& pipeline, std::span<const BufferRange> bindings,
                             std::span<const std::byte> push, std::uint32_t groups) {
  KVLAB_REQUIRE(recording_, internal, "CommandStream::dispatch outside begin()/submit_and_wait()");
  KVLAB_REQUIRE(bindings.size() == pipeline.storage_buffers(), internal, "pipeline ", pipeline.name(), " takes ",
                pipeline.storage_buffers(), " buffers, got ", bindings.size());
  KVLAB_REQUIRE(push.size() == pipeline.push_constant_bytes(), internal, "pipeline ", pipeline.name(), " takes ",
                pipeline.push_constant_bytes(), " bytes of push constants, got ", push.size());
  KVLAB_REQUIRE(sets_used_ < kMaxSets && bindings.size() <= kMaxBindingsPerSet, internal,
                "CommandStream: more than ", kMaxSets, " dispatches in one submission");
  KVLAB_REQUIRE(groups >= 1 && groups <= device_.limits().maxComputeWorkGroupCount[0], internal, "pipeline ",
                pipeline.name(), ": ", groups, " workgroups is outside [1, maxComputeWorkGroupCount[0]]");
  const VkDevice d = device_.handle();
  const VkDescriptorSetLayout layout = pipeline.set_layout();
  const VkDescriptorSetAllocateInfo alloc{.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                          .descriptorPool = descriptors_,
                                          .descriptorSetCount = 1,
                                          .pSetLayouts = &layout};
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(d, &alloc, &set), "vkAllocateDescriptorSets");
  ++sets_used_;
  std::vector<VkDescriptorBufferInfo> infos(bindings.size());
  std::vector<VkWriteDescriptorSet> writes(bindings.size());
  for (std::size_t i = 0; i < bindings.size(); ++i) {
    infos[i] = {bindings[i].buffer, bindings[i].offset, bindings[i].range};
    writes[i] = {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                 .dstSet = set,
                 .dstBinding = static_cast<std::uint32_t>(i),
                 .descriptorCount = 1,
                 .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                 .pBufferInfo = &infos[i]};
  }
  vkUpdateDescriptorSets(d, static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle());
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout(), 0, 1, &set, 0, nullptr);
  if (!push.empty()) {
    vkCmdPushConstants(cmd_, pipeline.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                       static_cast<std::uint32_t>(push.size()), push.data());
  }
  vkCmdDispatch(cmd_, groups, 1, 1);
  end_command(pipeline.name());
}

void CommandStream::copy(VkBuffer src, VkDeviceSize src_offset, VkBuffer dst, VkDeviceSize dst_offset,
                         VkDeviceSize bytes) {
  KVLAB_REQUIRE(recording_, internal, "CommandStream::copy outside begin()/submit_and_wait()");
  if (bytes == 0) return;
  const VkBufferCopy region{src_offset, dst_offset, bytes};
  vkCmdCopyBuffer(cmd_, src, dst, 1, &region);
  end_command("copy");
}

void CommandStream::update(VkBuffer dst, VkDeviceSize offset, std::span<const std::byte> data) {
  KVLAB_REQUIRE(recording_, internal, "CommandStream::update outside begin()/submit_and_wait()");
  KVLAB_REQUIRE(offset % 4 == 0 && data.size() % 4 == 0, internal, "CommandStream::update of ", data.size(),
                " bytes at byte offset ", offset, ": both must be multiples of 4");
  constexpr std::size_t kMaxPiece = 65536;  // vkCmdUpdateBuffer's limit per command
  for (std::size_t at = 0; at < data.size(); at += kMaxPiece) {
    const std::size_t n = std::min(kMaxPiece, data.size() - at);
    vkCmdUpdateBuffer(cmd_, dst, offset + at, n, data.data() + at);
  }
  if (!data.empty()) end_command("update");
}

void CommandStream::submit_and_wait() {
  KVLAB_REQUIRE(recording_, internal, "CommandStream::submit_and_wait without begin()");
  recording_ = false;
  held_ = false;
  const auto steps = static_cast<std::uint32_t>(step_names_.size());
  const std::uint32_t end = std::min(steps + 1, TimestampQueries::kMaxStamps - 1);
  timestamps_.write(cmd_, end, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT);
  check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  const VkSubmitInfo submit{.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd_};
  const VkDevice d = device_.handle();
  check(vkQueueSubmit(device_.queue(), 1, &submit, fence_), "vkQueueSubmit");
  ++submissions_;
  check(vkWaitForFences(d, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  check(vkResetFences(d, 1, &fence_), "vkResetFences");
  const std::vector<double> at = timestamps_.read(end + 1);  // at[i]: stamp i + 1
  last_seconds_.reset();
  last_steps_.clear();
  if (at.empty()) return;
  last_seconds_ = at.back();
  if (end != steps + 1) return;  // more commands than stamps: no per-command times
  for (std::uint32_t i = 0; i < steps; ++i) {
    last_steps_.push_back({std::move(step_names_[i]), at[i] - (i == 0 ? 0.0 : at[i - 1])});
  }
}

}  // namespace kvlab::vk
