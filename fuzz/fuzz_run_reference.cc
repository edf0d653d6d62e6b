// parse -> run on the reference (harness/spine.h run_case): any bytes as one problem
// line, run with the reference as both the backend and the oracle under a small memory
// cap. The result must be PASSED (the oracle agrees with itself bit for bit, guard
// bands intact, inputs unchanged), SKIPPED (over the cap) or INVALID (the op rejects
// the parameters). FAILED or UNIMPLEMENTED on the reference, an exception escaping
// run_case, a huge allocation (libFuzzer -malloc_limit_mb) or a sanitizer report are
// bugs.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "harness/backends.h"
#include "harness/problem.h"
#include "harness/spine.h"
#include "kvlab/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlab::harness;
  static const std::unique_ptr<kvlab::Backend> backend = make_backend("reference");
  static const std::unique_ptr<kvlab::Backend> reference = make_backend("reference");
  Problem problem;
  try {
    problem = parse_problem(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const kvlab::Error&) {
    return 0;  // not a problem line: the expected outcome
  }
  RunOptions options;
  // The memory cap: small, so each run takes milliseconds and nothing big is allocated
  // (the footprint check skips larger problems before prepare()).
  options.max_bytes = 64u << 20;
  // And the work cap: about a second of the instrumented reference (a long cache script
  // passed the memory cap and ran far longer, quadratic in its trace;
  // docs/ci.md §Test costs).
  options.max_work = 20'000'000;
  const CaseResult r = run_case(problem, *backend, *reference, options);
  if (r.status == Status::failed || r.status == Status::unimplemented) {
    std::fprintf(stderr, "%s", describe(r).c_str());
    KVLAB_FUZZ_CHECK(r.status == Status::passed || r.status == Status::skipped || r.status == Status::invalid);
  }
  return 0;
}
