#include "reference/reference_backend.h"

#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/kv_move.h"
#include "reference/quantized_sdpa.h"
#include "reference/rope.h"
#include "reference/sdpa.h"
#include "reference/turboquant.h"

namespace kvlab {

namespace {

ConstTensorView cv(const DTensor& t) { return host_cview(t); }
const ConstTensorView* opt(const DTensor* t, ConstTensorView& storage) {
  if (t == nullptr || !*t) return nullptr;
  storage = cv(*t);
  return &storage;
}
ref::QuantizedView qview(const QuantizedDTensor& q) {
  return {cv(q.wq), cv(q.scales), q.biases ? cv(q.biases) : ConstTensorView{}, q.spec};
}

}  // namespace

void ReferenceBackend::affine_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding,
                                       const DTensor& wq, const DTensor& scales, const DTensor& biases) {
  ref::affine_quantize(cv(x), spec, rounding, host_view(wq), host_view(scales), host_view(biases));
}

void ReferenceBackend::affine_dequantize(const DTensor& wq, const DTensor& scales, const DTensor& biases,
                                         const QuantSpec& spec, const DTensor& out) {
  ref::affine_dequantize(cv(wq), cv(scales), cv(biases), spec, host_view(out));
}

void ReferenceBackend::fp_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding,
                                   std::optional<float> global_scale, const DTensor& wq, const DTensor& scales) {
  ref::fp_quantize(cv(x), spec, rounding, global_scale, host_view(wq), host_view(scales));
}

void ReferenceBackend::fp_dequantize(const DTensor& wq, const DTensor& scales, const QuantSpec& spec,
                                     std::optional<float> global_scale, const DTensor& out) {
  ref::fp_dequantize(cv(wq), cv(scales), spec, global_scale, host_view(out));
}

void ReferenceBackend::rope(const DTensor& x, const RopeParams& params, const Offsets& offsets,
                            const DTensor& out) {
  std::optional<ConstTensorView> per_row;
  if (offsets.per_row) per_row = cv(*offsets.per_row);
  ref::rope(cv(x), params, offsets.scalar, per_row, host_view(out));
}

void ReferenceBackend::sdpa(const DTensor& q, const DTensor& k, const DTensor& v, const AttentionParams& params,
                            const DTensor* mask_array, const DTensor* sinks, const DTensor& out) {
  ConstTensorView m, s;
  ref::sdpa(cv(q), cv(k), cv(v), params, opt(mask_array, m), opt(sinks, s), host_view(out));
}

void ReferenceBackend::quantized_sdpa(const DTensor& q, const QuantizedDTensor& k, const QuantizedDTensor& v,
                                      const AttentionParams& params, const DTensor* mask_array,
                                      const DTensor* sinks, const DTensor& out) {
  ConstTensorView m, s;
  ref::quantized_sdpa(cv(q), qview(k), qview(v), params, opt(mask_array, m), opt(sinks, s), host_view(out));
}

void ReferenceBackend::turboquant_encode(const DTensor& x, const TurboQuantCodec& codec, const DTensor& norms,
                                         const DTensor& indices) {
  ref::turboquant_encode(cv(x), codec, host_view(norms), host_view(indices));
}

void ReferenceBackend::turboquant_decode(const DTensor& norms, const DTensor& indices, const TurboQuantCodec& codec,
                                         const DTensor& out) {
  ref::turboquant_decode(cv(norms), cv(indices), codec, host_view(out));
}

void ReferenceBackend::kv_scatter(const DTensor& src, const DTensor& slots, const DTensor& dst) {
  ref::kv_scatter(cv(src), cv(slots), host_view(dst));
}

void ReferenceBackend::kv_gather(const DTensor& src, const DTensor& batch_index, const DTensor& dst) {
  ref::kv_gather(cv(src), cv(batch_index), host_view(dst));
}

void ReferenceBackend::kv_copy_blocks(const DTensor& src, std::span<const SeqBlock> blocks, const DTensor& dst) {
  ref::kv_copy_blocks(cv(src), blocks, host_view(dst));
}

void ReferenceBackend::kv_roll(const DTensor& src, const DTensor& shifts, const DTensor& dst) {
  ref::kv_roll(cv(src), cv(shifts), host_view(dst));
}

}  // namespace kvlab
