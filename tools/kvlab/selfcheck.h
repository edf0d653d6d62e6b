// `kvlab selfcheck`: verifies the reference oracle against the worked examples of
// docs/quantization.md §Worked examples and analytic properties, and prints one line per
// verified fact.
#pragma once

#include <cstdint>
#include <iosfwd>

namespace kvlab::tools {

struct SelfcheckOptions {
  std::uint64_t seed = 20261121;
  bool verbose = false;
};

// Returns the number of failed checks (0 = everything verified).
int run_selfcheck(const SelfcheckOptions& options, std::ostream& out);

}  // namespace kvlab::tools
