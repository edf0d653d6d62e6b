// Running code kvlab does not own (plugin kernels) in a child process, so that a crash
// or a hang ends one call with an Error naming it, not the whole run (docs/plugins.md).
//
// The child is a fork() of kvlab: it sees every operand as it was at the call. What it
// writes reaches kvlab only through memory mapped shared (make_shared_host_buffer), so
// a backend that isolates its calls allocates every buffer that way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kvlab/dtensor.h"

namespace kvlab {

struct Isolation {
  bool enabled = true;
  double timeout_seconds = 60;  // a call running longer is killed and reported as a hang
};

// Runs `body(msg, cap)` in a forked child and returns its result, with the child's `msg`
// copied back. Error{device} naming `what` when the child dies by a signal, exits
// without returning, or is still running after `timeout_seconds` (it is killed).
std::int32_t run_isolated(const std::function<std::int32_t(char* msg, std::size_t cap)>& body, char* msg,
                          std::size_t cap, double timeout_seconds, const std::string& what);

// Host memory shared with children forked later (MAP_SHARED | MAP_ANONYMOUS), page
// aligned; host_data() is as for make_host_buffer.
BufferPtr make_shared_host_buffer(std::size_t bytes);

}  // namespace kvlab
