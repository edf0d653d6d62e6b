// Moving kvlab host tensors in and out of MLX (internal to kernels/mlx; includes MLX).
//
// Inputs are copied into MLX-owned buffers (never aliased: MLX may donate an input's
// buffer to an output, which must not write into a kvlab operand). Outputs are
// evaluated, made row-contiguous and copied into the kvlab view only when MLX's dtype
// and shape match the view's exactly: a mismatch is a wrapping bug, never converted.
#pragma once

#include <exception>
#include <stdexcept>
#include <utility>

#include <mlx/mlx.h>

#include "kvlab/error.h"
#include "kvlab/tensor.h"

namespace kvlab::mlxk {

namespace mx = mlx::core;

// Every MLX op here runs on the CPU device (the pinned wheel is CPU-only; naming it
// keeps a future Metal/CUDA wheel from silently changing what is judged).
inline mx::StreamOrDevice cpu() { return mx::Device(mx::Device::cpu); }

mx::Dtype to_mx(DType t);
mx::Shape to_mx_shape(const Shape& s);
// A copy of v's bytes as an MLX array of the same dtype and shape.
mx::array to_array(const ConstTensorView& v);
// Evaluates a, checks dtype and shape against out, and copies its bytes into out.
void copy_out(mx::array a, const TensorView& out, const char* what);

// Runs f, turning anything MLX throws into a kvlab::Error carrying MLX's message:
// std::invalid_argument (MLX's rejection of its inputs) as invalid_argument, anything
// else as internal. kvlab::Errors pass through unchanged.
template <class F>
void guarded(const char* op, F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(ErrorKind::invalid_argument, cat("mlx ", op, ": MLX rejected the call: ", e.what()));
  } catch (const std::exception& e) {
    fail(ErrorKind::internal, cat("mlx ", op, ": MLX threw: ", e.what()));
  }
}

}  // namespace kvlab::mlxk
