// rope through ggml_rope_ext on ggml's CPU backend, f32 and f16 (ggml's CPU rope computes
// no other type: bf16 is UNIMPLEMENTED). kvlab's x (B, *, T, D) is, per batch row b, ggml's
// [D, 1, T, M] (M the middle axes: ggml indexes positions by its third axis), with int32
// positions t + offset_b; traditional pairs (2i, 2i+1) are ggml's NORMAL mode, the split
// halves (i, i + dims/2) NEOX; the position scale is freq_scale; explicit wavelengths are
// ggml's freq factors with freq_base 1 (θ = p·1^(−2i/dims)/freqs[i]); no YaRN
// (ext_factor 0, attn_factor 1). Features past dims are copied by ggml.
//
// ggml's arithmetic (ggml-cpu/ops.cpp, ggml_rope_cache_init): in f32, θ_i = p·s^i with
// s = powf(base, −2/dims) multiplied in one pair at a time, then ·freq_scale, cosf/sinf, the
// products and the sum in f32, then one rounding to T; the oracle's angle is exact (double).
// Positions outside int32 (ggml's position type) and MLX's arithmetic (flavour=mlx) are
// UNIMPLEMENTED.
#include <limits>
#include <vector>

#include "kernels/ggml/ggml_ops.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"
#include "reference/rope.h"

namespace kvlab::ggmlk {

void rope(Engine& e, const RopeArgs& a) {
  const ConstTensorView x = host_cview(a.x);
  const TensorView out = host_view(a.out);
  const std::optional<ConstTensorView> per_row = host_per_row(a.offsets);
  ref::validate_rope(x, a.params, a.offsets.scalar, per_row, out);
  const RopeParams& p = a.params;
  KVLAB_REQUIRE(!p.mlx_arithmetic, unsupported, "ggml rope: MLX's arithmetic (flavour=mlx) is MLX's, not ggml's");
  KVLAB_REQUIRE(x.dtype == DType::f32 || x.dtype == DType::f16, unsupported, "ggml rope: ", dtype_name(x.dtype),
                " (ggml's CPU rope computes f32 and f16 only)");
  if (out.numel() == 0) return;
  const std::int64_t B = x.shape.front(), T = x.shape[x.shape.size() - 2], D = x.shape.back();
  const std::int64_t M = x.numel() / (B * T * D), row = M * T * D;
  const std::size_t es = dtype_size(x.dtype);
  // ggml's rope counts a graph's rows (M·T here) with int.
  KVLAB_REQUIRE(M * T <= std::numeric_limits<std::int32_t>::max(), unsupported, "ggml rope: ", M * T,
                " rows per batch row, beyond ggml's int row count");
  // Every position t + offset_b must be an int32, as ggml's are.
  std::vector<std::int32_t> positions(static_cast<std::size_t>(T));
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(B), a.offsets.scalar);
  if (per_row) {
    for (std::int64_t b = 0; b < B; ++b) offsets[static_cast<std::size_t>(b)] = per_row->load_int(b);
  }
  for (const std::int64_t o : offsets) {
    KVLAB_REQUIRE(o >= std::numeric_limits<std::int32_t>::min() &&
                      o + T - 1 <= std::numeric_limits<std::int32_t>::max(),
                  unsupported, "ggml rope: positions ", o, "..", o + T - 1, " beyond ggml's int32 positions");
  }
  const bool wavelengths = !p.freqs.empty();
  const std::vector<float> freqs = p.freqs;  // ggml reads them through a non-const tensor
  const int mode = p.traditional ? GGML_ROPE_TYPE_NORMAL : GGML_ROPE_TYPE_NEOX;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t)
      positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(offsets[static_cast<std::size_t>(b)] + t);
    Context ctx(6);
    ggml_tensor* tx = ctx.tensor(float_type(x.dtype), D, 1, T, M, x.data + static_cast<std::size_t>(b * row) * es);
    ggml_tensor* tp = ctx.tensor(GGML_TYPE_I32, T, 1, 1, 1, positions.data());
    ggml_tensor* tf = wavelengths ? ctx.tensor(GGML_TYPE_F32, p.dims / 2, 1, 1, 1, freqs.data()) : nullptr;
    ggml_tensor* r = ggml_rope_ext(ctx.get(), tx, tp, tf, p.dims, mode, 0, wavelengths ? 1.0f : p.base, p.scale, 0.0f,
                                   1.0f, 0.0f, 0.0f);
    r->data = out.data + static_cast<std::size_t>(b * row) * es;
    e.compute(ctx.get(), r, "rope");
  }
}

}  // namespace kvlab::ggmlk
