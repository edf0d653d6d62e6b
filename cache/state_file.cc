#include "cache/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

namespace kvlab {
namespace {

using json = nlohmann::json;

// Tensor bytes are copied verbatim between memory and the file, and safetensors data is
// little-endian; a big-endian port would need a byte swap here.
static_assert(std::endian::native == std::endian::little, "state_file assumes a little-endian host");

// The reference safetensors reader refuses headers above 100 MB; a header that large
// from this writer would mean millions of tensors, so a bigger claim is corruption.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kFormatKey = "kvlab.format";
constexpr std::string_view kLayersKey = "kvlab.layers";
constexpr std::string_view kUserPrefix = "user.";
// The deepest valid structure is root → tensor entry → shape array (depth 3).
constexpr int kMaxJsonDepth = 3;

std::string_view safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::u32: return "U32";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  fail(ErrorKind::internal, "unknown DType in state_file");
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::u32, DType::i32, DType::u8})
    if (safetensors_dtype(t) == s) return t;
  return std::nullopt;
}

std::string errno_text(int err) { return std::strerror(err); }

std::string layer_prefix(std::size_t layer) { return "L." + std::to_string(layer) + "."; }

// nlohmann refuses to dump invalid UTF-8; checking each string up front lets the error
// name the offending entry and keeps the file untouched.
void require_utf8(const std::string& s, const std::string& what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception& e) {
    fail(ErrorKind::invalid_argument, cat(what, " is not valid UTF-8: ", e.what()));
  }
}

// ---------------------------------------------------------------------------------
// Writer

struct PlannedTensor {
  const Tensor* tensor;
  std::uint64_t begin, end;
};

// Builds the padded JSON header; `planned` receives the tensors in data order.
std::string build_header(const std::vector<CacheState>& layers, const std::map<std::string, std::string>& user,
                         std::vector<PlannedTensor>& planned) {
  json header = json::object();
  json meta = json::object();
  meta[std::string(kFormatKey)] = kStateFileFormat;
  meta[std::string(kLayersKey)] = std::to_string(layers.size());
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const CacheState& s = layers[i];
    const std::string prefix = layer_prefix(i);
    KVLAB_REQUIRE(!s.class_name.empty(), invalid_argument, "layer ", i, " has an empty class name");
    require_utf8(s.class_name, cat("class name of layer ", i));
    meta[prefix + "class"] = s.class_name;
    for (const auto& [key, value] : s.meta) {
      require_utf8(key, cat("meta key of layer ", i));
      require_utf8(value, cat("meta value '", key, "' of layer ", i));
      meta[prefix + "meta." + key] = value;
    }
    for (const auto& [name, tensor] : s.tensors) {
      KVLAB_REQUIRE(!name.empty(), invalid_argument, "layer ", i, " has a tensor with an empty name");
      require_utf8(name, cat("tensor name of layer ", i));
      const std::uint64_t bytes = tensor.nbytes();
      json shape = json::array();
      for (std::int64_t d : tensor.shape()) shape.push_back(d);
      header[prefix + name] = {{"dtype", safetensors_dtype(tensor.dtype())},
                               {"shape", std::move(shape)},
                               {"data_offsets", {cursor, cursor + bytes}}};
      planned.push_back({&tensor, cursor, cursor + bytes});
      cursor += bytes;
    }
  }
  for (const auto& [key, value] : user) {
    require_utf8(key, "user metadata key");
    require_utf8(value, cat("user metadata value '", key, "'"));
    meta[std::string(kUserPrefix) + key] = value;
  }
  header[std::string(kMetadataKey)] = std::move(meta);
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data region starts 8-byte aligned,
  // as the reference safetensors writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// A temporary file next to the target; removed on destruction unless committed.
class TempFile {
 public:
  explicit TempFile(const std::filesystem::path& target) : target_(target) {
    static std::atomic<unsigned> counter{0};
    const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
    int err = EEXIST;
    for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
      // The name is cut so the temporary stays within NAME_MAX for any valid target name.
      path_ = dir / cat(".", target.filename().string().substr(0, 200), ".tmp-", ::getpid(), "-", counter.fetch_add(1));
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) return;
      err = errno;
    }
    fail(ErrorKind::io, cat("cannot write cache state file '", target.string(), "': creating temporary '",
                            path_.string(), "' failed: ", errno_text(err)));
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  void write(const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_io("writing", n < 0 ? errno : EIO);
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  }

  // fsync, close and rename over the target: the only step that changes the target.
  void commit() {
    if (::fsync(fd_) != 0) fail_io("fsync of the temporary", errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail_io("closing the temporary", errno);
    if (::rename(path_.c_str(), target_.c_str()) != 0) fail_io("renaming the temporary over it", errno);
    committed_ = true;
    // Make the rename itself durable. Best effort: the new file is already in place and
    // complete, and some file systems do not support fsync on a directory.
    const std::filesystem::path dir = target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  [[noreturn]] void fail_io(const char* step, int err) const {
    fail(ErrorKind::io, cat("cannot write cache state file '", target_.string(), "': ", step, " failed: ",
                            errno_text(err)));
  }

  std::filesystem::path target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

// ---------------------------------------------------------------------------------
// Reader

[[noreturn]] void corrupt(const std::filesystem::path& path, const std::string& what) {
  fail(ErrorKind::corrupt, cat("cache state file '", path.string(), "' is corrupt: ", what));
}

class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(ErrorKind::io, cat("cannot open cache state file '", path.string(), "': ", errno_text(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail_io(errno);
    if (!S_ISREG(st.st_mode))
      fail(ErrorKind::io, cat("cache state file '", path.string(), "' is not a regular file"));
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  std::uint64_t size() const { return size_; }

  // Reads exactly `size` bytes at `offset`; the caller has checked the range.
  void read(std::uint64_t offset, void* dst, std::size_t size) const {
    auto* p = static_cast<char*>(dst);
    while (size > 0) {
      const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_io(errno);
      if (n == 0) corrupt(path_, cat("file ended at byte ", offset, " (it shrank while being read)"));
      p += n;
      offset += static_cast<std::uint64_t>(n);
      size -= static_cast<std::size_t>(n);
    }
  }

 private:
  [[noreturn]] void fail_io(int err) const {
    fail(ErrorKind::io, cat("cannot read cache state file '", path_.string(), "': ", errno_text(err)));
  }

  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// A canonical decimal index: digits only, no leading zero except "0", at most 9 digits.
std::optional<std::size_t> parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::size_t>(c - '0');
  }
  return v;
}

// Splits "L.<index>.<rest>" into (index, rest); nullopt unless it has that form with a
// non-empty rest.
std::optional<std::pair<std::size_t, std::string>> split_layer_key(const std::string& key) {
  if (key.rfind("L.", 0) != 0) return std::nullopt;
  const std::size_t dot = key.find('.', 2);
  if (dot == std::string::npos || dot + 1 >= key.size()) return std::nullopt;
  const auto index = parse_index(std::string_view(key).substr(2, dot - 2));
  if (!index) return std::nullopt;
  return std::make_pair(*index, key.substr(dot + 1));
}

// Parses the header, rejecting duplicate keys (nlohmann would keep the last silently, so
// two readers could disagree on the content) and nesting deeper than any valid header.
json parse_header(const std::filesystem::path& path, const std::string& text) {
  if (text.empty() || text[0] != '{') corrupt(path, "the header does not start with '{'");
  std::vector<std::set<std::string>> keys;
  std::string problem;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth + 1 && problem.empty()) problem = cat("the header nests deeper than ", kMaxJsonDepth);
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        problem.empty())
      problem = cat("duplicate header key \"", parsed.get<std::string>(), "\"");
    return problem.empty();  // stop building the tree once something is wrong
  };
  json header;
  try {
    header = json::parse(text, callback);
  } catch (const json::exception& e) {
    corrupt(path, cat("the header is not valid JSON: ", e.what()));
  }
  if (!problem.empty()) corrupt(path, problem);
  if (!header.is_object()) corrupt(path, "the header is not a JSON object");
  return header;
}

std::uint64_t json_u64(const std::filesystem::path& path, const json& v, const std::string& what) {
  if (!v.is_number_unsigned()) corrupt(path, cat(what, " is ", v.dump(), ", not a non-negative integer"));
  return v.get<std::uint64_t>();
}

struct TensorEntry {
  std::size_t layer;
  std::string name, key;
  DType dtype;
  Shape shape;
  std::uint64_t begin, end;
};

TensorEntry parse_tensor_entry(const std::filesystem::path& path, const std::string& key, const json& entry,
                               std::size_t layer_count, std::uint64_t data_size) {
  const auto split = split_layer_key(key);
  if (!split) corrupt(path, cat("header key \"", key, "\" is neither __metadata__ nor L.<layer>.<tensor>"));
  if (split->first >= layer_count)
    corrupt(path, cat("tensor \"", key, "\" names layer ", split->first, " but the file has ", layer_count, " layers"));
  if (!entry.is_object() || entry.size() != 3 || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets"))
    corrupt(path, cat("tensor \"", key, "\" must be an object with exactly dtype, shape and data_offsets"));
  TensorEntry t{split->first, split->second, key, DType::f32, {}, 0, 0};

  const json& dtype = entry.at("dtype");
  const auto parsed_dtype = dtype.is_string() ? dtype_from_safetensors(dtype.get<std::string>()) : std::nullopt;
  if (!parsed_dtype) corrupt(path, cat("tensor \"", key, "\" has unknown dtype ", dtype.dump()));
  t.dtype = *parsed_dtype;

  const json& shape = entry.at("shape");
  if (!shape.is_array()) corrupt(path, cat("tensor \"", key, "\" shape ", shape.dump(), " is not a list"));
  // Bytes of the tensor, and the product of the non-zero dims: both must fit in int64,
  // so no later stride or size computation can overflow even for zero-element tensors.
  std::uint64_t elements = 1, nonzero_product = 1;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (const json& d : shape) {
    const std::uint64_t dim = json_u64(path, d, cat("a dimension of tensor \"", key, "\""));
    if (dim > kMax || (dim > 0 && nonzero_product > kMax / dim))
      corrupt(path, cat("tensor \"", key, "\" shape ", shape.dump(), " overflows int64"));
    nonzero_product *= std::max<std::uint64_t>(dim, 1);
    elements *= dim;
    t.shape.push_back(static_cast<std::int64_t>(dim));
  }
  const std::uint64_t esize = dtype_size(t.dtype);
  if (elements > kMax / esize) corrupt(path, cat("tensor \"", key, "\" shape ", shape.dump(), " overflows int64"));
  const std::uint64_t bytes = elements * esize;

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    corrupt(path, cat("tensor \"", key, "\" data_offsets ", offsets.dump(), " is not a pair"));
  t.begin = json_u64(path, offsets[0], cat("data_offsets[0] of tensor \"", key, "\""));
  t.end = json_u64(path, offsets[1], cat("data_offsets[1] of tensor \"", key, "\""));
  if (t.begin > t.end || t.end > data_size)
    corrupt(path, cat("tensor \"", key, "\" data_offsets [", t.begin, ", ", t.end,
                      ") lie outside the data region of ", data_size, " bytes"));
  if (t.end - t.begin != bytes)
    corrupt(path, cat("tensor \"", key, "\" data_offsets [", t.begin, ", ", t.end, ") hold ", t.end - t.begin,
                      " bytes but shape ", shape.dump(), " of ", safetensors_dtype(t.dtype), " needs ", bytes));
  return t;
}

// Reads __metadata__ into layer classes/meta and user metadata; returns the layer count.
std::size_t parse_metadata(const std::filesystem::path& path, const json& header, LoadedStates& out) {
  const auto it = header.find(kMetadataKey);
  if (it == header.end()) corrupt(path, "the header has no __metadata__");
  const json& meta = *it;
  if (!meta.is_object()) corrupt(path, "__metadata__ is not an object");
  for (const auto& [key, value] : meta.items())
    if (!value.is_string()) corrupt(path, cat("metadata \"", key, "\" is ", value.dump(), ", not a string"));

  const auto format = meta.find(kFormatKey);
  if (format == meta.end()) corrupt(path, cat("metadata has no ", kFormatKey, " (not a kvlab cache state file)"));
  if (format->get<std::string>() != kStateFileFormat)
    corrupt(path,
            cat("format is \"", format->get<std::string>(), "\", this reader accepts \"", kStateFileFormat, "\""));
  const auto layers = meta.find(kLayersKey);
  if (layers == meta.end()) corrupt(path, cat("metadata has no ", kLayersKey));
  const auto count = parse_index(layers->get<std::string>());
  // Every layer needs its own "L.<i>.class" entry, so a count above the number of
  // entries is a lie; checking it first bounds the allocation below by the header size.
  if (!count || *count > meta.size())
    corrupt(path, cat(kLayersKey, " is \"", layers->get<std::string>(), "\", not a layer count"));
  out.layers.resize(*count);

  for (const auto& [key, value] : meta.items()) {
    if (key == kFormatKey || key == kLayersKey) continue;
    if (key.rfind(kUserPrefix, 0) == 0) {
      out.user_metadata.emplace(key.substr(kUserPrefix.size()), value.get<std::string>());
      continue;
    }
    const auto split = split_layer_key(key);
    if (!split) corrupt(path, cat("unknown metadata key \"", key, "\""));
    if (split->first >= *count)
      corrupt(path, cat("metadata \"", key, "\" names layer ", split->first, " but the file has ", *count, " layers"));
    CacheState& layer = out.layers[split->first];
    if (split->second == "class") {
      layer.class_name = value.get<std::string>();
    } else if (split->second.rfind("meta.", 0) == 0) {
      layer.meta.emplace(split->second.substr(5), value.get<std::string>());
    } else {
      corrupt(path, cat("unknown metadata key \"", key, "\""));
    }
  }
  for (std::size_t i = 0; i < *count; ++i)
    if (out.layers[i].class_name.empty())
      corrupt(path, cat("layer ", i, " has no class name (", layer_prefix(i), "class)"));
  return *count;
}

}  // namespace

void save_cache_states(const std::filesystem::path& path, const std::vector<CacheState>& layers,
                       const std::map<std::string, std::string>& user_metadata) {
  // Everything that can be rejected is rejected before the file system is touched.
  std::vector<PlannedTensor> planned;
  const std::string header = build_header(layers, user_metadata, planned);
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(header.size() >> (8 * i));

  TempFile tmp(path);
  tmp.write(length, sizeof length);
  tmp.write(header.data(), header.size());
  for (const PlannedTensor& t : planned)
    if (t.end > t.begin) tmp.write(t.tensor->data(), static_cast<std::size_t>(t.end - t.begin));
  tmp.commit();
}

LoadedStates load_cache_states(const std::filesystem::path& path) {
  const InputFile file(path);
  if (file.size() < 8) corrupt(path, cat("the file has ", file.size(), " bytes, fewer than the 8-byte header length"));
  std::uint8_t length[8];
  file.read(0, length, sizeof length);
  std::uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<std::uint64_t>(length[i]) << (8 * i);
  if (header_size > file.size() - 8)
    corrupt(path, cat("the header length ", header_size, " exceeds the ", file.size() - 8, " bytes after it"));
  if (header_size > kMaxHeaderBytes)
    corrupt(path, cat("the header length ", header_size, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  std::string text(static_cast<std::size_t>(header_size), '\0');
  file.read(8, text.data(), text.size());
  const json header = parse_header(path, text);

  LoadedStates out;
  const std::size_t layer_count = parse_metadata(path, header, out);
  const std::uint64_t data_start = 8 + header_size, data_size = file.size() - data_start;

  std::vector<TensorEntry> entries;
  for (const auto& [key, entry] : header.items())
    if (key != kMetadataKey) entries.push_back(parse_tensor_entry(path, key, entry, layer_count, data_size));

  // The data region must be exactly the tensors back to back: an overlap means two
  // tensors share bytes, a gap or a tail means bytes no entry accounts for (a truncated
  // header or an appended payload); all are rejected rather than guessed about.
  std::vector<const TensorEntry*> order;
  for (const TensorEntry& t : entries) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  std::uint64_t cursor = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry* t : order) {
    if (t->begin < cursor)
      corrupt(path, cat("tensor \"", t->key, "\" [", t->begin, ", ", t->end, ") overlaps tensor \"", previous->key,
                        "\" [", previous->begin, ", ", previous->end, ")"));
    if (t->begin > cursor)
      corrupt(path, cat("the data region has a gap [", cursor, ", ", t->begin, ") before tensor \"", t->key, "\""));
    cursor = t->end;
    previous = t;
  }
  if (cursor != data_size)
    corrupt(path, cat("the data region has ", data_size - cursor, " trailing bytes after the last tensor (at ", cursor,
                      " of ", data_size, ")"));

  for (const TensorEntry& t : entries) {
    Tensor tensor(t.dtype, t.shape);
    if (t.end > t.begin) file.read(data_start + t.begin, tensor.data(), static_cast<std::size_t>(t.end - t.begin));
    out.layers[t.layer].tensors.emplace(t.name, std::move(tensor));
  }
  return out;
}

}  // namespace kvlab
