// The property suite (labels `property`, `property-deep`): every property of
// properties.h with the production hooks. RC_PARAMS (seed, max_success) comes from the
// ctest registration (fixed seed 42, or the commit-derived seed of the `.explore` run);
// the seed is printed first, and a failure prints the shrunk case (config + commands)
// and RapidCheck's RC_PARAMS="reproduce=…" line; a stateful failure also logs its case
// as a `kvlab repro` line (repro_line.h).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <iostream>

#include "property_tests/properties.h"
#include "property_tests/repro_line.h"

namespace kvlab::prop {
namespace {

// `[ seed     ] N` like every random test of kvlab (tests/unit/test_util.h), once per run.
class SeedPrinter final : public ::testing::Environment {
 public:
  void SetUp() override {
    const rc::detail::TestParams& p = rc::detail::configuration().testParams;
    std::cout << "[ seed     ] " << p.seed << " (RapidCheck; rerun with RC_PARAMS=\"seed=" << p.seed
              << " max_success=" << p.maxSuccess << "\"" << (real_dims() ? " KVLAB_PROP_DIMS=real" : "") << "), "
              << p.maxSuccess << " cases per property, backend " << prop_backend_name()
              << " (KVLAB_PROP_BACKEND)\n"
              << std::flush;
    ::testing::Test::RecordProperty("seed", std::to_string(p.seed));
  }
};
[[maybe_unused]] ::testing::Environment* const seed_printer = ::testing::AddGlobalTestEnvironment(new SeedPrinter);

// A backend that cannot start here (no Vulkan device or driver) skips the whole run with
// the reason instead of failing every case (ctest reports it Skipped, CMakeLists.txt).
class BackendProbe final : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      make_prop_backend();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      GTEST_SKIP() << "no usable backend " << prop_backend_name() << ": " << e.what();
    }
  }
};
[[maybe_unused]] ::testing::Environment* const backend_probe = ::testing::AddGlobalTestEnvironment(new BackendProbe);

const Hooks& hooks() {
  static const Hooks h = production_hooks();
  return h;
}

RC_GTEST_PROP(Stateful, KVCache, ()) { stateful_case(Kind::kv, hooks()); }
RC_GTEST_PROP(Stateful, RotatingKVCache, ()) { stateful_case(Kind::rotating, hooks()); }
RC_GTEST_PROP(Stateful, QuantizedKVCache, ()) { stateful_case(Kind::quantized, hooks()); }

RC_GTEST_PROP(Metamorphic, IncrementalEqualsOneShot, ()) { incremental_equals_one_shot(hooks()); }
RC_GTEST_PROP(Metamorphic, QuantizedEqualsDequantized, ()) { quantized_equals_dequantized(hooks()); }
RC_GTEST_PROP(Metamorphic, QuantizedWithinBound, ()) { quantized_within_bound(hooks()); }
RC_GTEST_PROP(Metamorphic, RotatingEqualsWindowedFull, ()) { rotating_equals_windowed_full(hooks()); }
RC_GTEST_PROP(Metamorphic, PositionsArePreUpdateOffsets, ()) { positions_are_pre_update_offsets(hooks()); }

RC_GTEST_PROP(Stateful, ChunkedKVCache, ()) { stateful_case(Kind::chunked, hooks()); }
// Why the backend under test cannot run a TurboQuantKVCache (its encode or decode kernel
// is unsupported there: Vulkan today), or empty when it can. Probed once with one token.
const std::string& turboquant_missing() {
  static const std::string why = [] {
    Config cfg;
    cfg.kind = Kind::turboquant;
    cfg.tq_bits = 4;
    try {
      Sut sut(cfg, hooks());
      const DTensor k = sut.be.upload(sut.raw(Stream::key, 0, 1)), v = sut.be.upload(sut.raw(Stream::value, 0, 1));
      sut.cache->update(k, v);
      sut.cache->content(ContentForm::decoded);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::unsupported) return std::string(e.what());
      throw;
    }
    return std::string();
  }();
  return why;
}

void turboquant_stateful() { stateful_case(Kind::turboquant, hooks()); }
void turboquant_split() { turboquant_prefill_split_invariant(hooks()); }

TEST(Stateful, TurboQuantKVCache) {
  if (!turboquant_missing().empty()) GTEST_SKIP() << "backend " << prop_backend_name() << ": " << turboquant_missing();
  rc::detail::checkGTest(&turboquant_stateful);
}
TEST(Metamorphic, TurboQuantPrefillSplitInvariant) {
  if (!turboquant_missing().empty()) GTEST_SKIP() << "backend " << prop_backend_name() << ": " << turboquant_missing();
  rc::detail::checkGTest(&turboquant_split);
}

RC_GTEST_PROP(Regression, RopeVectorOffsetsPerRow, ()) { rope_vector_offsets_per_row(hooks()); }
RC_GTEST_PROP(Regression, QuantizedBatchGqaPaddedMask, ()) { quantized_batch_gqa_padded_mask(hooks()); }
RC_GTEST_PROP(Regression, QuantizedPvValueDims, ()) { quantized_pv_value_dims(hooks()); }
RC_GTEST_PROP(Regression, QuantizePolicyPerLayer, ()) { quantize_policy_per_layer(hooks()); }
RC_GTEST_PROP(Regression, RestoreRejectsInconsistentOffset, ()) { restore_rejects_inconsistent_offset(hooks()); }
RC_GTEST_PROP(Regression, StateFileCorruptionIsAnError, ()) { state_file_corruption_is_an_error(hooks()); }
RC_GTEST_PROP(Regression, TrimmedEmptyRoundTrips, ()) { trimmed_empty_round_trips(hooks()); }

const BatchHooks& batch_hooks() {
  static const BatchHooks h = production_batch_hooks();
  return h;
}

RC_GTEST_PROP(Batch, KVCacheRowsMatchLogs, ()) { batch_kv_rows_match_logs(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, QuantizedRowsMatchLogs, ()) { batch_quantized_rows_match_logs(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, AttendEqualsPerRow, ()) { batch_attend_equals_per_row(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, RotatingExtractNewest, ()) { batch_rotating_extract_newest(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, PrefixFetchMatchesFormat, ()) { prefix_fetch_matches_format(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, RotatingLifecycle, ()) { batch_rotating_lifecycle(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, AttendSurvivesFilterExtend, ()) { batch_attend_survives_filter_extend(hooks(), batch_hooks()); }
RC_GTEST_PROP(Batch, PrefixReuseContinues, ()) { prefix_reuse_continues(hooks(), batch_hooks()); }

}  // namespace
}  // namespace kvlab::prop
