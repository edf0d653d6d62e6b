// The problem-line parser (harness/problem.h): any bytes as one line, product syntax
// included. Properties, for every Problem a line expands to:
//   * its canonical line parses back (parse_problem) to the same Problem, and prints
//     the same line again (print -> parse -> print is the identity on canonical lines);
//   * that line is a single problem (expand_line gives exactly it);
// and a line that expand_line takes as one problem is what parse_problem returns.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "harness/problem.h"
#include "kvlab/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlab::harness;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  std::vector<Problem> problems;
  std::uint64_t count = 0;
  try {
    // The lazy expansion of any product, however large; the first few and the last of
    // its problems are checked (all of a product would make one input take seconds).
    const LineExpansion e(line);
    count = e.size();
    for (std::uint64_t k = 0; k < count && k < 16; ++k) problems.push_back(e.at(k));
    if (count > 16) problems.push_back(e.at(count - 1));
  } catch (const kvlab::Error&) {
    return 0;  // rejected input: the expected outcome
  }
  KVLAB_FUZZ_CHECK(!problems.empty());
  for (const Problem& p : problems) {
    const std::string printed = p.line();
    Problem again;
    try {
      again = parse_problem(printed);
    } catch (const kvlab::Error& e) {
      std::fprintf(stderr, "canonical line '%s' does not parse: %s\n", printed.c_str(), e.what());
      KVLAB_FUZZ_CHECK(false);
    }
    KVLAB_FUZZ_CHECK(again == p);
    KVLAB_FUZZ_CHECK(again.line() == printed);
    const std::vector<Problem> expanded = expand_line(printed);
    KVLAB_FUZZ_CHECK(expanded.size() == 1 && expanded.front() == p);
  }
  if (count == 1) {
    try {
      KVLAB_FUZZ_CHECK(parse_problem(line) == problems.front());
    } catch (const kvlab::Error& e) {
      std::fprintf(stderr, "parse_problem rejects a single-problem line: %s\n", e.what());
      KVLAB_FUZZ_CHECK(false);
    }
  }
  return 0;
}
