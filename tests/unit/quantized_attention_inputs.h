// Inputs of the quantized-attention tests of the optimized backends (tests/simd,
// tests/vulkan): random problems quantized by the oracle, the oracle's visibility rule,
// and NaN poisoning of the keys no query may see. Each test file keeps its own budget
// and comparison (they follow each backend's accumulation).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/mask.h"
#include "reference/quantized_sdpa.h"
#include "tests/unit/test_util.h"

namespace kvlab::testing {

struct QuantizedAttentionInputs {
  Tensor q;
  ref::QuantizedTensor k, v;
  AttentionParams params;
  std::optional<Tensor> mask, sinks;
};

struct AttentionDims {
  std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
};

inline ConstTensorView optional_view(const Tensor& t) {
  return t.rank() > 0 && t.numel() > 0 ? t.view() : ConstTensorView{};
}
inline ref::QuantizedView view_of(const ref::QuantizedTensor& x) {
  return {x.wq.view(), x.scales.view(), optional_view(x.biases), x.spec};
}
inline std::int64_t dv_of(const QuantizedAttentionInputs& in) { return in.v.wq.dim(3) * 32 / in.v.spec.bits; }

inline ref::QuantizedTensor quantize(const Tensor& x, const QuantSpec& spec) {
  if (spec.mode == QuantMode::affine) return ref::affine_quantize(x, spec, Rounding::mlx_cpu);
  return ref::fp_quantize(x, spec, Rounding::mlx_cpu);
}

inline QuantSpec affine(int bits, int group) { return QuantSpec::make(QuantMode::affine, bits, group); }

// Normal(0,1) q, K and V; K and V quantized with their own spec from data of their own
// dtype (which is the dtype of their scales and biases).
inline QuantizedAttentionInputs random_inputs(SeededRng& rng, const AttentionDims& s, DType q_dtype,
                                              const QuantSpec& ks, const QuantSpec& vs, DType k_dtype,
                                              DType v_dtype) {
  QuantizedAttentionInputs in;
  in.q = random_normal(rng, q_dtype, {s.B, s.Hq, s.Lq, s.Dk});
  in.k = quantize(random_normal(rng, k_dtype, {s.B, s.Hkv, s.Lk, s.Dk}), ks);
  in.v = quantize(random_normal(rng, v_dtype, {s.B, s.Hkv, s.Lk, s.Dv}), vs);
  in.params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.Dk)));
  return in;
}

// Whether query (b, h, i) may see key j (the oracle's rule).
inline bool visible(const QuantizedAttentionInputs& in, std::int64_t b, std::int64_t h, std::int64_t i,
                    std::int64_t j) {
  const MaskSpec& m = in.params.mask;
  const std::int64_t Lq = in.q.dim(2), Lk = in.k.wq.dim(2);
  switch (m.kind) {
    case MaskKind::none: return true;
    case MaskKind::causal: return ref::causal_visible(m, b, i, j, Lq, Lk);
    case MaskKind::boolean:
    case MaskKind::additive: {
      const Tensor& a = *in.mask;
      const std::int64_t at = (((a.dim(0) == 1 ? 0 : b) * a.dim(1) + (a.dim(1) == 1 ? 0 : h)) * Lq + i) * Lk + j;
      if (m.kind == MaskKind::boolean) return a.view().load_int(at) != 0;
      const float x = a.view().load(at);
      return !(std::isinf(x) && x < 0);
    }
  }
  return true;
}

// NaN into the scales of every K and V row that no query of its kv head may see (as the
// harness does): a kernel that reads one, or multiplies its zero weight by it, fails.
inline int poison_hidden_keys(QuantizedAttentionInputs& in) {
  const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2);
  const std::int64_t Hkv = in.k.wq.dim(1), Lk = in.k.wq.dim(2), R = Hq / Hkv;
  int poisoned = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (std::int64_t j = 0; j < Lk; ++j) {
        bool seen = false;
        for (std::int64_t h = kvh * R; h < (kvh + 1) * R && !seen; ++h)
          for (std::int64_t i = 0; i < Lq && !seen; ++i) seen = visible(in, b, h, i, j);
        if (seen) continue;
        const std::int64_t row = (b * Hkv + kvh) * Lk + j;
        for (Tensor* scales : {&in.k.scales, &in.v.scales}) {
          const std::int64_t g = scales->dim(3);
          for (std::int64_t x = 0; x < g; ++x) scales->view().store(row * g + x, std::numeric_limits<float>::quiet_NaN());
        }
        ++poisoned;
      }
  return poisoned;
}

}  // namespace kvlab::testing
