// The kernel interface: memory operations plus one virtual per op of kvlab/op_list.h.
//
// A backend owns its memory: tensors handed to kernels are DTensors, i.e. a range
// of a backend Buffer plus dtype and dense row-major shape. For host backends
// (reference, SIMD) a Buffer is host memory and host_view() gives raw pointers;
// a device backend (Vulkan) maps the same calls onto its own buffers. Caches are
// written once over Backend&, so the same command sequence runs on every backend.
//
// Every op's default throws Error{unsupported} naming the backend and the op: a backend
// overrides what it implements, and a comparison never silently runs another backend's
// kernel. Contracts (shapes, layouts, what is invalid) are documented once, in the
// reference kernel headers under reference/; every backend must honour them and throw
// kvlab::Error for the same invalid inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/dtensor.h"
#include "kvlab/op_list.h"

namespace kvlab {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The precision of the kernels' running accumulators (attention's softmax statistics
  // and P·V sums, reductions): f32 or wider for every kvlab backend (the oracle uses
  // double). The harness's precision ceilings (harness/op.h Budget::precision_nmse_max)
  // are derived for f32; a backend that declares f16/bf16 is held to its output budget only.
  // Both declarations are read right after the call they describe (harness/spine.cc), so
  // an engine whose arithmetic depends on the call may report its last call's (ggml).
  virtual DType accumulation() const { return DType::f32; }
  // Which intermediate values of attention the kernels round to the input dtype T before
  // using them. An engine may: MLX rounds q·scale and P, its quantized attention the
  // logits and the dequantized K/V. kvlab's own kernels round none (f32 throughout, one
  // rounding of the output). The attention precision ceiling (harness/ops/sdpa_info.cc)
  // keeps a term only for what is declared, so a kernel that declares none is held to
  // what f32 arithmetic and one final rounding allow. The default assumes every one.
  struct AttentionRounding {
    bool scaled_q = true, dequantized_kv = true, logits = true, probabilities = true;
    static constexpr AttentionRounding none() { return {false, false, false, false}; }
  };
  virtual AttentionRounding attention_rounding() const { return {}; }

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
  // How upload(const Tensor&) moves a deferred tensor (kvlab/tensor.h): by default its
  // bytes are read whole and uploaded; a backend that needs no bytes overrides it.
  virtual void upload_deferred(const DTensor& dst, const Tensor& src);
  Tensor download(const DTensor& t);

  // ---- kernels (kvlab/op_list.h) -----------------------------------------------
#define KVLAB_DECLARE_OP(op, Args, stem) virtual void op(const Args& args);
  KVLAB_OPS(KVLAB_DECLARE_OP)
#undef KVLAB_DECLARE_OP
};

// ---- delegation ------------------------------------------------------------------
// A backend that runs an op by handing it to the reference oracle, having no kernel of
// its own for it (the SIMD backend's TurboQuant codec and device-offset ops, the
// ForwardingBackend's ops not overridden), says so with note_delegated(op) during the
// call. The harness takes the record around each backend run: a case whose backend side
// delegated is UNIMPLEMENTED ("delegated to the reference"), never PASSED, since its
// comparison would be the oracle's with itself. Per thread; take_delegated() returns the
// ops noted since the last take, each once, and clears them.
void note_delegated(const char* op);
std::vector<std::string> take_delegated();

}  // namespace kvlab
