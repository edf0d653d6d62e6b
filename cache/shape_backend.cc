#include "cache/shape_backend.h"

#include <cstring>
#include <vector>

namespace kvlab {
namespace {

class ShapeBuffer final : public Buffer {
 public:
  explicit ShapeBuffer(std::size_t bytes) : size_(bytes) {
    if (bytes <= ShapeBackend::kSmallBytes) bytes_.resize(bytes);
  }
  std::size_t size() const override { return size_; }
  std::byte* host_data() override { return bytes_.empty() ? nullptr : bytes_.data(); }

 private:
  std::size_t size_;
  std::vector<std::byte> bytes_;  // empty for a buffer over kSmallBytes
};

// The bytes of `t` when its buffer holds any, else nullptr.
std::byte* small_bytes(const DTensor& t) {
  std::byte* base = t.buffer ? t.buffer->host_data() : nullptr;
  KVLAB_REQUIRE(!t.buffer || t.offset + t.nbytes() <= t.buffer->size(), shape_mismatch, "tensor of ", t.nbytes(),
                " bytes at offset ", t.offset, " overruns its ", t.buffer->size(), "-byte buffer");
  return base ? base + t.offset : nullptr;
}

}  // namespace

BufferPtr ShapeBackend::allocate(std::size_t bytes) { return std::make_shared<ShapeBuffer>(bytes); }

void ShapeBackend::upload(const DTensor& dst, const void* src) {
  if (std::byte* p = small_bytes(dst); p && dst.nbytes() > 0) std::memcpy(p, src, dst.nbytes());
}

void ShapeBackend::download(const DTensor& src, void* dst) {
  if (src.nbytes() == 0) return;
  if (const std::byte* p = small_bytes(src))
    std::memcpy(dst, p, src.nbytes());
  else
    std::memset(dst, 0, src.nbytes());
}

void ShapeBackend::fill(const DTensor& dst, std::uint32_t element_bits) {
  std::byte* p = small_bytes(dst);
  if (!p) return;
  const std::size_t es = dtype_size(dst.dtype);
  for (std::size_t i = 0; i + es <= dst.nbytes(); i += es) std::memcpy(p + i, &element_bits, es);
}

// A small deferred tensor is read (its values may be bookkeeping); a large one never is.
void ShapeBackend::upload_deferred(const DTensor& dst, const Tensor& src) {
  if (std::byte* p = small_bytes(dst); p && dst.nbytes() > 0) src.read_bytes(0, p, dst.nbytes());
}

#define KVLAB_SHAPE_NO_OP(op, Args, stem) \
  void ShapeBackend::op(const Args&) {}
KVLAB_OPS(KVLAB_SHAPE_NO_OP)
#undef KVLAB_SHAPE_NO_OP

}  // namespace kvlab
