// Backend memory as kernels see it: a Buffer, a DTensor (a range of a Buffer with dtype
// and dense row-major shape) and the packed form of a quantized tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "kvlab/dtype.h"
#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"

namespace kvlab {

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual std::size_t size() const = 0;
  // Host address of byte 0, or nullptr when the memory is not host-addressable.
  virtual std::byte* host_data() = 0;
};
using BufferPtr = std::shared_ptr<Buffer>;

struct DTensor {
  BufferPtr buffer;
  std::size_t offset = 0;  // bytes from the buffer start
  DType dtype = DType::f32;
  Shape shape;

  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return shape_nbytes(shape, dtype); }
  explicit operator bool() const { return buffer != nullptr; }
};

// A packed tensor of any quantization format (kvlab/quant_spec.h): codes wq (u32,
// (..., D·bits/32)), scales (..., D/group), biases of the same shape when the format has
// them (empty otherwise), and nvfp4's optional global scale.
struct QuantizedDTensor {
  DTensor wq, scales, biases;
  QuantSpec spec;
  std::optional<float> global_scale;
};

// Optional per-row positions: either a scalar or an int32 tensor of shape (B,).
struct Offsets {
  std::int32_t scalar = 0;
  std::optional<DTensor> per_row;
};

}  // namespace kvlab
