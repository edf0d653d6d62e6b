// Batch-cache mutants of the bug zoo: BatchHooks overrides (see batch_mutants.cc).
#pragma once

#include <string>
#include <vector>

#include "property_tests/properties.h"

namespace kvlab::prop::zoo {

struct BatchMutant {
  std::string id;
  std::string upstream;
  BatchHooks batch;
};

std::vector<BatchMutant> batch_mutants();

}  // namespace kvlab::prop::zoo
