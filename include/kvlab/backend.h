// The kernel interface: the table of kernels every backend implements.
//
// A backend owns its memory: tensors handed to kernels are DTensors, i.e. a range
// of a backend Buffer plus dtype and dense row-major shape. For host backends
// (reference, SIMD) a Buffer is host memory and host_view() gives raw pointers;
// a device backend (Vulkan) maps the same calls onto its own buffers. Caches are
// written once over Backend&, so the same command sequence runs on every backend.
//
// Contracts (shapes, layouts, what is invalid) are documented once, in the
// reference kernel headers under reference/; every backend must honour them and
// throw kvlab::Error for the same invalid inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kvlab/dtype.h"
#include "kvlab/ops.h"
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

// A packed affine/fp tensor: codes (u32, (..., D·bits/32)), scales (..., D/group) and,
// for affine, biases of the same shape as scales.
struct QuantizedDTensor {
  DTensor wq, scales, biases;
  QuantSpec spec;
};

// Optional per-row positions: either a scalar or an int32 tensor of shape (B,).
struct Offsets {
  std::int32_t scalar = 0;
  std::optional<DTensor> per_row;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory -----------------------------------------------------------------
  virtual BufferPtr allocate(std::size_t bytes) = 0;
  DTensor allocate(DType dtype, Shape shape);
  virtual void upload(const DTensor& dst, const void* src) = 0;    // dst.nbytes() bytes
  virtual void download(const DTensor& src, void* dst) = 0;        // src.nbytes() bytes
  // Fills every element with the given bit pattern (low dtype_size bytes), e.g. a NaN
  // poison for unused cache slots.
  virtual void fill(const DTensor& dst, std::uint32_t element_bits) = 0;
  virtual void finish() {}  // waits until submitted work is complete
  DTensor upload(const Tensor& t);
  Tensor download(const DTensor& t);

  // ---- quantization (reference/affine_quantize.h, reference/fp_quantize.h) -------
  virtual void affine_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding,
                               const DTensor& wq, const DTensor& scales, const DTensor& biases) = 0;
  virtual void affine_dequantize(const DTensor& wq, const DTensor& scales, const DTensor& biases,
                                 const QuantSpec& spec, const DTensor& out) = 0;
  virtual void fp_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding,
                           std::optional<float> global_scale, const DTensor& wq,
                           const DTensor& scales) = 0;
  virtual void fp_dequantize(const DTensor& wq, const DTensor& scales, const QuantSpec& spec,
                             std::optional<float> global_scale, const DTensor& out) = 0;

  // ---- attention (reference/rope.h, reference/sdpa.h, reference/quantized_sdpa.h) --
  virtual void rope(const DTensor& x, const RopeParams& params, const Offsets& offsets,
                    const DTensor& out) = 0;
  // mask_array: required for MaskKind::boolean/additive, ignored otherwise.
  // sinks: optional (Hq,) float logits.
  virtual void sdpa(const DTensor& q, const DTensor& k, const DTensor& v,
                    const AttentionParams& params, const DTensor* mask_array,
                    const DTensor* sinks, const DTensor& out) = 0;
  virtual void quantized_sdpa(const DTensor& q, const QuantizedDTensor& k,
                              const QuantizedDTensor& v, const AttentionParams& params,
                              const DTensor* mask_array, const DTensor* sinks,
                              const DTensor& out) = 0;

  // ---- TurboQuant (reference/turboquant.h) ----------------------------------------
  // x (..., D) float -> norms (...) f16 and indices (..., ceil(dim·bits/32)) u32.
  virtual void turboquant_encode(const DTensor& x, const TurboQuantCodec& codec, const DTensor& norms,
                                 const DTensor& indices) = 0;
  // Writes the decoded channels of out (..., D) (only `codec.channels` when given).
  virtual void turboquant_decode(const DTensor& norms, const DTensor& indices, const TurboQuantCodec& codec,
                                 const DTensor& out) = 0;

  // ---- cache data movement (reference/kv_move.h) ---------------------------------
  virtual void kv_scatter(const DTensor& src, const DTensor& slots, const DTensor& dst) = 0;
  virtual void kv_gather(const DTensor& src, const DTensor& batch_index, const DTensor& dst) = 0;
  virtual void kv_copy_blocks(const DTensor& src, std::span<const SeqBlock> blocks,
                              const DTensor& dst) = 0;
  virtual void kv_roll(const DTensor& src, const DTensor& shifts, const DTensor& dst) = 0;
};

}  // namespace kvlab
