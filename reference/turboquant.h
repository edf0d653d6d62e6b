// Reference TurboQuant MSE codec (spec §6.2; kvquant-anchors §1, §6.A.3, §7).
// CONTRACT DRAFT — completed by the implementation.
//
// make_turboquant_codec(dim, bits, seed): randomized Hadamard rotation when dim is a
// power of two, else a dense Haar-orthogonal matrix; Lloyd–Max codebook of 2^bits levels
// for one coordinate of a uniform unit vector in R^dim. Deterministic in (dim, bits, seed).
// turboquant_encode: per vector x (last axis): norm = ‖x‖ (f32, stored f16), u = x/max(norm,
// 1e-6), y = R u, idx_d = #{m : y_d > midpoint_m}, packed as the §1.4 LSB-first bitstream.
// turboquant_decode: x̂ = norm · R⁻¹(codebook[idx]) in f32, rounded once to out.dtype.
#pragma once

#include <cstdint>

#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab::ref {

TurboQuantCodec make_turboquant_codec(int dim, int bits, std::uint64_t seed);

void turboquant_encode(const ConstTensorView& x, const TurboQuantCodec& codec, const TensorView& norms,
                       const TensorView& indices);
void turboquant_decode(const ConstTensorView& norms, const ConstTensorView& indices, const TurboQuantCodec& codec,
                       const TensorView& out);

}  // namespace kvlab::ref
