// The reference for the verification step, computed once per problem instead of once per
// verified backend.
//
// Every SIMD target is verified against the oracle on the same perf problem, and at perf
// shapes the oracle is what costs (sdpa with Lq=512, Lk=4096 is ~34 Gflop in double: about
// four minutes here). harness::run_case places identical inputs for a problem each time
// (the fill is keyed by the problem line) and makes the same reference calls (no rerun),
// so the oracle's outputs of the n-th call after expect(line) can be replayed byte for
// byte for the next backend verified on that line. Only the latest problem is kept:
// benchmarks of one problem run back to back.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "kvlab/host_buffer.h"
#include "reference/reference_backend.h"

namespace kvlab::bench {

class MemoReference final : public HostMemoryBackend {
 public:
  std::string name() const override { return "reference"; }
  // The problem line the next kernel call belongs to.
  void expect(const std::string& problem_line) {
    pending_ = problem_line;
    call_ = 0;
  }
  int computed() const { return computed_; }  // oracle calls made (the rest were replays)

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

 private:
  // Replays the outputs cached for the pending problem, or runs `compute` and caches
  // them. An oracle that throws caches nothing (the next call throws again).
  template <class Compute>
  void memo(std::initializer_list<const DTensor*> outputs, Compute&& compute);

  ReferenceBackend oracle_;
  std::string pending_, cached_key_;
  std::size_t call_ = 0;                                 // calls since expect()
  std::vector<std::vector<std::vector<std::byte>>> cached_;  // [call][output] bytes
  int computed_ = 0;
};

}  // namespace kvlab::bench
