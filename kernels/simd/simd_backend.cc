// SimdBackend: target enumeration/forcing and the Backend table. The only per-target
// code here is CurrentTarget(), which reports which compiled copy dispatch picked.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/simd_backend.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
std::int64_t CurrentTarget() { return HWY_TARGET; }
}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <hwy/targets.h>

#include "kernels/simd/simd_backend.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/kv_append.h"
#include "reference/turboquant.h"

namespace kvlab {

namespace simd {
HWY_EXPORT(CurrentTarget);
}  // namespace simd

namespace {

// The mask forced by the innermost live ScopedSimdTarget (0: none). Highway keeps the
// mock itself but offers no getter, so nesting is tracked here.
std::int64_t g_forced_mask = 0;

// What the CPU supports, read with no mock active. Computed once: later calls could
// run inside a ScopedSimdTarget, where hwy::SupportedTargets() reports the mock.
std::int64_t unmocked_supported() {
  static const std::int64_t supported = [] {
    if (g_forced_mask != 0) hwy::SetSupportedTargetsForTest(0);
    const std::int64_t s = hwy::SupportedTargets();
    if (g_forced_mask != 0) hwy::SetSupportedTargetsForTest(g_forced_mask);
    return s;
  }();
  return supported;
}

}  // namespace

std::vector<SimdTarget> simd_compiled_targets() {
  std::vector<SimdTarget> out;
  const std::int64_t supported = unmocked_supported();
  // Lower bits are better targets on x86 (HWY_AVX3_DL < HWY_AVX3 < ... < HWY_SCALAR).
  for (std::int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) {
    const std::int64_t bit = bits & -bits;
    SimdTarget t{hwy::TargetName(bit), bit, (supported & bit) != 0, {}};
    if (!t.attainable) t.reason = "compiled in, but this CPU (or valgrind) does not support it";
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::string> simd_targets() {
  std::vector<std::string> names;
  for (const SimdTarget& t : simd_compiled_targets())
    if (t.attainable) names.push_back(t.name);
  return names;
}

std::string simd_current_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(simd::CurrentTarget)()); }

namespace {

// The Highway bit of target `name`; throws as ScopedSimdTarget's constructor documents.
std::int64_t attainable_bit(std::string_view name) {
  std::string attainable, compiled;
  bool known = false;
  for (const SimdTarget& t : simd_compiled_targets()) {
    compiled += (compiled.empty() ? "" : ", ") + t.name;
    known = known || t.name == name;
    if (t.name == name && t.attainable) return t.bit;
    if (t.attainable) attainable += (attainable.empty() ? "" : ", ") + t.name;
  }
  // A name that is no compiled target (a typo, the wrong case) is a usage error; a
  // compiled target this CPU cannot run makes the backend unavailable here.
  KVLAB_REQUIRE(known, invalid_argument, "unknown SIMD target '", name, "' (compiled targets: ", compiled, ")");
  fail(ErrorKind::unsupported, cat("SIMD target '", name, "' is not attainable here (attainable: ", attainable, ")"));
}

}  // namespace

SimdTargetPin::SimdTargetPin(std::int64_t bit) : bit_(bit), previous_(g_forced_mask) {
  if (bit_ == 0 || bit_ == previous_) return;
  g_forced_mask = bit_;
  // Updates Highway's chosen target too, so HWY_DYNAMIC_DISPATCH re-dispatches.
  hwy::SetSupportedTargetsForTest(bit_);
}

SimdTargetPin::~SimdTargetPin() {
  if (bit_ == 0 || bit_ == previous_) return;
  g_forced_mask = previous_;
  // Back to the CPU's own targets as a mock of them, not by clearing the mock: with none,
  // Highway re-detects the CPU (eight CPUID instructions) at the next dispatch, and in a
  // VM each CPUID traps to the host, so every pinned call would make the next unpinned
  // one pay for it (docs/benchmarks.md §Measurements behind kernel choices).
  hwy::SetSupportedTargetsForTest(previous_ != 0 ? previous_ : unmocked_supported());
}

ScopedSimdTarget::ScopedSimdTarget(std::string_view name) : pin_(attainable_bit(name)) {}

SimdBackend::SimdBackend(std::string_view target) : bit_(attainable_bit(target)) {}

std::string SimdBackend::name() const {
  const SimdTargetPin pin(bit_);
  return "simd:" + simd_current_target();
}

// ---- kernels: the host-kernel adapter (kvlab/host_buffer.h) onto simd:: ------------

void SimdBackend::quantize_kernel(const QuantizeArgs& a) { simd::quantize(host_cview(a.x), a.rounding, host_view(a.out)); }

void SimdBackend::dequantize_kernel(const DequantizeArgs& a) { simd::dequantize(host_cview(a.in), host_view(a.out), a.flavour); }

void SimdBackend::rope_kernel(const RopeArgs& a) {
  simd::rope(host_cview(a.x), a.params, a.offsets.scalar, host_per_row(a.offsets), host_view(a.out));
}

Backend::AttentionRounding SimdBackend::attention_rounding() const {
  AttentionRounding r = AttentionRounding::none();
  r.probabilities = simd::last_attention_rounded_probabilities();
  return r;
}

void SimdBackend::sdpa_kernel(const SdpaArgs& a) {
  ConstTensorView m, s;
  simd::sdpa(host_cview(a.q), host_cview(a.k), host_cview(a.v), a.params, host_cview(a.mask, m),
             host_cview(a.sinks, s), host_view(a.out));
}

void SimdBackend::quantized_sdpa_kernel(const QuantizedSdpaArgs& a) {
  ConstTensorView m, s;
  simd::quantized_sdpa(host_cview(a.q), host_cview(a.k), host_cview(a.v), a.params, host_cview(a.mask, m),
                       host_cview(a.sinks, s), host_view(a.out));
}

// TurboQuant is not vectorized: the SIMD backend runs the oracle's codec, so caches over
// this backend work, and notes the delegation so no case counts it as a SIMD pass.
void SimdBackend::turboquant_encode_kernel(const TurboQuantEncodeArgs& a) {
  note_delegated("turboquant_encode");  // the oracle runs it: never judged as SIMD
  ref::turboquant_encode(host_cview(a.x), a.codec, host_view(a.norms), host_view(a.indices));
}

void SimdBackend::turboquant_decode_kernel(const TurboQuantDecodeArgs& a) {
  note_delegated("turboquant_decode");  // the oracle runs it: never judged as SIMD
  ref::turboquant_decode(host_cview(a.norms), host_cview(a.indices), a.codec, host_view(a.out));
}

// The device-offset ops are a few row memcpys and B integer adds, which vector code
// would not speed up: the SIMD backend runs the oracle's host code (noted as delegated).
void SimdBackend::kv_append_advance_kernel(const KvAppendAdvanceArgs& a) {
  note_delegated("kv_append_advance");  // the oracle runs it: never judged as SIMD
  ref::kv_append_advance(host_cview(a.k), host_cview(a.v), a.left_padding, host_view(a.offsets), host_view(a.k_cache),
                         host_view(a.v_cache));
}

void SimdBackend::kv_snapshot_kernel(const KvSnapshotArgs& a) {
  note_delegated("kv_snapshot");
  ref::kv_snapshot(host_cview(a.src), host_view(a.dst));
}

void SimdBackend::kv_scatter_kernel(const KvScatterArgs& a) {
  simd::kv_scatter(host_cview(a.src), a.slots, host_view(a.dst));
}

void SimdBackend::kv_gather_kernel(const KvGatherArgs& a) {
  simd::kv_gather(host_cview(a.src), a.batch_index, host_view(a.dst));
}

void SimdBackend::kv_copy_blocks_kernel(const KvCopyBlocksArgs& a) {
  simd::kv_copy_blocks(host_cview(a.src), a.blocks, host_view(a.dst));
}

void SimdBackend::kv_roll_kernel(const KvRollArgs& a) {
  simd::kv_roll(host_cview(a.src), a.shifts, host_view(a.dst));
}

void SimdBackend::kv_cast_kernel(const KvCastArgs& a) { simd::kv_cast(host_cview(a.src), host_view(a.dst)); }

}  // namespace kvlab
#endif  // HWY_ONCE
