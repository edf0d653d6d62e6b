// kvlab::Error — the one exception type of the lab.
//
// Every invalid input (bad bits, group size, shape, dtype, misuse of a cache API,
// corrupt file) throws an Error whose message names the offending value. Nothing
// in kvlab aborts on user input; see docs/design.md §Errors.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvlab {

enum class ErrorKind {
  invalid_argument,  // a parameter outside its documented domain (bits 7, group 48, …)
  shape_mismatch,    // tensors whose shapes do not fit together
  dtype_mismatch,    // a tensor of the wrong element type
  unsupported,       // valid request that this backend/kernel does not implement
  misuse,            // an API called in a state that forbids it
  io,                // a file could not be read or written
  corrupt,           // a file or buffer whose content is inconsistent
  device,            // a backend device failure (Vulkan, …)
  internal,          // a broken invariant inside kvlab itself
};

std::string_view error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ErrorKind kind() const noexcept { return kind_; }
  // The message without the "kind: " prefix that what() carries (for re-wrapping an
  // error with more context).
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

// Concatenates anything streamable; used to build messages that name values.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] void fail(ErrorKind kind, const std::string& message);

}  // namespace kvlab

// KVLAB_REQUIRE(cond, kind, parts...): throw kvlab::Error(kind, cat(parts...)) unless cond.
#define KVLAB_REQUIRE(cond, kind, ...)                                     \
  do {                                                                     \
    if (!(cond)) ::kvlab::fail(::kvlab::ErrorKind::kind, ::kvlab::cat(__VA_ARGS__)); \
  } while (false)
