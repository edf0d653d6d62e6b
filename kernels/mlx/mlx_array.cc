#include "kernels/mlx/mlx_array.h"

#include <cstring>
#include <limits>

namespace kvlab::mlxk {

mx::Dtype to_mx(DType t) {
  switch (t) {
    case DType::f32: return mx::float32;
    case DType::f16: return mx::float16;
    case DType::bf16: return mx::bfloat16;
    case DType::u32: return mx::uint32;
    case DType::i32: return mx::int32;
    case DType::u8: return mx::uint8;
  }
  fail(ErrorKind::internal, cat("mlx: no MLX dtype for kvlab dtype ", static_cast<int>(t)));
}

namespace {

const char* mx_dtype_name(mx::Dtype t) {
  if (t == mx::float32) return "float32";
  if (t == mx::float16) return "float16";
  if (t == mx::bfloat16) return "bfloat16";
  if (t == mx::uint32) return "uint32";
  if (t == mx::int32) return "int32";
  if (t == mx::uint8) return "uint8";
  if (t == mx::bool_) return "bool";
  return "another MLX dtype";
}

Shape from_mx_shape(const mx::Shape& s) { return Shape(s.begin(), s.end()); }

}  // namespace

mx::Shape to_mx_shape(const Shape& s) {
  mx::Shape out;
  for (const std::int64_t d : s) {
    // MLX's shapes are int32; a larger axis cannot be expressed at all.
    KVLAB_REQUIRE(d <= std::numeric_limits<mx::ShapeElem>::max(), unsupported, "mlx: axis of ", d,
                  " elements in shape ", shape_str(s), " exceeds MLX's int32 shapes");
    out.push_back(static_cast<mx::ShapeElem>(d));
  }
  return out;
}

mx::array to_array(const ConstTensorView& v) {
  const std::size_t n = v.nbytes();
  // At least one byte: an empty tensor still gets a real (unused) buffer.
  mx::allocator::Data data = mx::allocator::malloc(n == 0 ? 1 : n);
  if (n != 0) std::memcpy(data.buffer().raw_ptr(), v.data, n);
  return mx::array(std::move(data), to_mx_shape(v.shape), to_mx(v.dtype));
}

void copy_out(mx::array a, const TensorView& out, const char* what) {
  KVLAB_REQUIRE(a.dtype() == to_mx(out.dtype), internal, "mlx: ", what, ": MLX produced ", mx_dtype_name(a.dtype()),
                ", the output is ", dtype_name(out.dtype));
  KVLAB_REQUIRE(from_mx_shape(a.shape()) == out.shape, internal, "mlx: ", what, ": MLX produced shape ",
                shape_str(from_mx_shape(a.shape())), ", the output is ", shape_str(out.shape));
  if (out.nbytes() == 0) return;
  mx::eval(a);
  // Broadcasts and views can leave strided or partial storage; copy only dense rows.
  if (!a.flags().row_contiguous || a.data_size() != a.size()) {
    a = mx::contiguous(a, false, cpu());
    mx::eval(a);
  }
  KVLAB_REQUIRE(a.nbytes() == out.nbytes(), internal, "mlx: ", what, ": MLX holds ", a.nbytes(), " bytes, the output ",
                out.nbytes());
  std::memcpy(out.data, a.data<std::byte>(), out.nbytes());
}

}  // namespace kvlab::mlxk
