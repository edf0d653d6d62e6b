// Command submission (RAII): one command buffer recorded with dispatches and copies,
// submitted to the device's compute queue and waited on with a fence. A full memory
// barrier follows every command, so later commands (and the host, after the wait) see
// earlier writes; kernels are small and the backend is synchronous, so simplicity wins.
// A held recording (begin(true)) is a batch of several commands: begin() refuses to
// discard it, so a transfer that needs a submission of its own cannot silently drop the
// commands recorded so far; only submit_and_wait() or abandon() end it.
// Optionally, timestamp queries bracket each submission and follow each of its commands
// (where the queue supports them): the submission's device time and each command's
// (last_steps(): which pass of a kernel takes the time). Off by default because reading
// them back costs more than a small kernel on lavapipe
// (docs/benchmarks.md §Measurements behind kernel choices).
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/vulkan/runtime/device.h"
#include "kernels/vulkan/runtime/pipeline.h"

namespace kvlab::vk {

struct BufferRange {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize range = 0;
};

// A timestamp pool for one submission: a stamp at its start, after each of its first
// kMaxStamps - 2 commands, and at its end.
class TimestampQueries {
 public:
  static constexpr std::uint32_t kMaxStamps = 64;
  // Inert when `enabled` is false or the queue has no timestamps.
  TimestampQueries(const Device& device, bool enabled);
  ~TimestampQueries();
  TimestampQueries(const TimestampQueries&) = delete;
  TimestampQueries& operator=(const TimestampQueries&) = delete;

  bool available() const { return pool_ != VK_NULL_HANDLE; }
  void reset(VkCommandBuffer cmd) const;
  void write(VkCommandBuffer cmd, std::uint32_t query, VkPipelineStageFlagBits stage) const;
  // Seconds from stamp 0 to each of stamps 1..`count`-1 of the last completed
  // submission; empty when unavailable.
  std::vector<double> read(std::uint32_t count) const;

 private:
  VkDevice device_;
  VkQueryPool pool_ = VK_NULL_HANDLE;
  double period_ns_ = 1.0;
  std::uint64_t mask_ = ~std::uint64_t{0};
};

class CommandStream {
 public:
  CommandStream(const Device& device, bool timestamps);
  ~CommandStream();
  CommandStream(const CommandStream&) = delete;
  CommandStream& operator=(const CommandStream&) = delete;

  // Starts recording (discarding anything recorded but never submitted, e.g. after an
  // exception between begin() and submit_and_wait()). With `hold`, the recording is a
  // batch; Error(internal) when a held recording is open.
  void begin(bool hold = false);
  // Drops an open recording, held or not, without submitting it (exception paths).
  void abandon() noexcept;
  bool held() const { return held_; }
  // Binds `bindings` to 0..n-1 of the pipeline's set, pushes `push` (the pipeline's
  // push-constant size), dispatches `groups` workgroups along x.
  void dispatch(const ComputePipeline& pipeline, std::span<const BufferRange> bindings, std::span<const std::byte> push,
                std::uint32_t groups);
  void copy(VkBuffer src, VkDeviceSize src_offset, VkBuffer dst, VkDeviceSize dst_offset, VkDeviceSize bytes);
  // Writes `data` (whole words, at a word-aligned offset) into dst from the command buffer
  // itself (vkCmdUpdateBuffer, in pieces of at most 64 KiB): small host data reaches
  // device-local memory inside the same submission as the dispatches that read it.
  void update(VkBuffer dst, VkDeviceSize offset, std::span<const std::byte> data);
  // Submits, waits for completion, and reads the timestamps.
  void submit_and_wait();

  std::optional<double> last_seconds() const { return last_seconds_; }
  // The device time of each command of the last submission, in recording order, named by
  // its pipeline ("copy", "update" for the transfers); empty without timestamps or when
  // the submission had more commands than the pool has stamps.
  struct Step {
    std::string name;
    double seconds = 0;
  };
  const std::vector<Step>& last_steps() const { return last_steps_; }
  // Submissions so far (tests: a batch is one submission).
  std::uint64_t submissions() const { return submissions_; }

 private:
  // The barrier that follows every command, and the command's stamp.
  void end_command(std::string_view name);

  const Device& device_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorPool descriptors_ = VK_NULL_HANDLE;
  TimestampQueries timestamps_;
  bool recording_ = false;
  bool held_ = false;
  std::uint64_t submissions_ = 0;
  std::uint32_t sets_used_ = 0;
  std::optional<double> last_seconds_;
  std::vector<std::string> step_names_;  // of the open recording
  std::vector<Step> last_steps_;
};

}  // namespace kvlab::vk
