// Host memory for CPU backends (reference, SIMD): 64-byte aligned Buffers, and the
// checked conversion of a DTensor into raw-pointer views for kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <type_traits>

#include "kvlab/backend.h"
#include "kvlab/quantized_view.h"

namespace kvlab {

BufferPtr make_host_buffer(std::size_t bytes);

// The allocation behind host buffers: 64-byte aligned, and from kHugePageBytes up (on
// Linux) a mapping of its own, aligned to that size and offered to the kernel's
// transparent huge pages (madvise; a no-op where THP is off or already on for
// everything). kvlab_bench's bandwidth baselines allocate the same way, so kernels and the
// ceilings they are read against see the same page size (on a host whose THP mode is
// `madvise`, 4 KiB pages held the streaming-read baseline well below the machine's limit,
// and buffers that glibc served from its heap after earlier large frees ran kernels up to
// 3x slower than fresh ones: bench/records/). nullptr when out of memory. Free with
// free_host_bytes and the same size.
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
std::byte* allocate_host_bytes(std::size_t bytes);
void free_host_bytes(std::byte* data, std::size_t bytes);

// A kernel's reusable scratch array on allocate_host_bytes (so large ones get the same
// huge-page mapping as tensors): resize keeps the contents' storage when it fits, else
// replaces it uninitialized (no zero fill: callers write before they read). Trivial
// element types only.
template <typename T>
class HostArray {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  HostArray() = default;
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  ~HostArray() { release(); }
  // n elements, uninitialized when the storage was replaced; throws std::bad_alloc.
  T* resize(std::size_t n) {
    if (n > capacity_) {
      release();
      if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
      data_ = reinterpret_cast<T*>(allocate_host_bytes(n * sizeof(T)));
      if (data_ == nullptr) throw std::bad_alloc();
      capacity_ = n;
    }
    return data_;
  }
  void release() {
    free_host_bytes(reinterpret_cast<std::byte*>(data_), capacity_ * sizeof(T));
    data_ = nullptr;
    capacity_ = 0;
  }
  std::size_t capacity_bytes() const { return capacity_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

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
