#include "kernels/mlx/attention_mask.h"

#include <vector>

#include "reference/mask.h"

namespace kvlab::mlxk {

MlxMask mlx_mask(const MaskSpec& spec, const ConstTensorView* mask, std::int64_t batch, std::int64_t lq,
                 std::int64_t lk) {
  switch (spec.kind) {
    case MaskKind::none: return {};
    case MaskKind::causal: {
      if (spec.window == 0 && spec.left_padding.empty() && spec.right_padding.empty()) return {"causal", {}};
      std::vector<bool> keep(static_cast<std::size_t>(batch * lq * lk));
      std::size_t n = 0;
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t i = 0; i < lq; ++i)
          for (std::int64_t j = 0; j < lk; ++j) keep[n++] = ref::causal_visible(spec, b, i, j, lq, lk);
      return {"", mx::array(keep.begin(), to_mx_shape({batch, 1, lq, lk}), mx::bool_)};
    }
    case MaskKind::boolean: return {"", mx::astype(to_array(*mask), mx::bool_, cpu())};
    case MaskKind::additive: return {"", to_array(*mask)};
  }
  fail(ErrorKind::internal, "mlx: unknown mask kind");
}

}  // namespace kvlab::mlxk
