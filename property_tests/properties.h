// The property bodies, callable with any Hooks: the `property` tests run them with the
// production hooks (test_properties.cc), the bug zoo with each mutant's hooks
// (zoo/test_zoo.cc). Each body is one RapidCheck case: it generates its inputs with
// `*gen` (so they appear in the counterexample) and fails with RC_ASSERT / RC_FAIL.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/batch_rotating_kv_cache.h"
#include "cache/prefix_cache.h"
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

// ---- batch caches (batch_properties.cc, batch_rotating_prefix.cc) ---------------------
// Fault-injection points of the batch properties, kept apart from Hooks so the
// single-cache properties and mutants stay as they were. production_batch_hooks() calls
// the real code.
struct BatchHooks {
  // What BatchRotatingKVCache::extract(i) adopts: row i's newest real tokens.
  std::function<FetchedKV(const BatchRotatingKVCache&, std::int64_t)> rotating_extract_rows;
  std::function<PrefixFetch(PrefixCache&, const std::string&, const CacheFormat&, const std::vector<std::int32_t>&)>
      prefix_fetch;
};
BatchHooks production_batch_hooks();

// B1/B2: random batches (unequal left padding, sometimes a right-padded prefill), chunks,
// decodes, filter, extend, merge, state round trip; after every step each row equals its
// token log and a single cache built from that row alone (spec §4.9, §4.11, App. C).
void batch_kv_rows_match_logs(const Hooks& hooks, const BatchHooks& batch);
void batch_quantized_rows_match_logs(const Hooks& hooks, const BatchHooks& batch);
// B3: attend on a BatchKVCache (B >= 2, unequal prompts) == each row alone (spec §5.5).
void batch_attend_equals_per_row(const Hooks& hooks, const BatchHooks& batch);
// B4: BatchRotatingKVCache extract(i) == newest min(offset_i, max_size) tokens (§7 row 7).
void batch_rotating_extract_newest(const Hooks& hooks, const BatchHooks& batch);
// B5: a prefix-cache hit has exactly the requested per-layer format (§7, SwiftLM PR 73).
void prefix_fetch_matches_format(const Hooks& hooks, const BatchHooks& batch);

struct NamedBatchProperty {
  std::string name;
  void (*body)(const Hooks&, const BatchHooks&);
};
// Run after all_properties() by the zoo, in this order.
const std::vector<NamedBatchProperty>& batch_properties();

}  // namespace kvlab::prop
