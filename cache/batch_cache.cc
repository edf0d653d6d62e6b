#include "cache/batch_cache.h"

namespace kvlab {

BatchCache& batch_verbs(Cache& cache, const char* verb) {
  BatchCache* b = cache.batch();
  if (b == nullptr)
    fail(ErrorKind::misuse, cat(verb, "() needs a batch cache (BatchKVCache, BatchRotatingKVCache, "
                                      "BatchQuantizedKVCache), got ",
                                cache.class_name()));
  return *b;
}

void prepare_right(BatchCache& batch, const std::vector<std::int32_t>& right_padding, std::int64_t tokens) {
  std::vector<std::int32_t> lengths;
  for (const std::int32_t pad : right_padding) lengths.push_back(static_cast<std::int32_t>(tokens - pad));
  batch.prepare({}, lengths, right_padding);
}

}  // namespace kvlab
