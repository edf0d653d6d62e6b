// Rebuilding caches from their serialized state by class name: loading files, and deep
// copies (a stored prefix-cache entry must never alias a live buffer, vllm-mlx#642).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

// The cache a state describes, on `backend`. Throws corrupt for an unknown class name
// or an invalid state (nothing is half-built).
std::unique_ptr<Cache> cache_from_state(Backend& backend, const CacheState& state);

// An independent deep copy of `cache` (on the same backend): its state, restored.
std::unique_ptr<Cache> clone_cache(const Cache& cache);

// A model's per-layer caches in one safetensors file (cache/state_file.h), written
// atomically. Loading restores every layer or throws: a corrupt, truncated or
// mismatched file never yields a half-loaded list, and caches already in memory are
// untouched because loading builds new objects.
void save_caches(const std::filesystem::path& path, const std::vector<const Cache*>& layers,
                 const std::map<std::string, std::string>& user_metadata = {});
struct LoadedCaches {
  std::vector<std::unique_ptr<Cache>> layers;
  std::map<std::string, std::string> user_metadata;
};
LoadedCaches load_caches(const std::filesystem::path& path, Backend& backend);

}  // namespace kvlab
