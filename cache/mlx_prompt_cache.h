// mlx-lm prompt-cache files (save_prompt_cache / load_prompt_cache of mlx-lm 0.32.2), read
// into and written from kvlab's CacheStates, so a prompt cache moves both ways between
// kvlab and mlx-lm. The container is the same safetensors file as kvlab's own state
// files (cache/state_file.h); the naming and metadata are mlx-lm's.
//
// The layout, as mlx-lm 0.32.2 writes it (read from its cache.py; later layouts add
// per-class meta_state strings, see "Differences from later layouts" below):
//   tensors  "<layer>.<field>"        one per entry of the class's `state` tuple;
//            "<layer>.<field>.<part>" for a tuple inside it (QuantizedKVCache's keys and
//                                     values are (wq, scales, biases));
//   Python scalars in `state` are stored as 0-d arrays (int → I32, bool → BOOL) and None
//   as an empty F32 array of shape (0,);
//   __metadata__ = tree_flatten([user_metadata, class_names, scalars]):
//     "0.<key>"  user metadata,   "1.<layer>"  the class name,
//     "2.0" = "" (a placeholder so the list is never empty), then for each converted
//     scalar j ≥ 1: "2.<j>.0" = the tensor key, "2.<j>.1" = "scalar" | "string" | "none".
// Fields per class (the order of its `state`):
//   KVCache               keys, values, offset
//   RotatingKVCache       keys, values, offset, keep, max_size, _idx
//   QuantizedKVCache      (wq, scales, biases) of keys, of values, offset, group_size, bits
//   ChunkedKVCache        keys, values, offset, chunk_size, start_position
//   BatchKVCache          keys, values, offset[B], left_padding[B], _idx
//   BatchRotatingKVCache  keys, values, offset[B], left_padding[B], max_size, _offset,
//                         _idx, rotated
//
// The mapping to kvlab's CacheStates (each class's state()/from_state in cache/*.cc):
// * mlx-lm stores whole buffers, step-padded (256 rows) beyond the live rows; kvlab
//   stores the live rows only. Reading keeps the live rows: offset rows (KVCache,
//   QuantizedKVCache), min(offset, rows) (RotatingKVCache), offset − start_position
//   (ChunkedKVCache), _idx (BatchKVCache, and BatchRotatingKVCache unless rotated, when
//   it is the whole ring). Writing stores kvlab's live rows; mlx-lm grows the buffer on
//   its next update, and what update_and_fetch returns is the same.
// * An empty cache (keys None) is a state without tensors in kvlab, and the reverse; a
//   state with zero live rows (trimmed to nothing) reads as one without tensors, as
//   kvlab's caches save it, except ChunkedKVCache, which kvlab saves with zero-row
//   blocks once allocated (its start_position may be > 0 then).
// * QuantizedKVCache: mlx-lm 0.32.2 quantizes affine only and records no rounding; read
//   states get mode "affine" and rounding "mlx" (the flavour bit-exact with the pinned
//   MLX on the CPU, include/kvlab/quant_spec.h; a file from Metal would want mlx_gpu,
//   which the file cannot say). So a kvlab state's rounding does not survive the trip:
//   it comes back as "mlx". Writing refuses any mode but affine (mxfp4, ...).
// * Lossy in mlx-lm, refused by the writer rather than silently dropped: a BatchKVCache
//   between prepare(right_padding) and finalize (its _right_padding is not in `state`),
//   a BatchRotatingKVCache with pending _lengths (same), user metadata keys that
//   tree_unflatten would not give back verbatim (empty, containing '.', all digits).
//
// Differences from later layouts and their losses (docs/semantics.md §mlx-lm prompt-cache files,
// docs/upstream-bugs.md §U4, §U5), where the pinned library wins:
// * 0.32.2 has no meta_state in the file: metadata is [user, classes, scalars], not
//   [meta_states, user, classes], and integer fields are 0-d I32 tensors.
// * BatchRotatingKVCache `rotated` is a 0-d BOOL tensor read back with .item(), so it
//   round-trips; the bool("False") == True loss of later layouts does not happen here.
// * ChunkedKVCache's state is its whole buffer with offset and start_position, so the
//   "wrong offset after trimming" loss does not happen either.
// * An empty KVCache can be saved (keys None becomes a "none" scalar).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cache/state_file.h"

namespace kvlab {

// The mlx-lm release whose format this is.
inline constexpr const char* kMlxPromptCacheVersion = "mlx-lm 0.32.2";

enum class StateFileFormat { kvlab, mlx_lm };
const char* state_file_format_name(StateFileFormat f);  // "kvlab" / "mlx-lm"

// Which of the two formats `path` holds, from its header alone. Error{corrupt} naming
// the file when it is neither (or not a safetensors file at all), Error{io} when it
// cannot be read.
StateFileFormat detect_state_file_format(const std::filesystem::path& path);

// Reads an mlx-lm prompt-cache file. Strict: every defect is Error{corrupt} naming the
// key or value (unknown class, missing or unexpected fields, wrong dtypes or shapes,
// shapes inconsistent with the offsets, truncation); sizes are checked against the file
// before anything is allocated.
// A layer of a class kvlab does not model (ArraysCache, MambaCache, CacheList of SSM and
// hybrid models) is Error{unsupported}; with `keep_unsupported` it is kept instead as
// its class name and raw tensors, listed in LoadedStates::unsupported, for describing.
LoadedStates load_mlx_prompt_cache(const std::filesystem::path& path, TensorLoad load = TensorLoad::eager,
                                   bool keep_unsupported = false);

// Writes kvlab states as a file mlx-lm's load_prompt_cache loads and continues from,
// atomically. Error{invalid_argument} naming the layer and value for a state mlx-lm
// cannot represent (see above) before the file system is touched.
void save_mlx_prompt_cache(const std::filesystem::path& path, const std::vector<CacheState>& layers,
                           const std::map<std::string, std::string>& user_metadata);

// Either format, detected; `format` receives which.
LoadedStates load_any_cache_states(const std::filesystem::path& path, StateFileFormat* format = nullptr,
                                   TensorLoad load = TensorLoad::eager, bool keep_unsupported = false);

}  // namespace kvlab
