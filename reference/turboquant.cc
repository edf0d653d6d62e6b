// STUB: replaced by the real oracle.
#include "reference/turboquant.h"

#include "kvlab/error.h"

namespace kvlab::ref {

TurboQuantCodec make_turboquant_codec(int, int, std::uint64_t) {
  fail(ErrorKind::unsupported, "make_turboquant_codec: not implemented yet");
}
void turboquant_encode(const ConstTensorView&, const TurboQuantCodec&, const TensorView&, const TensorView&) {
  fail(ErrorKind::unsupported, "turboquant_encode: not implemented yet");
}
void turboquant_decode(const ConstTensorView&, const ConstTensorView&, const TurboQuantCodec&, const TensorView&) {
  fail(ErrorKind::unsupported, "turboquant_decode: not implemented yet");
}

}  // namespace kvlab::ref
