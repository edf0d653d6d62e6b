#include "bench/memo_reference.h"

#include <cstring>

namespace kvlab::bench {

template <class Compute>
void MemoReference::memo(std::initializer_list<const DTensor*> outputs, Compute&& compute) {
  const std::size_t call = call_++;
  if (cached_key_ != pending_) {
    cached_key_ = pending_;
    cached_.clear();
  }
  if (call < cached_.size() && cached_[call].size() == outputs.size()) {
    bool sizes_match = true;
    std::size_t i = 0;
    for (const DTensor* out : outputs) sizes_match = sizes_match && cached_[call][i++].size() == out->nbytes();
    if (sizes_match) {
      i = 0;
      for (const DTensor* out : outputs) {
        const std::vector<std::byte>& image = cached_[call][i++];
        if (!image.empty()) std::memcpy(host_view(*out).data, image.data(), image.size());
      }
      return;
    }
  }
  compute();
  ++computed_;
  if (call != cached_.size()) return;  // calls out of step: compute, never cache
  std::vector<std::vector<std::byte>> images;
  for (const DTensor* out : outputs) {
    const TensorView v = host_view(*out);
    images.emplace_back(v.data, v.data + v.nbytes());
  }
  cached_.push_back(std::move(images));
}

void MemoReference::affine_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding, const DTensor& wq,
                                    const DTensor& scales, const DTensor& biases) {
  memo({&wq, &scales, &biases}, [&] { oracle_.affine_quantize(x, spec, rounding, wq, scales, biases); });
}
void MemoReference::affine_dequantize(const DTensor& wq, const DTensor& scales, const DTensor& biases,
                                      const QuantSpec& spec, const DTensor& out) {
  memo({&out}, [&] { oracle_.affine_dequantize(wq, scales, biases, spec, out); });
}
void MemoReference::fp_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding,
                                std::optional<float> global_scale, const DTensor& wq, const DTensor& scales) {
  memo({&wq, &scales}, [&] { oracle_.fp_quantize(x, spec, rounding, global_scale, wq, scales); });
}
void MemoReference::fp_dequantize(const DTensor& wq, const DTensor& scales, const QuantSpec& spec,
                                  std::optional<float> global_scale, const DTensor& out) {
  memo({&out}, [&] { oracle_.fp_dequantize(wq, scales, spec, global_scale, out); });
}
void MemoReference::rope(const DTensor& x, const RopeParams& params, const Offsets& offsets, const DTensor& out) {
  memo({&out}, [&] { oracle_.rope(x, params, offsets, out); });
}
void MemoReference::sdpa(const DTensor& q, const DTensor& k, const DTensor& v, const AttentionParams& params,
                         const DTensor* mask_array, const DTensor* sinks, const DTensor& out) {
  memo({&out}, [&] { oracle_.sdpa(q, k, v, params, mask_array, sinks, out); });
}
void MemoReference::quantized_sdpa(const DTensor& q, const QuantizedDTensor& k, const QuantizedDTensor& v,
                                   const AttentionParams& params, const DTensor* mask_array, const DTensor* sinks,
                                   const DTensor& out) {
  memo({&out}, [&] { oracle_.quantized_sdpa(q, k, v, params, mask_array, sinks, out); });
}
void MemoReference::turboquant_encode(const DTensor& x, const TurboQuantCodec& codec, const DTensor& norms,
                                      const DTensor& indices) {
  memo({&norms, &indices}, [&] { oracle_.turboquant_encode(x, codec, norms, indices); });
}
void MemoReference::turboquant_decode(const DTensor& norms, const DTensor& indices, const TurboQuantCodec& codec,
                                      const DTensor& out) {
  memo({&out}, [&] { oracle_.turboquant_decode(norms, indices, codec, out); });
}
void MemoReference::kv_scatter(const DTensor& src, const DTensor& slots, const DTensor& dst) {
  memo({&dst}, [&] { oracle_.kv_scatter(src, slots, dst); });
}
void MemoReference::kv_gather(const DTensor& src, const DTensor& batch_index, const DTensor& dst) {
  memo({&dst}, [&] { oracle_.kv_gather(src, batch_index, dst); });
}
void MemoReference::kv_copy_blocks(const DTensor& src, std::span<const SeqBlock> blocks, const DTensor& dst) {
  memo({&dst}, [&] { oracle_.kv_copy_blocks(src, blocks, dst); });
}
void MemoReference::kv_roll(const DTensor& src, const DTensor& shifts, const DTensor& dst) {
  memo({&dst}, [&] { oracle_.kv_roll(src, shifts, dst); });
}

}  // namespace kvlab::bench
