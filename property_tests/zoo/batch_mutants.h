// Batch-cache mutants of the bug zoo: BatchHooks overrides (see batch_mutants.cc and
// batch_lifecycle_mutants.cc). Test-only code: production has no fault-injection hooks,
// so each mutant re-creates its upstream bug from the public API, mostly by rewriting a
// cache's state (CacheState) the way the buggy code would have left it.
#pragma once

#include <string>
#include <vector>

#include "property_tests/properties.h"
#include "property_tests/zoo/mutants.h"

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

// `cache` behind a wrapper whose batch verbs filter and extend are `m`'s (the BatchKVCache
// lifecycle mutants), for drivers that reach a batch cache through Cache::batch() (the
// golden runner). A cache of another class comes back as it is.
std::unique_ptr<Cache> wrap_batch_kv(const BatchMutant& m, std::unique_ptr<Cache> cache);

}  // namespace kvlab::prop::zoo
