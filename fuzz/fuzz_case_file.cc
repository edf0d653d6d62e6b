// The case-file reader and expander (harness/problem.h read_case_file, LineExpansion):
// any bytes as a case file. Property: the canonical lines of the problems it yields,
// written as a case file, read back to the same problems in the same order (a case file
// of canonical lines is a fixed point of read -> print). Of each line's product the
// first few problems and the last are taken (a whole product can be 10^5 problems).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "harness/problem.h"
#include "kvlab/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlab::harness;
  // load_case_file reads a path; the input goes to a per-process file in RAM.
  static const kvlab::fuzz::ScratchFile input("case"), printed("case-printed");
  input.write(std::string_view(reinterpret_cast<const char*>(data), size));
  std::vector<Problem> problems;
  try {
    for (const CaseLine& l : read_case_file(input.path())) {
      const std::uint64_t n = l.expansion.size();
      for (std::uint64_t k = 0; k < n && k < 4; ++k) problems.push_back(l.expansion.at(k));
      if (n > 4) problems.push_back(l.expansion.at(n - 1));
    }
  } catch (const kvlab::Error&) {
    return 0;  // rejected input: the expected outcome
  }
  std::string text;
  for (const Problem& p : problems) text += p.line() + "\n";
  printed.write(text);
  std::vector<Problem> again;
  try {
    again = load_case_file(printed.path());
  } catch (const kvlab::Error& e) {
    std::fprintf(stderr, "the printed case file does not load: %s\n", e.what());
    KVLAB_FUZZ_CHECK(false);
  }
  KVLAB_FUZZ_CHECK(again == problems);
  return 0;
}
