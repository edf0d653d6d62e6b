// rope through mx::fast::rope: the scalar offset overload, or the array overload with
// kvlab's per-row offsets (int32 (B,), one per batch row as in MLX); explicit
// wavelengths go to MLX's `freqs` (also wavelengths: MLX takes their reciprocal), with
// `base` then left empty as MLX requires.
#include <optional>

#include "kernels/mlx/mlx_array.h"
#include "kernels/mlx/mlx_ops.h"
#include "kvlab/host_buffer.h"
#include "reference/rope.h"

namespace kvlab::mlxk {

void rope(const RopeArgs& a) {
  const ConstTensorView x = host_cview(a.x);
  const TensorView out = host_view(a.out);
  const std::optional<ConstTensorView> per_row = host_per_row(a.offsets);
  ref::validate_rope(x, a.params, a.offsets.scalar, per_row, out);
  if (out.numel() == 0) return;
  guarded("rope", [&] {
    const RopeParams& p = a.params;
    std::optional<float> base = p.base;
    std::optional<mx::array> freqs;
    if (!p.freqs.empty()) {
      base = std::nullopt;
      freqs = mx::array(p.freqs.begin(), {static_cast<int>(p.freqs.size())}, mx::float32);
    }
    const mx::array xa = to_array(x);
    const mx::array r = per_row ? mx::fast::rope(xa, p.dims, p.traditional, base, p.scale, to_array(*per_row), freqs, cpu())
                                : mx::fast::rope(xa, p.dims, p.traditional, base, p.scale, a.offsets.scalar, freqs, cpu());
    copy_out(r, out, "rope");
  });
}

}  // namespace kvlab::mlxk
