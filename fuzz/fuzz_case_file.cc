// The case-file reader and expander (harness/problem.h load_case_file): any bytes as
// a case file. Property: the canonical lines of the problems it yields, written as a
// case file, load back to the same problems in the same order (a case file of
// canonical lines is a fixed point of load -> print).
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
    problems = load_case_file(input.path());
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
