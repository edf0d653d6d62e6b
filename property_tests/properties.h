// The property bodies, callable with any Hooks: the `property` tests run them with the
// production hooks (test_properties.cc), the bug zoo with each mutant's hooks
// (zoo/test_zoo.cc). Each body is one RapidCheck case: it generates its inputs with
// `*gen` (so they appear in the counterexample) and fails with RC_ASSERT / RC_FAIL.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <string>
#include <vector>

#include "property_tests/prop_model.h"

namespace kvlab::prop {

// The size of the last failing case (for the zoo's kill matrix): RapidCheck's final
// counterexample is the last failing case it ran, since every failing shrink candidate
// is accepted. `steps` = commands (stateful) or chunks (metamorphic).
struct CaseSize {
  std::int64_t steps = 0, tokens = 0;
};
CaseSize& last_failure_size();

rc::Gen<Config> gen_config(Kind kind);

// Stateful model-based test (rc::state) of one cache kind: prefill, decode, attend,
// trim, save→load, to_quantized policy, rotating extract; observables after each.
void stateful_case(Kind kind, const Hooks& hooks);

// Metamorphic properties.
void incremental_equals_one_shot(const Hooks& hooks);          // M1
void quantized_equals_dequantized(const Hooks& hooks);         // M2
void quantized_within_bound(const Hooks& hooks);               // M3
void rotating_equals_windowed_full(const Hooks& hooks);        // M4
void positions_are_pre_update_offsets(const Hooks& hooks);     // M5

struct NamedProperty {
  std::string name;
  void (*body)(const Hooks&);
};
// Every property in a fixed order (the zoo reports the first that kills a mutant).
const std::vector<NamedProperty>& all_properties();

}  // namespace kvlab::prop
