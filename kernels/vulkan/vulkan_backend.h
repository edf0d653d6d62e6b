// The Vulkan backend: kernels as GLSL compute shaders (kernels/vulkan/shaders/, compiled
// by glslc at build time and embedded as SPIR-V) over a small RAII runtime
// (kernels/vulkan/runtime/). Contracts are the reference headers' (reference/*.h): the
// same results (bit-exact where the oracle is exact: affine codes/scales/biases,
// dequantize, kv moves; rope within one ulp of the dtype, see shaders/rope.comp) and the
// same kvlab::Error for the same invalid input (the oracle's validators run first).
//
// Memory: one VkBuffer per allocate(). On CPU and integrated devices it is host-visible
// and mapped, so upload/download are memcpy; on a discrete GPU it is device-local and
// transfers go through a staging buffer. Buffer::host_data() is always nullptr (device
// memory either way: go through upload/download). A tensor is bound from its offset
// aligned down to minStorageBufferOffsetAlignment, its range must fit
// maxStorageBufferRange (128 MiB on lavapipe), else Error(unsupported) names the size.
// Every call is synchronous: it returns when the device is done.
//
// Not implemented yet (Error(unsupported) naming the kernel, never a silent fallback to
// the oracle): fp_quantize/fp_dequantize, quantized_sdpa over fp-mode K/V, turboquant.
// sdpa/quantized_sdpa: within the harness attention_budget (f32 accumulation), see sdpa.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab {

// The workgroups an attention call aims for by default. A CPU device (lavapipe) runs a
// workgroup per core thread and gains nothing from more. On an NVIDIA H100 (132 SMs) a
// 64K-key decode ran fastest near 1024 of the targets swept with kvlab_bench ',wg=<N>'
// (bench/records/2026-11-26-nvidia-h100.md).
inline constexpr std::uint32_t kCpuAttentionWorkgroups = 256, kGpuAttentionWorkgroups = 1024;

struct VulkanOptions {
  // Index or name substring (see runtime/device.h); empty: KVLAB_VK_DEVICE, else the
  // best device (discrete, integrated, virtual, CPU).
  std::string device;
  // Enable VK_LAYER_KHRONOS_validation (Error(unsupported) when it is not installed);
  // each warning/error goes to on_validation_message (stderr without one).
  bool validation = false;
  std::function<void(const std::string&)> on_validation_message;
  // Use the u32-word shader builds even where 16/8-bit storage is supported, so a device
  // that has it (lavapipe) covers both paths.
  bool force_word_storage = false;
  // Device-local memory and staging transfers even where host-visible memory exists, so
  // that lavapipe covers the discrete-GPU path.
  bool force_staging = false;
  // The shared-memory builds of sdpa/quantized_sdpa even where the subgroup builds could
  // run (shaders/sdpa_core.glsl), so that lavapipe covers both.
  bool force_shared_reductions = false;
  // quantized_sdpa: the general attention pass even where the decode pass
  // (shaders/sdpa_quantized_decode.comp) applies, so that lavapipe covers both and a GPU
  // run can time them side by side. Flag ',general'.
  bool force_general_attention = false;
  // sdpa/quantized_sdpa: how many workgroups a call aims for when it splits the KV length
  // into chunks (flash-decoding; 0: kCpuAttentionWorkgroups on a CPU device, else
  // kGpuAttentionWorkgroups). Flag ',wg=<N>': tuning on a real GPU.
  std::uint32_t attention_workgroups = 0;
  // Tests: never take the hardware fast paths of the affine kernels (exact arithmetic only).
  bool exact_arithmetic_only = false;
  // Bracket each kernel's submission with timestamp queries (last_kernel_seconds());
  // off by default: reading them back costs more than a small kernel on lavapipe.
  bool timestamps = false;
};

// One command of a kernel's submission and its device time (timestamps on): the
// pipeline's name (shaders.h), or "copy" / "update" for the transfers.
struct VulkanKernelStep {
  std::string pass;
  double seconds = 0;
};

struct VulkanDeviceInfo {
  int index = 0;
  std::string name;
  std::string type;  // discrete, integrated, virtual, cpu, other
};

class VulkanBackend final : public Backend {
 public:
  // Throws Error(unsupported) with the reason when there is no driver, no matching
  // device, or a device below Vulkan 1.2.
  explicit VulkanBackend(VulkanOptions options = {});
  ~VulkanBackend() override;
  VulkanBackend(const VulkanBackend&) = delete;
  VulkanBackend& operator=(const VulkanBackend&) = delete;

  // "vulkan:<device name>", plus " [words]" / " [staging]" / " [nosubgroup]" when those
  // paths are forced.
  std::string name() const override;
  // The shaders keep q·scale, logits, P and dequantized K/V in f32 (shaders/*.comp).
  AttentionRounding attention_rounding() const override { return AttentionRounding::none(); }
  VulkanDeviceInfo device() const;
  bool uses_small_storage() const;  // 16/8-bit storage shader builds in use
  bool uses_staging() const;        // device-local memory + staging transfers
  // sdpa/quantized_sdpa run their subgroup builds: the device has compute-stage subgroup
  // arithmetic with a subgroup size the shaders handle, and force_shared_reductions is off.
  bool uses_subgroup_reductions() const;
  bool validation_enabled() const;
  // Device time of the last kernel's submission (timestamp queries); nullopt unless
  // VulkanOptions::timestamps is on, the queue has timestamps and a kernel ran.
  std::optional<double> last_kernel_seconds() const;
  // The same submission's commands, each with its device time, in recording order; empty
  // where last_kernel_seconds() is nullopt or the submission had more than 62 commands.
  std::vector<VulkanKernelStep> last_kernel_steps() const;

  using Backend::allocate;
  using Backend::download;
  using Backend::upload;
  BufferPtr allocate(std::size_t bytes) override;
  void upload(const DTensor& dst, const void* src) override;
  void download(const DTensor& src, void* dst) override;
  void fill(const DTensor& dst, std::uint32_t element_bits) override;

  // Kernels (kvlab/op_list.h), each in kernels/vulkan/<stem>.cc. The affine format only:
  // fp formats throw unsupported naming the op and mode. Ops not declared here (TurboQuant,
  // any op added to the list since) keep Backend's default, Error{unsupported} naming the op.
  void quantize(const QuantizeArgs& a) override;
  void dequantize(const DequantizeArgs& a) override;
  void rope(const RopeArgs& a) override;
  void sdpa(const SdpaArgs& a) override;
  void quantized_sdpa(const QuantizedSdpaArgs& a) override;
  void kv_scatter(const KvScatterArgs& a) override;
  void kv_gather(const KvGatherArgs& a) override;
  void kv_copy_blocks(const KvCopyBlocksArgs& a) override;
  void kv_roll(const KvRollArgs& a) override;
  void kv_append_advance(const KvAppendAdvanceArgs& a) override;
  void kv_snapshot(const KvSnapshotArgs& a) override;

  // The runtime context (kernels/vulkan/context.h); for the kernels' translation units
  // and the runtime tests.
  class Context;
  Context& context() { return *context_; }

 private:
  std::unique_ptr<Context> context_;
};

// The harness factory: variant = "[<device>][,words][,staging][,nosubgroup][,general][,validate][,wg=<N>]"
// (device as in VulkanOptions::device; words/staging/nosubgroup force the fallback paths
// (nosubgroup: force_shared_reductions); wg sets attention_workgroups, 1..65535; validate turns on the
// validation layer, messages to stderr). Throws Error(unsupported)
// with the reason when no device is usable.
std::unique_ptr<Backend> make_vulkan_backend(std::string_view variant);
// The options that variant stands for (Error(invalid_argument) naming an unknown flag).
VulkanOptions vulkan_options_from_variant(std::string_view variant);

// The devices the driver reports, in index order (empty when there is no driver).
std::vector<VulkanDeviceInfo> vulkan_devices();

}  // namespace kvlab
