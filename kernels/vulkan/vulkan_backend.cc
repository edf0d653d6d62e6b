// VulkanBackend: construction, names and memory operations. The kernels live beside their
// shaders' stems (affine_quantize.cc, rope.cc, kv_move.cc, sdpa.cc, quantized_sdpa.cc,
// kv_append.cc); an op without one is not overridden (vulkan_backend.h).
#include "kernels/vulkan/vulkan_backend.h"

#include <charconv>

#include "kernels/vulkan/context.h"
#include "kvlab/error.h"

namespace kvlab {

VulkanBackend::VulkanBackend(VulkanOptions options) : context_(std::make_unique<Context>(options)) {}

VulkanBackend::~VulkanBackend() = default;

std::string VulkanBackend::name() const {
  return cat("vulkan:", context_->device().info().name, context_->options().force_word_storage ? " [words]" : "",
             context_->staging() && context_->options().force_staging ? " [staging]" : "",
             context_->options().force_shared_reductions ? " [nosubgroup]" : "",
             context_->options().force_general_attention ? " [general]" : "",
             context_->options().attention_workgroups != 0 ? cat(" [wg=", context_->options().attention_workgroups, "]")
                                                           : std::string());
}

VulkanDeviceInfo VulkanBackend::device() const {
  const vk::PhysicalDeviceInfo& i = context_->device().info();
  return {i.index, i.name, std::string(vk::device_type_name(i.type))};
}

bool VulkanBackend::uses_small_storage() const { return context_->small_storage(); }
bool VulkanBackend::uses_staging() const { return context_->staging(); }
bool VulkanBackend::validation_enabled() const { return context_->validation_enabled(); }
std::optional<double> VulkanBackend::last_kernel_seconds() const { return context_->last_kernel_seconds(); }
std::vector<VulkanKernelStep> VulkanBackend::last_kernel_steps() const { return context_->last_kernel_steps(); }

BufferPtr VulkanBackend::allocate(std::size_t bytes) { return context_->allocate(bytes); }
void VulkanBackend::upload(const DTensor& dst, const void* src) { context_->upload(dst, src); }
void VulkanBackend::download(const DTensor& src, void* dst) { context_->download(src, dst); }

void VulkanBackend::fill(const DTensor& dst, std::uint32_t element_bits) {
  const ConstTensorView v = context_->view(dst);
  if (v.nbytes() == 0) return;
  // The element bits replicated over a word (shaders/fill.comp): elements start on
  // their own alignment, so byte k of every word is byte k of the pattern.
  std::uint32_t pattern = element_bits;
  if (dtype_size(dst.dtype) == 1) pattern = (element_bits & 0xFFu) * 0x01010101u;
  if (dtype_size(dst.dtype) == 2) pattern = (element_bits & 0xFFFFu) * 0x00010001u;
  const BoundTensor b = context_->bind(dst, 1);
  const struct {
    std::uint32_t byte_offset, nbytes, pattern;
  } push{b.offset, static_cast<std::uint32_t>(v.nbytes()), pattern};
  const std::uint64_t words = (std::uint64_t{b.offset} + v.nbytes() + 3) / 4 - b.offset / 4;
  context_->dispatch(vulkan::ShaderId::fill, {b}, &push, sizeof push, words);
}

VulkanOptions vulkan_options_from_variant(std::string_view variant) {
  VulkanOptions options;
  std::string_view rest = variant;
  const std::size_t comma = rest.find(',');
  options.device = std::string(rest.substr(0, comma));
  rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  while (!rest.empty()) {
    const std::size_t next = rest.find(',');
    const std::string_view flag = rest.substr(0, next);
    if (flag == "words") {
      options.force_word_storage = true;
    } else if (flag == "staging") {
      options.force_staging = true;
    } else if (flag == "nosubgroup") {
      options.force_shared_reductions = true;
    } else if (flag == "general") {
      options.force_general_attention = true;
    } else if (flag.substr(0, 3) == "wg=") {
      const std::string_view digits = flag.substr(3);
      std::uint32_t n = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
      KVLAB_REQUIRE(ec == std::errc{} && end == digits.data() + digits.size() && n >= 1 && n <= 65535,
                    invalid_argument, "vulkan backend variant '", variant, "': ',wg=' needs a workgroup count in ",
                    "[1, 65535], got '", digits, "'");
      options.attention_workgroups = n;
    } else if (flag == "validate") {
      // Messages go to stderr as "[vulkan] <severity> <type>: ..." (runtime/instance.cc),
      // where the CTest run of the lavapipe tier fails on them.
      options.validation = true;
    } else {
      fail(ErrorKind::invalid_argument, cat("vulkan backend variant '", variant, "': unknown flag '", flag,
                                            "' (expected [<device>][,words][,staging][,nosubgroup][,general][,validate][,wg=<N>])"));
    }
    rest = next == std::string_view::npos ? std::string_view{} : rest.substr(next + 1);
  }
  return options;
}

std::unique_ptr<Backend> make_vulkan_backend(std::string_view variant) {
  return std::make_unique<VulkanBackend>(vulkan_options_from_variant(variant));
}

std::vector<VulkanDeviceInfo> vulkan_devices() {
  std::vector<VulkanDeviceInfo> out;
  try {
    const vk::Instance instance;
    for (const vk::PhysicalDeviceInfo& d : vk::list_physical_devices(instance)) {
      out.push_back({d.index, d.name, std::string(vk::device_type_name(d.type))});
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;  // no driver: no devices
  }
  return out;
}

}  // namespace kvlab
