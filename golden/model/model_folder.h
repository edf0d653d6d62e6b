// The model folders `kvlab golden` generates under --models: one per checked-in model
// (golden/models/<id>: config.json and the SHA-256 of the weights its generator writes),
// made on demand and verified, so goldens are always recorded over the checked-in weights.
//
// A folder may also hold weights kvlab did not write — a user trying their own model in
// the folder kvlab made, or pointing --models at their own folders. Those are never
// overwritten: kvlab stamps what it writes with a sidecar file, `model.kvlab-generated`
// (`<sha256>  model.safetensors`, the format `sha256sum -c` checks), and regenerates
// stale weights only when the stamp names exactly the file that is there. A stamp beside
// the weights, not inside them, keeps the checked-in hashes those of the weights alone.
#pragma once

#include <filesystem>
#include <string>

namespace kvlab::golden {

inline constexpr const char* kGeneratedStamp = "model.kvlab-generated";

struct ModelFolder {
  std::filesystem::path dir;  // config.json, model.safetensors, the stamp
  std::string sha256;         // of model.safetensors, equal to the checked-in hash
  bool generated = false;     // written by this call
};

// The folder of model `id` under `models_dir`, from `<golden_dir>/models/<id>`:
//  - used as it is when its weights have the checked-in hash and its config is the
//    checked-in one (stamped if it was not: the bytes are kvlab's own);
//  - generated when there are no weights, or when the stamp names the weights there;
//  - otherwise Error(invalid_argument) naming the path, both hashes and what to do.
// Error(internal) when freshly generated weights miss the checked-in hash (the generator
// changed). Every path read must be a regular file (Error(io) otherwise).
ModelFolder ensure_model_folder(const std::filesystem::path& golden_dir, const std::string& id,
                                const std::filesystem::path& models_dir);

}  // namespace kvlab::golden
