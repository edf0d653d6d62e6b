// kvlab's attention masks as MLX sees them (internal to kernels/mlx; includes MLX).
#pragma once

#include <optional>
#include <string>

#include "kernels/mlx/mlx_array.h"
#include "kvlab/ops.h"

namespace kvlab::mlxk {

struct MlxMask {
  std::string mode;               // "causal" or "" (MLX's mask_mode)
  std::optional<mx::array> array; // bool (keep) or additive, broadcastable to (B, Hq, Lq, Lk)
};

// none -> no mask; a plain causal mask -> MLX's "causal" mode (lower-right aligned, as
// kvlab's); a causal mask with a window or paddings -> the boolean (B, 1, Lq, Lk) array
// mlx-lm builds for those (create_causal_mask), from kvlab's own visibility rule; a
// boolean array -> MLX bool (nonzero keeps); an additive array -> as given.
MlxMask mlx_mask(const MaskSpec& spec, const ConstTensorView* mask, std::int64_t batch, std::int64_t lq,
                 std::int64_t lk);

}  // namespace kvlab::mlxk
