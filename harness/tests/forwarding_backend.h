// A test-only Backend that forwards every kernel to the reference, over the same host
// memory; tests derive from it and override one kernel to misbehave on purpose.
#pragma once

#include "kvlab/host_buffer.h"
#include "reference/reference_backend.h"

namespace kvlab::harness::testing {

class ForwardingBackend : public HostMemoryBackend {
 public:
  std::string name() const override { return "forwarding"; }
#define KVLAB_FORWARD_OP(op, Args, stem) \
  void op(const Args& a) override { ref_.op(a); }
  KVLAB_OPS(KVLAB_FORWARD_OP)
#undef KVLAB_FORWARD_OP

 protected:
  ReferenceBackend ref_;
};

}  // namespace kvlab::harness::testing
