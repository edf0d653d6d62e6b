// Vulkan attention over packed K/V (contract: reference/quantized_sdpa.h):
// shaders/quantized_sdpa.comp reads codes, scales and biases directly — no dequantized
// copy — with the factored logit q·k = Σ_g s_g·Σ q_d c_d + b_g·Σ q_d (the harness budget
// allows it), then the combine pass of sdpa.cc. Affine K/V of any bits 2..8 and group
// size; the fp modes (mxfp4/mxfp8/nvfp4) throw Error(unsupported).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/vulkan/attention_driver.h"
#include "kernels/vulkan/context.h"
#include "kvlab/error.h"
#include "reference/quantized_sdpa.h"

namespace kvlab {

namespace {

ref::QuantizedView view_of(VulkanBackend::Context& c, const QuantizedDTensor& x) {
  return {c.view(x.wq), c.view(x.scales), x.biases ? c.view(x.biases) : ConstTensorView{}, x.spec};
}

// The specialization of shaders/sdpa_quantized_decode.comp for this call (K bits, V bits,
// room for heads per workgroup: 4 or 8, so that a lavapipe run compiles few pipelines), or
// nothing where that pass does not apply (see its header): then the general pass runs.
std::vector<std::uint32_t> decode_pass_shape(const vk::Device& device, const QuantizedDTensor& k,
                                             const QuantizedDTensor& v, std::int64_t group, std::int64_t dk,
                                             std::int64_t dv, const DTensor* mask) {
  // The shader's TILE, MAX_SUBGROUPS, MAX_Q_FLOATS and MAX_K_GROUPS.
  constexpr std::int64_t kTile = 64, kMaxSubgroups = 16, kMaxQFloats = 2048, kMaxKGroups = 32;
  const auto word_codes = [](int bits) { return bits == 2 || bits == 4 || bits == 8 ? 32 / bits : 0; };
  const auto pow2 = [](std::int64_t n) { return n > 0 && (n & (n - 1)) == 0; };
  const std::int64_t kcpw = word_codes(k.spec.bits), vcpw = word_codes(v.spec.bits);
  if (mask != nullptr || kcpw == 0 || vcpw == 0) return {};
  if (!pow2(k.spec.group_size) || !pow2(v.spec.group_size) || k.spec.group_size < kcpw ||
      v.spec.group_size < vcpw || dk / k.spec.group_size > kMaxKGroups) {
    return {};
  }
  const std::int64_t vw = dv / vcpw;  // V words per key: a power of two <= the tile
  if (dv % vcpw != 0 || vw > kTile || !pow2(vw)) return {};
  const std::int64_t r = vulkan_attention::heads_per_workgroup(group, dk) <= 4 ? 4 : 8;
  const std::int64_t shared_floats = kMaxQFloats + kMaxKGroups * r + 2 * kTile * r + 3 * r * kMaxSubgroups + kTile * vcpw;
  if (dk * r > kMaxQFloats || shared_floats * 4 > device.limits().maxComputeSharedMemorySize) return {};
  return {static_cast<std::uint32_t>(k.spec.bits), static_cast<std::uint32_t>(v.spec.bits),
          static_cast<std::uint32_t>(r)};
}
}  // namespace

void VulkanBackend::quantized_sdpa(const QuantizedSdpaArgs& a) {
  const auto& [q, k, v, params, mask_array, sinks, out] = a;
  namespace va = vulkan_attention;
  Context& c = *context_;
  const ConstTensorView qv = c.view(q), ov = c.view(out);
  const TensorView out_view{const_cast<std::byte*>(ov.data), ov.dtype, ov.shape};  // validation only, never written
  const ref::QuantizedView kq = view_of(c, k), vq = view_of(c, v);
  ConstTensorView mask_view, sinks_view;
  if (mask_array) mask_view = c.view(*mask_array);
  if (sinks) sinks_view = c.view(*sinks);
  ref::validate_quantized_sdpa(qv, kq, vq, params, mask_array ? &mask_view : nullptr, sinks ? &sinks_view : nullptr,
                               out_view);
  for (const QuantizedDTensor* x : {&k, &v}) {
    KVLAB_REQUIRE(x->spec.format().encoder == QuantEncoder::affine, unsupported, "VulkanBackend: quantized_sdpa supports affine K/V only; ",
                  x == &k ? "K" : "V", " uses ", to_string(x->spec));
  }

  std::vector<std::uint32_t> table = va::base_table(q, out, k.wq.shape[1], k.wq.shape[2], params, mask_array, sinks);
  const BoundTensor bks = c.bind(k.scales, dtype_size(k.scales.dtype)), bkb = c.bind(k.biases, dtype_size(k.biases.dtype));
  const BoundTensor bvs = c.bind(v.scales, dtype_size(v.scales.dtype)), bvb = c.bind(v.biases, dtype_size(v.biases.dtype));
  table[va::kKDtype] = static_cast<std::uint32_t>(k.scales.dtype);
  table[va::kVDtype] = static_cast<std::uint32_t>(v.scales.dtype);
  table[va::kKsOff] = bks.offset;
  table[va::kKbOff] = bkb.offset;
  table[va::kVsOff] = bvs.offset;
  table[va::kVbOff] = bvb.offset;
  table[va::kKBits] = static_cast<std::uint32_t>(k.spec.bits);
  table[va::kKGroup] = static_cast<std::uint32_t>(k.spec.group_size);
  table[va::kVBits] = static_cast<std::uint32_t>(v.spec.bits);
  table[va::kVGroup] = static_cast<std::uint32_t>(v.spec.group_size);
  // The subgroup build stages K in slices of whole 32-code blocks: Dk is a multiple of the
  // affine group size (validated above), which is at least 32. The decode pass needs
  // subgroup arithmetic too.
  const bool subgroups = uses_subgroup_reductions();
  std::vector<std::uint32_t> decode;
  if (subgroups && !c.options().force_general_attention) {
    decode = decode_pass_shape(c.device(), k, v, q.shape[1] / k.wq.shape[1], q.shape[3], out.shape[3], mask_array);
  }
  const vulkan::ShaderId pass = !decode.empty() ? vulkan::ShaderId::quantized_sdpa_decode
                                : subgroups     ? vulkan::ShaderId::quantized_sdpa_subgroup
                                                : vulkan::ShaderId::quantized_sdpa;
  va::run(c, pass, std::move(table), q, {c.bind(k.wq, 4), c.bind(v.wq, 4)},
          {bks, bkb, bvs, bvb}, mask_array, sinks, out, decode);
}

}  // namespace kvlab
