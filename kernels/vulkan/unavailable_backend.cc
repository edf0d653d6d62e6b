// The stand-in that make_vulkan_backend_or_unavailable() hands out when no Vulkan device
// is usable: host memory, so the harness can place its tensors, and every kernel throws
// the Error(unsupported) that explains why, so `kvlab check` reports each case
// UNIMPLEMENTED with the reason instead of failing (DESIGN.md: absence is explicit).
// Nothing is ever computed here: there is no fallback to the oracle.
#include "kernels/vulkan/vulkan_backend.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"

namespace kvlab {

namespace {

class UnavailableVulkanBackend final : public HostMemoryBackend {
 public:
  explicit UnavailableVulkanBackend(std::string reason) : reason_(std::move(reason)) {}
  std::string name() const override { return "vulkan (unavailable)"; }

  void affine_quantize(const DTensor&, const QuantSpec&, Rounding, const DTensor&, const DTensor&,
                       const DTensor&) override { refuse(); }
  void affine_dequantize(const DTensor&, const DTensor&, const DTensor&, const QuantSpec&, const DTensor&) override {
    refuse();
  }
  void fp_quantize(const DTensor&, const QuantSpec&, Rounding, std::optional<float>, const DTensor&,
                   const DTensor&) override { refuse(); }
  void fp_dequantize(const DTensor&, const DTensor&, const QuantSpec&, std::optional<float>, const DTensor&) override {
    refuse();
  }
  void rope(const DTensor&, const RopeParams&, const Offsets&, const DTensor&) override { refuse(); }
  void sdpa(const DTensor&, const DTensor&, const DTensor&, const AttentionParams&, const DTensor*, const DTensor*,
            const DTensor&) override { refuse(); }
  void quantized_sdpa(const DTensor&, const QuantizedDTensor&, const QuantizedDTensor&, const AttentionParams&,
                      const DTensor*, const DTensor*, const DTensor&) override { refuse(); }
  void turboquant_encode(const DTensor&, const TurboQuantCodec&, const DTensor&, const DTensor&) override { refuse(); }
  void turboquant_decode(const DTensor&, const DTensor&, const TurboQuantCodec&, const DTensor&) override { refuse(); }
  void kv_scatter(const DTensor&, const DTensor&, const DTensor&) override { refuse(); }
  void kv_gather(const DTensor&, const DTensor&, const DTensor&) override { refuse(); }
  void kv_copy_blocks(const DTensor&, std::span<const SeqBlock>, const DTensor&) override { refuse(); }
  void kv_roll(const DTensor&, const DTensor&, const DTensor&) override { refuse(); }

 private:
  [[noreturn]] void refuse() const { fail(ErrorKind::unsupported, cat("no usable Vulkan device: ", reason_)); }
  std::string reason_;
};

}  // namespace

std::unique_ptr<Backend> make_vulkan_backend_or_unavailable(std::string_view variant) {
  try {
    return make_vulkan_backend(variant);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;  // e.g. a malformed variant
    return std::make_unique<UnavailableVulkanBackend>(e.what());
  }
}

}  // namespace kvlab
