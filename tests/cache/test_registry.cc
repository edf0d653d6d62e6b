// Restoring caches by class name, deep copies, and whole-model cache files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
namespace {

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
// like the original (DESIGN.md observable 5: save → load → continue equals continue).
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

}  // namespace
}  // namespace kvlab
