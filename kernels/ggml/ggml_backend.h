// The ggml backend: kvlab's Backend ops computed by llama.cpp's ggml (the CPU backend of
// the vendored ggml of the pinned llama-cpp-python sdist, built by tools/ggml/engine.sh),
// so the harness, the shrinker and the benchmarks judge the engine a llama.cpp user runs
// exactly as they judge kvlab's own kernels (docs/engines.md §The ggml backend). Host
// memory (HostMemoryBackend); each op maps its operands onto ggml tensors, builds a
// one-node graph and computes it on ggml's threadpool. Ops ggml has no equivalent for are
// not overridden (UNIMPLEMENTED, naming the op).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kvlab/backend.h"

namespace kvlab {

// "ggml 0.25.3 (llama-cpp-python 0.3.36)": the engine compiled against.
std::string ggml_engine_version();
// variant: empty, or "static_kv" — quantized K/V are converted to ggml's blocks on the
// first call that sees their buffers and reused while the same buffers come back, so a
// benchmark times ggml's kernel on fixed K/V, not kvlab's layout conversion (kvlab_bench
// makes `ggml` this way; never for a cache, whose K/V change in place). Throws
// Error(invalid_argument) for another variant.
std::unique_ptr<Backend> make_ggml_backend(std::string_view variant);

}  // namespace kvlab
