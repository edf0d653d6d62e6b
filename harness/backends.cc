#include "harness/backends.h"

#include <mutex>

#include "harness/plugin_backend.h"
#include "kvlab/error.h"
#include "kvlab/suggest.h"
#include "reference/reference_backend.h"
#ifdef KVLAB_HAVE_SIMD
#include "kernels/simd/simd_backend.h"
#endif
#ifdef KVLAB_HAVE_VULKAN
#include "kernels/vulkan/vulkan_backend.h"
#endif
#ifdef KVLAB_HAVE_MLX
#include "kernels/mlx/mlx_backend.h"
#endif
#ifdef KVLAB_HAVE_GGML
#include "kernels/ggml/ggml_backend.h"
#endif

namespace kvlab::harness {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<BackendEntry>& registry() {
  static std::vector<BackendEntry> entries{
      {"reference", "host scalar oracle (double accumulation)", "the oracle of reference/, kernel by kernel",
       [](std::string_view variant) -> std::unique_ptr<Backend> {
         KVLAB_REQUIRE(variant.empty(), invalid_argument, "backend 'reference' has no variant '", variant, "'");
         return std::make_unique<ReferenceBackend>();
       }},
#ifdef KVLAB_HAVE_SIMD
      {"simd", "host SIMD (Highway, run-time dispatch)",
       "kernels/simd; 'simd' picks the best target, 'simd:<TARGET>' pins one (AVX3, AVX2, SSE4, SSSE3, SCALAR)",
       [](std::string_view variant) -> std::unique_ptr<Backend> {
         if (variant.empty()) return std::make_unique<SimdBackend>();
         return std::make_unique<SimdBackend>(variant);
       }},
#endif
#ifdef KVLAB_HAVE_VULKAN
      {"vulkan", "Vulkan compute (GLSL compute shaders, SPIR-V built by glslc)",
       "kernels/vulkan; 'vulkan' picks KVLAB_VK_DEVICE or the best device (discrete, integrated, CPU), "
       "'vulkan:<index|name>' pins one; ',words' / ',staging' / ',nosubgroup' force the fallback storage / memory / reduction paths; "
       "',validate' turns the validation layer on (messages on stderr); ',wg=<N>' sets how many workgroups an attention call aims for (tuning)",
       // No usable device: Error(unsupported) with the reason, which `kvlab check` reports
       // as every case UNIMPLEMENTED (check.cc) and `kvlab list` prints.
       [](std::string_view variant) { return make_vulkan_backend(variant); }},
#endif
      // Always listed: a build without the venv's MLX names why, and `kvlab check
      // --backend mlx` reports every case UNIMPLEMENTED with that reason.
      {"mlx",
#ifdef KVLAB_HAVE_MLX
       cat("MLX ", mlx_version(), " CPU (the pinned wheel of build/venv)"),
#else
       "MLX (not built)",
#endif
       "kernels/mlx: the real MLX library's kernels (quantize, RoPE, attention, moves) as a backend",
       [](std::string_view variant) -> std::unique_ptr<Backend> {
#ifdef KVLAB_HAVE_MLX
         return make_mlx_backend(variant);
#else
         (void)variant;
         fail(ErrorKind::unsupported, cat("backend 'mlx' is not built here: ", KVLAB_MLX_ABSENT_REASON));
#endif
       }},
      // Always listed, like mlx: a build without the ggml engine names why.
      {"ggml",
#ifdef KVLAB_HAVE_GGML
       cat(ggml_engine_version(), " CPU (build/ggml-engine)"),
#else
       "ggml (not built)",
#endif
       "kernels/ggml: llama.cpp's ggml (CPU backend) as a backend: its block formats' quantize/dequantize, "
       "flash attention (f32/f16/bf16 and block K/V); 'ggml:static_kv' keeps block K/V converted across calls (benchmarks)",
       [](std::string_view variant) -> std::unique_ptr<Backend> {
#ifdef KVLAB_HAVE_GGML
         return make_ggml_backend(variant);
#else
         (void)variant;
         fail(ErrorKind::unsupported, cat("backend 'ggml' is not built here: ", KVLAB_GGML_ABSENT_REASON));
#endif
       }},
      // Bring-your-own-kernel: a shared library speaking the C ABI of kvlab/plugin.h.
      {"plugin", "C plugin (kvlab/plugin.h ABI v1)",
       "harness/plugin_backend.h; 'plugin:/path/to/lib.so' loads a shared library exporting kvlab_plugin_entry",
       [](std::string_view variant) { return make_plugin_backend(variant); }},
  };
  return entries;
}

std::pair<std::string_view, std::string_view> split_name(std::string_view name) {
  const std::size_t colon = name.find(':');
  if (colon == std::string_view::npos) return {name, {}};
  return {name.substr(0, colon), name.substr(colon + 1)};
}

BackendEntry find_entry(std::string_view base) {
  const std::lock_guard lock(registry_mutex());
  std::string known;
  std::vector<std::string> names;
  for (const BackendEntry& e : registry()) {
    if (e.name == base) return e;
    known += cat(known.empty() ? "" : ", ", e.name);
    names.emplace_back(e.name);
  }
  fail(ErrorKind::invalid_argument,
       cat("unknown backend '", base, "'", did_you_mean(base, names), " (known: ", known, ")"));
}

}  // namespace

std::unique_ptr<Backend> make_backend(std::string_view name) {
  const auto [base, variant] = split_name(name);
  return find_entry(base).make(variant);
}

std::string backend_target(std::string_view name) {
  const auto [base, variant] = split_name(name);
  std::string target = find_entry(base).target;
  return variant.empty() ? target : cat(target, " ", variant);
}

std::vector<BackendEntry> backend_entries() {
  const std::lock_guard lock(registry_mutex());
  return registry();
}

void register_backend(BackendEntry entry) {
  const std::lock_guard lock(registry_mutex());
  for (BackendEntry& e : registry()) {
    if (e.name == entry.name) {
      e = std::move(entry);
      return;
    }
  }
  registry().push_back(std::move(entry));
}

}  // namespace kvlab::harness
