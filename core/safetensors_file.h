#pragma once

// File I/O around the safetensors container (core/safetensors.h): the atomic writer and
// the bounded reader every kvlab file format shares. Cache state files
// (cache/state_file.cc) and mlx-lm prompt-cache files (cache/mlx_prompt_cache.cc) differ
// in their naming and metadata, not in how bytes reach the disk, so that part is here.
// `noun` names the kind of file in every message ("cache state file").

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace kvlab::safetensors {

// A temporary next to the target, renamed over it by commit(): a reader sees the old
// file or the new one, never a mixture. Removed on destruction unless committed. Every
// failure is Error{io} naming the target.
class TempFile {
 public:
  TempFile(const std::filesystem::path& target, std::string noun);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();

  void write(const void* data, std::size_t size);
  void commit();  // fsync, close, rename over the target

 private:
  [[noreturn]] void fail_io(const char* step, int err) const;

  std::filesystem::path target_, path_;
  std::string noun_;
  int fd_ = -1;
  bool committed_ = false;
};

// A regular file opened for bounded reads; Error{io} when it cannot be opened or read,
// `errors` (kind corrupt) when it shrinks while being read.
class InputFile {
 public:
  InputFile(const std::filesystem::path& path, std::string noun, FileErrors errors);
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  std::uint64_t size() const { return size_; }
  // Reads exactly `size` bytes at `offset`; the caller has checked the range.
  void read(std::uint64_t offset, void* dst, std::size_t size) const;

 private:
  [[noreturn]] void fail_io(int err) const;

  std::filesystem::path path_;
  std::string noun_;
  FileErrors errors_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The bytes of a tensor entry that stay in `file`, from byte `start` of the file on
// (Tensor::deferred): each read is a positioned read, so the file is never held.
std::shared_ptr<const TensorBytes> file_bytes(std::shared_ptr<const InputFile> file, std::uint64_t start);

// Tensors up to this size are always read (bookkeeping: offsets, scalars); a reader that
// defers reads only them and the header.
inline constexpr std::uint64_t kDeferAboveBytes = std::uint64_t{64} << 10;

// The tensor of entry `e` of a file whose data buffer starts at `data_start`: deferred to
// `file` when it is over `defer_above` bytes (nullopt: never), else read now.
Tensor read_entry(const std::shared_ptr<const InputFile>& file, std::uint64_t data_start, const Entry& e,
                  std::optional<std::uint64_t> defer_above);

// Writes `t`'s bytes to `out`, a deferred tensor in bounded chunks (kvlab never holds a
// whole deferred tensor to copy it).
void write_tensor_bytes(TempFile& out, const Tensor& t);

// The length field and the JSON header of `file`, every size checked against the file
// before anything is allocated: fewer than 8 bytes, a header length past the end or over
// kMaxHeaderBytes are `errors`. data_start/data_size locate the data buffer.
struct Header {
  nlohmann::json json;
  std::uint64_t data_start = 0, data_size = 0;
};
Header read_header(const InputFile& file, const FileErrors& errors);

// A whole file of named tensors with string metadata, for formats whose tensor names
// carry no structure the reader must check while reading (model weights, goldens): the
// caller checks names, dtypes and shapes afterwards. Reading is strict (tiling, known
// dtypes, sizes against the file) and refuses files over `max_bytes` before reading
// any tensor; writing is atomic, tensors in name order.
struct TensorFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
TensorFile read_tensor_file(const std::filesystem::path& path, const std::string& noun, const FileErrors& errors,
                            std::uint64_t max_bytes);
// `max_bytes`: the reader's cap on the whole file, refused before anything is written.
void write_tensor_file(const std::filesystem::path& path, const std::string& noun, const TensorFile& file,
                       std::uint64_t max_bytes = UINT64_MAX);

}  // namespace kvlab::safetensors
