// A test-only Backend that forwards every kernel to the reference, over the same host
// memory; tests derive from it and override one kernel to misbehave on purpose.
#pragma once

#include "kvlab/host_buffer.h"
#include "reference/reference_backend.h"

namespace kvlab::harness::testing {

class ForwardingBackend : public HostMemoryBackend {
 public:
  std::string name() const override { return "forwarding"; }
  void affine_quantize(const DTensor& x, const QuantSpec& s, Rounding r, const DTensor& wq, const DTensor& sc,
                       const DTensor& b) override {
    ref_.affine_quantize(x, s, r, wq, sc, b);
  }
  void affine_dequantize(const DTensor& wq, const DTensor& sc, const DTensor& b, const QuantSpec& s,
                         const DTensor& out) override {
    ref_.affine_dequantize(wq, sc, b, s, out);
  }
  void fp_quantize(const DTensor& x, const QuantSpec& s, Rounding r, std::optional<float> g, const DTensor& wq,
                   const DTensor& sc) override {
    ref_.fp_quantize(x, s, r, g, wq, sc);
  }
  void fp_dequantize(const DTensor& wq, const DTensor& sc, const QuantSpec& s, std::optional<float> g,
                     const DTensor& out) override {
    ref_.fp_dequantize(wq, sc, s, g, out);
  }
  void rope(const DTensor& x, const RopeParams& p, const Offsets& o, const DTensor& out) override {
    ref_.rope(x, p, o, out);
  }
  void sdpa(const DTensor& q, const DTensor& k, const DTensor& v, const AttentionParams& p, const DTensor* m,
            const DTensor* s, const DTensor& out) override {
    ref_.sdpa(q, k, v, p, m, s, out);
  }
  void quantized_sdpa(const DTensor& q, const QuantizedDTensor& k, const QuantizedDTensor& v,
                      const AttentionParams& p, const DTensor* m, const DTensor* s, const DTensor& out) override {
    ref_.quantized_sdpa(q, k, v, p, m, s, out);
  }
  void turboquant_encode(const DTensor& x, const TurboQuantCodec& c, const DTensor& n, const DTensor& i) override {
    ref_.turboquant_encode(x, c, n, i);
  }
  void turboquant_decode(const DTensor& n, const DTensor& i, const TurboQuantCodec& c, const DTensor& out) override {
    ref_.turboquant_decode(n, i, c, out);
  }
  void kv_scatter(const DTensor& src, const DTensor& slots, const DTensor& dst) override {
    ref_.kv_scatter(src, slots, dst);
  }
  void kv_gather(const DTensor& src, const DTensor& index, const DTensor& dst) override {
    ref_.kv_gather(src, index, dst);
  }
  void kv_copy_blocks(const DTensor& src, std::span<const SeqBlock> blocks, const DTensor& dst) override {
    ref_.kv_copy_blocks(src, blocks, dst);
  }
  void kv_roll(const DTensor& src, const DTensor& shifts, const DTensor& dst) override {
    ref_.kv_roll(src, shifts, dst);
  }

 protected:
  ReferenceBackend ref_;
};

}  // namespace kvlab::harness::testing
