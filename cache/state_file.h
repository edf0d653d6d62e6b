// The cache state file: a list of per-layer CacheStates in one safetensors container
// (docs/semantics.md §State files), written atomically and read strictly.
//
// Layout (standard safetensors, readable by any safetensors reader):
//   [8 bytes: header length N, u64 little-endian]
//   [N bytes: JSON object, padded with trailing spaces to a multiple of 8]
//   [data region: the raw little-endian bytes of every tensor, packed]
// Header entries:
//   "L.<layer>.<tensor name>": {"dtype", "shape", "data_offsets": [begin, end)}
//       dtype one of F32 F16 BF16 U32 I32 U8; offsets relative to the data region.
//   "__metadata__": string → string:
//       "kvlab.format"       = kStateFileFormat
//       "kvlab.layers"       = number of layers (decimal)
//       "L.<layer>.class"    = the cache's class name (required, non-empty)
//       "L.<layer>.meta.<k>" = the cache's meta[k]
//       "user.<key>"         = user metadata; keys round-trip verbatim, dots included
//                              (mlx-lm's tree_unflatten nests dotted keys,
//                              docs/semantics.md §mlx-lm prompt-cache files).
// Layer indices are canonical decimals (no sign, no leading zeros). A tensor or meta
// name is everything after "L.<layer>.", so it may itself contain dots.
//
// Writer: tensors are packed in layer order, then name order, with no gaps; the file is
// written to a unique temporary in the target's directory, fsynced, and renamed over the
// target, so a reader sees either the old file or the new one, never a mixture. Any
// failure removes the temporary and throws Error{io} naming the path.
//
// Reader: strict. Every defect is an Error of kind io (cannot open/read) or corrupt
// (content), naming the offending entry: short file, header length beyond the file,
// non-JSON or non-object header, duplicate JSON keys, unknown dtype, bad shape, offsets
// out of range or not matching shape × dtype size, overlapping tensors, gaps or
// trailing bytes in the data region (the data region must be exactly the tensors, back
// to back, as the reference safetensors reader also requires), unknown header keys,
// layer entries outside [0, layers), a layer without a class, non-string metadata, and
// a wrong format version. Every size is checked against the file size before anything
// is allocated, so a lying header cannot cause a huge allocation.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

// Version string of the layout above. Bump it when the layout changes incompatibly; a
// reader accepts exactly this value.
inline constexpr const char* kStateFileFormat = "kvlab.cache_states/1";

struct LoadedStates {
  std::vector<CacheState> layers;
  std::map<std::string, std::string> user_metadata;
  // Layers kept only to be described (load_mlx_prompt_cache's keep_unsupported): index →
  // why kvlab cannot restore them. Empty for every load that restores.
  std::map<std::size_t, std::string> unsupported;
};

// Writes layers and user metadata to `path` atomically. Throws Error{invalid_argument}
// for a state that cannot be represented (empty class name, empty tensor name, invalid
// UTF-8 in a string) before touching the file system, and Error{io} for any file system
// failure; in both cases an existing file at `path` is left byte-identical.
// Deferred tensors (from a deferred load) are copied from their file in bounded chunks.
void save_cache_states(const std::filesystem::path& path, const std::vector<CacheState>& layers,
                       const std::map<std::string, std::string>& user_metadata);

// How a loader treats tensor bytes: read them all, or leave every tensor over 64 KiB in
// the file as a deferred tensor (kvlab/tensor.h) read on demand, so that a file of tens
// of GB is checked and described from its header and scalars (docs/large-files.md). A
// deferred state restores on a ShapeBackend (cache/shape_backend.h) without reading its
// K/V, on any other backend by reading them.
// deferred_all defers every tensor however small: the tests of the deferred path use it
// to show that no reader or checker touches a byte it does not need.
enum class TensorLoad { eager, deferred, deferred_all };

// The size over which `load` leaves a tensor in its file (nullopt: none is left).
std::optional<std::uint64_t> defer_above(TensorLoad load);

// Reads a file written by save_cache_states; see the reader rules above.
LoadedStates load_cache_states(const std::filesystem::path& path, TensorLoad load = TensorLoad::eager);

}  // namespace kvlab
