// A Backend that forwards every kernel to the reference, over the same host memory.
// Derive from it and override the kernels you implement: the rest stay correct and are
// noted as delegated (kvlab/backend.h), so the harness (run_check) judges your kernels
// alone and reports the forwarded ops' cases UNIMPLEMENTED, not PASSED. The harness's own tests override one
// kernel to misbehave on purpose; examples/downstream overrides one correctly.
#pragma once

#include <string>

#include "kvlab/host_buffer.h"
#include "reference/reference_backend.h"

namespace kvlab::harness {

class ForwardingBackend : public HostMemoryBackend {
 public:
  std::string name() const override { return "forwarding"; }
#define KVLAB_FORWARD_OP(op, Args, stem) \
  void op(const Args& a) override {        \
    note_delegated(#op);                   \
    ref_.op(a);                            \
  }
  KVLAB_OPS(KVLAB_FORWARD_OP)
#undef KVLAB_FORWARD_OP

 protected:
  ReferenceBackend ref_;
};

}  // namespace kvlab::harness
