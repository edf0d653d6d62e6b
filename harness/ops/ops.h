// The harness ops, listed once: each is an OpInfo (harness/ops/<stem>_info.cc, with its
// tolerance object, derivation and traffic model) over kernel ops of kvlab/op_list.h,
// plus the cache-level op `cache` (cache_info.cc), which drives caches over a backend.
// The list makes the declarations below and all_ops(); a static_assert below fails the
// build when a KVLAB_OPS op is driven by no harness op or an entry names an op that is
// not listed, and tests/test_op_list.cc checks that each entry's smoke cases do call the
// kernel ops it names and that each has harness/cases/<name>/.
#pragma once

#include <cstdint>
#include <string_view>

#include "harness/op.h"
#include "kvlab/dtype.h"
#include "kvlab/quant_spec.h"

// X(name, kernel ops...): the OpInfo accessor kvlab::harness::ops::name() and the ops of
// KVLAB_OPS its cases drive. `cache` names the ops no kernel-level harness op covers
// (TurboQuant's codec, judged through the TurboQuant cache); it calls others too.
#define KVLAB_HARNESS_OPS(X)                        \
  X(affine_quantize, quantize)                      \
  X(affine_dequantize, dequantize)                  \
  X(fp_quantize, quantize)                          \
  X(fp_dequantize, dequantize)                      \
  X(ggml_quantize, quantize)                        \
  X(ggml_dequantize, dequantize)                    \
  X(rope, rope)                                     \
  X(sdpa, sdpa)                                     \
  X(quantized_sdpa, quantized_sdpa)                 \
  X(kv_scatter, kv_scatter)                         \
  X(kv_gather, kv_gather)                           \
  X(kv_copy_blocks, kv_copy_blocks)                 \
  X(kv_roll, kv_roll)                               \
  X(kv_append_advance, kv_append_advance)           \
  X(kv_snapshot, kv_snapshot)                       \
  X(kv_cast, kv_cast)                               \
  X(cache, turboquant_encode, turboquant_decode)

namespace kvlab::harness::ops {

#define KVLAB_DECLARE_HARNESS_OP(name, ...) const OpInfo& name();
KVLAB_HARNESS_OPS(KVLAB_DECLARE_HARNESS_OP)
#undef KVLAB_DECLARE_HARNESS_OP

// Per harness op, its name and the kernel ops it names, as written ("a, b").
struct HarnessOpEntry {
  std::string_view name, kernel_ops;
};
inline constexpr HarnessOpEntry kHarnessOps[] = {
#define KVLAB_HARNESS_OP_ENTRY(name, ...) {#name, #__VA_ARGS__},
    KVLAB_HARNESS_OPS(KVLAB_HARNESS_OP_ENTRY)
#undef KVLAB_HARNESS_OP_ENTRY
};
inline constexpr std::string_view kListedKernelOps[] = {
#define KVLAB_LISTED_KERNEL_OP(op, Args, stem) #op,
    KVLAB_OPS(KVLAB_LISTED_KERNEL_OP)
#undef KVLAB_LISTED_KERNEL_OP
};

// Calls f on each op of a "a, b" list.
template <class F>
constexpr void for_each_named_op(std::string_view ops, F f) {
  while (!ops.empty()) {
    const std::size_t comma = ops.find(',');
    std::string_view op = ops.substr(0, comma);
    while (!op.empty() && op.front() == ' ') op.remove_prefix(1);
    f(op);
    ops = comma == std::string_view::npos ? std::string_view{} : ops.substr(comma + 1);
  }
}
constexpr bool drives(const HarnessOpEntry& entry, std::string_view op) {
  bool found = false;
  for_each_named_op(entry.kernel_ops, [&](std::string_view named) { found = found || named == op; });
  return found;
}
constexpr bool every_listed_op_is_driven() {
  for (std::string_view op : kListedKernelOps) {
    bool driven = false;
    for (const HarnessOpEntry& entry : kHarnessOps) driven = driven || drives(entry, op);
    if (!driven) return false;
  }
  return true;
}
constexpr bool every_named_op_is_listed() {
  bool ok = true;
  for (const HarnessOpEntry& entry : kHarnessOps) {
    ok = ok && !entry.kernel_ops.empty();
    for_each_named_op(entry.kernel_ops, [&](std::string_view named) {
      bool listed = false;
      for (std::string_view op : kListedKernelOps) listed = listed || op == named;
      ok = ok && listed;
    });
  }
  return ok;
}
static_assert(every_listed_op_is_driven(), "an op of KVLAB_OPS is named by no entry of KVLAB_HARNESS_OPS");
static_assert(every_named_op_is_listed(), "a KVLAB_HARNESS_OPS entry names no op, or an op not in KVLAB_OPS");

// The (B, H, T, D) shape of the problem's keys B, H, T, D: the input of the quantize ops.
inline Shape bhtd_shape(const Problem& p) { return {p.integer("B"), p.integer("H"), p.integer("T"), p.integer("D")}; }

// ---- for the traffic models (OpInfo::traffic_model) ------------------------------
// Bytes of one element of the dtype named by the problem's `key`.
inline std::int64_t dtype_bytes(const Problem& p, const char* key = "dtype") {
  return static_cast<std::int64_t>(dtype_size(dtype_from_name(p.word(key))));
}
// Elements of x (B, H, T, D): the quantizers' and rope's input.
inline std::int64_t bhtd_numel(const Problem& p) {
  return p.integer("B") * p.integer("H") * p.integer("T") * p.integer("D");
}
// Packed storage of n elements under `spec` for data of element size `es`:
//   codes  n·bits/8 bytes (u32 words, D·bits/32 per row),
//   scales n/group · (es for affine, 1 byte — E8M0/E4M3 — for the fp modes, 2 — f16 —
//   for ggml's blocks),
//   biases n/group · the scales' size (affine, q4_1, q5_1).
inline std::int64_t packed_bytes(const QuantSpec& spec, std::int64_t n, std::int64_t es) {
  const std::int64_t groups = n / spec.group_size;
  const ScaleEncoding scale = spec.format().scale;
  const std::int64_t scale_size = scale == ScaleEncoding::input_dtype ? es : (scale == ScaleEncoding::f16 ? 2 : 1);
  return n * spec.bits / 8 + groups * scale_size * (spec.has_biases() ? 2 : 1);
}

// The rope op's tolerance (its derivation is in rope_info.cc), per element of
// ref = rope(x) with batch row b at positions t + row_offsets[b]; for checks outside the
// harness that compare a backend's RoPE with the oracle's (the property suite).
std::vector<double> rope_budget(const Tensor& x, const RopeParams& rope, const std::vector<std::int32_t>& row_offsets,
                                const Tensor& ref);

}  // namespace kvlab::harness::ops
