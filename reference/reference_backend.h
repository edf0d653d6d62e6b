// The reference backend: a Backend whose kernels are the oracle functions of
// reference/, over host memory. A cache over this backend is the reference cache.
#pragma once

#include "kvlab/host_buffer.h"

namespace kvlab {

class ReferenceBackend final : public HostMemoryBackend {
 public:
  std::string name() const override { return "reference"; }
  AttentionRounding attention_rounding() const override { return AttentionRounding::none(); }
  KVLAB_OVERRIDE_ALL_OPS
};

}  // namespace kvlab
