// Vulkan RoPE (contract: reference/rope.h): shaders/rope.comp, with per-row offsets read
// from the device buffer and the inverse frequencies from the host (rope_setup.h).
#include <vector>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/rope_setup.h"
#include "kvlab/error.h"
#include "reference/rope.h"

namespace kvlab {

void VulkanBackend::rope(const RopeArgs& a) {
  const auto& [x, params, offsets, out] = a;
  Context& c = *context_;
  std::optional<ConstTensorView> per_row;
  if (offsets.per_row) per_row = c.view(*offsets.per_row);
  ref::validate_rope(c.view(x), params, offsets.scalar, per_row, c.view(out));
  KVLAB_REQUIRE(!params.mlx_arithmetic, unsupported,
                "VulkanBackend: rope in MLX's arithmetic (flavour=mlx) is computed by the oracle only");
  if (x.numel() == 0) return;
  KVLAB_REQUIRE(c.device().enabled().float64, unsupported, "VulkanBackend: rope needs shaderFloat64, which device '",
                c.device().info().name, "' lacks");

  const std::int64_t batch = x.shape.front(), seq = x.shape[x.shape.size() - 2], d = x.shape.back();
  const std::int64_t heads = x.numel() / d / batch / seq;  // the axes between B and T
  const int half = params.dims / 2;
  const std::vector<double> inv_freq = vulkan::rope_inverse_frequencies(params);
  const std::size_t es = dtype_size(x.dtype);
  const BoundTensor bx = c.bind(x, es), bo = c.bind(out, es);
  const BoundTensor btable = c.bind_table(inv_freq.data(), inv_freq.size() * sizeof(double));
  const BoundTensor boff = offsets.per_row ? c.bind(*offsets.per_row, 4) : btable;  // unread without per-row offsets
  const vulkan::RopePush push{bx.offset,
                              bo.offset,
                              boff.offset,
                              static_cast<std::uint32_t>(x.dtype),
                              static_cast<std::uint32_t>(batch),
                              static_cast<std::uint32_t>(heads),
                              static_cast<std::uint32_t>(seq),
                              static_cast<std::uint32_t>(d),
                              static_cast<std::uint32_t>(params.dims),
                              params.traditional ? 1u : 0u,
                              offsets.per_row ? 1u : 0u,
                              offsets.scalar,
                              params.scale};
  c.dispatch(vulkan::ShaderId::rope, {bx, bo, boff, btable}, &push, sizeof push,
             static_cast<std::uint64_t>(batch * seq * half));
}

}  // namespace kvlab
