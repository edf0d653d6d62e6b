// Batch-cache mutants of the bug zoo: BatchHooks overrides (see batch_mutants.cc and
// batch_lifecycle_mutants.cc). Test-only code: production has no fault-injection hooks,
// so each mutant re-creates its upstream bug from the public API, mostly by rewriting a
// cache's state (CacheState) the way the buggy code would have left it.
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

// Every batch mutant: the seed bugs, attention and prefix-cache mutants (batch_mutants.cc)
// and the batch lifecycle mutants.
std::vector<BatchMutant> batch_mutants();
// The lifecycle mutants of BatchKVCache, BatchQuantizedKVCache and BatchRotatingKVCache
// (batch_lifecycle_mutants.cc).
std::vector<BatchMutant> batch_lifecycle_mutants();

}  // namespace kvlab::prop::zoo
