// sdpa through ggml_flash_attn_ext (kernels/ggml/attention.h): K and V are kvlab's own
// buffers, whose rows are ggml's f32/f16/bf16 rows, so ggml reads them in place.
#include "kernels/ggml/attention.h"
#include "kvlab/host_buffer.h"
#include "reference/attention_operands.h"
#include "reference/sdpa.h"

namespace kvlab::ggmlk {

Arithmetic sdpa(Engine& e, const SdpaArgs& a) {
  const ref::SdpaOperands o(a);  // host views, validated by the oracle's checks
  const ConstTensorView &q = o.q, &k = o.k, &v = o.v;
  const TensorView& out = o.out;
  const ConstTensorView *mask = o.mask, *sinks = o.sinks;
  const KvRows kr{float_type(k.dtype), k.data, k.shape[3]}, vr{float_type(v.dtype), v.data, v.shape[3]};
  return attend(e, q, kr, vr, k.shape[1], k.shape[2], a.params, mask, sinks, out, "sdpa");
}

}  // namespace kvlab::ggmlk
