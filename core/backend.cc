#include "kvlab/backend.h"

#include "kvlab/error.h"

#include <algorithm>
#include <utility>

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

namespace {
std::vector<std::string>& delegated_here() {
  thread_local std::vector<std::string> ops;
  return ops;
}
}  // namespace

void note_delegated(const char* op) {
  auto& ops = delegated_here();
  if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.emplace_back(op);
}

std::vector<std::string> take_delegated() { return std::exchange(delegated_here(), {}); }

#define KVLAB_DEFAULT_OP(op, Args, stem)                                                  \
  void Backend::op(const Args&) {                                                           \
    fail(ErrorKind::unsupported, cat("backend ", name(), " does not implement the op " #op)); \
  }
KVLAB_OPS(KVLAB_DEFAULT_OP)
#undef KVLAB_DEFAULT_OP

}  // namespace kvlab
