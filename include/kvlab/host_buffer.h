// Host memory for CPU backends (reference, SIMD): 64-byte aligned Buffers, and the
// checked conversion of a DTensor into raw-pointer views for kernels.
#pragma once

#include "kvlab/backend.h"

namespace kvlab {

BufferPtr make_host_buffer(std::size_t bytes);

// Views of a DTensor whose buffer is host-addressable. Throws misuse when the buffer
// is not host memory, and shape_mismatch when [offset, offset+nbytes) overruns it.
TensorView host_view(const DTensor& t);
ConstTensorView host_cview(const DTensor& t);

// Shared by CPU backends: memory operations on host buffers.
class HostMemoryBackend : public Backend {
 public:
  using Backend::allocate;
  using Backend::download;
  using Backend::upload;
  BufferPtr allocate(std::size_t bytes) override;
  void upload(const DTensor& dst, const void* src) override;
  void download(const DTensor& src, void* dst) override;
  void fill(const DTensor& dst, std::uint32_t element_bits) override;
};

}  // namespace kvlab
