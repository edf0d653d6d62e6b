#include "kvlab/backend.h"

#include "kvlab/error.h"

namespace kvlab {

DTensor Backend::allocate(DType dtype, Shape shape) {
  DTensor t{nullptr, 0, dtype, std::move(shape)};
  t.buffer = allocate(t.nbytes());
  return t;
}

DTensor Backend::upload(const Tensor& t) {
  DTensor d = allocate(t.dtype(), t.shape());
  if (t.is_deferred())
    upload_deferred(d, t);
  else
    upload(d, t.data());
  return d;
}

void Backend::upload_deferred(const DTensor& dst, const Tensor& src) { upload(dst, src.materialize().data()); }

Tensor Backend::download(const DTensor& t) {
  Tensor out(t.dtype, t.shape);
  download(t, out.data());
  return out;
}

#define KVLAB_DEFAULT_OP(op, Args, stem)                                                  \
  void Backend::op(const Args&) {                                                           \
    fail(ErrorKind::unsupported, cat("backend ", name(), " does not implement the op " #op)); \
  }
KVLAB_OPS(KVLAB_DEFAULT_OP)
#undef KVLAB_DEFAULT_OP

}  // namespace kvlab
