#include "cache/registry.h"

#include <functional>
#include <map>
#include <string>

#include "cache/batch_kv_cache.h"
#include "cache/batch_quantized_kv_cache.h"
#include "cache/batch_rotating_kv_cache.h"
#include "cache/chunked_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "cache/state_file.h"
#include "cache/turboquant_kv_cache.h"

namespace kvlab {

namespace {

using Factory = std::function<std::unique_ptr<Cache>(Backend&, const CacheState&)>;

template <class T>
Factory factory() {
  return [](Backend& be, const CacheState& s) -> std::unique_ptr<Cache> { return T::from_state(be, s); };
}

const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> table{
      {"KVCache", factory<KVCache>()},
      {"RotatingKVCache", factory<RotatingKVCache>()},
      {"QuantizedKVCache", factory<QuantizedKVCache>()},
      {"ChunkedKVCache", factory<ChunkedKVCache>()},
      {"BatchRotatingKVCache", factory<BatchRotatingKVCache>()},
      {"BatchKVCache", factory<BatchKVCache>()},
      {"BatchQuantizedKVCache", factory<BatchQuantizedKVCache>()},
      {"TurboQuantKVCache", factory<TurboQuantKVCache>()},
  };
  return table;
}

}  // namespace

std::unique_ptr<Cache> cache_from_state(Backend& backend, const CacheState& state) {
  const auto it = factories().find(state.class_name);
  KVLAB_REQUIRE(it != factories().end(), corrupt, "unknown cache class '", state.class_name, "' in a cache state");
  return it->second(backend, state);
}

std::unique_ptr<Cache> clone_cache(const Cache& cache) { return cache_from_state(cache.backend(), cache.state()); }

void save_caches(const std::filesystem::path& path, const std::vector<const Cache*>& layers,
                 const std::map<std::string, std::string>& user_metadata) {
  std::vector<CacheState> states;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    KVLAB_REQUIRE(layers[i] != nullptr, invalid_argument, "layer ", i, " to save is null");
    states.push_back(layers[i]->state());
  }
  save_cache_states(path, states, user_metadata);
}

LoadedCaches load_caches(const std::filesystem::path& path, Backend& backend) {
  LoadedStates loaded = load_cache_states(path);
  LoadedCaches out;
  out.user_metadata = std::move(loaded.user_metadata);
  for (std::size_t i = 0; i < loaded.layers.size(); ++i) {
    try {
      out.layers.push_back(cache_from_state(backend, loaded.layers[i]));
    } catch (const Error& e) {
      fail(e.kind(), cat(path.string(), ": layer ", i, ": ", e.what()));
    }
  }
  return out;
}

}  // namespace kvlab
