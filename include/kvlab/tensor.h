// The host tensor vocabulary: one owning container (Tensor, on xtensor) and two
// non-owning contiguous views (TensorView / ConstTensorView) that kernels take.
//
// Layout is always dense row-major. f16/bf16 elements are stored as uint16_t bit
// patterns; load()/store() convert through f32 with round-to-nearest-even, so a
// kernel can read like the math (`float x = in.load(i)`) whatever the dtype.
#pragma once

#include <cstdint>
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
  template <class T> xt::xarray<T>& storage() { return std::get<xt::xarray<T>>(data_); }
  template <class T> const xt::xarray<T>& storage() const { return std::get<xt::xarray<T>>(data_); }

  // Copies of sub-blocks along one axis: [begin, end) of `axis`.
  Tensor slice(int axis, std::int64_t begin, std::int64_t end) const;

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  std::variant<xt::xarray<float>, xt::xarray<std::uint16_t>, xt::xarray<std::uint32_t>,
               xt::xarray<std::int32_t>, xt::xarray<std::uint8_t>>
      data_;
};

// Throws shape_mismatch naming `what` unless v.shape == expected.
void require_shape(const ConstTensorView& v, const Shape& expected, const char* what);
// Throws dtype_mismatch naming `what` unless v.dtype == expected.
void require_dtype(const ConstTensorView& v, DType expected, const char* what);
void require_float(const ConstTensorView& v, const char* what);
void require_rank(const ConstTensorView& v, int rank, const char* what);

}  // namespace kvlab
