// The SIMD backend: host memory (HostMemoryBackend) and kernels written once with Google
// Highway and dispatched at run time to the best target the CPU supports (AVX3 on the CI
// machine, AVX2 under valgrind). Contracts are the reference headers' (reference/*.h):
// same results (bit-exact where the oracle is exact: affine codes/scales/biases,
// dequantize, kv moves) and the same kvlab::Error for the same invalid input.
//
// An op not vectorized is not overridden, so it throws Error{unsupported} naming the op:
// it never falls back to the reference silently (a comparison against the oracle would
// then compare the oracle with itself). TurboQuant and the device-offset ops are the
// declared exceptions: they run the oracle's code and say so (note_delegated).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/host_buffer.h"

namespace kvlab {

// X(op, ArgumentStruct): the ops of kvlab/op_list.h the SIMD backend overrides, a subset
// of KVLAB_OPS. A new op needs no entry here: until it has a kernel in
// kernels/simd/<stem>.cc it throws Error{unsupported} and the harness reports its cases
// UNIMPLEMENTED. TurboQuant and the device-offset ops are listed but run the oracle's
// code, noted as delegated (kvlab/backend.h), so no case counts them as SIMD passes.
#define KVLAB_SIMD_OPS(X)                        \
  X(quantize, QuantizeArgs)                      \
  X(dequantize, DequantizeArgs)                  \
  X(rope, RopeArgs)                              \
  X(sdpa, SdpaArgs)                              \
  X(quantized_sdpa, QuantizedSdpaArgs)           \
  X(turboquant_encode, TurboQuantEncodeArgs)     \
  X(turboquant_decode, TurboQuantDecodeArgs)     \
  X(kv_scatter, KvScatterArgs)                   \
  X(kv_gather, KvGatherArgs)                     \
  X(kv_copy_blocks, KvCopyBlocksArgs)            \
  X(kv_roll, KvRollArgs)                         \
  X(kv_append_advance, KvAppendAdvanceArgs)      \
  X(kv_snapshot, KvSnapshotArgs)                 \
  X(kv_cast, KvCastArgs)

// One Highway target compiled into this binary.
struct SimdTarget {
  std::string name;         // Highway's name: "AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"
  std::int64_t bit = 0;     // the HWY_* target bit
  bool attainable = false;  // compiled in and supported by this CPU (unmocked)
  std::string reason;       // why not attainable (empty when attainable)
};

// Every compiled target, best first, with attainability on this machine. Tests iterate
// over it and print the skipped ones with their reason.
std::vector<SimdTarget> simd_compiled_targets();
// Names of the attainable targets, best first.
std::vector<std::string> simd_targets();
// The target that dispatch picks now (honours an active ScopedSimdTarget).
std::string simd_current_target();

// Makes the target with Highway bit `bit` current for its scope (0: leaves dispatch as it
// is) and restores the previous choice after: how a pinned SimdBackend runs each call.
// Cheap (two hwy::SetSupportedTargetsForTest calls at most, and no CPU re-detection
// after). Process-global: not thread-safe.
class SimdTargetPin {
 public:
  explicit SimdTargetPin(std::int64_t bit);
  ~SimdTargetPin();
  SimdTargetPin(const SimdTargetPin&) = delete;
  SimdTargetPin& operator=(const SimdTargetPin&) = delete;

 private:
  std::int64_t bit_ = 0, previous_ = 0;
};

// Forces dispatch to one target, by name, for its lifetime (hwy::SetSupportedTargetsForTest),
// then restores the previous choice. Throws Error{unsupported} for a target that is not
// attainable here, naming it and the attainable ones. Process-global: not thread-safe,
// meant for tests and the harness.
class ScopedSimdTarget {
 public:
  explicit ScopedSimdTarget(std::string_view name);

 private:
  SimdTargetPin pin_;
};

class SimdBackend final : public HostMemoryBackend {
 public:
  SimdBackend() = default;
  // Pinned to one Highway target (the harness runs every attainable target: `kvlab check
  // --backend simd:SSE4`): each call makes it current and restores the previous choice,
  // so backends pinned to different targets can live side by side (`kvlab check` with
  // several --backend runs them case by case). Throws unsupported for a target not
  // attainable here, invalid_argument for a name that is no compiled target.
  explicit SimdBackend(std::string_view target);

  std::string name() const override;
  // f32 throughout: q·scale, logits and dequantized K/V stay f32 (the integer K side of
  // the 4-bit decode carries q in 24 bits under a run-time error certificate); P too,
  // except in a bf16 decode on an AVX512_BF16 CPU, whose V side rounds it to bf16 (the
  // call reports it: simd::last_attention_rounded_probabilities).
  AttentionRounding attention_rounding() const override;

  // The ops this backend runs (KVLAB_SIMD_OPS below); the rest keep Backend's default,
  // Error{unsupported} naming the op. `override` makes each entry a checked member of
  // KVLAB_OPS: a misspelt or stale entry does not compile.
#define KVLAB_SIMD_PINNED_OP(op, Args) \
  void op(const Args& a) override {    \
    const SimdTargetPin pin(bit_);     \
    op##_kernel(a);                    \
  }
  KVLAB_SIMD_OPS(KVLAB_SIMD_PINNED_OP)
#undef KVLAB_SIMD_PINNED_OP

 private:
  // The kernels proper (simd_backend.cc), run under the pin.
#define KVLAB_SIMD_KERNEL(op, Args) void op##_kernel(const Args& a);
  KVLAB_SIMD_OPS(KVLAB_SIMD_KERNEL)
#undef KVLAB_SIMD_KERNEL

  std::int64_t bit_ = 0;  // the pinned target's Highway bit; 0: whatever dispatch picks
};

}  // namespace kvlab
