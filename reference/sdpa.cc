// STUB: replaced by the real oracle.
#include "reference/sdpa.h"

#include "kvlab/error.h"

namespace kvlab::ref {
void sdpa(const ConstTensorView&, const ConstTensorView&, const ConstTensorView&, const AttentionParams&, const ConstTensorView*, const ConstTensorView*, const TensorView&) { fail(ErrorKind::unsupported, "sdpa: not implemented yet"); }
Tensor sdpa(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor*, const Tensor*) { fail(ErrorKind::unsupported, "sdpa: not implemented yet"); }

}  // namespace kvlab::ref
