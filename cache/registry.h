// Rebuilding caches from their serialized state by class name: loading files, and deep
// copies (a stored prefix-cache entry must never alias a live buffer, vllm-mlx#642).
#pragma once

#include <memory>

#include "cache/cache.h"

namespace kvlab {

// The cache a state describes, on `backend`. Throws corrupt for an unknown class name
// or an invalid state (nothing is half-built).
std::unique_ptr<Cache> cache_from_state(Backend& backend, const CacheState& state);

// An independent deep copy of `cache` (on the same backend): its state, restored.
std::unique_ptr<Cache> clone_cache(const Cache& cache);

}  // namespace kvlab
