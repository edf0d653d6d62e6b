// KVCache writes an update that fits its buffer in place: mlx-lm regrows only when
// prev + S rows exceed the buffer (docs/semantics.md §Common rules). The growth test in
// test_kv_cache.cc only ever appends past the end, so a cache that regrew on every
// update (capacity creeping up by a step each time) passed it.
#include <gtest/gtest.h>

#include <vector>

#include "cache/kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_kv_cache_fit {
namespace {

using testing::token_block;
using testing::range_ids;
using testing::token_ids;

TEST(KVCacheFit, UpdatesThatFitKeepTheFirstStep) {
  ReferenceBackend be;
  KVCache cache(be);
  int stored = 0;
  for (const int s : {3, 5, 1, 247}) {  // 3 + 5 + 1 + 247 = 256: the last one fills the step exactly
    cache.update(token_block(be, {range_ids(static_cast<float>(stored), s)}, 1, 2),
                 token_block(be, {range_ids(static_cast<float>(stored), s)}, 1, 2));
    stored += s;
    EXPECT_EQ(cache.capacity(), 256) << "after " << stored << " tokens";
    // keys and values, one head of width 2, f32: 256 rows of 2 · 2 · 4 bytes
    EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(256 * 2 * 2 * 4)) << "after " << stored << " tokens";
  }
  EXPECT_EQ(token_ids(be, cache.fetch().keys), range_ids(0, 256));
  cache.update(token_block(be, {range_ids(256, 1)}, 1, 2), token_block(be, {range_ids(256, 1)}, 1, 2));
  EXPECT_EQ(cache.capacity(), 512);  // on the step boundary: one more step, nothing cut
}

}  // namespace
}  // namespace test_kv_cache_fit
}  // namespace kvlab
