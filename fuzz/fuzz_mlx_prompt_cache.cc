// The mlx-lm prompt-cache reader and writer (cache/mlx_prompt_cache.h): any bytes as an
// mlx-lm file. Properties:
//   * a file the reader accepts holds valid kvlab caches (the reader checks every layer
//     with from_state, so cache_from_state must accept each one here);
//   * reader → writer → reader agrees: the reloaded layers (class, tensors bit for bit,
//     meta) and user metadata equal the first load, and writing again gives the same
//     bytes. The only states the writer may refuse after the reader accepted them are
//     user metadata keys mlx-lm itself would not give back (dotted or numeric), by design.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "cache/mlx_prompt_cache.h"
#include "cache/registry.h"
#include "fuzz/fuzz_util.h"
#include "kvlab/error.h"
#include "reference/reference_backend.h"

namespace {

bool same_tensor(const kvlab::Tensor& a, const kvlab::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

bool same_states(const kvlab::LoadedStates& a, const kvlab::LoadedStates& b) {
  if (a.user_metadata != b.user_metadata || a.layers.size() != b.layers.size()) return false;
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const kvlab::CacheState &x = a.layers[i], &y = b.layers[i];
    if (x.class_name != y.class_name || x.meta != y.meta || x.tensors.size() != y.tensors.size()) return false;
    for (auto ix = x.tensors.begin(), iy = y.tensors.begin(); ix != x.tensors.end(); ++ix, ++iy)
      if (ix->first != iy->first || !same_tensor(ix->second, iy->second)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const kvlab::fuzz::ScratchFile input("mlx.safetensors"), saved("saved.safetensors");
  static kvlab::ReferenceBackend backend;
  input.write(std::string_view(reinterpret_cast<const char*>(data), size));
  kvlab::LoadedStates first;
  try {
    first = kvlab::load_mlx_prompt_cache(input.path());
  } catch (const kvlab::Error&) {
    return 0;  // rejected file: the expected outcome
  }
  for (const kvlab::CacheState& layer : first.layers) (void)kvlab::cache_from_state(backend, layer);

  try {
    kvlab::save_mlx_prompt_cache(saved.path(), first.layers, first.user_metadata);
  } catch (const kvlab::Error& e) {
    KVLAB_FUZZ_CHECK(std::string(e.what()).find("would not survive mlx-lm's tree_unflatten") != std::string::npos);
    return 0;
  }
  const std::string bytes = saved.read();
  const kvlab::LoadedStates second = kvlab::load_mlx_prompt_cache(saved.path());
  KVLAB_FUZZ_CHECK(same_states(first, second));
  kvlab::save_mlx_prompt_cache(saved.path(), second.layers, second.user_metadata);
  KVLAB_FUZZ_CHECK(saved.read() == bytes);
  return 0;
}
