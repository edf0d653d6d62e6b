// The MLX backend: kvlab's Backend ops computed by the real MLX library (the pinned
// wheel of build/venv, its CPU backend), so the harness, the shrinker and the benchmarks
// judge a real engine's kernels exactly as they judge kvlab's own. Host memory
// (HostMemoryBackend); each op wraps the operands as MLX arrays, evaluates MLX's op and
// copies the result into the output tensor. Ops MLX has no equivalent for are not
// overridden (UNIMPLEMENTED, naming the op).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kvlab/backend.h"

namespace kvlab {

// The MLX version compiled against ("0.32.4").
std::string mlx_version();
// variant: empty (MLX's CPU device). Throws Error(invalid_argument) for another variant.
std::unique_ptr<Backend> make_mlx_backend(std::string_view variant);

}  // namespace kvlab
