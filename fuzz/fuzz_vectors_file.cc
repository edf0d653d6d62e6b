// The vectors-file reader (harness/vectors.h) and the judging of what it accepts: any
// bytes as a vectors file. Properties:
//   * read -> write -> read agrees: the reloaded info, problem lines and tensors (bit
//     for bit) equal the first read, and writing them again gives the same bytes (the
//     writer is deterministic);
//   * judging an accepted problem (run_recorded_case with the reference as judge) never
//     throws and ends PASSED, FAILED, INVALID or SKIPPED.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "harness/spine.h"
#include "harness/vectors.h"
#include "kvlab/error.h"
#include "reference/reference_backend.h"

namespace {

bool same_tensors(const std::vector<kvlab::Tensor>& a, const std::vector<kvlab::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype() != b[i].dtype() || a[i].shape() != b[i].shape() || a[i].nbytes() != b[i].nbytes()) return false;
    if (a[i].nbytes() > 0 && std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()) != 0) return false;
  }
  return true;
}

bool same_case(const kvlab::harness::VectorsCase& a, const kvlab::harness::VectorsCase& b) {
  return a.problem == b.problem && a.input_names == b.input_names && a.output_names == b.output_names &&
         same_tensors(a.inputs, b.inputs) && same_tensors(a.outputs, b.outputs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlab::harness;
  static const kvlab::fuzz::ScratchFile input("vectors.safetensors"), saved("saved.safetensors");
  static kvlab::ReferenceBackend judge;
  input.write(std::string_view(reinterpret_cast<const char*>(data), size));
  std::vector<VectorsCase> first;
  VectorsInfo info;
  try {
    const VectorsFile file(input.path());
    info = file.info();
    for (std::size_t k = 0; k < file.size(); ++k) first.push_back(file.load(k));
  } catch (const kvlab::Error&) {
    return 0;  // rejected file: the expected outcome
  }

  // What the reader accepted, the writer writes; any Error from here on is a finding.
  write_vectors(saved.path(), info, first);
  const std::string bytes = saved.read();
  {
    const VectorsFile again(saved.path());
    KVLAB_FUZZ_CHECK(again.size() == first.size());
    const VectorsInfo& i2 = again.info();
    KVLAB_FUZZ_CHECK(i2.engine == info.engine && i2.engine_version == info.engine_version &&
                     i2.flavour == info.flavour && i2.writer == info.writer);
    for (std::size_t k = 0; k < first.size(); ++k) KVLAB_FUZZ_CHECK(same_case(again.load(k), first[k]));
  }
  write_vectors(saved.path(), info, first);
  KVLAB_FUZZ_CHECK(saved.read() == bytes);

  RunOptions run;
  run.max_bytes = std::uint64_t{256} << 20;
  run.max_work = 50'000'000;
  for (VectorsCase& c : first) {
    const CaseResult r = run_recorded_case(c.problem, Recorded{std::move(c.inputs), std::move(c.outputs)}, "fuzz",
                                           judge, run);
    KVLAB_FUZZ_CHECK(r.status == Status::passed || r.status == Status::failed || r.status == Status::invalid ||
                     r.status == Status::skipped);
  }
  return 0;
}
