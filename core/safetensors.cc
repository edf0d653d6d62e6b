#include "core/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <set>
#include <tuple>

namespace kvlab::safetensors {

namespace {

using json = nlohmann::json;

// Root → tensor entry → shape array: nothing valid nests deeper.
constexpr int kMaxJsonDepth = 3;

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::u32, DType::i32, DType::u8};

std::uint64_t json_u64(const json& v, const std::string& what, const FileErrors& errors) {
  if (!v.is_number_unsigned()) errors.raise(cat(what, " is ", v.dump(), ", not a non-negative integer"));
  return v.get<std::uint64_t>();
}

}  // namespace

std::string_view dtype_code(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::u32: return "U32";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  fail(ErrorKind::internal, "unknown DType for a safetensors file");
}

std::optional<DType> dtype_from_code(std::string_view name) {
  for (const DType t : kDTypes)
    if (dtype_code(t) == name) return t;
  return std::nullopt;
}

void FileErrors::raise(const std::string& what) const { fail(kind, cat(prefix, what)); }

std::optional<std::size_t> parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::size_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::size_t>(c - '0');
  }
  return v;
}

namespace {

// A first pass over the header with no tree: nesting depth and duplicate keys, stopping at
// the first problem. (nlohmann's callback parser would do it while building the tree, but
// it rescans the parent object after every nested one: quadratic in the tensors of a file,
// seconds for a vectors file of a few thousand problems
// (docs/benchmarks.md §Measurements behind kernel choices). This pass and the plain parse
// are both linear.)
class HeaderCheck final : public json::json_sax_t {
 public:
  std::string problem;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(json::number_integer_t) override { return true; }
  bool number_unsigned(json::number_unsigned_t) override { return true; }
  bool number_float(json::number_float_t, const json::string_t&) override { return true; }
  bool string(json::string_t&) override { return true; }
  bool binary(json::binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return nest();
  }
  bool key(json::string_t& k) override {
    if (!keys_.back().insert(k).second) problem = cat("duplicate header key \"", k, "\"");
    return problem.empty();
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return nest(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool nest() {
    if (++depth_ > kMaxJsonDepth) problem = cat("the header nests deeper than ", kMaxJsonDepth);
    return problem.empty();
  }
  std::vector<std::set<std::string>> keys_;
  std::size_t depth_ = 0;
};

}  // namespace

json parse_header(const std::string& text, const FileErrors& errors) {
  if (text.empty() || text[0] != '{') errors.raise("the header does not start with '{'");
  HeaderCheck check;
  const bool well_formed = json::sax_parse(text, &check);
  if (!check.problem.empty()) errors.raise(check.problem);
  json header;
  try {
    header = json::parse(text);  // throws the parse error the check pass stopped at
  } catch (const json::exception& e) {
    errors.raise(cat("the header is not valid JSON: ", e.what()));
  }
  if (!well_formed) errors.raise("the header is not valid JSON");
  if (!header.is_object()) errors.raise("the header is not a JSON object");
  return header;
}

const json& metadata(const json& header, std::string_view missing, const FileErrors& errors) {
  const auto it = header.find(kMetadataKey);
  if (it == header.end()) errors.raise(std::string(missing));
  if (!it->is_object()) errors.raise("__metadata__ is not an object");
  for (const auto& [key, value] : it->items())
    if (!value.is_string()) errors.raise(cat("metadata \"", key, "\" is ", value.dump(), ", not a string"));
  return *it;
}

Entry parse_entry(const std::string& key, const json& entry, std::uint64_t buffer_size, const FileErrors& errors) {
  if (!entry.is_object() || entry.size() != 3 || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets"))
    errors.raise(cat("tensor \"", key, "\" must be an object with exactly dtype, shape and data_offsets"));
  Entry t;
  t.key = key;

  const json& dtype = entry.at("dtype");
  const auto parsed = dtype.is_string() ? dtype_from_code(dtype.get<std::string>()) : std::nullopt;
  if (!parsed) errors.raise(cat("tensor \"", key, "\" ", errors.bad_dtype, dtype.dump(), errors.bad_dtype_after));
  t.dtype = *parsed;

  const json& shape = entry.at("shape");
  if (!shape.is_array()) errors.raise(cat("tensor \"", key, "\" shape ", shape.dump(), " is not a list"));
  // The element count and the product of the non-zero dims both fit in int64, so no
  // stride or size computed later can overflow, even for a zero-element tensor.
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t elements = 1, nonzero = 1;
  for (const json& d : shape) {
    const std::uint64_t dim = json_u64(d, cat("a dimension of tensor \"", key, "\""), errors);
    if (dim > kMax || (dim > 0 && nonzero > kMax / dim))
      errors.raise(cat("tensor \"", key, "\" shape ", shape.dump(), " overflows int64"));
    nonzero *= std::max<std::uint64_t>(dim, 1);
    elements *= dim;
    t.shape.push_back(static_cast<std::int64_t>(dim));
  }
  const std::uint64_t esize = dtype_size(t.dtype);
  if (elements > kMax / esize) errors.raise(cat("tensor \"", key, "\" shape ", shape.dump(), " overflows int64"));
  const std::uint64_t bytes = elements * esize;

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    errors.raise(cat("tensor \"", key, "\" data_offsets ", offsets.dump(), " is not a pair"));
  t.begin = json_u64(offsets[0], cat("data_offsets[0] of tensor \"", key, "\""), errors);
  t.end = json_u64(offsets[1], cat("data_offsets[1] of tensor \"", key, "\""), errors);
  if (t.begin > t.end || t.end > buffer_size)
    errors.raise(cat("tensor \"", key, "\" data_offsets [", t.begin, ", ", t.end, errors.range_end,
                     " lie outside the ", errors.buffer, " of ", buffer_size, " bytes"));
  if (t.end - t.begin != bytes)
    errors.raise(cat("tensor \"", key, "\" data_offsets [", t.begin, ", ", t.end, errors.range_end, " hold ",
                     t.end - t.begin, " bytes but shape ", shape.dump(), " of ", dtype_code(t.dtype), " needs ", bytes));
  return t;
}

void require_tiling(std::vector<const Entry*> entries, std::uint64_t buffer_size, const FileErrors& errors) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry* a, const Entry* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  std::uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : entries) {
    if (e->begin < cursor)
      errors.raise(cat("tensor \"", e->key, "\" [", e->begin, ", ", e->end, errors.range_end, " overlaps tensor \"",
                       previous->key, "\" [", previous->begin, ", ", previous->end, errors.range_end));
    if (e->begin > cursor)
      errors.raise(cat("the ", errors.buffer, " has a ", errors.gap, " [", cursor, ", ", e->begin,
                       ") before tensor \"", e->key, "\""));
    cursor = e->end;
    previous = e;
  }
  if (cursor != buffer_size)
    errors.raise(cat("the ", errors.buffer, " has ", buffer_size - cursor, " ", errors.tail,
                     " after the last tensor (at ", cursor, " of ", buffer_size, ")"));
}

ReadResult read_exact_at(int fd, std::uint64_t offset, void* dst, std::size_t size) {
  auto* p = static_cast<char*>(dst);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return {errno, std::nullopt};
    if (n == 0) return {0, offset};
    p += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
  return {};
}

std::uint64_t decode_length(const unsigned char (&bytes)[8]) {
  std::uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return length;
}

void encode_length(std::uint64_t length, unsigned char (&bytes)[8]) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(length >> (8 * i));
}

void pad_header(std::string& text) {
  text.append((8 - text.size() % 8) % 8, ' ');
  // Every kvlab reader refuses a header over kMaxHeaderBytes, so a writer must not make
  // one: a file kvlab writes is one kvlab reads back.
  KVLAB_REQUIRE(text.size() <= kMaxHeaderBytes, invalid_argument, "the file's header would be ", text.size(),
                " bytes, over the ", kMaxHeaderBytes, " every kvlab reader accepts (metadata or tensor names too long)");
}

}  // namespace kvlab::safetensors
