#include "tools/kvlab/selfcheck.h"

#include <ostream>

namespace kvlab::tools {

int run_selfcheck(const SelfcheckOptions&, std::ostream& out) {
  out << "selfcheck: pending\n";
  return 0;
}

}  // namespace kvlab::tools
