// The cache state-file loader (cache/state_file.h) and the caches it feeds
// (cache/registry.h): any bytes as a state file. Properties:
//   * load -> save -> load agrees: the reloaded layers (class, tensors bit for bit,
//     meta) and user metadata equal the first load, and saving them again writes the
//     same bytes (the writer is deterministic);
//   * a layer that cache_from_state accepts gives a cache whose state() restores
//     (cache_from_state again) to a cache with the same state(): what clone_cache does.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>

#include "cache/registry.h"
#include "cache/state_file.h"
#include "fuzz/fuzz_util.h"
#include "kvlab/error.h"
#include "reference/reference_backend.h"

namespace {

bool same_tensor(const kvlab::Tensor& a, const kvlab::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

bool same_state(const kvlab::CacheState& a, const kvlab::CacheState& b) {
  if (a.class_name != b.class_name || a.meta != b.meta || a.tensors.size() != b.tensors.size()) return false;
  for (auto ia = a.tensors.begin(), ib = b.tensors.begin(); ia != a.tensors.end(); ++ia, ++ib)
    if (ia->first != ib->first || !same_tensor(ia->second, ib->second)) return false;
  return true;
}

bool same_states(const kvlab::LoadedStates& a, const kvlab::LoadedStates& b) {
  if (a.user_metadata != b.user_metadata || a.layers.size() != b.layers.size()) return false;
  for (std::size_t i = 0; i < a.layers.size(); ++i)
    if (!same_state(a.layers[i], b.layers[i])) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The loader and the writer take paths; both files are per-process and in RAM.
  static const kvlab::fuzz::ScratchFile input("state.safetensors"), saved("saved.safetensors");
  static kvlab::ReferenceBackend backend;
  input.write(std::string_view(reinterpret_cast<const char*>(data), size));
  kvlab::LoadedStates first;
  try {
    first = kvlab::load_cache_states(input.path());
  } catch (const kvlab::Error&) {
    return 0;  // rejected file: the expected outcome
  }

  // A file the reader accepted holds nothing the writer refuses; any Error from here on
  // escapes and is reported as a crash.
  kvlab::save_cache_states(saved.path(), first.layers, first.user_metadata);
  const std::string bytes = saved.read();
  const kvlab::LoadedStates second = kvlab::load_cache_states(saved.path());
  KVLAB_FUZZ_CHECK(same_states(first, second));
  kvlab::save_cache_states(saved.path(), second.layers, second.user_metadata);
  KVLAB_FUZZ_CHECK(saved.read() == bytes);

  for (const kvlab::CacheState& layer : first.layers) {
    std::unique_ptr<kvlab::Cache> cache;
    try {
      cache = kvlab::cache_from_state(backend, layer);
    } catch (const kvlab::Error&) {
      continue;  // not a valid cache: the expected outcome
    }
    const kvlab::CacheState state = cache->state();
    const std::unique_ptr<kvlab::Cache> clone = kvlab::cache_from_state(backend, state);
    KVLAB_FUZZ_CHECK(same_state(clone->state(), state));
  }
  return 0;
}
