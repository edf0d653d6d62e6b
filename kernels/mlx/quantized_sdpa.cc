// quantized_sdpa as mlx-lm computes it (mlx_lm/models/base.py,
// quantized_scaled_dot_product_attention, 0.32.2), in C++ with MLX ops: q scaled in its
// own dtype, reshaped per GQA group, scores = quantized_matmul(q, K, transpose),
// mask (bool: where(mask, scores, finfo.min); additive: scores + mask), precise softmax,
// out = quantized_matmul(p, V). Beyond mlx-lm, as kvlab's contract asks: K and V each
// use their own spec (mlx-lm passes one group/bits to both), Dv != Dk (mlx-lm reshapes
// with the query D), per-head masks with Hq > Hkv are split per group (mlx-lm would
// misbroadcast them), and sinks are a leading logit column dropped after the softmax
// (how MLX's own fallback sdpa implements them).
#include "kernels/mlx/attention_mask.h"
#include "kernels/mlx/mlx_array.h"
#include "kernels/mlx/mlx_ops.h"
#include "kvlab/host_buffer.h"
#include "reference/attention_operands.h"
#include "reference/quantized_sdpa.h"

namespace kvlab::mlxk {

namespace {

struct MlxQuantized {
  mx::array wq, scales;
  std::optional<mx::array> biases;
};

// K or V as quantized_matmul takes them; with GQA an axis is inserted before the
// sequence so one kv head broadcasts over its R query heads.
MlxQuantized wrap_quantized(const QuantizedView& t, bool grouped) {
  const auto wrap = [&](const ConstTensorView& v) {
    const mx::array a = to_array(v);
    return grouped ? mx::expand_dims(a, -3, cpu()) : a;
  };
  MlxQuantized r{wrap(t.wq), wrap(t.scales), std::nullopt};
  if (t.spec.has_biases()) r.biases = wrap(t.biases);
  return r;
}

std::string mode_of(const QuantSpec& s) { return std::string(quant_mode_name(s.mode)); }

}  // namespace

void quantized_sdpa(const QuantizedSdpaArgs& a) {
  const ref::QuantizedSdpaOperands o(a);  // host views, validated by the oracle's checks
  const ConstTensorView& q = o.q;
  const QuantizedView &k = o.k, &v = o.v;
  const TensorView& out = o.out;
  const ConstTensorView *mask = o.mask, *sinks = o.sinks;
  KVLAB_REQUIRE(a.params.softcap == 0.0f, unsupported, "mlx quantized_sdpa: softcap ", a.params.softcap,
                ": mlx-lm's quantized attention has no logit softcap");
  for (const QuantizedView* x : {&k, &v}) {
    KVLAB_REQUIRE(x->spec.format().encoder != QuantEncoder::ggml, unsupported, "mlx quantized_sdpa: ",
                  to_string(x->spec), " is a ggml block format, which MLX does not have");
  }
  guarded("quantized_sdpa", [&] {
    const std::int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], Dk = q.shape[3];
    const std::int64_t Hkv = k.wq.shape[1], Lk = k.wq.shape[2], Dv = out.shape[3];
    const std::int64_t R = Hq / Hkv;
    const bool grouped = R > 1;

    mx::array queries = mx::multiply(to_array(q), mx::array(a.params.scale, to_mx(q.dtype)), cpu());
    if (grouped) queries = mx::reshape(queries, to_mx_shape({B, Hkv, R, Lq, Dk}), cpu());
    const MlxQuantized kq = wrap_quantized(k, grouped), vq = wrap_quantized(v, grouped);

    mx::array scores = mx::quantized_matmul(queries, kq.wq, kq.scales, kq.biases, true, k.spec.group_size,
                                            k.spec.bits, mode_of(k.spec), cpu());
    MlxMask m = mlx_mask(a.params.mask, mask, B, Lq, Lk);
    if (m.mode == "causal") {
      // mlx-lm's string-mask branch: query i (at position Lk − Lq + i) keeps keys j <= it.
      const mx::array qi = mx::arange(static_cast<int>(Lk - Lq), static_cast<int>(Lk), cpu());
      const mx::array kj = mx::arange(static_cast<int>(Lk), cpu());
      m.array = mx::greater_equal(mx::expand_dims(qi, 1, cpu()), mx::expand_dims(kj, 0, cpu()), cpu());
    }
    if (m.array) {
      mx::array ma = *m.array;
      if (grouped && ma.ndim() > 3) {
        ma = ma.shape(1) == Hq ? mx::reshape(ma, {ma.shape(0), static_cast<int>(Hkv), static_cast<int>(R),
                                                  static_cast<int>(Lq), static_cast<int>(Lk)}, cpu())
                               : mx::expand_dims(ma, -3, cpu());
      }
      if (ma.dtype() == mx::bool_) {
        scores = mx::where(ma, scores, mx::array(mx::finfo(scores.dtype()).min, scores.dtype()), cpu());
      } else {
        scores = mx::add(scores, ma, cpu());
      }
    }
    if (sinks) {
      mx::array s = to_array(*sinks);
      const mx::Dtype t = mx::promote_types(scores.dtype(), s.dtype());
      s = grouped ? mx::reshape(s, {1, static_cast<int>(Hkv), static_cast<int>(R), 1, 1}, cpu())
                  : mx::reshape(s, {1, static_cast<int>(Hq), 1, 1}, cpu());
      mx::Shape col = scores.shape();
      col.back() = 1;
      scores = mx::concatenate({mx::broadcast_to(mx::astype(s, t, cpu()), col, cpu()), mx::astype(scores, t, cpu())},
                               -1, cpu());
    }
    mx::array p = mx::softmax(scores, std::vector<int>{-1}, true, cpu());
    if (sinks) {
      mx::Shape start(p.ndim(), 0), stop = p.shape();
      start.back() = 1;
      p = mx::slice(p, start, stop, cpu());
    }
    mx::array r = mx::quantized_matmul(p, vq.wq, vq.scales, vq.biases, false, v.spec.group_size, v.spec.bits,
                                       mode_of(v.spec), cpu());
    if (grouped) r = mx::reshape(r, to_mx_shape({B, Hq, Lq, Dv}), cpu());
    // mlx-lm returns the promoted dtype of q, scores and V's scales; kvlab's output is q's.
    if (r.dtype() != to_mx(out.dtype)) r = mx::astype(r, to_mx(out.dtype), cpu());
    copy_out(r, out, "quantized_sdpa");
  });
}

}  // namespace kvlab::mlxk
