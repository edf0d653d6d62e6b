// sdpa through ggml_flash_attn_ext (kernels/ggml/attention.h): K and V are kvlab's own
// buffers, whose rows are ggml's f32/f16/bf16 rows, so ggml reads them in place.
#include "kernels/ggml/attention.h"
#include "kvlab/host_buffer.h"
#include "reference/sdpa.h"

namespace kvlab::ggmlk {

Arithmetic sdpa(Engine& e, const SdpaArgs& a) {
  ConstTensorView mask_storage, sinks_storage;
  const ConstTensorView q = host_cview(a.q), k = host_cview(a.k), v = host_cview(a.v);
  const ConstTensorView* mask = host_cview(a.mask, mask_storage);
  const ConstTensorView* sinks = host_cview(a.sinks, sinks_storage);
  const TensorView out = host_view(a.out);
  ref::validate_sdpa(q, k, v, a.params, mask, sinks, out);
  const KvRows kr{float_type(k.dtype), k.data, k.shape[3]}, vr{float_type(v.dtype), v.data, v.shape[3]};
  return attend(e, q, kr, vr, k.shape[1], k.shape[2], a.params, mask, sinks, out, "sdpa");
}

}  // namespace kvlab::ggmlk
