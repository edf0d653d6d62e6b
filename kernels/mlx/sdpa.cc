// sdpa through mx::fast::scaled_dot_product_attention: GQA (MLX maps query head h to kv
// head h / (Hq/Hkv), as kvlab does), Dv != Dk, MLX's masks and sinks. MLX has no
// logit softcap, so a softcap > 0 is unsupported.
#include "kernels/mlx/attention_mask.h"
#include "kernels/mlx/mlx_array.h"
#include "kernels/mlx/mlx_ops.h"
#include "kvlab/host_buffer.h"
#include "reference/attention_operands.h"
#include "reference/sdpa.h"

namespace kvlab::mlxk {

void sdpa(const SdpaArgs& a) {
  const ref::SdpaOperands o(a);  // host views, validated by the oracle's checks
  const ConstTensorView &q = o.q, &k = o.k, &v = o.v;
  const TensorView& out = o.out;
  const ConstTensorView *mask = o.mask, *sinks = o.sinks;
  KVLAB_REQUIRE(a.params.softcap == 0.0f, unsupported, "mlx sdpa: softcap ", a.params.softcap,
                ": mx::fast::scaled_dot_product_attention has no logit softcap");
  // MLX rejects an additive mask or sinks whose dtype does not promote to q's (an f32
  // mask with f16 q); casting them first would round the values the oracle adds exactly.
  const mx::Dtype qt = to_mx(q.dtype);
  KVLAB_REQUIRE(a.params.mask.kind != MaskKind::additive || mx::promote_types(to_mx(mask->dtype), qt) == qt,
                unsupported, "mlx sdpa: an additive ", dtype_name(mask->dtype), " mask with ", dtype_name(q.dtype),
                " q: MLX requires the mask dtype to promote to the output dtype, and a cast would round it");
  KVLAB_REQUIRE(!sinks || mx::promote_types(to_mx(sinks->dtype), qt) == qt, unsupported, "mlx sdpa: ",
                dtype_name(sinks->dtype), " sinks with ", dtype_name(q.dtype),
                " q: MLX requires the sinks dtype to promote to the output dtype, and a cast would round them");
  guarded("sdpa", [&] {
    const MlxMask m = mlx_mask(a.params.mask, mask, q.shape[0], q.shape[2], k.shape[2]);
    std::optional<mx::array> sink;
    if (sinks) sink = to_array(*sinks);
    const mx::array r = mx::fast::scaled_dot_product_attention(to_array(q), to_array(k), to_array(v), a.params.scale,
                                                               m.mode, m.array, sink, false, cpu());
    copy_out(r, out, "sdpa");
  });
}

}  // namespace kvlab::mlxk
