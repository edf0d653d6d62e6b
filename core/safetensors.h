#pragma once

// The safetensors container as kvlab's strict readers see it: an 8-byte little-endian
// header length, a JSON header of {dtype, shape, data_offsets} entries plus
// __metadata__, then a data buffer the entries tile exactly. Cache state files
// (cache/state_file.cc) and vectors files (harness/vectors.cc) are both this container
// with their own metadata and tensor naming, which stay with them; what is here is the
// part where the two must agree with each other and with the reference reader.
//
// The two formats word their errors differently, and tests and scripts match those
// words, so every check here reports through a FileErrors the caller fills in.

#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "kvlab/tensor.h"

namespace kvlab::safetensors {

// Tensor bytes go verbatim between memory and the file, and safetensors data is
// little-endian; a big-endian port would need a byte swap wherever this is included.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

// The reference reader refuses headers above 100 MB; that many bytes of header would
// mean millions of tensors, so a bigger claim is a damaged or hostile file.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr std::string_view kMetadataKey = "__metadata__";

// "F32", "BF16", ... for a DType, and back (exact, case-sensitive); nullopt for a name
// kvlab has no DType for.
std::string_view dtype_code(DType dtype);
std::optional<DType> dtype_from_code(std::string_view name);

// How one format reports a malformed file: every message is prefix + what, thrown as
// `kind`; the wording fields are the words that format has always used.
struct FileErrors {
  ErrorKind kind;
  std::string prefix;            // e.g. "vectors file 'x': "
  std::string_view buffer;       // what the data region is called: "data region"
  char range_end;                // closes a [begin, end) range in messages: ')' or ']'
  std::string_view gap;          // an uncovered stretch of the buffer: "gap"
  std::string_view tail;         // bytes after the last tensor: "trailing bytes"
  std::string_view bad_dtype;    // before the dtype value: "has unknown dtype "
  std::string_view bad_dtype_after;  // after it: "" or a list of the accepted names

  [[noreturn]] void raise(const std::string& what) const;
};

// A canonical decimal index: digits only, no leading zero but "0", at most 9 digits.
std::optional<std::size_t> parse_index(std::string_view s);

// The header text parsed into a JSON object. Duplicate keys are refused (nlohmann keeps
// the last one silently, so two readers could see different files) and so is nesting
// deeper than any valid header (root → entry → shape), which bounds the recursion.
nlohmann::json parse_header(const std::string& text, const FileErrors& errors);

// The header's __metadata__, which safetensors defines as a map of strings to strings;
// `missing` is the message for a header without one.
const nlohmann::json& metadata(const nlohmann::json& header, std::string_view missing, const FileErrors& errors);

struct Entry {
  std::string key;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // within the data buffer
};

// One tensor entry of the header: exactly {dtype, shape, data_offsets}, a known dtype, a
// shape whose byte count fits int64, and offsets inside a buffer of `buffer_size` bytes
// spanning exactly that byte count. The key's own form is the caller's to check.
Entry parse_entry(const std::string& key, const nlohmann::json& entry, std::uint64_t buffer_size,
                  const FileErrors& errors);

// safetensors' own rule: the entries' ranges tile the buffer back to back. An overlap
// means two tensors share bytes, a gap or a tail means bytes no entry accounts for (a
// truncated header, an appended payload); all are refused rather than guessed about.
void require_tiling(std::vector<const Entry*> entries, std::uint64_t buffer_size, const FileErrors& errors);

// Reads exactly `size` bytes at `offset` of `fd`, retrying short reads and EINTR.
struct ReadResult {
  int error = 0;                          // errno of a failed read
  std::optional<std::uint64_t> ended_at;  // where the file ended before `size` bytes
};
ReadResult read_exact_at(int fd, std::uint64_t offset, void* dst, std::size_t size);

// The header length field, and the header text padded with spaces (JSON whitespace) so
// the data buffer starts 8-byte aligned, as the reference writer does.
std::uint64_t decode_length(const unsigned char (&bytes)[8]);
void encode_length(std::uint64_t length, unsigned char (&bytes)[8]);
// Error{invalid_argument} when the padded header exceeds kMaxHeaderBytes (the readers'
// limit): writers call it before they touch the file system.
void pad_header(std::string& text);

}  // namespace kvlab::safetensors
