// What every RoPE dispatch of the Vulkan backend shares (rope.cc):
// the push-constant block of shaders/rope.comp and the inverse frequencies.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvlab/ops.h"

namespace kvlab::vulkan {

// The push-constant block of shaders/rope.comp, field for field.
struct RopePush {
  std::uint32_t x_offset, out_offset, offsets_offset, dtype, batch, heads, seq, dim, dims, traditional, per_row;
  std::int32_t scalar_offset;
  float scale;
};
static_assert(sizeof(RopePush) == 13 * 4);

// The inverse frequencies, computed on the host with the oracle's exact expressions
// (reference/rope.cc), so the shader's angles are the oracle's bit for bit.
inline std::vector<double> rope_inverse_frequencies(const RopeParams& params) {
  const int half = params.dims / 2;
  std::vector<double> inv(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) {
    inv[static_cast<std::size_t>(i)] =
        params.freqs.empty() ? std::pow(static_cast<double>(params.base), -2.0 * i / params.dims)
                             : 1.0 / static_cast<double>(params.freqs[static_cast<std::size_t>(i)]);
  }
  return inv;
}

}  // namespace kvlab::vulkan
