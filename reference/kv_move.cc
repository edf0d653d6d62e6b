// STUB: replaced by the real oracle.
#include "reference/kv_move.h"

#include "kvlab/error.h"

namespace kvlab::ref {
void kv_scatter(const ConstTensorView&, const ConstTensorView&, const TensorView&) { fail(ErrorKind::unsupported, "kv_scatter: not implemented yet"); }
void kv_gather(const ConstTensorView&, const ConstTensorView&, const TensorView&) { fail(ErrorKind::unsupported, "kv_gather: not implemented yet"); }
void kv_copy_blocks(const ConstTensorView&, std::span<const SeqBlock>, const TensorView&) { fail(ErrorKind::unsupported, "kv_copy_blocks: not implemented yet"); }
void kv_roll(const ConstTensorView&, const ConstTensorView&, const TensorView&) { fail(ErrorKind::unsupported, "kv_roll: not implemented yet"); }

}  // namespace kvlab::ref
