#include "reference/kv_cast.h"

#include <cstdint>
#include <cstring>

#include "kvlab/error.h"

namespace kvlab::ref {

namespace {

constexpr const char* kCast = "kv_cast";

std::size_t cast_bytes(const ConstTensorView& v) { return static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype); }

// Element i of a float view, widened to f32 (exact for every f16 and bf16 value).
float load(const std::byte* data, DType dtype, std::int64_t i) {
  if (dtype == DType::f32) {
    float x;
    std::memcpy(&x, data + i * 4, 4);
    return x;
  }
  std::uint16_t bits;
  std::memcpy(&bits, data + i * 2, 2);
  return dtype == DType::f16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

// x rounded once to `dtype` (kvlab/dtype.h's conversions) and stored as element i.
void store(std::byte* data, DType dtype, std::int64_t i, float x) {
  if (dtype == DType::f32) {
    std::memcpy(data + i * 4, &x, 4);
    return;
  }
  const std::uint16_t bits = dtype == DType::f16 ? f32_to_f16_bits(x) : f32_to_bf16_bits(x);
  std::memcpy(data + i * 2, &bits, 2);
}

}  // namespace

void validate_kv_cast(const ConstTensorView& src, const ConstTensorView& dst) {
  require_float(src, "kv_cast src");
  require_float(dst, "kv_cast dst");
  KVLAB_REQUIRE(src.shape == dst.shape, shape_mismatch, kCast, ": src ", shape_str(src.shape), " and dst ",
                shape_str(dst.shape), " differ");
  // Compared as integers: relational comparison of pointers into different objects is
  // unspecified. An overlap would make the result depend on the order of the writes.
  const std::size_t sb = cast_bytes(src), db = cast_bytes(dst);
  if (sb == 0 || db == 0) return;
  const auto s0 = reinterpret_cast<std::uintptr_t>(src.data), d0 = reinterpret_cast<std::uintptr_t>(dst.data);
  KVLAB_REQUIRE(s0 + sb <= d0 || d0 + db <= s0, invalid_argument, kCast, ": src (", sb, " bytes) overlaps dst (", db,
                " bytes)");
}

void kv_cast(const ConstTensorView& src, const TensorView& dst) {
  validate_kv_cast(src, dst);
  if (src.dtype == dst.dtype) {
    if (const std::size_t n = cast_bytes(src)) std::memcpy(dst.data, src.data, n);
    return;
  }
  for (std::int64_t i = 0, n = src.numel(); i < n; ++i) store(dst.data, dst.dtype, i, load(src.data, src.dtype, i));
}

}  // namespace kvlab::ref
