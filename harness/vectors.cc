#include "harness/vectors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "harness/report.h"
#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

using json = nlohmann::json;

using safetensors::kMetadataKey;
using safetensors::parse_index;
constexpr std::string_view kVersionKey = "kvlab.vectors";
constexpr std::string_view kProblemsKey = "problems";
constexpr std::string_view kProblemPrefix = "problem.";
constexpr std::string_view kInfoKeys[] = {"engine", "engine_version", "flavour", "writer"};
// prepare() may make up to this factor more bytes than the tensors it names (f32 copies
// for tolerances; tests/harness/test_bounds.cc), plus a constant: a problem whose
// footprint is beyond that of the bytes the file holds for it cannot match them, and is
// refused before prepare() allocates anything. The constant covers what does not grow
// with the tensors: a cache problem's step-256 capacity per batch row (B·Hkv·256·D·8
// bytes: 2 MiB for a two-token script over 4 rows of 4 heads of 64, which once made kvlab
// refuse its own export), up to B·Hkv·D = 32768.
constexpr std::uint64_t kFootprintFactor = 64;
constexpr std::uint64_t kFootprintSlack = std::uint64_t{64} << 20;

safetensors::FileErrors bad_errors(const std::filesystem::path& path) {
  return {ErrorKind::invalid_argument, cat("vectors file '", path.string(), "': "), "data buffer", ']', "hole",
          "bytes", "has dtype ", ", not one of F32 F16 BF16 U32 I32 U8"};
}

[[noreturn]] void bad(const std::filesystem::path& path, const std::string& what) { bad_errors(path).raise(what); }

[[noreturn]] void io_error(const std::filesystem::path& path, const std::string& step, int err) {
  fail(ErrorKind::io, cat("cannot read vectors file '", path.string(), "': ", step, ": ", std::strerror(err)));
}

// Exactly `size` bytes at `offset`; a file that shrank since it was opened is an error.
void read_at(int fd, const std::filesystem::path& path, std::uint64_t offset, void* dst, std::size_t size) {
  const auto result = safetensors::read_exact_at(fd, offset, dst, size);
  if (result.error != 0) io_error(path, "pread", result.error);
  if (result.ended_at) bad(path, cat("the file ended at byte ", *result.ended_at, " (it shrank while being read)"));
}

// A parsed entry and where its key "<problem>.in.<name>" or "<problem>.out.<name>" puts it.
struct RawEntry : safetensors::Entry {
  std::size_t problem = 0;
  bool input = true;
  std::string name;
};

RawEntry parse_entry(const std::filesystem::path& path, const std::string& key, const json& entry,
                     std::size_t problems, std::uint64_t buffer_size) {
  const std::size_t dot = key.find('.');
  const auto index = dot == std::string::npos ? std::nullopt : parse_index(std::string_view(key).substr(0, dot));
  const std::string_view rest = dot == std::string::npos ? std::string_view() : std::string_view(key).substr(dot + 1);
  const bool input = rest.starts_with("in.");
  if (!index || !(input || rest.starts_with("out.")) || rest.size() <= (input ? 3u : 4u))
    bad(path, cat("tensor \"", key, "\" is not named <problem>.in.<input> or <problem>.out.<output>"));
  if (*index >= problems)
    bad(path, cat("tensor \"", key, "\" belongs to problem ", *index, " but the file has ", problems, " problems"));
  return {safetensors::parse_entry(key, entry, buffer_size, bad_errors(path)), *index, input,
          std::string(rest.substr(input ? 3 : 4))};
}

const std::string& meta_string(const std::filesystem::path& path, const json& meta, std::string_view key) {
  const auto it = meta.find(key);
  if (it == meta.end()) bad(path, cat("metadata has no \"", key, "\""));
  return it->get_ref<const std::string&>();
}

// The metadata's info and problem lines (parsed and canonical); unknown keys are errors.
std::vector<Problem> parse_metadata(const std::filesystem::path& path, const json& header, VectorsInfo& info) {
  const json& meta =
      safetensors::metadata(header, "the header has no __metadata__ (not a kvlab vectors file)", bad_errors(path));
  if (!meta.contains(kVersionKey)) bad(path, cat("metadata has no \"", kVersionKey, "\" (not a kvlab vectors file)"));
  const std::string& version = meta_string(path, meta, kVersionKey);
  if (version != kVectorsVersion)
    bad(path, cat(kVersionKey, " is \"", version, "\"; this kvlab reads version \"", kVectorsVersion, "\""));
  info.engine = meta_string(path, meta, "engine");
  info.engine_version = meta_string(path, meta, "engine_version");
  info.flavour = meta_string(path, meta, "flavour");
  info.writer = meta_string(path, meta, "writer");
  if (info.engine.empty()) bad(path, "metadata \"engine\" is empty");

  const std::string& count_text = meta_string(path, meta, kProblemsKey);
  const auto count = parse_index(count_text);
  if (!count || *count < 1 || *count > kMaxVectorsProblems)
    bad(path, cat(kProblemsKey, " is \"", count_text, "\", not a count from 1 to ", kMaxVectorsProblems));
  // Every problem needs its own metadata entry: checked before anything is sized by it.
  if (*count > meta.size()) bad(path, cat(kProblemsKey, " is ", *count, " but the metadata has ", meta.size(), " entries"));

  std::vector<std::optional<Problem>> problems(*count);
  for (const auto& [key, value] : meta.items()) {
    if (key == kVersionKey || key == kProblemsKey) continue;
    if (std::find(std::begin(kInfoKeys), std::end(kInfoKeys), key) != std::end(kInfoKeys)) continue;
    const auto index = key.starts_with(kProblemPrefix) ? parse_index(std::string_view(key).substr(kProblemPrefix.size()))
                                                       : std::nullopt;
    if (!index) bad(path, cat("unknown metadata key \"", key, "\""));
    if (*index >= *count)
      bad(path, cat("metadata \"", key, "\" is past the ", *count, " problems the file declares (", kProblemsKey, ")"));
    try {
      problems[*index] = parse_problem(value.get<std::string>());
    } catch (const Error& e) {
      bad(path, cat(key, " \"", value.get<std::string>(), "\" is not a problem line: ", e.message()));
    }
  }
  std::vector<Problem> out;
  for (std::size_t k = 0; k < problems.size(); ++k) {
    if (!problems[k]) bad(path, cat("metadata has no \"", kProblemPrefix, k, "\" (", kProblemsKey, " is ", *count, ")"));
    out.push_back(std::move(*problems[k]));
  }
  return out;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) { return safetensors::dtype_code(dtype); }

VectorsFile::VectorsFile(std::filesystem::path path) : path_(std::move(path)) {
  // O_NONBLOCK: a FIFO would otherwise wait for a writer forever; it is refused below.
  file_.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file_.fd < 0) io_error(path_, "open", errno);
  struct stat st {};
  if (::fstat(file_.fd, &st) != 0) io_error(path_, "fstat", errno);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::io, cat("vectors file '", path_.string(), "' is not a regular file"));
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < 8) bad(path_, cat("the file has ", file_size, " bytes, fewer than the 8-byte header length"));
  unsigned char length[8];
  read_at(file_.fd, path_, 0, length, sizeof length);
  const std::uint64_t header_size = safetensors::decode_length(length);
  if (header_size > file_size - 8)
    bad(path_, cat("the header length ", header_size, " runs past the end of the file (", file_size - 8,
                   " bytes after the length)"));
  if (header_size > safetensors::kMaxHeaderBytes)
    bad(path_, cat("the header length ", header_size, " exceeds the limit of ", safetensors::kMaxHeaderBytes,
                   " bytes"));
  std::string text(static_cast<std::size_t>(header_size), '\0');
  read_at(file_.fd, path_, 8, text.data(), text.size());
  const json header = safetensors::parse_header(text, bad_errors(path_));
  text = std::string();

  std::vector<Problem> problems = parse_metadata(path_, header, info_);
  data_start_ = 8 + header_size;
  const std::uint64_t buffer_size = file_size - data_start_;
  std::vector<RawEntry> entries;
  for (const auto& [key, entry] : header.items())
    if (key != kMetadataKey) entries.push_back(parse_entry(path_, key, entry, problems.size(), buffer_size));
  std::vector<const safetensors::Entry*> ranges;
  for (const RawEntry& e : entries) ranges.push_back(&e);
  safetensors::require_tiling(std::move(ranges), buffer_size, bad_errors(path_));

  // Each problem's entries by name, then matched against what prepare() makes.
  std::vector<std::map<std::string, const RawEntry*>> ins(problems.size()), outs(problems.size());
  std::vector<std::uint64_t> bytes(problems.size(), 0);
  for (const RawEntry& e : entries) {
    (e.input ? ins : outs)[e.problem].emplace(e.name, &e);
    bytes[e.problem] += e.end - e.begin;
  }
  for (std::size_t k = 0; k < problems.size(); ++k) {
    const Problem& p = problems[k];
    const OpInfo& op = find_op(p.op());
    const std::uint64_t footprint = op.footprint(p);
    if (bytes[k] > (std::numeric_limits<std::uint64_t>::max() - kFootprintSlack) / kFootprintFactor ||
        footprint > bytes[k] * kFootprintFactor + kFootprintSlack)
      bad(path_, cat("problem ", k, " '", p.line(), "' needs about ", footprint, " bytes of tensors; the file holds ",
                     bytes[k], " for it"));
    Prepared prep;
    try {
      prep = op.prepare(p);
    } catch (const Error& e) {
      bad(path_, cat("problem ", k, " '", p.line(), "' cannot be prepared: ", e.message()));
    }
    ProblemEntries pe{p, {}, {}, {}, {}};
    const auto take = [&](std::map<std::string, const RawEntry*>& found, const std::string& name, DType dtype,
                          const Shape& shape, const char* role) {
      const std::string key = cat(k, ".", role, ".", name);
      const auto it = found.find(name);
      if (it == found.end()) bad(path_, cat("tensor \"", key, "\" is missing (problem ", k, " '", p.line(), "')"));
      const RawEntry& e = *it->second;
      if (e.dtype != dtype || e.shape != shape)
        bad(path_, cat("tensor \"", key, "\" is ", safetensors_dtype_name(e.dtype), shape_str(e.shape), "; problem ",
                       k, " '", p.line(), "' has ", safetensors_dtype_name(dtype), shape_str(shape)));
      found.erase(it);
      return Entry{e.dtype, e.shape, e.begin, e.end};
    };
    for (std::size_t i = 0; i < prep.inputs.size(); ++i) {
      pe.inputs.push_back(take(ins[k], prep.input_names[i], prep.inputs[i].dtype(), prep.inputs[i].shape(), "in"));
      pe.input_names.push_back(prep.input_names[i]);
    }
    for (const OutputSlot& slot : prep.outputs) {
      pe.outputs.push_back(take(outs[k], slot.name, slot.dtype, slot.shape, "out"));
      pe.output_names.push_back(slot.name);
    }
    for (const auto* left : {&ins[k], &outs[k]})
      if (!left->empty())
        bad(path_, cat("tensor \"", left->begin()->second->key, "\" is not an ", left == &ins[k] ? "input" : "output",
                       " of problem ", k, " '", p.line(), "'"));
    problems_.push_back(std::move(pe));
  }
}

VectorsFile::Descriptor::~Descriptor() {
  if (fd >= 0) ::close(fd);
}

VectorsCase VectorsFile::load(std::size_t k) const {
  const ProblemEntries& pe = problems_.at(k);
  VectorsCase c{pe.problem, pe.input_names, pe.output_names, {}, {}};
  for (const auto& [entries, tensors] : {std::pair{&pe.inputs, &c.inputs}, std::pair{&pe.outputs, &c.outputs}}) {
    for (const Entry& e : *entries) {
      Tensor t(e.dtype, e.shape);
      if (e.end > e.begin) read_at(file_.fd, path_, data_start_ + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
      tensors->push_back(std::move(t));
    }
  }
  return c;
}

void write_vectors(const std::filesystem::path& path, const VectorsInfo& info, const std::vector<VectorsCase>& cases,
                   std::uint64_t max_bytes) {
  KVLAB_REQUIRE(!cases.empty() && cases.size() <= kMaxVectorsProblems, invalid_argument, "a vectors file holds 1 to ",
                kMaxVectorsProblems, " problems, not ", cases.size());
  KVLAB_REQUIRE(!info.engine.empty(), invalid_argument, "a vectors file needs an engine name");
  // __metadata__ first and the tensors in data order: the header reads like the buffer.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta[std::string(kVersionKey)] = kVectorsVersion;
  meta["engine"] = info.engine;
  meta["engine_version"] = info.engine_version;
  meta["flavour"] = info.flavour;
  meta["writer"] = info.writer;
  meta[std::string(kProblemsKey)] = std::to_string(cases.size());
  for (std::size_t k = 0; k < cases.size(); ++k) meta[cat(kProblemPrefix, k)] = cases[k].problem.line();
  header[std::string(kMetadataKey)] = std::move(meta);

  std::vector<const Tensor*> order;
  std::uint64_t cursor = 0;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const VectorsCase& c = cases[k];
    KVLAB_REQUIRE(c.input_names.size() == c.inputs.size() && c.output_names.size() == c.outputs.size(),
                  invalid_argument, "problem ", k, " has ", c.input_names.size(), " input names for ", c.inputs.size(),
                  " inputs and ", c.output_names.size(), " output names for ", c.outputs.size(), " outputs");
    for (const auto& [names, tensors, role] : {std::tuple{&c.input_names, &c.inputs, "in"},
                                               std::tuple{&c.output_names, &c.outputs, "out"}}) {
      for (std::size_t i = 0; i < tensors->size(); ++i) {
        const Tensor& t = (*tensors)[i];
        const std::string key = cat(k, ".", role, ".", (*names)[i]);
        KVLAB_REQUIRE(!(*names)[i].empty() && !header.contains(key), invalid_argument, "tensor name \"", key,
                      "\" is empty or repeated");
        KVLAB_REQUIRE(t.nbytes() <= max_bytes - std::min(cursor, max_bytes), invalid_argument,
                      "the vectors exceed the cap of ", max_bytes, " bytes at problem ", k, " '", c.problem.line(),
                      "'; select fewer or smaller cases");
        nlohmann::ordered_json shape = nlohmann::ordered_json::array();
        for (const std::int64_t d : t.shape()) shape.push_back(d);
        header[key] = {{"dtype", safetensors_dtype_name(t.dtype())},
                       {"shape", std::move(shape)},
                       {"data_offsets", {cursor, cursor + t.nbytes()}}};
        cursor += t.nbytes();
        order.push_back(&t);
      }
    }
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    fail(ErrorKind::invalid_argument, cat("a vectors header cannot be written: ", e.what()));
  }
  safetensors::pad_header(text);
  unsigned char length[8];
  safetensors::encode_length(text.size(), length);

  OutputFile file(path.string());
  std::ostream& out = file.stream();
  out.write(reinterpret_cast<const char*>(length), sizeof length);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Tensor* t : order) {
    if (t->nbytes() > 0) out.write(reinterpret_cast<const char*>(t->data()), static_cast<std::streamsize>(t->nbytes()));
  }
  file.commit();
}

}  // namespace kvlab::harness
