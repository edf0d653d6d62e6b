#include "reference/reference_backend.h"

#include "reference/kv_append.h"
#include "reference/kv_cast.h"
#include "reference/kv_move.h"
#include "reference/quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/rope.h"
#include "reference/sdpa.h"
#include "reference/turboquant.h"

namespace kvlab {

void ReferenceBackend::quantize(const QuantizeArgs& a) { ref::quantize(host_cview(a.x), a.rounding, host_view(a.out)); }

void ReferenceBackend::dequantize(const DequantizeArgs& a) { ref::dequantize(host_cview(a.in), host_view(a.out), a.flavour); }

void ReferenceBackend::rope(const RopeArgs& a) {
  ref::rope(host_cview(a.x), a.params, a.offsets.scalar, host_per_row(a.offsets), host_view(a.out));
}

void ReferenceBackend::sdpa(const SdpaArgs& a) {
  ConstTensorView m, s;
  ref::sdpa(host_cview(a.q), host_cview(a.k), host_cview(a.v), a.params, host_cview(a.mask, m),
            host_cview(a.sinks, s), host_view(a.out));
}

void ReferenceBackend::quantized_sdpa(const QuantizedSdpaArgs& a) {
  ConstTensorView m, s;
  ref::quantized_sdpa(host_cview(a.q), host_cview(a.k), host_cview(a.v), a.params, host_cview(a.mask, m),
                      host_cview(a.sinks, s), host_view(a.out));
}

void ReferenceBackend::turboquant_encode(const TurboQuantEncodeArgs& a) {
  ref::turboquant_encode(host_cview(a.x), a.codec, host_view(a.norms), host_view(a.indices));
}

void ReferenceBackend::turboquant_decode(const TurboQuantDecodeArgs& a) {
  ref::turboquant_decode(host_cview(a.norms), host_cview(a.indices), a.codec, host_view(a.out));
}

void ReferenceBackend::kv_scatter(const KvScatterArgs& a) {
  ref::kv_scatter(host_cview(a.src), a.slots, host_view(a.dst));
}

void ReferenceBackend::kv_gather(const KvGatherArgs& a) {
  ref::kv_gather(host_cview(a.src), a.batch_index, host_view(a.dst));
}

void ReferenceBackend::kv_copy_blocks(const KvCopyBlocksArgs& a) {
  ref::kv_copy_blocks(host_cview(a.src), a.blocks, host_view(a.dst));
}

void ReferenceBackend::kv_roll(const KvRollArgs& a) {
  ref::kv_roll(host_cview(a.src), a.shifts, host_view(a.dst));
}

void ReferenceBackend::kv_append_advance(const KvAppendAdvanceArgs& a) {
  ref::kv_append_advance(host_cview(a.k), host_cview(a.v), a.left_padding, host_view(a.offsets), host_view(a.k_cache),
                         host_view(a.v_cache));
}

void ReferenceBackend::kv_snapshot(const KvSnapshotArgs& a) { ref::kv_snapshot(host_cview(a.src), host_view(a.dst)); }

void ReferenceBackend::kv_cast(const KvCastArgs& a) { ref::kv_cast(host_cview(a.src), host_view(a.dst)); }

}  // namespace kvlab
