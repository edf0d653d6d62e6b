#include "kvlab/host_buffer.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

// Under AddressSanitizer the large mappings below are not its allocations: their tails are
// poisoned by hand, so a read past a buffer's last byte is still reported.
#if defined(__SANITIZE_ADDRESS__)
#define KVLAB_HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLAB_HOST_ASAN 1
#endif
#endif
#if defined(KVLAB_HOST_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace kvlab {

namespace {

// A large allocation's mapped bytes: whole 4 KiB pages.
[[maybe_unused]] std::size_t mapped_length(std::size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(std::size_t bytes) : size_(bytes), data_(allocate_host_bytes(bytes)) {
    if (!data_) throw std::bad_alloc();
  }
  ~HostBuffer() override { free_host_bytes(data_, size_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  std::size_t size() const override { return size_; }
  std::byte* host_data() override { return data_; }

 private:
  std::size_t size_;
  std::byte* data_;
};

}  // namespace

std::byte* allocate_host_bytes(std::size_t bytes) {
  if (bytes > SIZE_MAX - 2 * kHugePageBytes) return nullptr;
#if defined(__linux__)
  if (bytes >= kHugePageBytes) {
    // A mapping of its own, not glibc's heap: glibc raises its mmap threshold to the size
    // of each large block freed (up to 32 MiB), after which blocks of that size come from
    // the heap, onto pages earlier blocks faulted in at 4 KiB that madvise does not
    // convert. Mapped 2 MiB longer than needed, then trimmed to a 2 MiB-aligned start;
    // the tail's partial huge page stays in 4 KiB pages.
    const std::size_t length = mapped_length(bytes);
    void* const raw = ::mmap(nullptr, length + kHugePageBytes, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (aligned > start) ::munmap(raw, aligned - start);
    const std::uintptr_t end = start + length + kHugePageBytes;
    if (end > aligned + length) ::munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
#if defined(MADV_HUGEPAGE)
    (void)::madvise(reinterpret_cast<void*>(aligned), length, MADV_HUGEPAGE);  // a hint only
#endif
#if defined(KVLAB_HOST_ASAN)
    ASAN_POISON_MEMORY_REGION(reinterpret_cast<void*>(aligned + bytes), length - bytes);
#endif
    return reinterpret_cast<std::byte*>(aligned);
  }
#endif
  // 64 bytes: a full cache line / AVX-512 vector for every kernel; the size rounded to
  // whole lines.
  const std::size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* data = nullptr;
  if (posix_memalign(&data, bytes >= kHugePageBytes ? kHugePageBytes : 64, rounded) != 0) return nullptr;
  return static_cast<std::byte*>(data);
}

void free_host_bytes(std::byte* data, std::size_t bytes) {
  if (data == nullptr) return;
#if defined(__linux__)
  if (bytes >= kHugePageBytes) {
#if defined(KVLAB_HOST_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(data, mapped_length(bytes));  // a later mapping here starts clean
#endif
    ::munmap(data, mapped_length(bytes));
    return;
  }
#endif
  std::free(data);
}

BufferPtr make_host_buffer(std::size_t bytes) { return std::make_shared<HostBuffer>(bytes); }

TensorView host_view(const DTensor& t) {
  KVLAB_REQUIRE(t.buffer != nullptr, misuse, "tensor of shape ", shape_str(t.shape), " has no buffer");
  std::byte* base = t.buffer->host_data();
  KVLAB_REQUIRE(base != nullptr, misuse, "buffer of ", t.buffer->size(), " bytes is not host-addressable");
  const std::size_t bytes = t.nbytes();  // throws instead of wrapping for huge shapes
  KVLAB_REQUIRE(t.offset <= t.buffer->size() && bytes <= t.buffer->size() - t.offset, shape_mismatch, "tensor ",
                shape_str(t.shape), " ", dtype_name(t.dtype), " (", bytes, " bytes) at byte offset ", t.offset,
                " overruns its buffer of ", t.buffer->size(), " bytes");
  // Kernels may read elements through typed pointers, which needs natural alignment.
  KVLAB_REQUIRE(t.offset % dtype_size(t.dtype) == 0, invalid_argument, "tensor ", dtype_name(t.dtype),
                " at byte offset ", t.offset, " is not aligned to its ", dtype_size(t.dtype), "-byte elements");
  return TensorView{{base + t.offset, t.dtype, t.shape}};
}

ConstTensorView host_cview(const DTensor& t) { return host_view(t); }

const ConstTensorView* host_cview(const DTensor* t, ConstTensorView& storage) {
  if (t == nullptr) return nullptr;
  storage = host_cview(*t);
  return &storage;
}

std::optional<ConstTensorView> host_per_row(const Offsets& offsets) {
  if (!offsets.per_row) return std::nullopt;
  return host_cview(*offsets.per_row);
}

QuantizedView host_cview(const QuantizedDTensor& t) {
  return {host_cview(t.wq), host_cview(t.scales), t.biases ? host_cview(t.biases) : ConstTensorView{}, t.spec,
          t.global_scale};
}

QuantizedMutView host_view(const QuantizedDTensor& t) {
  const bool biases = t.spec.has_biases() || t.biases;
  return {host_view(t.wq), host_view(t.scales), biases ? host_view(t.biases) : TensorView{}, t.spec, t.global_scale};
}

BufferPtr HostMemoryBackend::allocate(std::size_t bytes) { return make_host_buffer(bytes); }

void HostMemoryBackend::upload(const DTensor& dst, const void* src) {
  const TensorView v = host_view(dst);
  if (v.nbytes() != 0) std::memcpy(v.data, src, v.nbytes());
}

void HostMemoryBackend::download(const DTensor& src, void* dst) {
  const TensorView v = host_view(src);
  if (v.nbytes() != 0) std::memcpy(dst, v.data, v.nbytes());
}

void HostMemoryBackend::fill(const DTensor& dst, std::uint32_t element_bits) {
  const TensorView v = host_view(dst);
  const std::size_t es = dtype_size(v.dtype);
  const std::size_t n = v.nbytes();  // computed once: every NaN-poisoned cache allocation comes here
  for (std::size_t i = 0; i < n; i += es) std::memcpy(v.data + i, &element_bits, es);  // little-endian
}

}  // namespace kvlab
