#include "core/safetensors_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace kvlab::safetensors {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::filesystem::path directory_of(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

}  // namespace

TempFile::TempFile(const std::filesystem::path& target, std::string noun) : target_(target), noun_(std::move(noun)) {
  static std::atomic<unsigned> counter{0};
  int err = EEXIST;
  for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
    // The name is cut so the temporary stays within NAME_MAX for any valid target name.
    path_ = directory_of(target) /
            cat(".", target.filename().string().substr(0, 200), ".tmp-", ::getpid(), "-", counter.fetch_add(1));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    err = errno;
  }
  fail(ErrorKind::io, cat("cannot write ", noun_, " '", target.string(), "': creating temporary '", path_.string(),
                          "' failed: ", errno_text(err)));
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

void TempFile::write(const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("writing", n < 0 ? errno : EIO);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void TempFile::commit() {
  if (::fsync(fd_) != 0) fail_io("fsync of the temporary", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail_io("closing the temporary", errno);
  if (::rename(path_.c_str(), target_.c_str()) != 0) fail_io("renaming the temporary over it", errno);
  committed_ = true;
  // Make the rename itself durable. Best effort: the new file is already in place and
  // complete, and some file systems do not support fsync on a directory.
  const int dfd = ::open(directory_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void TempFile::fail_io(const char* step, int err) const {
  fail(ErrorKind::io, cat("cannot write ", noun_, " '", target_.string(), "': ", step, " failed: ", errno_text(err)));
}

InputFile::InputFile(const std::filesystem::path& path, std::string noun, FileErrors errors)
    : path_(path), noun_(std::move(noun)), errors_(std::move(errors)) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever;
  // it is refused below like every file that is not regular.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) fail(ErrorKind::io, cat("cannot open ", noun_, " '", path.string(), "': ", errno_text(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fail(ErrorKind::io, cat("cannot read ", noun_, " '", path_.string(), "': ", errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail(ErrorKind::io, cat(noun_, " '", path.string(), "' is not a regular file"));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  (void)::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::read(std::uint64_t offset, void* dst, std::size_t size) const {
  const auto result = read_exact_at(fd_, offset, dst, size);
  if (result.error != 0) fail_io(result.error);
  if (result.ended_at) errors_.raise(cat("file ended at byte ", *result.ended_at, " (it shrank while being read)"));
}

void InputFile::fail_io(int err) const {
  fail(ErrorKind::io, cat("cannot read ", noun_, " '", path_.string(), "': ", errno_text(err)));
}

namespace {

class FileBytes final : public TensorBytes {
 public:
  FileBytes(std::shared_ptr<const InputFile> file, std::uint64_t start) : file_(std::move(file)), start_(start) {}
  void read(std::uint64_t offset, void* dst, std::size_t size) const override { file_->read(start_ + offset, dst, size); }

 private:
  std::shared_ptr<const InputFile> file_;
  std::uint64_t start_;
};

// What one write moves from a deferred tensor: large enough for sequential disk speed,
// small against any memory limit a user sets.
constexpr std::size_t kCopyChunkBytes = std::size_t{8} << 20;

}  // namespace

std::shared_ptr<const TensorBytes> file_bytes(std::shared_ptr<const InputFile> file, std::uint64_t start) {
  return std::make_shared<FileBytes>(std::move(file), start);
}

Tensor read_entry(const std::shared_ptr<const InputFile>& file, std::uint64_t data_start, const Entry& e,
                  std::optional<std::uint64_t> defer_above) {
  if (defer_above && e.end - e.begin > *defer_above) return Tensor::deferred(e.dtype, e.shape, file_bytes(file, data_start + e.begin));
  Tensor t(e.dtype, e.shape);
  if (e.end > e.begin) file->read(data_start + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
  return t;
}

void write_tensor_bytes(TempFile& out, const Tensor& t) {
  const std::size_t total = t.nbytes();
  if (total == 0) return;
  if (!t.is_deferred()) return out.write(t.data(), total);
  // One buffer per thread for every copy: a run converting hundreds of tensors allocates
  // it once (under ASan, freed chunks would otherwise pile up in its quarantine).
  thread_local std::vector<std::byte> chunk;
  chunk.resize(std::min(total, kCopyChunkBytes));
  for (std::size_t at = 0; at < total; at += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), total - at);
    t.read_bytes(at, chunk.data(), n);
    out.write(chunk.data(), n);
  }
}

Header read_header(const InputFile& file, const FileErrors& errors) {
  if (file.size() < 8) errors.raise(cat("the file has ", file.size(), " bytes, fewer than the 8-byte header length"));
  unsigned char length[8];
  file.read(0, length, sizeof length);
  const std::uint64_t header_size = decode_length(length);
  if (header_size > file.size() - 8)
    errors.raise(cat("the header length ", header_size, " exceeds the ", file.size() - 8, " bytes after it"));
  if (header_size > kMaxHeaderBytes)
    errors.raise(cat("the header length ", header_size, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  std::string text(static_cast<std::size_t>(header_size), '\0');
  file.read(8, text.data(), text.size());
  Header out;
  out.json = parse_header(text, errors);
  out.data_start = 8 + header_size;
  out.data_size = file.size() - out.data_start;
  return out;
}

}  // namespace kvlab::safetensors

namespace kvlab::safetensors {

TensorFile read_tensor_file(const std::filesystem::path& path, const std::string& noun, const FileErrors& errors,
                            std::uint64_t max_bytes) {
  const InputFile file(path, noun, errors);
  if (file.size() > max_bytes)
    errors.raise(cat("the file has ", file.size(), " bytes, more than the ", max_bytes, " this reader accepts"));
  const Header h = read_header(file, errors);
  TensorFile out;
  if (const auto meta = h.json.find(kMetadataKey); meta != h.json.end())
    for (const auto& [key, value] : metadata(h.json, "", errors).items()) out.metadata.emplace(key, value.get<std::string>());
  std::vector<Entry> entries;
  for (const auto& [key, entry] : h.json.items())
    if (key != kMetadataKey) entries.push_back(parse_entry(key, entry, h.data_size, errors));
  std::vector<const Entry*> ranges;
  for (const Entry& e : entries) ranges.push_back(&e);
  require_tiling(std::move(ranges), h.data_size, errors);
  for (const Entry& e : entries) {
    Tensor t(e.dtype, e.shape);
    if (e.end > e.begin) file.read(h.data_start + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
    out.tensors.emplace(e.key, std::move(t));
  }
  return out;
}

void write_tensor_file(const std::filesystem::path& path, const std::string& noun, const TensorFile& file,
                       std::uint64_t max_bytes) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    const std::uint64_t end = offset + t.nbytes();
    header[name] = {{"dtype", std::string(dtype_code(t.dtype()))}, {"shape", t.shape()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  if (!file.metadata.empty()) header[std::string(kMetadataKey)] = file.metadata;
  std::string text = header.dump();
  pad_header(text);
  KVLAB_REQUIRE(offset <= max_bytes && 8 + text.size() <= max_bytes - offset, invalid_argument, "a ", noun, " of ",
                8 + text.size() + offset, " bytes would be over the ", max_bytes, " its reader accepts");
  unsigned char length[8];
  encode_length(text.size(), length);
  TempFile tmp(path, noun);
  tmp.write(length, sizeof length);
  tmp.write(text.data(), text.size());
  for (const auto& [name, t] : file.tensors) write_tensor_bytes(tmp, t);
  tmp.commit();
}

}  // namespace kvlab::safetensors
