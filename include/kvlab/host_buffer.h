// Host memory for CPU backends (reference, SIMD): 64-byte aligned Buffers, and the
// checked conversion of a DTensor into raw-pointer views for kernels.
#pragma once

#include <optional>

#include "kvlab/backend.h"
#include "kvlab/quantized_view.h"

namespace kvlab {

BufferPtr make_host_buffer(std::size_t bytes);

// The allocation behind host buffers (free it with std::free): 64-byte aligned, and from
// kHugePageBytes up aligned to that size and offered to the kernel's transparent huge
// pages (madvise; a no-op where THP is off or already on for everything). kvlab_bench's
// bandwidth baselines allocate the same way, so kernels and the ceilings they are read
// against see the same page size (on a host whose THP mode is `madvise`, 4 KiB pages held
// the streaming-read baseline well below the machine's limit: bench/records/). nullptr
// when out of memory.
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
std::byte* allocate_host_bytes(std::size_t bytes);

// Views of a DTensor whose buffer is host-addressable. Throws misuse when the buffer
// is not host memory, and shape_mismatch when [offset, offset+nbytes) overruns it.
TensorView host_view(const DTensor& t);
ConstTensorView host_cview(const DTensor& t);

// The host-kernel adapter: op operands (kvlab/op_list.h) as the views host kernels
// (reference, SIMD) take, converted in one place.
// Optional operand (mask, sinks): nullptr stays nullptr, else `storage` holds the view.
const ConstTensorView* host_cview(const DTensor* t, ConstTensorView& storage);
std::optional<ConstTensorView> host_per_row(const Offsets& offsets);
// Absent biases are an empty view on the read side (the kernel names them missing);
// an output's biases are mapped when the format has them (a missing one is misuse) or
// when given anyway (the encoder rejects them).
QuantizedView host_cview(const QuantizedDTensor& t);
QuantizedMutView host_view(const QuantizedDTensor& t);

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
