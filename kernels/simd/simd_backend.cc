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

ConstTensorView cv(const DTensor& t) { return host_cview(t); }

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

ScopedSimdTarget::ScopedSimdTarget(std::string_view name) : previous_(g_forced_mask) {
  std::string attainable, compiled;
  bool known = false;
  for (const SimdTarget& t : simd_compiled_targets()) {
    compiled += (compiled.empty() ? "" : ", ") + t.name;
    known = known || t.name == name;
    if (t.name == name && t.attainable) {
      g_forced_mask = t.bit;
      // Updates Highway's chosen target too, so HWY_DYNAMIC_DISPATCH re-dispatches.
      hwy::SetSupportedTargetsForTest(t.bit);
      return;
    }
    if (t.attainable) attainable += (attainable.empty() ? "" : ", ") + t.name;
  }
  // A name that is no compiled target (a typo, the wrong case) is a usage error; a
  // compiled target this CPU cannot run makes the backend unavailable here.
  KVLAB_REQUIRE(known, invalid_argument, "unknown SIMD target '", name, "' (compiled targets: ", compiled, ")");
  fail(ErrorKind::unsupported, cat("SIMD target '", name, "' is not attainable here (attainable: ", attainable, ")"));
}

ScopedSimdTarget::~ScopedSimdTarget() {
  g_forced_mask = previous_;
  hwy::SetSupportedTargetsForTest(previous_);
}

// ---- implemented kernels ----------------------------------------------------------

void SimdBackend::affine_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding, const DTensor& wq,
                                  const DTensor& scales, const DTensor& biases) {
  simd::affine_quantize(cv(x), spec, rounding, host_view(wq), host_view(scales), host_view(biases));
}

void SimdBackend::affine_dequantize(const DTensor& wq, const DTensor& scales, const DTensor& biases,
                                    const QuantSpec& spec, const DTensor& out) {
  simd::affine_dequantize(cv(wq), cv(scales), cv(biases), spec, host_view(out));
}

void SimdBackend::rope(const DTensor& x, const RopeParams& params, const Offsets& offsets, const DTensor& out) {
  std::optional<ConstTensorView> per_row;
  if (offsets.per_row) per_row = cv(*offsets.per_row);
  simd::rope(cv(x), params, offsets.scalar, per_row, host_view(out));
}

void SimdBackend::kv_scatter(const DTensor& src, const DTensor& slots, const DTensor& dst) {
  simd::kv_scatter(cv(src), cv(slots), host_view(dst));
}

void SimdBackend::kv_gather(const DTensor& src, const DTensor& batch_index, const DTensor& dst) {
  simd::kv_gather(cv(src), cv(batch_index), host_view(dst));
}

void SimdBackend::kv_copy_blocks(const DTensor& src, std::span<const SeqBlock> blocks, const DTensor& dst) {
  simd::kv_copy_blocks(cv(src), blocks, host_view(dst));
}

void SimdBackend::kv_roll(const DTensor& src, const DTensor& shifts, const DTensor& dst) {
  simd::kv_roll(cv(src), cv(shifts), host_view(dst));
}

void SimdBackend::fp_quantize(const DTensor& x, const QuantSpec& spec, Rounding rounding,
                              std::optional<float> global_scale, const DTensor& wq, const DTensor& scales) {
  simd::fp_quantize(cv(x), spec, rounding, global_scale, host_view(wq), host_view(scales));
}

void SimdBackend::fp_dequantize(const DTensor& wq, const DTensor& scales, const QuantSpec& spec,
                                std::optional<float> global_scale, const DTensor& out) {
  simd::fp_dequantize(cv(wq), cv(scales), spec, global_scale, host_view(out));
}

namespace {
const ConstTensorView* opt_cview(const DTensor* t, ConstTensorView& storage) {
  if (t == nullptr) return nullptr;
  storage = cv(*t);
  return &storage;
}
ref::QuantizedView quantized_cview(const QuantizedDTensor& t) {
  return {cv(t.wq), cv(t.scales), t.biases ? cv(t.biases) : ConstTensorView{}, t.spec};
}
}  // namespace

void SimdBackend::sdpa(const DTensor& q, const DTensor& k, const DTensor& v, const AttentionParams& params,
                       const DTensor* mask_array, const DTensor* sinks, const DTensor& out) {
  ConstTensorView mask_view, sinks_view;
  simd::sdpa(cv(q), cv(k), cv(v), params, opt_cview(mask_array, mask_view), opt_cview(sinks, sinks_view),
             host_view(out));
}

void SimdBackend::quantized_sdpa(const DTensor& q, const QuantizedDTensor& k, const QuantizedDTensor& v,
                                 const AttentionParams& params, const DTensor* mask_array, const DTensor* sinks,
                                 const DTensor& out) {
  ConstTensorView mask_view, sinks_view;
  simd::quantized_sdpa(cv(q), quantized_cview(k), quantized_cview(v), params, opt_cview(mask_array, mask_view),
                       opt_cview(sinks, sinks_view), host_view(out));
}

// TurboQuant is not vectorized (the SIMD kernel list does not include it): the
// SIMD backend runs the oracle's codec explicitly, so caches over this backend work.
void SimdBackend::turboquant_encode(const DTensor& x, const TurboQuantCodec& codec, const DTensor& norms,
                                    const DTensor& indices) {
  ref::turboquant_encode(cv(x), codec, host_view(norms), host_view(indices));
}
void SimdBackend::turboquant_decode(const DTensor& norms, const DTensor& indices, const TurboQuantCodec& codec,
                                    const DTensor& out) {
  ref::turboquant_decode(cv(norms), cv(indices), codec, host_view(out));
}

}  // namespace kvlab
#endif  // HWY_ONCE
