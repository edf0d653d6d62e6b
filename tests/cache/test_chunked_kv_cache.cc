// ChunkedKVCache (docs/semantics.md §Chunked cache): front trimming (mlx-lm#1673), content per step
// against a trivially-correct model, the llama4 chunk mask, state through the state file
// (docs/upstream-bugs.md §U4), trim, poison and misuse.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "cache/chunked_kv_cache.h"
#include "cache/state_file.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_chunked_kv_cache {
namespace {

using testing::token_block;
using testing::range_ids;
using testing::token_ids;

constexpr std::int64_t kHeads = 2, kDk = 4, kDv = 6;
constexpr float kValueBase = 10000.0f;  // value of absolute token p holds id kValueBase + p

// The trivially-correct model: which absolute tokens the cache holds.
struct Model {
  std::int64_t chunk, offset = 0, start = 0;
  void trim_front() {
    if (offset - start > chunk) start = offset - chunk;
  }
};

// Feeds absolute tokens [cache.offset(), cache.offset() + s) as keys and values.
FetchedKV feed(Backend& be, ChunkedKVCache& cache, std::int64_t s) {
  const auto first = static_cast<float>(cache.offset());
  return cache.update(token_block(be, {range_ids(first, s)}, kHeads, kDk),
                      token_block(be, {range_ids(kValueBase + first, s)}, kHeads, kDv));
}

// llama4's rule, written out independently of the cache: key position k and query
// position q attend iff they are in the same chunk and k <= q.
std::vector<std::uint8_t> expected_mask(std::int64_t chunk, std::int64_t start, std::int64_t offset, std::int64_t n,
                                        int window = 0) {
  std::vector<std::uint8_t> m;
  for (std::int64_t q = offset; q < offset + n; ++q)
    for (std::int64_t k = start; k < offset + n; ++k)
      m.push_back(k / chunk == q / chunk && k <= q && (window == 0 || q - k < window) ? 1 : 0);
  return m;
}

std::vector<std::uint8_t> mask_values(const CacheMask& mask) {
  std::vector<std::uint8_t> m;
  const Tensor& t = mask.array.value();
  for (std::int64_t i = 0; i < t.numel(); ++i) m.push_back(static_cast<std::uint8_t>(t.view().load_int(i)));
  return m;
}

// Runs a schedule of update sizes, calling maybe_trim_front before each update as llama4
// does, and checks content, counters and mask against the model at every step.
void check_schedule(std::int64_t chunk, const std::vector<std::int64_t>& sizes) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, chunk);
  Model model{chunk};
  for (std::size_t step = 0; step < sizes.size(); ++step) {
    const std::int64_t s = sizes[step];
    SCOPED_TRACE("chunk " + std::to_string(chunk) + ", step " + std::to_string(step) + ", S " + std::to_string(s));
    cache.maybe_trim_front();
    model.trim_front();
    ASSERT_EQ(cache.start_position(), model.start);
    const CacheMask mask = cache.make_mask(s, 0);
    ASSERT_EQ(mask.spec.kind, MaskKind::boolean);
    const std::int64_t len = model.offset - model.start + s;
    ASSERT_EQ(mask.array->shape(), (Shape{1, 1, s, len}));
    EXPECT_EQ(mask_values(mask), expected_mask(chunk, model.start, model.offset, s));

    const FetchedKV kv = feed(be, cache, s);
    model.offset += s;
    const std::int64_t held = model.offset - model.start;
    EXPECT_EQ(kv.length(), len) << "the mask must fit the keys the update returns";
    EXPECT_EQ(token_ids(be, kv.keys), range_ids(static_cast<float>(model.start), held));
    EXPECT_EQ(token_ids(be, kv.values), range_ids(kValueBase + static_cast<float>(model.start), held));
    EXPECT_EQ(kv.keys.shape, (Shape{1, kHeads, held, kDk}));
    EXPECT_EQ(kv.values.shape, (Shape{1, kHeads, held, kDv}));
    EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{static_cast<std::int32_t>(model.offset)});
    EXPECT_EQ(cache.kv_length(), held);
  }
}

TEST(ChunkedKVCache, PerStepContentIsTheExpectedAbsoluteTokens) {
  check_schedule(4, {6, 1, 1, 3, 1, 1, 1, 1, 9, 2, 1});
  check_schedule(3, {1, 1, 1, 1, 1, 1, 1});
  check_schedule(1, {2, 1, 1, 5});
  check_schedule(300, {255, 1, 1, 100, 1, 1});  // crosses step boundaries before trimming
  std::mt19937 rng(7);
  std::vector<std::int64_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(1 + static_cast<std::int64_t>(rng() % 7));
  check_schedule(5, sizes);
}

// The stand-in run of docs/upstream-bugs.md §U4: chunk 4, 300 decode steps. After each front trim
// the buffer is exactly 4 rows; the next token regrows it by the step rule to 4 + 256.
TEST(ChunkedKVCache, DecodeTraceMatchesTheStandInRun) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 4);
  for (int i = 0; i < 300; ++i) {
    cache.maybe_trim_front();
    feed(be, cache, 1);
  }
  EXPECT_EQ(cache.offset(), 300);
  EXPECT_EQ(cache.start_position(), 295);
  EXPECT_EQ(cache.capacity(), 260);
  EXPECT_EQ(cache.kv_length(), 5);
  EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(260 * kHeads * (kDk + kDv) * 4));
  EXPECT_EQ(token_ids(be, cache.fetch().keys), range_ids(295, 5));
}

// mlx-lm#1673: the old rule trimmed on keys.shape[2] (256 after the first update), so
// a chunk of 4 with 3 live tokens dropped 252 rows and kept poison/zeros.
TEST(ChunkedKVCache, TrimFrontCountsValidTokensNotCapacity) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 4);
  feed(be, cache, 3);
  ASSERT_EQ(cache.capacity(), 256);
  cache.maybe_trim_front();
  EXPECT_EQ(cache.start_position(), 0);
  EXPECT_EQ(cache.capacity(), 256);
  EXPECT_EQ(token_ids(be, cache.fetch().keys), range_ids(0, 3));
  feed(be, cache, 3);
  cache.maybe_trim_front();  // 6 valid > 4: drop the oldest 2
  EXPECT_EQ(cache.start_position(), 2);
  EXPECT_EQ(cache.capacity(), 4);
  EXPECT_EQ(token_ids(be, cache.fetch().keys), range_ids(2, 4));
}

TEST(ChunkedKVCache, MaskAlsoAppliesAWindowAndIsAnArrayForOneToken) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 8);
  feed(be, cache, 11);
  cache.maybe_trim_front();  // holds [3, 11)
  const CacheMask one = cache.make_mask(1, 0);
  ASSERT_EQ(one.spec.kind, MaskKind::boolean);  // key 3..7 are in the previous chunk
  EXPECT_EQ(mask_values(one), expected_mask(8, 3, 11, 1));
  EXPECT_EQ(mask_values(cache.make_mask(6, 2)), expected_mask(8, 3, 11, 6, 2));
  EXPECT_THROW(cache.make_mask(0, 0), Error);
  EXPECT_THROW(cache.make_mask(2, -1), Error);
}

class ChunkedStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvlab_chunked_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// docs/upstream-bugs.md §U4: mlx-lm reloads this cache with offset 260 (< start 295). Here the
// state holds the 5 valid rows and offset/start in meta, and the reload continues identically.
TEST_F(ChunkedStateTest, ReloadAfterTrimmingPastTheBufferKeepsOffsetAndStart) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 4);
  for (int i = 0; i < 300; ++i) {
    cache.maybe_trim_front();
    feed(be, cache, 1);
  }
  const CacheState state = cache.state();
  EXPECT_EQ(state.tensors.at("keys").shape(), (Shape{1, kHeads, 5, kDk}));
  EXPECT_EQ(state.meta.at("offset"), "300");
  EXPECT_EQ(state.meta.at("start_position"), "295");
  EXPECT_EQ(state.meta.at("chunk_size"), "4");

  const auto file = dir_ / "chunked.safetensors";
  save_cache_states(file, {state, ChunkedKVCache(be, 2).state()}, {{"model", "llama4"}});
  const LoadedStates loaded = load_cache_states(file);
  ASSERT_EQ(loaded.layers.size(), 2u);
  auto restored = ChunkedKVCache::from_state(be, loaded.layers[0]);
  EXPECT_EQ(restored->offset(), 300);
  EXPECT_EQ(restored->start_position(), 295);
  EXPECT_EQ(restored->chunk_size(), 4);
  EXPECT_EQ(token_ids(be, restored->fetch().keys), range_ids(295, 5));
  EXPECT_EQ(token_ids(be, restored->fetch().values), range_ids(kValueBase + 295, 5));
  auto empty = ChunkedKVCache::from_state(be, loaded.layers[1]);
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(empty->chunk_size(), 2);

  // save → load → continue equals continue (docs/design.md §Observables, item 5).
  for (std::int64_t s : {1, 3, 1, 6}) {
    cache.maybe_trim_front();
    restored->maybe_trim_front();
    EXPECT_EQ(mask_values(cache.make_mask(s, 0)), mask_values(restored->make_mask(s, 0)));
    const FetchedKV a = feed(be, cache, s);
    const FetchedKV b = feed(be, *restored, s);
    EXPECT_EQ(token_ids(be, a.keys), token_ids(be, b.keys));
    EXPECT_EQ(token_ids(be, a.values), token_ids(be, b.values));
    EXPECT_EQ(cache.offsets(), restored->offsets());
    EXPECT_EQ(cache.start_position(), restored->start_position());
  }
}

TEST(ChunkedKVCache, InconsistentStatesAreRejected) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 4);
  feed(be, cache, 6);
  cache.maybe_trim_front();
  const CacheState good = cache.state();
  ASSERT_NO_THROW(ChunkedKVCache::from_state(be, good));
  const std::vector<std::pair<const char*, std::function<void(CacheState&)>>> edits = {
      {"wrong class", [](CacheState& s) { s.class_name = "KVCache"; }},
      {"no offset", [](CacheState& s) { s.meta.erase("offset"); }},
      {"no start", [](CacheState& s) { s.meta.erase("start_position"); }},
      {"no chunk", [](CacheState& s) { s.meta.erase("chunk_size"); }},
      {"offset below start (mlx-lm reload)", [](CacheState& s) { s.meta["offset"] = "1"; }},
      {"rows disagree with offset", [](CacheState& s) { s.meta["offset"] = "7"; }},
      {"junk integer", [](CacheState& s) { s.meta["offset"] = "6x"; }},
      {"negative integer", [](CacheState& s) { s.meta["start_position"] = "-2"; }},
      {"zero chunk", [](CacheState& s) { s.meta["chunk_size"] = "0"; }},
      {"keys without values", [](CacheState& s) { s.tensors.erase("values"); }},
      {"unknown tensor", [](CacheState& s) { s.tensors.emplace("extra", Tensor(DType::f32, {1})); }},
      {"integer keys", [](CacheState& s) { s.tensors["keys"] = Tensor(DType::i32, {1, kHeads, 4, kDk}); }},
      {"rank-3 values", [](CacheState& s) { s.tensors["values"] = Tensor(DType::f32, {kHeads, 4, kDv}); }},
      {"no tensors but an offset", [](CacheState& s) { s.tensors.clear(); }},
  };
  for (const auto& [name, edit] : edits) {
    SCOPED_TRACE(name);
    CacheState s = good;
    edit(s);
    try {
      ChunkedKVCache::from_state(be, s);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
    }
  }
}

TEST(ChunkedKVCache, TrimRemovesNewestNeverBelowStartAndPoisons) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 4);
  feed(be, cache, 7);
  cache.maybe_trim_front();  // holds [3, 7), buffer 4 rows
  feed(be, cache, 2);        // holds [3, 9), buffer 4 + 256
  EXPECT_EQ(cache.trim(2), 2);
  EXPECT_EQ(cache.trim(100), 4);  // clamps to the valid tokens
  EXPECT_EQ(cache.offset(), 3);
  EXPECT_EQ(cache.start_position(), 3);
  EXPECT_EQ(cache.kv_length(), 0);
  const Tensor keys = be.download(cache.key_buffer());
  for (std::int64_t row = 0; row < cache.capacity(); ++row)
    EXPECT_TRUE(std::isnan(keys.view().load(row * kDk))) << "row " << row;
  const FetchedKV kv = feed(be, cache, 2);
  EXPECT_EQ(token_ids(be, kv.keys), range_ids(3, 2));
}

TEST(ChunkedKVCache, UnusedRowsArePoison) {
  ReferenceBackend be;
  ChunkedKVCache cache(be, 4);
  feed(be, cache, 5);
  cache.maybe_trim_front();
  feed(be, cache, 1);  // buffer = 4 kept + 256 new rows; rows 5.. never written
  const Tensor keys = be.download(cache.key_buffer());
  const Tensor values = be.download(cache.value_buffer());
  for (std::int64_t row = 0; row < cache.capacity(); ++row) {
    const bool live = row < cache.kv_length();
    EXPECT_EQ(std::isnan(keys.view().load(row * kDk)), !live) << "key row " << row;
    EXPECT_EQ(std::isnan(values.view().load(row * kDv + 1)), !live) << "value row " << row;
  }
}

TEST(ChunkedKVCache, MisuseIsANamedErrorAndChangesNothing) {
  ReferenceBackend be;
  for (std::int64_t bad : {0, -3}) {
    try {
      ChunkedKVCache c(be, bad);
      ADD_FAILURE() << "chunk_size " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  ChunkedKVCache cache(be, 4);
  feed(be, cache, 3);
  try {
    cache.update(token_block(be, {range_ids(3, 1)}, 3, kDk), token_block(be, {range_ids(3, 1)}, 3, kDv));
    ADD_FAILURE() << "a head-count change must be rejected";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("(1, 3, 1, 4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cache.update(token_block(be, {range_ids(3, 1)}, kHeads, kDk, DType::f16),
                            token_block(be, {range_ids(3, 1)}, kHeads, kDv, DType::f16)),
               Error);
  try {
    cache.trim(-1);
    ADD_FAILURE() << "trim(-1) accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cache.update_quantized(token_block(be, {range_ids(3, 1)}, kHeads, kDk),
                                      token_block(be, {range_ids(3, 1)}, kHeads, kDv)),
               Error);
  EXPECT_EQ(cache.offset(), 3);
  EXPECT_EQ(cache.start_position(), 0);
  EXPECT_EQ(token_ids(be, cache.fetch().keys), range_ids(0, 3));
  EXPECT_EQ(token_ids(be, feed(be, cache, 1).keys), range_ids(0, 4));
}

}  // namespace
}  // namespace test_chunked_kv_cache
}  // namespace kvlab
