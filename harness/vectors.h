// Vectors files: an engine-neutral record of kvlab problems with their inputs and one
// engine's outputs, so any engine (any language) can be judged by kvlab's policies, and
// kvlab's own inputs and expected outputs can be handed to an engine.
//
// A vectors file is a plain safetensors file (8-byte little-endian header length, JSON
// header, data buffer). Metadata (all strings): kvlab.vectors = "1", engine,
// engine_version, flavour, writer, problems = N (1..100000), problem.<k> = the problem
// line of problem k. Tensors: <k>.in.<input> for every input and <k>.out.<slot> for
// every output slot of find_op(op).prepare(problem.<k>), with exactly its dtypes and
// shapes. The format is fixed (a Python reader/writer follows it byte for byte).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/op.h"
#include "harness/problem.h"
#include "kvlab/tensor.h"

namespace kvlab::harness {

inline constexpr std::string_view kVectorsVersion = "1";
inline constexpr std::size_t kMaxVectorsProblems = 100000;
// The most bytes `kvlab vectors write` puts in one file (a file is read back whole
// per problem, and checked in or mailed around; bigger selections are split).
inline constexpr std::uint64_t kMaxVectorsWriteBytes = std::uint64_t{1} << 30;

struct VectorsInfo {
  std::string engine;          // "kvlab", "mlx", ...
  std::string engine_version;  // "0.32.4"
  std::string flavour;         // free text: "oracle", "mlx_cpu"
  std::string writer;          // free text: what wrote the file
};

// One problem with the tensors the file records for it, in Prepared order: inputs under
// Prepared::input_names, outputs under the OutputSlot names.
struct VectorsCase {
  Problem problem;
  std::vector<std::string> input_names, output_names;
  std::vector<Tensor> inputs, outputs;
};

// An opened and fully validated vectors file. The constructor checks everything but the
// tensor bytes themselves: the safetensors structure (header bounds, entries, offsets
// that tile the buffer exactly), the metadata, every problem line, and that each
// problem's tensors are exactly prepare()'s names, dtypes and shapes. Any defect is a
// kvlab::Error (invalid_argument; io when the file cannot be read) naming the file and
// the culprit. Tensor bytes are read per problem by load(), so memory stays bounded by
// one problem's tensors (and the header, at most 100 MiB).
class VectorsFile {
 public:
  explicit VectorsFile(std::filesystem::path path);
  VectorsFile(const VectorsFile&) = delete;
  VectorsFile& operator=(const VectorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const VectorsInfo& info() const { return info_; }
  std::size_t size() const { return problems_.size(); }
  const Problem& problem(std::size_t k) const { return problems_.at(k).problem; }
  VectorsCase load(std::size_t k) const;

 private:
  struct Entry {
    DType dtype = DType::f32;
    Shape shape;
    std::uint64_t begin = 0, end = 0;
  };
  struct ProblemEntries {
    Problem problem;
    std::vector<std::string> input_names, output_names;
    std::vector<Entry> inputs, outputs;
  };
  // Closes the file however construction ends (a rejected file throws mid-way).
  struct Descriptor {
    int fd = -1;
    Descriptor() = default;
    Descriptor(const Descriptor&) = delete;
    Descriptor& operator=(const Descriptor&) = delete;
    ~Descriptor();
  };
  std::filesystem::path path_;
  Descriptor file_;
  std::uint64_t data_start_ = 0;
  VectorsInfo info_;
  std::vector<ProblemEntries> problems_;
};

// Writes `cases` as a vectors file: to a temporary beside `path`, renamed over it once
// complete, so a failure never leaves a truncated file. Refuses (Error, before touching
// the file system) an empty list or one over kMaxVectorsProblems, more than max_bytes of
// tensors, and names that do not pair up with the tensors. Whether the tensors are
// prepare()'s is the reader's check (the writer's callers have just prepared them).
void write_vectors(const std::filesystem::path& path, const VectorsInfo& info, const std::vector<VectorsCase>& cases,
                   std::uint64_t max_bytes = kMaxVectorsWriteBytes);

// The safetensors dtype name of a kvlab DType ("F32", "BF16", ...).
std::string_view safetensors_dtype_name(DType dtype);

}  // namespace kvlab::harness
