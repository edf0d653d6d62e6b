// Restoring caches by class name, deep copies, and whole-model cache files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

#include "cache/batch_kv_cache.h"
#include "cache/batch_quantized_kv_cache.h"
#include "cache/batch_rotating_kv_cache.h"
#include "cache/chunked_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "cache/turboquant_kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_registry {
namespace {

using testing::expect_same_state;

using testing::token_block;
using testing::token_ids;

std::vector<float> ids(float first, int n) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(first + static_cast<float>(i));
  return v;
}

std::filesystem::path temp_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvlab_registry_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

TEST(Registry, CloneIsADeepCopy) {
  ReferenceBackend be;
  KVCache cache(be);
  cache.update(token_block(be, {ids(1, 4)}, 2, 4), token_block(be, {ids(1, 4)}, 2, 4));
  const auto copy = clone_cache(cache);
  cache.trim(2);
  cache.update(token_block(be, {ids(50, 3)}, 2, 4), token_block(be, {ids(50, 3)}, 2, 4));
  auto& restored = dynamic_cast<KVCache&>(*copy);
  EXPECT_EQ(token_ids(be, restored.fetch().keys), ids(1, 4));
  EXPECT_EQ(restored.offsets(), std::vector<std::int32_t>{4});
}

TEST(Registry, UnknownClassIsCorrupt) {
  ReferenceBackend be;
  CacheState s{"MambaCache", {}, {}};
  testing::expect_error([&] { cache_from_state(be, s); }, ErrorKind::corrupt, {"MambaCache"});
}

// A model with mixed layer kinds saved to one file and loaded back continues exactly
// like the original (docs/design.md §Observables, item 5: save → load → continue equals
// continue).
TEST(Registry, MixedLayersRoundTripThroughAFile) {
  ReferenceBackend be;
  KVCache plain(be);
  RotatingKVCache ring(be, 4);
  QuantizedKVCache packed(be, QuantSpec{QuantMode::affine, 4, 32}, Rounding::mlx_gpu);
  plain.update(token_block(be, {ids(1, 6)}, 1, 32), token_block(be, {ids(1, 6)}, 1, 32));
  ring.update(token_block(be, {ids(1, 6)}, 1, 32), token_block(be, {ids(1, 6)}, 1, 32));
  packed.update_quantized(token_block(be, {ids(1, 6)}, 1, 32), token_block(be, {ids(1, 6)}, 1, 32));
  const auto path = temp_file("mixed.safetensors");
  save_caches(path, {&plain, &ring, &packed}, {{"model", "tiny"}});
  LoadedCaches loaded = load_caches(path, be);
  ASSERT_EQ(loaded.layers.size(), 3u);
  EXPECT_EQ(loaded.user_metadata.at("model"), "tiny");
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(loaded.layers[i]->class_name(), (std::vector<std::string>{"KVCache", "RotatingKVCache", "QuantizedKVCache"}[i]));
  const DTensor k = token_block(be, {ids(7, 1)}, 1, 32);
  EXPECT_EQ(token_ids(be, ring.update(k, k).keys), token_ids(be, loaded.layers[1]->update(k, k).keys));
  EXPECT_EQ(token_ids(be, plain.update(k, k).keys), token_ids(be, loaded.layers[0]->update(k, k).keys));
  const auto a = packed.update_quantized(k, k), b = loaded.layers[2]->update_quantized(k, k);
  EXPECT_TRUE(testing::bit_equal(be.download(a.keys.wq), be.download(b.keys.wq)));
  std::filesystem::remove_all(path.parent_path());
}

TEST(Registry, TruncatedFileIsRejectedAndNamesThePath) {
  ReferenceBackend be;
  KVCache plain(be);
  plain.update(token_block(be, {ids(1, 3)}, 1, 4), token_block(be, {ids(1, 3)}, 1, 4));
  const auto path = temp_file("truncated.safetensors");
  save_caches(path, {&plain});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 5);
  testing::expect_error([&] { load_caches(path, be); }, ErrorKind::corrupt, {path.string()});
  std::filesystem::remove_all(path.parent_path());
}

// ---- a cache trimmed back to no tokens round-trips -------------------------------------
//
// Issue 19: the deep property run found `Decode, Trim(1), SaveLoad` failing on KVCache
// (its state kept a zero-row block, and restoring it called update with S = 0). Every
// kind that can be trimmed to empty is saved there, restored in memory and through a
// state file, and continued next to an un-saved twin: each step must return the same
// bits, offsets and state.

void expect_same_quantized(Backend& be, const QuantizedDTensor& a, const QuantizedDTensor& b, const std::string& what) {
  EXPECT_TRUE(testing::bit_equal(be.download(a.wq), be.download(b.wq))) << what << " wq";
  EXPECT_TRUE(testing::bit_equal(be.download(a.scales), be.download(b.scales))) << what << " scales";
  EXPECT_EQ(static_cast<bool>(a.biases), static_cast<bool>(b.biases)) << what << " biases";
  if (a.biases && b.biases) {
    EXPECT_TRUE(testing::bit_equal(be.download(a.biases), be.download(b.biases))) << what << " biases";
  }
}

// One update of `rows` (token ids per batch row) on both caches, through the path the
// kind requires; what they return, their offsets and their states must agree.
void expect_same_update(Backend& be, Cache& twin, Cache& restored, const std::vector<std::vector<float>>& rows,
                        std::int64_t heads, std::int64_t dim, const std::string& what) {
  const DTensor k = token_block(be, rows, heads, dim), v = token_block(be, rows, heads, dim);
  if (twin.is_quantized()) {
    const FetchedQuantizedKV a = twin.update_quantized(k, v), b = restored.update_quantized(k, v);
    expect_same_quantized(be, a.keys, b.keys, what + " keys");
    expect_same_quantized(be, a.values, b.values, what + " values");
  } else {
    const FetchedKV a = twin.update(k, v), b = restored.update(k, v);
    EXPECT_TRUE(testing::bit_equal(be.download(a.keys), be.download(b.keys))) << what << " keys";
    EXPECT_TRUE(testing::bit_equal(be.download(a.values), be.download(b.values))) << what << " values";
  }
  EXPECT_EQ(twin.offsets(), restored.offsets()) << what;
  EXPECT_EQ(twin.kv_length(), restored.kv_length()) << what;
  expect_same_state(twin.state(), restored.state(), what + ": state");
}

// Token ids first.. of every batch row (row b starts 100·b higher).
std::vector<std::vector<float>> rows_of(std::int64_t batch, float first, int n) {
  std::vector<std::vector<float>> rows;
  for (std::int64_t b = 0; b < batch; ++b) rows.push_back(ids(first + 100.0f * static_cast<float>(b), n));
  return rows;
}

// Feeds `n` tokens to every row of `c` through the path its kind requires.
void feed(Backend& be, Cache& c, std::int64_t batch, std::int64_t heads, std::int64_t dim, float first, int n) {
  const DTensor k = token_block(be, rows_of(batch, first, n), heads, dim);
  if (c.is_quantized()) c.update_quantized(k, k);
  else c.update(k, k);
}

// `trimmed_empty` builds a cache that a trim left with no tokens (the same one each
// call). Its state restores, in memory and through a state file, to a cache with that
// very state, which then continues (prefill, decode, decode) like an un-saved twin.
void expect_empty_round_trip(Backend& be, const std::function<std::unique_ptr<Cache>()>& trimmed_empty,
                             std::int64_t batch, std::int64_t heads, std::int64_t dim) {
  const std::unique_ptr<Cache> saved = trimmed_empty();
  ASSERT_EQ(saved->kv_length(), 0) << "the setup must trim the cache to empty";
  const CacheState s = saved->state();
  std::unique_ptr<Cache> in_memory;
  ASSERT_NO_THROW(in_memory = cache_from_state(be, s));
  expect_same_state(in_memory->state(), s, "restored in memory");
  const auto path = temp_file(std::string(saved->class_name()) + "_trimmed_empty.safetensors");
  save_caches(path, {saved.get()});
  LoadedCaches loaded;
  ASSERT_NO_THROW(loaded = load_caches(path, be));
  std::filesystem::remove_all(path.parent_path());
  ASSERT_EQ(loaded.layers.size(), 1u);
  expect_same_state(loaded.layers[0]->state(), s, "restored from a file");
  for (Cache* restored : {in_memory.get(), loaded.layers[0].get()}) {
    const std::string what = restored == in_memory.get() ? "in memory" : "from a file";
    const std::unique_ptr<Cache> twin = trimmed_empty();
    EXPECT_EQ(restored->kv_length(), 0) << what;
    EXPECT_EQ(restored->offsets(), twin->offsets()) << what;
    expect_same_update(be, *twin, *restored, rows_of(batch, 50, 3), heads, dim, what + ", prefill(3)");
    expect_same_update(be, *twin, *restored, rows_of(batch, 53, 1), heads, dim, what + ", decode");
    expect_same_update(be, *twin, *restored, rows_of(batch, 54, 1), heads, dim, what + ", decode");
  }
}

constexpr std::int64_t kHeads = 2, kDim = 32;

TEST(TrimmedToEmpty, KVCacheRoundTrips) {
  ReferenceBackend be;
  expect_empty_round_trip(
      be,
      [&be] {
        auto c = std::make_unique<KVCache>(be);
        feed(be, *c, 1, kHeads, kDim, 1, 1);  // the deep run's Decode, Trim(1), SaveLoad
        EXPECT_EQ(c->trim(1), 1);
        return c;
      },
      1, kHeads, kDim);
}

TEST(TrimmedToEmpty, KVCacheAfterGrowthRoundTrips) {
  ReferenceBackend be;
  expect_empty_round_trip(
      be,
      [&be] {
        auto c = std::make_unique<KVCache>(be);
        feed(be, *c, 2, kHeads, kDim, 1, 300);  // past one 256-row step
        EXPECT_EQ(c->trim(305), 300);
        return c;
      },
      2, kHeads, kDim);
}

TEST(TrimmedToEmpty, RotatingKVCacheRoundTrips) {
  ReferenceBackend be;
  for (const std::int64_t keep : {0, 2}) {
    SCOPED_TRACE(keep);
    expect_empty_round_trip(
        be,
        [&be, keep] {
          auto c = std::make_unique<RotatingKVCache>(be, 8, keep);
          feed(be, *c, 1, kHeads, kDim, 1, 3);
          feed(be, *c, 1, kHeads, kDim, 4, 1);
          EXPECT_EQ(c->trim(4), 4);
          return c;
        },
        1, kHeads, kDim);
  }
}

TEST(TrimmedToEmpty, QuantizedKVCacheRoundTrips) {
  ReferenceBackend be;
  expect_empty_round_trip(
      be,
      [&be] {
        auto c = std::make_unique<QuantizedKVCache>(be, QuantSpec{QuantMode::affine, 4, 32}, Rounding::mlx_cpu);
        feed(be, *c, 1, kHeads, kDim, 1, 5);
        EXPECT_EQ(c->trim(9), 5);
        return c;
      },
      1, kHeads, kDim);
}

TEST(TrimmedToEmpty, ChunkedKVCacheRoundTrips) {
  ReferenceBackend be;
  // Trimmed to empty before and after a front trim (start_position 0 and 3).
  for (const bool front : {false, true}) {
    SCOPED_TRACE(front);
    expect_empty_round_trip(
        be,
        [&be, front] {
          auto c = std::make_unique<ChunkedKVCache>(be, 4);
          feed(be, *c, 1, kHeads, kDim, 1, 7);
          if (front) c->maybe_trim_front();
          EXPECT_EQ(c->trim(10), front ? 4 : 7);
          return c;
        },
        1, kHeads, kDim);
  }
}

TEST(TrimmedToEmpty, TurboQuantKVCacheRoundTrips) {
  ReferenceBackend be;
  for (const double bits : {4.0, 2.5}) {
    SCOPED_TRACE(bits);
    expect_empty_round_trip(
        be,
        [&be, bits] {
          auto c = std::make_unique<TurboQuantKVCache>(be, bits, 7);
          feed(be, *c, 1, kHeads, kDim, 1, 3);
          EXPECT_EQ(c->trim(3), 3);
          return c;
        },
        1, kHeads, kDim);
  }
}

TEST(TrimmedToEmpty, BatchKVCacheRoundTrips) {
  ReferenceBackend be;
  expect_empty_round_trip(
      be,
      [&be] {
        auto c = std::make_unique<BatchKVCache>(be, std::vector<std::int32_t>{2, 0});
        feed(be, *c, 2, kHeads, kDim, 1, 4);
        EXPECT_EQ(c->trim(4), 4);
        return c;
      },
      2, kHeads, kDim);
}

TEST(TrimmedToEmpty, BatchQuantizedKVCacheRoundTrips) {
  ReferenceBackend be;
  expect_empty_round_trip(
      be,
      [&be] {
        auto c = std::make_unique<BatchQuantizedKVCache>(be, std::vector<std::int32_t>{0, 1},
                                                         QuantSpec{QuantMode::affine, 4, 32}, Rounding::mlx_gpu);
        feed(be, *c, 2, kHeads, kDim, 1, 3);
        EXPECT_EQ(c->trim(3), 3);
        return c;
      },
      2, kHeads, kDim);
}

TEST(TrimmedToEmpty, BatchRotatingKVCacheRoundTrips) {
  ReferenceBackend be;
  expect_empty_round_trip(
      be,
      [&be] {
        auto c = std::make_unique<BatchRotatingKVCache>(be, 8, std::vector<std::int32_t>{1, 0});
        feed(be, *c, 2, kHeads, kDim, 1, 3);
        feed(be, *c, 2, kHeads, kDim, 4, 1);
        EXPECT_EQ(c->trim(4), 4);
        return c;
      },
      2, kHeads, kDim);
}

}  // namespace
}  // namespace test_registry
}  // namespace kvlab
