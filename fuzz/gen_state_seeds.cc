// Writes the seed corpus of fuzz_state_file: small state files of every cache class, as
// save_caches writes them, so the fuzzer starts from files the loader and each class's
// from_state accept. Run once after a format change (fuzz/README.md):
//   build/fuzz/fuzz/fuzz_gen_state_seeds fuzz/corpus/state_file
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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

namespace {

using namespace kvlab;

// (B, 1 head, S, 32) f32 keys/values with distinct small values.
DTensor block(Backend& be, std::int64_t batch, std::int64_t tokens, float first) {
  Tensor t(DType::f32, {batch, 1, tokens, 32});
  const TensorView v = t.view();
  for (std::int64_t i = 0; i < t.numel(); ++i) v.store(i, first + static_cast<float>(i % 97) / 8.0f);
  return be.upload(t);
}

void feed(Cache& c, std::int64_t batch, std::int64_t tokens) {
  const DTensor k = block(c.backend(), batch, tokens, 1), v = block(c.backend(), batch, tokens, -1);
  if (c.is_quantized()) {
    c.update_quantized(k, v);
  } else {
    c.update(k, v);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output directory>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  ReferenceBackend be;
  const QuantSpec q4{QuantMode::affine, 4, 32};
  std::vector<std::pair<std::string, std::unique_ptr<Cache>>> caches;
  caches.emplace_back("kv", std::make_unique<KVCache>(be));
  caches.emplace_back("rotating", std::make_unique<RotatingKVCache>(be, 4));
  caches.emplace_back("quantized", std::make_unique<QuantizedKVCache>(be, q4, Rounding::mlx_gpu));
  caches.emplace_back("chunked", std::make_unique<ChunkedKVCache>(be, 4));
  caches.emplace_back("batch_kv", std::make_unique<BatchKVCache>(be, std::vector<std::int32_t>{1, 0}));
  caches.emplace_back("batch_rotating",
                      std::make_unique<BatchRotatingKVCache>(be, 4, std::vector<std::int32_t>{0, 2}));
  caches.emplace_back("batch_quantized", std::make_unique<BatchQuantizedKVCache>(
                                             be, std::vector<std::int32_t>{0, 1}, q4, Rounding::mlx_cpu));
  caches.emplace_back("turboquant", std::make_unique<TurboQuantKVCache>(be, 3.0));
  std::vector<const Cache*> all;
  for (auto& [name, cache] : caches) {
    const std::int64_t batch = name.rfind("batch", 0) == 0 ? 2 : 1;
    feed(*cache, batch, 3);
    feed(*cache, batch, 2);
    save_caches(dir / (name + ".safetensors"), {cache.get()});
    all.push_back(cache.get());
  }
  // Every class as the layers of one model, with user metadata.
  save_caches(dir / "all_layers.safetensors", all, {{"model", "tiny"}, {"dotted.key", "v"}});
  // An empty model: no layers at all.
  save_caches(dir / "no_layers.safetensors", {});
  return 0;
}
