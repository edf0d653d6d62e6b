// quantized_sdpa through ggml_flash_attn_ext over ggml's block formats (q8_0, q4_0, q4_1,
// q5_0, q5_1, iq4_nl; K and V may differ), kernels/ggml/attention.h. kvlab's packed K/V
// (a codes bitstream per row, f16 d and m beside it: reference/ggml_quantize.h) are laid
// out as ggml's block structs first — a mapping of bytes, done per call, or once per
// buffer with the backend's static_kv variant (kvlab_bench). Affine and microscaling K/V
// are not ggml's: UNIMPLEMENTED.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/ggml/attention.h"
#include "kvlab/host_buffer.h"
#include "reference/attention_operands.h"
#include "reference/ggml_quantize.h"
#include "reference/quantized_sdpa.h"

namespace kvlab::ggmlk {

namespace {

// K or V in ggml's blocks: rows of D/32 block structs.
std::vector<std::uint8_t> to_blocks(const QuantizedView& t) {
  const std::int64_t groups = t.scales.shape.back(), rows = t.scales.numel() / groups;
  const std::size_t row_bytes = static_cast<std::size_t>(groups) * ref::ggml_block_bytes(t.spec.mode);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(rows) * row_bytes), codes;
  for (std::int64_t r = 0; r < rows; ++r) row_to_blocks(t, r, out.data() + static_cast<std::size_t>(r) * row_bytes, codes);
  return out;
}

// FNV-1a over the first and last 64 bytes of each of the operand's tensors: O(1), and a
// buffer rewritten with other K/V in between shows in it (with its address and shape alike).
std::uint64_t fingerprint(const QuantizedView& t) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const ConstTensorView* v : {&t.wq, &t.scales, &t.biases}) {
    if (v->data == nullptr) continue;
    const std::size_t n = v->nbytes(), edge = std::min<std::size_t>(n, 64);
    for (const std::size_t start : {std::size_t{0}, n - edge}) {
      for (std::size_t i = 0; i < edge; ++i) {
        h ^= std::to_integer<std::uint8_t>(v->data[start + i]);
        h *= 1099511628211ULL;
      }
    }
  }
  return h;
}

// The blocks of `t`: a kept copy of the same buffers and bytes when `keep` is given, else
// converted now (and kept when `keep` is given).
std::shared_ptr<const std::vector<std::uint8_t>> blocks_of(const QuantizedView& t, StaticKv* keep) {
  const std::uint64_t fp = keep != nullptr ? fingerprint(t) : 0;
  if (keep != nullptr) {
    for (const BlockCopy& c : keep->kept) {
      if (c.wq == t.wq.data && c.scales == t.scales.data && c.biases == t.biases.data && c.shape == t.wq.shape &&
          c.mode == t.spec.mode && c.fingerprint == fp) {
        return c.blocks;
      }
    }
  }
  BlockCopy copy{t.wq.data, t.scales.data, t.biases.data, t.wq.shape, t.spec.mode, fp,
                 std::make_shared<const std::vector<std::uint8_t>>(to_blocks(t))};
  if (keep == nullptr) return copy.blocks;
  if (keep->kept.size() == StaticKv::kKept) keep->kept.erase(keep->kept.begin());
  keep->kept.push_back(std::move(copy));
  return keep->kept.back().blocks;
}

}  // namespace

Arithmetic quantized_sdpa(Engine& e, const QuantizedSdpaArgs& a, StaticKv* keep) {
  const ref::QuantizedSdpaOperands o(a);  // host views, validated by the oracle's checks
  const ConstTensorView& q = o.q;
  const QuantizedView &k = o.k, &v = o.v;
  const TensorView& out = o.out;
  const ConstTensorView *mask = o.mask, *sinks = o.sinks;
  for (const QuantizedView* t : {&k, &v}) {
    KVLAB_REQUIRE(t->spec.format().encoder == QuantEncoder::ggml, unsupported, "ggml quantized_sdpa: ",
                  to_string(t->spec), " K/V (ggml's flash attention reads its own block formats only)");
  }
  const std::shared_ptr<const std::vector<std::uint8_t>> kb = blocks_of(k, keep), vb = blocks_of(v, keep);
  const KvRows kr{block_type(k.spec.mode), kb->data(), k.scales.shape[3] * ref::kGgmlBlock};
  const KvRows vr{block_type(v.spec.mode), vb->data(), out.shape[3]};
  return attend(e, q, kr, vr, k.wq.shape[1], k.wq.shape[2], a.params, mask, sinks, out, "quantized_sdpa");
}

}  // namespace kvlab::ggmlk
