// The property bodies, callable with any Hooks: the `property` tests run them with the
// production hooks (test_properties.cc), the bug zoo with each mutant's hooks
// (zoo/test_zoo.cc). Each body is one RapidCheck case: it generates its inputs with
// `*gen` (so they appear in the counterexample) and fails with RC_ASSERT / RC_FAIL.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

#include "cache/batch_kv_cache.h"
#include "cache/batch_quantized_kv_cache.h"
#include "cache/batch_rotating_kv_cache.h"
#include "cache/prefix_cache.h"
#include "kvlab/error.h"
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
// The kind-specific options of gen_config (chunked_turboquant.cc); call inside a generator.
void gen_chunked_options(Config& c);
void gen_turbo_options(Config& c);

// Stateful model-based test (rc::state) of one cache kind: prefill, decode, attend,
// trim, save→load, to_quantized policy, rotating extract, chunked front trim;
// observables after each.
void stateful_case(Kind kind, const Hooks& hooks);

// Metamorphic properties.
void incremental_equals_one_shot(const Hooks& hooks);          // M1
void quantized_equals_dequantized(const Hooks& hooks);         // M2
void quantized_within_bound(const Hooks& hooks);               // M3
void rotating_equals_windowed_full(const Hooks& hooks);        // M4
void positions_are_pre_update_offsets(const Hooks& hooks);     // M5
// M6 (chunked_turboquant.cc), checked on every Attend of Stateful.TurboQuantKVCache (a
// property of its own would build another 200 caches' codecs): attention through the
// cache equals attention over its decoded content, bit for bit.
void check_turbo_attend_reads_decoded(Sut& sut, const AttendResult& r, std::int64_t p0, std::int64_t n);
void turboquant_prefill_split_invariant(const Hooks& hooks);   // M7 (chunked_turboquant.cc, vlm#973)

// Regression properties for docs/upstream-bugs.md rows (regressions.cc).
void rope_vector_offsets_per_row(const Hooks& hooks);          // R1 rows 29/31/33
void quantized_batch_gqa_padded_mask(const Hooks& hooks);      // R2 rows 10/11
void quantized_pv_value_dims(const Hooks& hooks);              // R3 row 56
void quantize_policy_per_layer(const Hooks& hooks);            // R4 row 9
void restore_rejects_inconsistent_offset(const Hooks& hooks);  // R5 rows 54 (and B.4)
void state_file_corruption_is_an_error(const Hooks& hooks);    // R6 row 55
void trimmed_empty_round_trips(const Hooks& hooks);            // R7 issue 19 (deep run)

// Shared by the metamorphic and regression properties: chunk lengths summing to at most
// `max_total` (mostly decode-sized); one attend of n tokens through hooks.attend at the
// cache's offset (q/k/v = content at those positions), with the queries roped at the
// pre-update positions; the case size recorded for the zoo if `body` fails.
std::vector<std::int64_t> gen_chunks(std::int64_t max_total);
struct Step {
  AttendResult r;
  std::int64_t p0 = 0, n = 0;
  Tensor q_rot;  // the queries roped at the pre-update positions
};
Step attend_chunk(Sut& sut, std::int64_t n);
void record_case(const std::vector<std::int64_t>& chunks);
template <class F>
void sized(const std::vector<std::int64_t>& chunks, F&& body) {
  try {
    body();
  } catch (...) {
    record_case(chunks);
    throw;
  }
}
// The same with the case size given directly (steps, tokens).
template <class F>
void sized(CaseSize size, F&& body) {
  try {
    body();
  } catch (...) {
    last_failure_size() = size;
    throw;
  }
}

struct NamedProperty {
  std::string name;
  void (*body)(const Hooks&);
};
// Every property in a fixed order (the zoo reports the first that kills a mutant).
const std::vector<NamedProperty>& all_properties();

// ---- batch caches (batch_properties.cc, batch_rotating_prefix.cc, batch_lifecycle.cc) ----
// Fault-injection points of the batch properties, kept apart from Hooks so the
// single-cache properties and mutants stay as they were. As with Hooks::wrap, a mutant of
// an operation of a batch cache (update, prepare, filter, extend, extract, the offsets and
// mask attention reads) is a wrapper cache overriding that member: the properties hold
// every batch cache as a Cache that went through `wrap` and reach it only through the
// real interface (Cache, Cache::batch()). What builds a batch cache from something that
// is not one yet (a state, single caches) has no cache to wrap, so it is a hook of its
// own, as is the prefix cache, which is no Cache. production_batch_hooks() calls the
// real code.
struct BatchHooks {
  // Applied to every batch cache a property creates, restores, merges or receives.
  std::function<std::unique_ptr<Cache>(std::unique_ptr<Cache>)> wrap;
  // The cache a state describes (cache/registry.h cache_from_state).
  std::function<std::unique_ptr<Cache>(Backend&, const CacheState&)> restore;
  // One batch row per single cache, in order (merge_batch below); a Cache, so that a
  // merge into another class shows.
  std::function<std::unique_ptr<Cache>(Backend&, std::span<const Cache* const>)> merge;
  std::function<PrefixFetch(PrefixCache&, const std::string&, const CacheFormat&, const std::vector<std::int32_t>&)>
      prefix_fetch;
  std::function<bool(PrefixCache&, const std::string&, const CacheFormat&, const std::vector<std::int32_t>&,
                     const LayerCaches&)>
      prefix_insert;
};
BatchHooks production_batch_hooks();

// The real merge of single caches of one kind: KVCache rows into a BatchKVCache,
// QuantizedKVCache rows into a BatchQuantizedKVCache, RotatingKVCache rows into a
// BatchRotatingKVCache. Any other kind, no rows, or a row of another class than the
// first (a wrapper included) is a kvlab::Error.
std::unique_ptr<Cache> merge_batch(Backend& be, std::span<const Cache* const> rows);
// `rows` for a static T::merge: each must be exactly a T (typeid, as extend_operand of
// cache/batch_cache.h), else Error{misuse} naming both classes.
template <class T>
std::vector<const T*> rows_of(std::span<const Cache* const> rows) {
  std::vector<const T*> out;
  for (const Cache* c : rows) {
    KVLAB_REQUIRE(c != nullptr, invalid_argument, "merge of a null cache");
    const Cache& row = *c;
    KVLAB_REQUIRE(typeid(row) == typeid(T), misuse, "merge of a ", rows[0]->class_name(), " with a ",
                  row.class_name(), rows[0]->class_name() == row.class_name() ? " wrapper" : "");
    out.push_back(static_cast<const T*>(c));
  }
  return out;
}

// B1/B2: random batches (unequal left padding, right-padded prompts split over several
// chunks, empty batches), decodes, chunks of 1..300 tokens, trim, filter (also with bad
// indices, which must be rejected), extend (with empty, merged and restored batches of
// other capacities), extract, merge, state round trips (also while a right pad is
// pending); after every step each row equals its token log and a single cache built
// from that row alone (docs/semantics.md §Batch cache and its invariants,
// docs/semantics.md §Batch quantized cache, docs/traces.md §T3).
void batch_kv_rows_match_logs(const Hooks& hooks, const BatchHooks& batch);
void batch_quantized_rows_match_logs(const Hooks& hooks, const BatchHooks& batch);
// B3: attend on a BatchKVCache (B >= 2, unequal prompts) == each row alone
// (docs/lifecycle.md §Offset snapshot).
void batch_attend_equals_per_row(const Hooks& hooks, const BatchHooks& batch);
// B4: BatchRotatingKVCache extract(i) == newest min(offset_i, max_size) tokens
// (docs/upstream-bugs.md row 7).
void batch_rotating_extract_newest(const Hooks& hooks, const BatchHooks& batch);
// B5: a prefix-cache hit has exactly the requested per-layer format
// (docs/semantics.md §Prefix cache, SwiftLM PR 73).
void prefix_fetch_matches_format(const Hooks& hooks, const BatchHooks& batch);
// L1: BatchRotatingKVCache lifecycle: right-padded prompts over several chunks
// (docs/traces.md §T5), decode, chunks, trim, filter, extend, merge of wrapped rings, state round
// trips (also while a right pad is pending), extract; rows == token logs
// (docs/semantics.md §Batch rotating cache, docs/lifecycle.md §Batch lifecycle).
void batch_rotating_lifecycle(const Hooks& hooks, const BatchHooks& batch);
// L2: filter and extend leave the surviving rows' attention outputs unchanged, bit for
// bit (BatchKVCache and BatchRotatingKVCache; docs/lifecycle.md §Batch lifecycle,
// docs/upstream-bugs.md rows 41/44/45/51).
void batch_attend_survives_filter_extend(const Hooks& hooks, const BatchHooks& batch);
// L3: prefix reuse: a hit holds exactly the reused tokens of the request, continues to
// the cache built from all of them, and never changes with the live caches it was taken
// from (KV, rotating and quantized layers; docs/semantics.md §Prefix cache,
// docs/upstream-bugs.md rows 42/48).
void prefix_reuse_continues(const Hooks& hooks, const BatchHooks& batch);

struct NamedBatchProperty {
  std::string name;
  void (*body)(const Hooks&, const BatchHooks&);
};
// Run after all_properties() by the zoo, in this order.
const std::vector<NamedBatchProperty>& batch_properties();

}  // namespace kvlab::prop
