#include "cache/registry.h"

#include <functional>
#include <map>
#include <string>

#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"

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

}  // namespace kvlab
