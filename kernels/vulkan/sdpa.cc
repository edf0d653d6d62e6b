// Vulkan attention (contract: reference/sdpa.h): shaders/sdpa.comp (the flash-decoding
// pass of shaders/sdpa_core.glsl) and shaders/sdpa_combine.comp. The oracle's validator
// runs first; a work buffer of this call (shaders/sdpa_params.glsl) carries the
// parameter table (shapes, mask, offsets) and the chunk partials.
//
// Two builds of the attention pass (shaders/sdpa_core.glsl): the subgroup build where the
// device has compute-stage subgroup arithmetic with a subgroup size of 4..64 dividing the
// local size (uses_subgroup_reductions), else, or with force_shared_reductions, the
// shared-memory build. Results differ between them only in the summation order of the
// softmax denominator (and possibly contraction): both within the same budget.
//
// Numerics: f32 everywhere (logits, online softmax, accumulation), exp/tanh from
// shaders/sdpa_math.glsl (a few ulp), one RNE rounding of the f32 result to out's dtype:
// within harness attention_budget, which allows f32 accumulation and a double rounding.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/vulkan/attention_driver.h"
#include "kernels/vulkan/context.h"
#include "kvlab/error.h"
#include "reference/attention_core.h"
#include "reference/sdpa.h"

namespace kvlab {

namespace vulkan_attention {

// Limits of the shaders' shared arrays (sdpa_core.glsl).
constexpr std::int64_t kMaxDk = 1024, kMaxDv = 512, kLocalSize = 64, kMaxHeadsPerWorkgroup = 8,
                       kStagedQFloats = 2048;
constexpr std::uint32_t kPartialHeader = 3;  // m, l, any
// The subgroup build keeps one value per subgroup in shared arrays of this many entries.
constexpr std::uint32_t kMaxSubgroups = 16;

std::int64_t heads_per_workgroup(std::int64_t group, std::int64_t dk) {
  return std::min<std::int64_t>({kMaxHeadsPerWorkgroup, group, kStagedQFloats / dk});
}

// The table for q (B, Hq, Lq, Dk), out (…, Dv), Lk keys over Hkv heads and the params;
// the caller fills the K/V offsets and dtypes (and the quantized fields).
std::vector<std::uint32_t> base_table(const DTensor& q, const DTensor& out, std::int64_t hkv, std::int64_t lk,
                                      const AttentionParams& params, const DTensor* mask, const DTensor* sinks) {
  const std::int64_t batch = q.shape[0];
  std::vector<std::uint32_t> t(kPaddings + 2 * static_cast<std::size_t>(batch), 0u);
  t[kQDtype] = static_cast<std::uint32_t>(q.dtype);
  t[kB] = u32(batch);
  t[kHq] = u32(q.shape[1]);
  t[kHkv] = u32(hkv);
  t[kLq] = u32(q.shape[2]);
  t[kLk] = u32(lk);
  t[kDk] = u32(q.shape[3]);
  t[kDv] = u32(out.shape[3]);
  t[kMaskKind] = static_cast<std::uint32_t>(params.mask.kind);
  t[kMaskB] = mask ? u32(mask->shape[0]) : 1u;
  t[kMaskH] = mask ? u32(mask->shape[1]) : 1u;
  t[kMaskDtype] = mask ? static_cast<std::uint32_t>(mask->dtype) : 0u;
  t[kWindow] = u32(params.mask.window);
  t[kScale] = std::bit_cast<std::uint32_t>(params.scale);
  t[kSoftcap] = std::bit_cast<std::uint32_t>(params.softcap);
  t[kMeanPolicy] = params.fully_masked == FullyMaskedRow::mean_of_values ? 1u : 0u;
  t[kHasSinks] = sinks ? 1u : 0u;
  t[kSinksDtype] = sinks ? static_cast<std::uint32_t>(sinks->dtype) : 0u;
  std::size_t at = kPaddings;
  t[kHasLpad] = params.mask.left_padding.empty() ? 0u : 1u;
  for (const std::int32_t p : params.mask.left_padding) t[at++] = static_cast<std::uint32_t>(p);
  t[kHasRpad] = params.mask.right_padding.empty() ? 0u : 1u;
  for (const std::int32_t p : params.mask.right_padding) t[at++] = static_cast<std::uint32_t>(p);
  return t;
}

// Runs the attention pass `pass` and the combine pass into `out`; quantized_sdpa first
// stages q as f32 into the work buffer (sdpa_stage_q.comp). Bindings of the pass: the
// work buffer, `operands` (q, k, v | K codes, V codes), the mask, then `meta` (K/V
// scales and biases). The KV length is split into chunks of whole tiles so that a
// decode step still has enough workgroups (flash-decoding). `specialization`: the values
// of the pass's specialization constants (none for the general passes).
void run(VulkanBackend::Context& c, vulkan::ShaderId pass, std::vector<std::uint32_t> table, const DTensor& q,
         std::initializer_list<BoundTensor> operands, std::initializer_list<BoundTensor> meta, const DTensor* mask,
         const DTensor* sinks, const DTensor& out, std::span<const std::uint32_t> specialization) {
  const bool quantized = pass != vulkan::ShaderId::sdpa && pass != vulkan::ShaderId::sdpa_subgroup;
  const char* op = quantized ? "quantized_sdpa" : "sdpa";
  const std::int64_t dk = table[kDk], dv = table[kDv], lk = table[kLk];
  KVLAB_REQUIRE(dk <= kMaxDk && dv <= kMaxDv, unsupported, "VulkanBackend: ", op, " supports Dk <= ", kMaxDk,
                " and Dv <= ", kMaxDv, " (its shared-memory tiles); got Dk = ", dk, ", Dv = ", dv);
  const std::int64_t rows = std::int64_t{table[kB]} * table[kHq] * table[kLq];
  // A workgroup serves a block of up to 8 query heads of one kv head (their staged q
  // rows must fit the shader's 2048 floats): every K/V element it loads serves them all.
  const std::int64_t group = table[kHq] / table[kHkv];
  const std::int64_t r_block = heads_per_workgroup(group, dk);
  table[kRBlock] = u32(r_block);
  const std::int64_t tasks = std::int64_t{table[kB]} * table[kHkv] * ((group + r_block - 1) / r_block) * table[kLq];
  const std::uint32_t wg = c.options().attention_workgroups;
  const bool cpu_device = c.device().info().type == VK_PHYSICAL_DEVICE_TYPE_CPU;
  const std::int64_t target_workgroups = wg != 0 ? wg : cpu_device ? kCpuAttentionWorkgroups : kGpuAttentionWorkgroups;
  const std::int64_t tiles = (lk + kLocalSize - 1) / kLocalSize;
  std::int64_t chunks = std::clamp<std::int64_t>((target_workgroups + tasks - 1) / tasks, 1, tiles);
  const std::int64_t chunk_len = (tiles + chunks - 1) / chunks * kLocalSize;
  chunks = (lk + chunk_len - 1) / chunk_len;
  table[kChunkLen] = u32(chunk_len);
  table[kChunks] = u32(chunks);

  // The work buffer: table, q as f32 (quantized), partials; all in words.
  const std::int64_t qf_base = (static_cast<std::int64_t>(table.size()) + 3) / 4 * 4;
  const std::int64_t partial_base = qf_base + (quantized ? rows * dk : 0);
  const std::int64_t words = partial_base + rows * chunks * (dv + kPartialHeader);
  table[kQfBase] = u32(qf_base);
  table[kPartialBase] = u32(partial_base);
  const BoundTensor bq = c.bind(q, dtype_size(q.dtype)), bout = c.bind(out, dtype_size(out.dtype));
  table[kQOff] = bq.offset;
  table[kOutOff] = bout.offset;
  // The K and V operands are the last two (codes for quantized_sdpa).
  table[kKOff] = operands.begin()[operands.size() - 2].offset;
  table[kVOff] = operands.begin()[operands.size() - 1].offset;
  const DTensor work{c.allocate(static_cast<std::size_t>(words) * 4), 0, DType::u32, {words}};
  const BoundTensor bwork = c.bind(work, 4);
  BoundTensor bmask = bwork, bsinks = bwork;  // unread without a mask array / sinks
  if (mask) {
    bmask = c.bind(*mask, dtype_size(mask->dtype));
    table[kMaskOff] = bmask.offset;
  }
  if (sinks) {
    bsinks = c.bind(*sinks, dtype_size(sinks->dtype));
    table[kSinksOff] = bsinks.offset;
  }
  // One submission for the table and all passes: one fence wait instead of several, and
  // the timestamps of last_kernel_seconds() bracket the whole kernel (kvlab_bench times it
  // by them). The table is written by the command buffer, not by a staged upload, which on
  // device-local memory (a discrete GPU) would be a submission of its own.
  VulkanBackend::Context::Batch batch(c);
  c.update(DTensor{work.buffer, 0, DType::u32, {static_cast<std::int64_t>(table.size())}}, table.data());

  if (quantized) {
    c.dispatch(vulkan::ShaderId::sdpa_stage_q, {bwork, bq}, nullptr, 0, static_cast<std::uint64_t>(rows * dk));
  }
  std::vector<BoundTensor> b{bwork};
  b.insert(b.end(), operands.begin(), operands.end());
  b.push_back(bmask);
  b.insert(b.end(), meta.begin(), meta.end());
  // One workgroup per (task, chunk): the dispatch counts invocations.
  const auto invocations = static_cast<std::uint64_t>(tasks * chunks * kLocalSize);
  if (quantized) {
    KVLAB_REQUIRE(b.size() == 8, internal, "quantized_sdpa pass expects 8 bindings, got ", b.size());
    c.dispatch(pass, {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]}, nullptr, 0, invocations, specialization);
  } else {
    KVLAB_REQUIRE(b.size() == 5, internal, "sdpa pass expects 5 bindings, got ", b.size());
    c.dispatch(pass, {b[0], b[1], b[2], b[3], b[4]}, nullptr, 0, invocations);
  }
  c.dispatch(vulkan::ShaderId::sdpa_combine, {bwork, bsinks, bout}, nullptr, 0, static_cast<std::uint64_t>(rows * dv));
  batch.submit();
}

}  // namespace vulkan_attention

bool VulkanBackend::uses_subgroup_reductions() const {
  namespace va = vulkan_attention;
  const vk::Device& d = context_->device();
  const std::uint32_t size = d.subgroup_size();
  // A subgroup size dividing the local size (so subgroups are full) and at most
  // kMaxSubgroups of them per workgroup (the shader's shared arrays).
  constexpr auto local = static_cast<std::uint32_t>(va::kLocalSize);
  const bool size_ok = size > 0 && size <= local && local % size == 0 && local / size <= va::kMaxSubgroups;
  return d.enabled().subgroup_arithmetic && size_ok && !context_->options().force_shared_reductions;
}

void VulkanBackend::sdpa(const SdpaArgs& a) {
  const auto& [q, k, v, params, mask_array, sinks, out] = a;
  namespace va = vulkan_attention;
  Context& c = *context_;
  ConstTensorView mask_view, sinks_view;
  if (mask_array) mask_view = c.view(*mask_array);
  if (sinks) sinks_view = c.view(*sinks);
  const ConstTensorView ov = c.view(out);
  const TensorView out_view{const_cast<std::byte*>(ov.data), ov.dtype, ov.shape};  // validation only, never written
  const ConstTensorView kv = c.view(k), vv = c.view(v);
  ref::detail::validate_attention("sdpa", c.view(q), kv, vv, params, mask_array ? &mask_view : nullptr,
                                  sinks ? &sinks_view : nullptr, out_view, ref::detail::KvDtype::same_as_q);
  KVLAB_REQUIRE(kv.data != nullptr, invalid_argument, "sdpa k of shape ", shape_str(kv.shape), " has no data");
  KVLAB_REQUIRE(vv.data != nullptr, invalid_argument, "sdpa v of shape ", shape_str(vv.shape), " has no data");
  std::vector<std::uint32_t> table = va::base_table(q, out, k.shape[1], k.shape[2], params, mask_array, sinks);
  table[va::kKDtype] = table[va::kVDtype] = static_cast<std::uint32_t>(k.dtype);
  const std::size_t es = dtype_size(k.dtype);
  const vulkan::ShaderId pass = uses_subgroup_reductions() ? vulkan::ShaderId::sdpa_subgroup : vulkan::ShaderId::sdpa;
  va::run(c, pass, std::move(table), q, {c.bind(q, dtype_size(q.dtype)), c.bind(k, es), c.bind(v, es)},
          {}, mask_array, sinks, out, {});
}

}  // namespace kvlab
