#include "kvlab/error.h"

namespace kvlab {

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument: return "invalid_argument";
    case ErrorKind::shape_mismatch: return "shape_mismatch";
    case ErrorKind::dtype_mismatch: return "dtype_mismatch";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::misuse: return "misuse";
    case ErrorKind::io: return "io";
    case ErrorKind::corrupt: return "corrupt";
    case ErrorKind::device: return "device";
    case ErrorKind::internal: return "internal";
  }
  return "unknown";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(std::string(error_kind_name(kind)) + ": " + message), kind_(kind), message_(message) {}

void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace kvlab
