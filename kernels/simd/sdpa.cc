// Placeholder: the SIMD SDPA kernel is being written (issue 4). Until then the SIMD
// backend reports sdpa as unsupported, so the harness shows UNIMPLEMENTED, never a pass.
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"

namespace kvlab::simd {
void sdpa(const ConstTensorView&, const ConstTensorView&, const ConstTensorView&, const AttentionParams&,
          const ConstTensorView*, const ConstTensorView*, const TensorView&) {
  fail(ErrorKind::unsupported, "SimdBackend: sdpa is not implemented by the SIMD backend yet");
}
}  // namespace kvlab::simd
