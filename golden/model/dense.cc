#include "golden/model/dense.h"

#include <cmath>
#include <numbers>

#include "kvlab/error.h"

namespace kvlab::golden::dense {

namespace {

std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

const float* f32_data(const Tensor& t, const char* what) {
  KVLAB_REQUIRE(t.dtype() == DType::f32, dtype_mismatch, what, " weight is ", dtype_name(t.dtype()), ", expected f32");
  return reinterpret_cast<const float*>(t.data());
}

void require_same_shape(const Mat& a, const Mat& b, const char* what) {
  KVLAB_REQUIRE(a.rows == b.rows && a.width == b.width, shape_mismatch, what, ": (", a.rows, ", ", a.width,
                ") vs (", b.rows, ", ", b.width, ")");
}

}  // namespace

Mat::Mat(std::int64_t r, std::int64_t w) : rows(r), width(w), v(idx(r * w)) {}

Mat Mat::reshaped(std::int64_t new_width) const {
  KVLAB_REQUIRE(new_width > 0 && (rows * width) % new_width == 0, shape_mismatch, "cannot read ", rows * width,
                " values as rows of ", new_width);
  Mat out = *this;
  out.width = new_width;
  out.rows = rows * width / new_width;
  return out;
}

Mat Mat::columns(std::int64_t begin, std::int64_t count) const {
  KVLAB_REQUIRE(begin >= 0 && count >= 0 && begin + count <= width, shape_mismatch, "columns [", begin, ", ",
                begin + count, ") of rows of width ", width);
  Mat out(rows, count);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < count; ++c) out.row(r)[c] = row(r)[begin + c];
  return out;
}

Mat linear(const Mat& x, const Tensor& w) {
  KVLAB_REQUIRE(w.rank() == 2 && w.dim(1) == x.width, shape_mismatch, "linear: weight ", shape_str(w.shape()),
                " does not take inputs of width ", x.width);
  const float* wd = f32_data(w, "linear");
  const std::int64_t out_dim = w.dim(0);
  Mat y(x.rows, out_dim);
  for (std::int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    for (std::int64_t o = 0; o < out_dim; ++o) {
      const float* wr = wd + o * x.width;
      double acc = 0.0;  // f32·f32 products are exact in double; only the sum rounds
      for (std::int64_t i = 0; i < x.width; ++i) acc += static_cast<double>(xr[i]) * static_cast<double>(wr[i]);
      y.row(r)[o] = static_cast<float>(acc);
    }
  }
  return y;
}

Mat embedding(std::span<const std::int32_t> tokens, const Tensor& table) {
  KVLAB_REQUIRE(table.rank() == 2, shape_mismatch, "embedding table has shape ", shape_str(table.shape()));
  const float* td = f32_data(table, "embedding");
  const std::int64_t vocab = table.dim(0), dim = table.dim(1);
  Mat out(static_cast<std::int64_t>(tokens.size()), dim);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const std::int64_t id = tokens[t];
    KVLAB_REQUIRE(id >= 0 && id < vocab, invalid_argument, "token ", id, " at index ", t, " is outside the vocabulary [0, ",
                  vocab, ")");
    for (std::int64_t c = 0; c < dim; ++c) out.row(static_cast<std::int64_t>(t))[c] = td[id * dim + c];
  }
  return out;
}

Mat rms_norm(const Mat& x, const Tensor* weight, float eps) {
  const float* wd = nullptr;
  if (weight) {
    KVLAB_REQUIRE(weight->rank() == 1 && weight->dim(0) == x.width, shape_mismatch, "rms_norm: weight ",
                  shape_str(weight->shape()), " for rows of width ", x.width);
    wd = f32_data(*weight, "rms_norm");
  }
  Mat y(x.rows, x.width);
  for (std::int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    double ss = 0.0;
    for (std::int64_t i = 0; i < x.width; ++i) ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.width) + static_cast<double>(eps));
    for (std::int64_t i = 0; i < x.width; ++i) {
      const double w = wd ? static_cast<double>(wd[i]) : 1.0;
      y.row(r)[i] = static_cast<float>(static_cast<double>(xr[i]) * inv * w);
    }
  }
  return y;
}

Mat swiglu(const Mat& gate, const Mat& x) {
  require_same_shape(gate, x, "swiglu");
  Mat y(x.rows, x.width);
  for (std::size_t i = 0; i < y.v.size(); ++i) {
    const double g = gate.v[i];
    y.v[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * static_cast<double>(x.v[i]));
  }
  return y;
}

double gelu_approx(double x) {
  // mlx writes the constant as math.sqrt(2 / math.pi); the cube as x**3.
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

Mat gelu_approx(const Mat& x) {
  Mat y(x.rows, x.width);
  for (std::size_t i = 0; i < y.v.size(); ++i) y.v[i] = static_cast<float>(gelu_approx(static_cast<double>(x.v[i])));
  return y;
}

Mat geglu(const Mat& gate, const Mat& x) {
  require_same_shape(gate, x, "geglu");
  Mat y(x.rows, x.width);
  for (std::size_t i = 0; i < y.v.size(); ++i)
    y.v[i] = static_cast<float>(gelu_approx(static_cast<double>(gate.v[i])) * static_cast<double>(x.v[i]));
  return y;
}

void add_into(Mat& acc, const Mat& x) {
  require_same_shape(acc, x, "add");
  for (std::size_t i = 0; i < acc.v.size(); ++i) acc.v[i] += x.v[i];
}

Mat multiply(const Mat& a, const Mat& b) {
  require_same_shape(a, b, "multiply");
  Mat y(a.rows, a.width);
  for (std::size_t i = 0; i < y.v.size(); ++i) y.v[i] = a.v[i] * b.v[i];
  return y;
}

void scale_by(Mat& x, float s) {
  for (float& e : x.v) e *= s;
}

void softcap(Mat& x, float cap) {
  const double c = cap;
  for (float& e : x.v) e = static_cast<float>(std::tanh(static_cast<double>(e) / c) * c);
}

}  // namespace kvlab::golden::dense
