#include "bench/memo_reference.h"

#include <cstring>

namespace kvlab::bench {

// Outputs the call writes: an absent optional output (a format without biases) is left out.
std::vector<const DTensor*> written(std::vector<const DTensor*> outputs) {
  std::erase_if(outputs, [](const DTensor* t) { return !*t; });
  return outputs;
}

template <class Compute>
void MemoReference::memo(const std::vector<const DTensor*>& outputs, Compute&& compute) {
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

#define KVLAB_MEMO_OP(op, Args, stem) \
  void MemoReference::op(const Args& a) { memo(written(a.outputs()), [&] { oracle_.op(a); }); }
KVLAB_OPS(KVLAB_MEMO_OP)
#undef KVLAB_MEMO_OP

}  // namespace kvlab::bench
