// STUB: replaced by the real oracle.
#include "reference/rope.h"

#include "kvlab/error.h"

namespace kvlab::ref {
void rope(const ConstTensorView&, const RopeParams&, std::int32_t, const std::optional<ConstTensorView>&, const TensorView&) { fail(ErrorKind::unsupported, "rope: not implemented yet"); }
Tensor rope(const Tensor&, const RopeParams&, std::int32_t) { fail(ErrorKind::unsupported, "rope: not implemented yet"); }
Tensor rope(const Tensor&, const RopeParams&, const Tensor&) { fail(ErrorKind::unsupported, "rope: not implemented yet"); }

}  // namespace kvlab::ref
