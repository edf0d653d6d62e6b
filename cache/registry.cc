#include "cache/registry.h"

#include <map>
#include <string>

#include "cache/catalogue.h"
#include "cache/state_file.h"
#include "cache/turboquant_kv_cache.h"

namespace kvlab {

std::unique_ptr<Cache> cache_from_state(Backend& backend, const CacheState& state) {
  const CacheKindInfo* kind = find_cache_class(state.class_name);
  KVLAB_REQUIRE(kind != nullptr, corrupt, "unknown cache class '", state.class_name, "' in a cache state");
  return kind->from_state(backend, state);
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
