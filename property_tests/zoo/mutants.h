// The bug zoo: mutants that reproduce real cache bugs as test-only code (production
// code carries no fault-injection hooks). Each mutant is a set of Hooks: a mutant
// attention step, a wrapper cache implementing the Cache interface around a real cache,
// a mutant restore / quantization policy / prefix-cache extract.
#pragma once

#include <string>
#include <vector>

#include "property_tests/prop_model.h"

namespace kvlab::prop::zoo {

struct Mutant {
  std::string id;        // short name in the kill matrix
  std::string upstream;  // the upstream bug it reproduces
  Hooks hooks;
};

std::vector<Mutant> all_mutants();

}  // namespace kvlab::prop::zoo
