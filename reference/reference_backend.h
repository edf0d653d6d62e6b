// The reference backend: a Backend whose kernels are the oracle functions of
// reference/, over host memory. A cache over this backend is the reference cache.
#pragma once

#include <memory>

#include "kvlab/host_buffer.h"

namespace kvlab {

class ReferenceBackend final : public HostMemoryBackend {
 public:
  std::string name() const override { return "reference"; }

  void affine_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding, const DTensor& wq,
                       const DTensor& scales, const DTensor& biases) override;
  void affine_dequantize(const DTensor& wq, const DTensor& scales, const DTensor& biases, const QuantSpec& spec,
                         const DTensor& out) override;
  void fp_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding, std::optional<float> global_scale,
                   const DTensor& wq, const DTensor& scales) override;
  void fp_dequantize(const DTensor& wq, const DTensor& scales, const QuantSpec& spec,
                     std::optional<float> global_scale, const DTensor& out) override;
  void rope(const DTensor& x, const RopeParams& params, const Offsets& offsets, const DTensor& out) override;
  void sdpa(const DTensor& q, const DTensor& k, const DTensor& v, const AttentionParams& params,
            const DTensor* mask_array, const DTensor* sinks, const DTensor& out) override;
  void quantized_sdpa(const DTensor& q, const QuantizedDTensor& k, const QuantizedDTensor& v,
                      const AttentionParams& params, const DTensor* mask_array, const DTensor* sinks,
                      const DTensor& out) override;
  void turboquant_encode(const DTensor& x, const TurboQuantCodec& codec, const DTensor& norms,
                         const DTensor& indices) override;
  void turboquant_decode(const DTensor& norms, const DTensor& indices, const TurboQuantCodec& codec,
                         const DTensor& out) override;
  void kv_scatter(const DTensor& src, const DTensor& slots, const DTensor& dst) override;
  void kv_gather(const DTensor& src, const DTensor& batch_index, const DTensor& dst) override;
  void kv_copy_blocks(const DTensor& src, std::span<const SeqBlock> blocks, const DTensor& dst) override;
  void kv_roll(const DTensor& src, const DTensor& shifts, const DTensor& dst) override;
};

}  // namespace kvlab
