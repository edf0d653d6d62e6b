// The Vulkan rows of kvlab_bench over kernels/vulkan (bench/vulkan_bench.h).
#include "bench/vulkan_bench.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "bench/vulkan_baseline.h"
#include "kernels/vulkan/context.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

// VulkanOptions for "vulkan[:<variant>]" as make_vulkan_backend() reads the variant
// (kernels/vulkan/vulkan_backend.h), plus timestamps.
VulkanOptions timed_options(std::string_view backend) {
  KVLAB_REQUIRE(is_vulkan_backend(backend), invalid_argument, "'", backend, "' is not a Vulkan backend name");
  VulkanOptions options = vulkan_options_from_variant(backend.size() > 7 ? backend.substr(7) : std::string_view{});
  options.timestamps = true;
  return options;
}

VulkanBackend& as_vulkan(Backend& backend) {
  auto* v = dynamic_cast<VulkanBackend*>(&backend);
  KVLAB_REQUIRE(v != nullptr, internal, "backend '", backend.name(), "' is not a VulkanBackend");
  return *v;
}

// One kernel call is timed by the device when it made exactly one submission
// (Context::submissions()): then last_kernel_seconds() (timestamps at the start and end
// of that submission) is the whole call. A call of several submissions (today the
// attention kernels: stage q, attention pass, combine, in sdpa.cc) would be timed by its
// last one alone, so it falls back to the host's wall clock around the call: an upper
// bound that also counts validation, submissions and fence waits (small on lavapipe,
// large against a fast GPU's kernel).
class VulkanClock final : public DeviceClock {
 public:
  VulkanClock(VulkanBackend& backend, std::int64_t flush_bytes) : backend_(backend) {
    // The copy touches twice its buffer size (read one, write the other).
    constexpr std::int64_t kMiB = std::int64_t{1} << 20;
    if (flush_bytes > 0) {
      flush_ = std::make_unique<DeviceCopy>(backend.context().device(),
                                            static_cast<std::uint64_t>(std::max(flush_bytes / 2, kMiB)));
    }
  }

  void flush_caches() override {
    if (flush_) flush_->copy();
  }

  DeviceTiming time(const std::function<void()>& call) override {
    const std::uint64_t before = backend_.context().submissions();
    const auto start = std::chrono::steady_clock::now();
    call();
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start;
    const std::optional<double> device = backend_.last_kernel_seconds();
    if (backend_.context().submissions() - before != 1 || !device) return {wall.count(), false};
    DeviceTiming timing{*device, true, {}};
    for (const VulkanKernelStep& s : backend_.last_kernel_steps()) {
      timing.passes.emplace_back(s.pass.substr(0, s.pass.find(' ')), s.seconds);
    }
    return timing;
  }

 private:
  VulkanBackend& backend_;
  std::unique_ptr<DeviceCopy> flush_;
};

class VulkanCopyBaseline final : public DeviceCopyBaseline {
 public:
  VulkanCopyBaseline(std::string_view backend, std::int64_t bytes)
      : backend_(std::make_unique<VulkanBackend>(timed_options(backend))),
        copy_(backend_->context().device(), static_cast<std::uint64_t>(bytes)) {}

  double copy(DeviceCopyMethod method) override { return copy_.copy(method); }
  std::int64_t bytes() const override { return static_cast<std::int64_t>(copy_.bytes()); }
  std::string describe(DeviceCopyMethod method) const override {
    const VulkanDeviceInfo d = backend_->device();
    return cat(method == DeviceCopyMethod::command ? "vkCmdCopyBuffer " : "compute-shader copy (16-byte blocks) ",
               copy_.bytes() >> 20, " MiB, device-local, on ", d.name, " [", d.type, "]",
               copy_.limited_by().empty() ? "" : cat(" (smaller than asked: ", copy_.limited_by(), ")"),
               "; bytes = read + written");
  }

 private:
  std::unique_ptr<VulkanBackend> backend_;
  DeviceCopy copy_;
};

}  // namespace

std::unique_ptr<Backend> make_timed_vulkan_backend(std::string_view backend) {
  return std::make_unique<VulkanBackend>(timed_options(backend));
}

VulkanDeviceProbe probe_vulkan_device(std::string_view backend) {
  try {
    const VulkanBackend b(timed_options(backend));
    const VulkanDeviceInfo d = b.device();
    return {cat(d.name, " [", d.type, "]"), ""};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    return {"", e.what()};
  }
}

std::string vulkan_kernel_clock() {
  return "device timestamps where a call is one submission, else the host wall clock around the call "
         "(counter device_timed < 1)";
}

std::unique_ptr<DeviceClock> make_device_clock(Backend& backend, std::int64_t flush_bytes) {
  return std::make_unique<VulkanClock>(as_vulkan(backend), flush_bytes);
}

std::unique_ptr<DeviceCopyBaseline> make_device_copy_baseline(std::string_view backend, std::int64_t bytes) {
  return std::make_unique<VulkanCopyBaseline>(backend, bytes);
}

}  // namespace kvlab::bench
