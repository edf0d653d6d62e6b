// The property suite (labels `property`, `property-deep`): every property of
// properties.h with the production hooks. RC_PARAMS (seed, max_success) comes from the
// ctest registration; a failure prints the seed and the shrunk case (config + commands).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/properties.h"

namespace kvlab::prop {
namespace {

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

}  // namespace
}  // namespace kvlab::prop
