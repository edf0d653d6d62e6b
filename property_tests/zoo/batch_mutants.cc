// Batch-cache seed-bug mutants (test-only code; production has no hooks). Each is a
// BatchHooks override; their single-cache Hooks are the production ones.
//
// batch-rotating-extract-negative-padding (vllm-mlx PR 256 / mlx-lm#1114):
//   extract slices the temporal order from left_padding[i] unclamped. Evictions drive
//   left_padding negative (Appendix A.4); Python's keys[..., lp:] with lp < 0 counts from
//   the end, so the row loses its oldest real tokens. Rebuilt here from the cache's
//   public state (physical buffers, cursor, rotated, left_padding).
// prefix-cache-mixes-kv-bits (SharpAI/SwiftLM PR 73 review):
//   the lookup key ignores the quantization spec: every fetch uses the plain format key,
//   so a quantized request gets an unquantized state (and a stored quantized entry is
//   never found by its own format).
#include "property_tests/zoo/batch_mutants.h"

#include <algorithm>

namespace kvlab::prop::zoo {

namespace {

FetchedKV extract_negative_padding(const BatchRotatingKVCache& c, std::int64_t i) {
  Backend& be = c.backend();
  if (c.empty()) return {};
  const std::int64_t cap = c.capacity();
  const std::int64_t temporal = c.rotated() ? cap : c.cursor();
  const std::int64_t shift = c.rotated() ? c.cursor() : 0;
  const std::int64_t lp = c.left_padding().at(static_cast<std::size_t>(i));
  // The bug: Python slice semantics for a negative start.
  const std::int64_t start = lp >= 0 ? lp : std::max<std::int64_t>(0, temporal + lp);
  std::int64_t first = start, n = temporal - start;
  if (n > c.max_size()) first += n - c.max_size(), n = c.max_size();
  if (n <= 0) return {};
  const auto take = [&](const DTensor& buf) {
    const Tensor src = be.download(buf);
    const std::int64_t heads = src.dim(1), dim = src.dim(3);
    Tensor out(src.dtype(), {1, heads, n, dim});
    const ConstTensorView s = src.view();
    const TensorView d = out.view();
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t phys = (first + t + shift) % cap;
        for (std::int64_t x = 0; x < dim; ++x)
          d.store((h * n + t) * dim + x, s.load(((i * heads + h) * cap + phys) * dim + x));
      }
    return be.upload(out);
  };
  return {take(c.key_buffer()), take(c.value_buffer())};
}

}  // namespace

std::vector<BatchMutant> batch_mutants() {
  std::vector<BatchMutant> out;
  out.push_back({"batch-rotating-extract-negative-padding", "vllm-mlx PR 256 / mlx-lm#1114", production_batch_hooks()});
  out.back().batch.rotating_extract_rows = extract_negative_padding;
  out.push_back({"prefix-cache-mixes-kv-bits", "SharpAI/SwiftLM PR 73 review", production_batch_hooks()});
  out.back().batch.prefix_fetch = [](PrefixCache& pc, const std::string& model, const CacheFormat& format,
                                     const std::vector<std::int32_t>& tokens) {
    return pc.fetch(model, CacheFormat::uniform(format.size(), CacheFormat::kv()), tokens);
  };
  return out;
}

}  // namespace kvlab::prop::zoo
