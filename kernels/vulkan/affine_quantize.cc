// Vulkan quantize/dequantize, affine format only (contract: reference/affine_quantize.h),
// bit-exact with the oracle: shaders/affine_quantize.comp and shaders/affine_dequantize.comp.
#include <cstdint>

#include "kernels/vulkan/context.h"
#include "kvlab/error.h"
#include "reference/affine_quantize.h"
#include "reference/quantize.h"

namespace kvlab {

namespace {

}  // namespace

// The backend's one dispatch on the format table's encoder column.
void VulkanBackend::quantize(const QuantizeArgs& a) {
  const auto& [x, rounding, q] = a;
  const auto& [wq, scales, biases, spec, global_scale] = q;
  Context& c = *context_;
  ref::validate_format_operands(spec, biases ? c.view(biases) : ConstTensorView{}, global_scale, "quantize");
  ref::validate_rounding(spec, rounding, "quantize");
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::affine, unsupported, "VulkanBackend: quantize in mode ",
                quant_mode_name(spec.mode), " is not implemented yet");
  ref::validate_affine_quantize(c.view(x), spec, c.view(wq), c.view(scales), c.view(biases));
  KVLAB_REQUIRE(ref::host_quantize_flavour(spec, rounding).has_value(), unsupported,
                ref::unsupported_flavour("VulkanBackend", "quantize", spec, rounding));
  const std::int64_t groups = scales.numel();  // rows · D / group_size
  if (groups == 0) return;
  const std::size_t es = dtype_size(x.dtype);
  const BoundTensor bx = c.bind(x, es), bw = c.bind(wq, 4), bs = c.bind(scales, es), bb = c.bind(biases, es);
  const struct {
    std::uint32_t x_offset, wq_offset, scales_offset, biases_offset, dtype, groups, group_size, bits, gpu_rounding,
        exact_only;
  } push{bx.offset,
         bw.offset,
         bs.offset,
         bb.offset,
         static_cast<std::uint32_t>(x.dtype),
         u32(groups),
         u32(spec.group_size),
         u32(spec.bits),
         rounding == Rounding::mlx_gpu ? 1u : 0u,
         c.options().exact_arithmetic_only ? 1u : 0u};
  c.dispatch(vulkan::ShaderId::affine_quantize, {bx, bw, bs, bb}, &push, sizeof push,
             static_cast<std::uint64_t>(groups));
}

void VulkanBackend::dequantize(const DequantizeArgs& a) {
  const auto& [q, out, flavour] = a;
  const auto& [wq, scales, biases, spec, global_scale] = q;
  Context& c = *context_;
  ref::validate_format_operands(spec, biases ? c.view(biases) : ConstTensorView{}, global_scale, "dequantize");
  ref::validate_rounding(spec, flavour, "dequantize");
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::affine, unsupported, "VulkanBackend: dequantize in mode ",
                quant_mode_name(spec.mode), " is not implemented yet");
  ref::validate_affine_dequantize(c.view(wq), c.view(scales), c.view(biases), spec, c.view(out));
  KVLAB_REQUIRE(ref::host_dequantize_flavour(spec, scales.dtype, flavour).has_value(), unsupported,
                ref::unsupported_flavour("VulkanBackend", "dequantize", spec, flavour));
  const std::int64_t groups = scales.numel();
  if (groups == 0 || out.numel() == 0) return;
  const std::size_t ss = dtype_size(scales.dtype), os = dtype_size(out.dtype);
  const BoundTensor bw = c.bind(wq, 4), bs = c.bind(scales, ss), bb = c.bind(biases, ss), bo = c.bind(out, os);
  const struct {
    std::uint32_t wq_offset, scales_offset, biases_offset, out_offset, scales_dtype, out_dtype, groups, group_size,
        bits, exact_only;
  } push{bw.offset,
         bs.offset,
         bb.offset,
         bo.offset,
         static_cast<std::uint32_t>(scales.dtype),
         static_cast<std::uint32_t>(out.dtype),
         u32(groups),
         u32(spec.group_size),
         u32(spec.bits),
         c.options().exact_arithmetic_only ? 1u : 0u};
  c.dispatch(vulkan::ShaderId::affine_dequantize, {bw, bs, bb, bo}, &push, sizeof push,
             static_cast<std::uint64_t>(groups));
}

}  // namespace kvlab
