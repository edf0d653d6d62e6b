#include "kvlab/tensor.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <limits>
#include <utility>

#include <xtensor/xview.hpp>

namespace kvlab {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) {
    KVLAB_REQUIRE(d >= 0, invalid_argument, "negative dimension ", d, " in shape ", shape_str(s));
    KVLAB_REQUIRE(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / d, invalid_argument,
                  "shape ", shape_str(s), " overflows int64");
    n *= d;
  }
  return n;
}

std::size_t shape_nbytes(const Shape& s, DType dtype) {
  const auto n = static_cast<std::uint64_t>(shape_numel(s));
  const std::size_t es = dtype_size(dtype);
  KVLAB_REQUIRE(n <= std::numeric_limits<std::size_t>::max() / es, invalid_argument, "shape ", shape_str(s), " of ",
                dtype_name(dtype), " needs more bytes than fit in size_t");
  return static_cast<std::size_t>(n) * es;
}

std::int64_t row_major_index(const Shape& s, std::initializer_list<std::int64_t> idx) {
  KVLAB_REQUIRE(idx.size() == s.size(), internal, "index of rank ", idx.size(), " into shape ", shape_str(s));
  std::int64_t flat = 0;
  std::size_t axis = 0;
  for (std::int64_t i : idx) flat = flat * s[axis++] + i;
  return flat;
}

std::int64_t shape_dim(const Shape& s, int axis) {
  const int rank = static_cast<int>(s.size());
  KVLAB_REQUIRE(axis >= -rank && axis < rank, invalid_argument, "axis ", axis, " is out of range for shape ",
                shape_str(s), " of rank ", rank);
  return s[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)];
}

Shape shape_leading(const Shape& s) {
  KVLAB_REQUIRE(!s.empty(), invalid_argument, "a rank-0 shape has no last axis to drop");
  return Shape(s.begin(), s.end() - 1);
}

Shape shape_with_last(Shape s, std::int64_t last) {
  KVLAB_REQUIRE(!s.empty(), invalid_argument, "a rank-0 shape has no last axis to replace");
  s.back() = last;
  return s;
}

template <> std::int64_t BasicTensorView<const std::byte>::dim(int axis) const { return shape_dim(shape, axis); }
template <> std::int64_t BasicTensorView<std::byte>::dim(int axis) const { return shape_dim(shape, axis); }

namespace {

template <class Byte>
float load_float(Byte* data, DType t, std::int64_t i) {
  const auto k = static_cast<std::size_t>(i);
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, data + 4 * k, 4); return v; }
    case DType::f16: { std::uint16_t b; std::memcpy(&b, data + 2 * k, 2); return f16_bits_to_f32(b); }
    case DType::bf16: { std::uint16_t b; std::memcpy(&b, data + 2 * k, 2); return bf16_bits_to_f32(b); }
    default: fail(ErrorKind::dtype_mismatch, cat("load() needs a float tensor, got ", dtype_name(t)));
  }
}

template <class Byte>
std::int64_t load_integer(Byte* data, DType t, std::int64_t i) {
  const auto k = static_cast<std::size_t>(i);
  switch (t) {
    case DType::u32: { std::uint32_t v; std::memcpy(&v, data + 4 * k, 4); return v; }
    case DType::i32: { std::int32_t v; std::memcpy(&v, data + 4 * k, 4); return v; }
    case DType::u8: return static_cast<std::int64_t>(std::to_integer<std::uint8_t>(data[k]));
    default: fail(ErrorKind::dtype_mismatch, cat("load_int() needs an integer tensor, got ", dtype_name(t)));
  }
}

// The shape of an owning xtensor array. xtensor computes strides (products of trailing
// extents) in signed arithmetic even when an extent is zero, so those products must fit
// too: a fuzzed `quantized_sdpa B=0 Hq=82222222222222226` overflowed one (UB). Views
// never compute them, so an empty view beside huge extents stays valid.
std::vector<std::size_t> xshape(const Shape& s) {
  shape_numel(s);  // validates
  std::int64_t stride = 1;
  for (std::size_t i = s.size(); i > 0; --i) {
    const std::int64_t d = std::max<std::int64_t>(s[i - 1], 1);
    KVLAB_REQUIRE(stride <= std::numeric_limits<std::int64_t>::max() / d, invalid_argument, "shape ", shape_str(s),
                  " overflows int64 strides");
    stride *= d;
  }
  return {s.begin(), s.end()};
}

}  // namespace

template <> float BasicTensorView<const std::byte>::load(std::int64_t i) const { return load_float(data, dtype, i); }
template <> float BasicTensorView<std::byte>::load(std::int64_t i) const { return load_float(data, dtype, i); }
template <> std::int64_t BasicTensorView<const std::byte>::load_int(std::int64_t i) const { return load_integer(data, dtype, i); }
template <> std::int64_t BasicTensorView<std::byte>::load_int(std::int64_t i) const { return load_integer(data, dtype, i); }

void TensorView::store(std::int64_t i, float v) const {
  const auto k = static_cast<std::size_t>(i);
  switch (dtype) {
    case DType::f32: std::memcpy(data + 4 * k, &v, 4); return;
    case DType::f16: { const auto b = f32_to_f16_bits(v); std::memcpy(data + 2 * k, &b, 2); return; }
    case DType::bf16: { const auto b = f32_to_bf16_bits(v); std::memcpy(data + 2 * k, &b, 2); return; }
    default: fail(ErrorKind::dtype_mismatch, cat("store() needs a float tensor, got ", dtype_name(dtype)));
  }
}

namespace {

// The integer range of an integer dtype; a value outside it is rejected, never wrapped.
std::pair<std::int64_t, std::int64_t> int_range(DType t) {
  switch (t) {
    case DType::u32: return {0, std::numeric_limits<std::uint32_t>::max()};
    case DType::i32: return {std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()};
    case DType::u8: return {0, std::numeric_limits<std::uint8_t>::max()};
    default: fail(ErrorKind::dtype_mismatch, cat("store_int() needs an integer tensor, got ", dtype_name(t)));
  }
}

}  // namespace

void TensorView::store_int(std::int64_t i, std::int64_t v) const {
  const auto [lo, hi] = int_range(dtype);
  KVLAB_REQUIRE(lo <= v && v <= hi, invalid_argument, "value ", v, " does not fit dtype ", dtype_name(dtype),
                " (range ", lo, "..", hi, ")");
  const auto k = static_cast<std::size_t>(i);
  switch (dtype) {
    case DType::u32: { const auto x = static_cast<std::uint32_t>(v); std::memcpy(data + 4 * k, &x, 4); return; }
    case DType::i32: { const auto x = static_cast<std::int32_t>(v); std::memcpy(data + 4 * k, &x, 4); return; }
    case DType::u8: data[k] = static_cast<std::byte>(v); return;
    default: fail(ErrorKind::dtype_mismatch, cat("store_int() needs an integer tensor, got ", dtype_name(dtype)));
  }
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  const auto xs = xshape(shape_);
  switch (dtype_) {
    case DType::f32: data_ = xt::xarray<float>(xt::zeros<float>(xs)); break;
    case DType::f16: case DType::bf16: data_ = xt::xarray<std::uint16_t>(xt::zeros<std::uint16_t>(xs)); break;
    case DType::u32: data_ = xt::xarray<std::uint32_t>(xt::zeros<std::uint32_t>(xs)); break;
    case DType::i32: data_ = xt::xarray<std::int32_t>(xt::zeros<std::int32_t>(xs)); break;
    case DType::u8: data_ = xt::xarray<std::uint8_t>(xt::zeros<std::uint8_t>(xs)); break;
  }
}

Tensor Tensor::from_f32(const xt::xarray<float>& values, DType dtype) {
  require_float(ConstTensorView{nullptr, dtype, {}}, "Tensor::from_f32 target");
  Tensor t(dtype, Shape(values.shape().begin(), values.shape().end()));
  const TensorView v = t.view();
  std::int64_t i = 0;
  for (float x : values) v.store(i++, x);
  return t;
}

Tensor Tensor::from_values(DType dtype, Shape shape, std::span<const float> values) {
  Tensor t(dtype, std::move(shape));
  KVLAB_REQUIRE(static_cast<std::int64_t>(values.size()) == t.numel(), shape_mismatch, values.size(),
                " values for shape ", shape_str(t.shape()));
  require_float(t.view(), "Tensor::from_values");
  const TensorView v = t.view();
  for (std::size_t i = 0; i < values.size(); ++i) v.store(static_cast<std::int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::from_ints(DType dtype, Shape shape, std::span<const std::int64_t> values) {
  Tensor t(dtype, std::move(shape));
  KVLAB_REQUIRE(static_cast<std::int64_t>(values.size()) == t.numel(), shape_mismatch, values.size(),
                " values for shape ", shape_str(t.shape()));
  const TensorView v = t.view();
  for (std::size_t i = 0; i < values.size(); ++i) v.store_int(static_cast<std::int64_t>(i), values[i]);
  return t;
}

namespace {

template <class A>
std::byte* bytes_of(A& a) {
  if constexpr (std::is_same_v<std::remove_const_t<A>, std::monostate>)
    return nullptr;
  else
    return reinterpret_cast<std::byte*>(const_cast<std::remove_const_t<typename A::value_type>*>(a.data()));
}

// The bytes of a slice along one axis of a deferred tensor: `outer` runs of `run` bytes,
// the i-th at in-parent byte start + i·stride.
class SliceBytes final : public TensorBytes {
 public:
  SliceBytes(std::shared_ptr<const TensorBytes> parent, std::uint64_t start, std::uint64_t stride, std::uint64_t run)
      : parent_(std::move(parent)), start_(start), stride_(stride), run_(run) {}
  void read(std::uint64_t offset, void* dst, std::size_t size) const override {
    auto* out = static_cast<std::byte*>(dst);
    while (size > 0) {
      const std::uint64_t run_index = offset / run_, within = offset % run_;
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(size, run_ - within));
      parent_->read(start_ + run_index * stride_ + within, out, n);
      out += n;
      offset += n;
      size -= n;
    }
  }

 private:
  std::shared_ptr<const TensorBytes> parent_;
  std::uint64_t start_, stride_, run_;
};

}  // namespace

std::byte* Tensor::data() {
  if (is_deferred()) fail_deferred();
  return std::visit([](auto& a) { return bytes_of(a); }, data_);
}
const std::byte* Tensor::data() const {
  if (is_deferred()) fail_deferred();
  return std::visit([](const auto& a) { return static_cast<const std::byte*>(bytes_of(a)); }, data_);
}

void Tensor::fail_deferred() const {
  fail(ErrorKind::misuse, cat("the ", dtype_name(dtype_), " tensor ", shape_str(shape_),
                              " is deferred (its bytes stay in their file): read_bytes() or materialize() it"));
}

Tensor Tensor::deferred(DType dtype, Shape shape, std::shared_ptr<const TensorBytes> bytes) {
  KVLAB_REQUIRE(bytes != nullptr, invalid_argument, "Tensor::deferred needs a source of bytes");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  (void)t.nbytes();  // a shape whose byte count overflows is refused here, as by the constructor
  t.data_ = std::monostate{};
  t.bytes_ = std::move(bytes);
  return t;
}

void Tensor::read_bytes(std::uint64_t offset, void* dst, std::size_t size) const {
  KVLAB_REQUIRE(offset <= nbytes() && size <= nbytes() - offset, invalid_argument, "bytes [", offset, ", ",
                offset + size, ") of a ", nbytes(), "-byte tensor");
  if (size == 0) return;
  if (bytes_)
    bytes_->read(offset, dst, size);
  else
    std::memcpy(dst, data() + offset, size);
}

Tensor Tensor::materialize() const {
  if (!bytes_) return *this;
  Tensor out(dtype_, shape_);
  read_bytes(0, out.data(), out.nbytes());
  return out;
}
TensorView Tensor::view() { return TensorView{{data(), dtype_, shape_}}; }
ConstTensorView Tensor::view() const { return ConstTensorView{data(), dtype_, shape_}; }

xt::xarray<float> Tensor::to_f32() const {
  if (is_deferred()) return materialize().to_f32();
  require_float(view(), "Tensor::to_f32");
  xt::xarray<float> out = xt::zeros<float>(xshape(shape_));
  const ConstTensorView v = view();
  std::int64_t i = 0;
  for (float& x : out) x = v.load(i++);
  return out;
}

std::vector<std::int64_t> Tensor::to_ints() const {
  if (is_deferred()) return materialize().to_ints();
  std::vector<std::int64_t> out(static_cast<std::size_t>(numel()));
  const ConstTensorView v = view();
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = v.load_int(static_cast<std::int64_t>(i));
  return out;
}

Tensor Tensor::slice(int axis, std::int64_t begin, std::int64_t end) const {
  KVLAB_REQUIRE(axis >= -rank() && axis < rank(), invalid_argument, "slice axis ", axis, " for rank ", rank());
  const auto ax = static_cast<std::size_t>(axis < 0 ? axis + rank() : axis);
  KVLAB_REQUIRE(0 <= begin && begin <= end && end <= shape_[ax], invalid_argument, "slice [", begin, ", ",
                end, ") of axis ", ax, " with extent ", shape_[ax]);
  Shape out_shape = shape_;
  out_shape[ax] = end - begin;
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < ax; ++i) outer *= shape_[i];
  for (std::size_t i = ax + 1; i < shape_.size(); ++i) inner *= shape_[i];
  const auto es = static_cast<std::int64_t>(dtype_size(dtype_));
  if (bytes_) {
    const auto unit = static_cast<std::uint64_t>(inner * es);
    const std::uint64_t run = static_cast<std::uint64_t>(end - begin) * unit;
    if (run == 0 || outer == 0) return Tensor(dtype_, out_shape);  // no bytes to defer
    return deferred(dtype_, out_shape,
                    std::make_shared<SliceBytes>(bytes_, static_cast<std::uint64_t>(begin) * unit,
                                                 static_cast<std::uint64_t>(shape_[ax]) * unit, run));
  }
  Tensor out(dtype_, out_shape);
  if (out.numel() == 0) return out;  // nothing to copy (and data() may be null)
  for (std::int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + (o * (end - begin)) * inner * es,
                data() + (o * shape_[ax] + begin) * inner * es,
                static_cast<std::size_t>((end - begin) * inner * es));
  }
  return out;
}

void require_shape(const ConstTensorView& v, const Shape& expected, const char* what) {
  KVLAB_REQUIRE(v.shape == expected, shape_mismatch, what, " has shape ", shape_str(v.shape), ", expected ",
                shape_str(expected));
}
void require_dtype(const ConstTensorView& v, DType expected, const char* what) {
  KVLAB_REQUIRE(v.dtype == expected, dtype_mismatch, what, " has dtype ", dtype_name(v.dtype), ", expected ",
                dtype_name(expected));
}
void require_float(const ConstTensorView& v, const char* what) {
  KVLAB_REQUIRE(is_float(v.dtype), dtype_mismatch, what, " has dtype ", dtype_name(v.dtype),
                ", expected a float dtype (f32, f16, bf16)");
}
void require_rank(const ConstTensorView& v, int rank, const char* what) {
  KVLAB_REQUIRE(v.rank() == rank, shape_mismatch, what, " has rank ", v.rank(), " (shape ", shape_str(v.shape),
                "), expected rank ", rank);
}

}  // namespace kvlab
