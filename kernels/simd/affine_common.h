// What the SIMD affine kernels (affine_quantize.cc, affine_dequantize.cc) share outside
// the per-target code: the group constants, the job description handed to each target,
// the oracle's scalar steps (the parameters of docs/quantization.md §Affine parameters, the
// non-finite fallback), the parameter conversions, and the task split.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "kvlab/quant_spec.h"
#include "reference/affine_quantize.h"

namespace kvlab::simd::affine_detail {

constexpr float kScaleFloor = 1e-7f;  // MLX's eps on the group step (as the oracle)
constexpr int kMaxGroup = 128;        // QuantSpec::validate allows 32, 64, 128
struct GroupParams {
  float scale = 0, bias = 0;
};

// What a block of groups needs (both directions); sizes in elements/bytes per group.
struct GroupJob {
  int gs = 0, bits = 0;
  bool gpu = false;               // Rounding::mlx_gpu
  DType data_dtype = DType::f32;  // quantize: x; dequantize: out
  DType param_dtype = DType::f32; // scales/biases
  const std::byte* in = nullptr;  // quantize: x; dequantize: wq
  std::byte* out = nullptr;       // quantize: wq; dequantize: out
  std::byte* scales_out = nullptr;  // quantize
  std::byte* biases_out = nullptr;
  const std::byte* scales_in = nullptr;  // dequantize
  const std::byte* biases_in = nullptr;
};

inline float largest_code(int bits) { return static_cast<float>((1 << bits) - 1); }

inline float round_to_code(float v, bool gpu) { return gpu ? std::round(v) : std::rint(v); }

// The parameters of docs/quantization.md §Affine parameters from the group's extremes,
// operation for operation as the oracle.
inline GroupParams group_params(float alpha, float beta, int bits, bool gpu) {
  const float s0 = std::max((alpha - beta) / largest_code(bits), kScaleFloor);
  const bool anchor_on_min = std::abs(beta) > std::abs(alpha);
  const float s1 = anchor_on_min ? s0 : -s0;
  const float edge = anchor_on_min ? beta : alpha;
  const float q0 = round_to_code(edge / s1, gpu);
  if (q0 != 0.0f) return {edge / q0, edge};
  return {s1, 0.0f};
}

// The oracle's affine_code, for the non-finite fallback (NaN → 0; GPU: wrap mod 256).
inline std::uint8_t scalar_code(float value, const GroupParams& p, int bits, bool gpu) {
  const float n = largest_code(bits);
  const float r = round_to_code((value - p.bias) / p.scale, gpu);
  if (std::isnan(r)) return 0;
  if (!gpu) return static_cast<std::uint8_t>(std::min(std::max(r, 0.0f), n));
  const float capped = std::min(r, n);
  if (capped >= 0.0f) return static_cast<std::uint8_t>(capped);
  if (!(capped >= -0x1p31f)) return 0;
  return static_cast<std::uint8_t>(static_cast<std::int64_t>(capped) & 0xFF & ((std::int64_t{1} << bits) - 1));
}

// One group with the oracle's scalar loop (NaN-skipping `>`/`<` scan).
inline GroupParams scalar_group(const float* g, int gs, int bits, bool gpu, std::uint8_t* codes) {
  float alpha = gpu ? 0.0f : -std::numeric_limits<float>::infinity();
  float beta = std::numeric_limits<float>::infinity();
  for (int j = 0; j < gs; ++j) {
    if (g[j] > alpha) alpha = g[j];
    if (g[j] < beta) beta = g[j];
  }
  const GroupParams p = group_params(alpha, beta, bits, gpu);
  for (int j = 0; j < gs; ++j) codes[j] = scalar_code(g[j], p, bits, gpu);
  return p;
}

// Element k of a scales/biases buffer, with kvlab's own conversions (as TensorView).
inline void store_param(DType t, std::byte* base, std::size_t k, float v) {
  if (t == DType::f32) {
    std::memcpy(base + 4 * k, &v, 4);
    return;
  }
  const std::uint16_t bits = t == DType::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
  std::memcpy(base + 2 * k, &bits, 2);
}

inline float load_param(DType t, const std::byte* base, std::size_t k) {
  if (t == DType::f32) {
    float v;
    std::memcpy(&v, base + 4 * k, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, base + 2 * k, 2);
  return t == DType::f16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

// Runs fn over `groups` groups in tasks of streaming_elements_per_task/gs groups: a split fixed by
// the problem, never by the pool size.
using GroupsFn = void (*)(const GroupJob&, std::int64_t, std::int64_t);
inline void run_in_tasks(GroupsFn fn, const GroupJob& job, std::int64_t groups) {
  KVLAB_REQUIRE(job.gs > 0 && job.gs <= kMaxGroup && job.gs % 32 == 0, internal, "group size ", job.gs,
                " is outside the SIMD kernel's 32..", kMaxGroup);
  const std::int64_t per_task = std::max<std::int64_t>(1, streaming_elements_per_task(groups * job.gs) / job.gs);
  parallel_for((groups + per_task - 1) / per_task,
               [&](std::int64_t t) { fn(job, t * per_task, std::min(groups, (t + 1) * per_task)); });
}

// What both directions share: the group shape, the dtypes and the streams (quantize: x →
// wq; dequantize: wq → out).
inline GroupJob job_of(const QuantSpec& spec, DType data, DType params, const std::byte* in, std::byte* out) {
  GroupJob job;
  job.gs = spec.group_size;
  job.bits = spec.bits;
  job.data_dtype = data;
  job.param_dtype = params;
  job.in = in;
  job.out = out;
  return job;
}

}  // namespace kvlab::simd::affine_detail
