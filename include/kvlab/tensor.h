// The host tensor vocabulary: one owning container (Tensor, on xtensor) and two
// non-owning contiguous views (TensorView / ConstTensorView) that kernels take.
//
// Layout is always dense row-major. f16/bf16 elements are stored as uint16_t bit
// patterns; load()/store() convert through f32 with round-to-nearest-even, so a
// kernel can read like the math (`float x = in.load(i)`) whatever the dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <xtensor/xarray.hpp>

#include "kvlab/dtype.h"
#include "kvlab/error.h"

namespace kvlab {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& s);                  // "(2, 8, 128)"
std::int64_t shape_numel(const Shape& s);               // throws on negative dims
std::size_t shape_nbytes(const Shape& s, DType dtype);  // throws when the byte count overflows
std::int64_t row_major_index(const Shape& s, std::initializer_list<std::int64_t> idx);
std::int64_t shape_dim(const Shape& s, int axis);       // throws invalid_argument naming a bad axis
Shape shape_leading(const Shape& s);                    // every axis but the last; throws on rank 0
Shape shape_with_last(Shape s, std::int64_t last);      // the last axis replaced; throws on rank 0
inline Shape shape_appended(Shape s, std::int64_t last) {  // one axis added at the end
  s.push_back(last);
  return s;
}

// A non-owning view of contiguous memory with a dtype and a shape.
template <class Byte>
struct BasicTensorView {
  Byte* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;

  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return shape_nbytes(shape, dtype); }
  std::int64_t dim(int axis) const;  // negative axes count from the end; Error when out of range
  int rank() const { return static_cast<int>(shape.size()); }

  // Element i of a float tensor, converted exactly to f32.
  float load(std::int64_t i) const;
  // Integer element i (u32, i32, u8).
  std::int64_t load_int(std::int64_t i) const;
  template <class T> T* as() const { return reinterpret_cast<T*>(data); }
};

using ConstTensorView = BasicTensorView<const std::byte>;
struct TensorView : BasicTensorView<std::byte> {
  // Stores v rounded (RNE) to the view's float dtype.
  void store(std::int64_t i, float v) const;
  void store_int(std::int64_t i, std::int64_t v) const;
  operator ConstTensorView() const { return {data, dtype, shape}; }
};

// Where a deferred tensor's bytes live (Tensor::deferred): typically a region of a file
// too large to hold in memory. read() copies `size` bytes of the tensor's row-major
// bytes, starting at byte `offset` of the tensor; the caller keeps within nbytes().
class TensorBytes {
 public:
  virtual ~TensorBytes() = default;
  virtual void read(std::uint64_t offset, void* dst, std::size_t size) const = 0;
};

// Owning host tensor. Float data keeps its storage dtype; to_f32() gives an
// xtensor expression-friendly copy for math, from_f32() rounds back once.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  static Tensor from_f32(const xt::xarray<float>& values, DType dtype);
  static Tensor from_values(DType dtype, Shape shape, std::span<const float> values);
  static Tensor from_ints(DType dtype, Shape shape, std::span<const std::int64_t> values);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return shape_nbytes(shape_, dtype_); }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int axis) const { return shape_dim(shape_, axis); }

  std::byte* data();
  const std::byte* data() const;
  TensorView view();
  ConstTensorView view() const;

  xt::xarray<float> to_f32() const;    // float dtypes only
  std::vector<std::int64_t> to_ints() const;  // integer dtypes only

  // The typed xtensor storage; T must match the dtype's storage type
  // (float for f32, uint16_t for f16/bf16, uint32_t, int32_t, uint8_t).
  template <class T> xt::xarray<T>& storage() {
    if (is_deferred()) fail_deferred();
    return std::get<xt::xarray<T>>(data_);
  }
  template <class T> const xt::xarray<T>& storage() const {
    if (is_deferred()) fail_deferred();
    return std::get<xt::xarray<T>>(data_);
  }

  // Copies of sub-blocks along one axis: [begin, end) of `axis`.
  // A slice of a deferred tensor is deferred too (nothing is read).
  Tensor slice(int axis, std::int64_t begin, std::int64_t end) const;

  // A tensor whose bytes stay where `bytes` keeps them until asked for (cache files of
  // tens of GB are converted and inspected this way, one chunk in memory at a time).
  // dtype and shape are known; data(), view() and storage() throw Error{misuse};
  // read_bytes() fetches a range, materialize() the whole.
  static Tensor deferred(DType dtype, Shape shape, std::shared_ptr<const TensorBytes> bytes);
  bool is_deferred() const { return bytes_ != nullptr; }
  // Bytes [offset, offset + size) of the row-major data, from memory or from the source.
  void read_bytes(std::uint64_t offset, void* dst, std::size_t size) const;
  Tensor materialize() const;  // a tensor holding its bytes (a copy of *this when it does)

 private:
  [[noreturn]] void fail_deferred() const;

  DType dtype_ = DType::f32;
  Shape shape_;
  std::variant<xt::xarray<float>, xt::xarray<std::uint16_t>, xt::xarray<std::uint32_t>,
               xt::xarray<std::int32_t>, xt::xarray<std::uint8_t>, std::monostate>
      data_;
  std::shared_ptr<const TensorBytes> bytes_;  // set iff deferred (data_ holds monostate)
};

// Throws shape_mismatch naming `what` unless v.shape == expected.
void require_shape(const ConstTensorView& v, const Shape& expected, const char* what);
// Throws dtype_mismatch naming `what` unless v.dtype == expected.
void require_dtype(const ConstTensorView& v, DType expected, const char* what);
void require_float(const ConstTensorView& v, const char* what);
void require_rank(const ConstTensorView& v, int rank, const char* what);

}  // namespace kvlab
