// What the mlx-lm prompt-cache reader (mlx_prompt_cache.cc) and writer
// (mlx_prompt_cache_write.cc) share; not part of the cache library's interface.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "cache/cache.h"
#include "core/safetensors.h"

namespace kvlab::mlx_prompt_cache {

inline constexpr const char* kNoun = "mlx-lm prompt cache file";
inline constexpr const char* kClasses =
    "KVCache, RotatingKVCache, QuantizedKVCache, ChunkedKVCache, BatchKVCache, BatchRotatingKVCache";
// mlx stores a Python bool as a 0-d BOOL tensor; kvlab has no bool dtype, and a BOOL is
// one byte holding 0 or 1, so it is read as U8 and remembered as a flag.
inline constexpr std::string_view kBoolCode = "BOOL";

// Whether kvlab's own cache accepts the state (its from_state checks every shape against
// the meta: ranks, dtypes, head dims against bits and group size, offsets against rows),
// on the host reference backend; the error, when not, in kvlab's words.
std::optional<std::string> rejected_by_kvlab(const CacheState& state);

}  // namespace kvlab::mlx_prompt_cache
