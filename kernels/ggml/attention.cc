#include "kernels/ggml/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kvlab/error.h"
#include "reference/mask.h"

namespace kvlab::ggmlk {

namespace {

constexpr std::uint16_t kF16Zero = 0x0000, kF16NegInf = 0xFC00;

// ggml's mask: f16 (mb, mh, Lq, Lk), additive; empty when the problem has none.
struct GgmlMask {
  std::vector<std::uint16_t> bits;
  std::int64_t mb = 1, mh = 1;
};

GgmlMask build_mask(const AttentionParams& params, const ConstTensorView* mask, std::int64_t b_count,
                    std::int64_t lq, std::int64_t lk, const char* what) {
  GgmlMask m;
  switch (params.mask.kind) {
    case MaskKind::none: return m;
    case MaskKind::causal: {
      const bool per_row = !params.mask.left_padding.empty() || !params.mask.right_padding.empty();
      m.mb = per_row ? b_count : 1;
      m.bits.resize(static_cast<std::size_t>(m.mb * lq * lk));
      std::size_t n = 0;
      for (std::int64_t b = 0; b < m.mb; ++b)
        for (std::int64_t i = 0; i < lq; ++i)
          for (std::int64_t j = 0; j < lk; ++j)
            m.bits[n++] = ref::causal_visible(params.mask, b, i, j, lq, lk) ? kF16Zero : kF16NegInf;
      return m;
    }
    case MaskKind::boolean:
    case MaskKind::additive: {
      const Shape& s = mask->shape;  // (1|B, 1|Hq, Lq, Lk): validated
      m.mb = s[0];
      m.mh = s[1];
      m.bits.resize(static_cast<std::size_t>(mask->numel()));
      for (std::int64_t i = 0; i < mask->numel(); ++i) {
        if (params.mask.kind == MaskKind::boolean) {
          m.bits[static_cast<std::size_t>(i)] = mask->load_int(i) != 0 ? kF16Zero : kF16NegInf;
          continue;
        }
        const float x = mask->load(i);
        const std::uint16_t h = f32_to_f16_bits(x);
        const float back = f16_bits_to_f32(h);
        KVLAB_REQUIRE(back == x || (std::isnan(back) && std::isnan(x)), unsupported, "ggml ", what,
                      ": additive mask value ", x, " (element ", i, ") is not an f16 value; ggml's mask is f16, "
                      "and rounding it would change the scores");
        m.bits[static_cast<std::size_t>(i)] = h;
      }
      return m;
    }
  }
  fail(ErrorKind::internal, "ggml: unknown mask kind");
}

bool has_fully_masked_row(const GgmlMask& m, std::int64_t lk) {
  const auto n = static_cast<std::size_t>(lk);
  for (std::size_t r = 0; r + n <= m.bits.size(); r += n) {
    bool all = true;
    for (std::size_t j = 0; j < n && all; ++j) all = m.bits[r + j] == kF16NegInf;
    if (all) return true;
  }
  return false;
}

}  // namespace

Arithmetic attend(Engine& e, const ConstTensorView& q, const KvRows& k, const KvRows& v, std::int64_t hkv,
                  std::int64_t lk, const AttentionParams& params, const ConstTensorView* mask,
                  const ConstTensorView* sinks, const TensorView& out, const char* what) {
  const std::int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], Dk = q.shape[3], Dv = out.shape[3];
  // ggml's kernels index query rows (B·Hq·Lq) and keys with int.
  constexpr std::int64_t int_max = std::numeric_limits<std::int32_t>::max();
  KVLAB_REQUIRE(lk <= int_max && Lq <= int_max && B * Hq <= int_max / Lq, unsupported, "ggml ", what,
                ": B·Hq·Lq = ", B, "·", Hq, "·", Lq, " or Lk ", lk, " beyond ggml's int row indices");
  const GgmlMask m = build_mask(params, mask, B, Lq, lk, what);
  KVLAB_REQUIRE(params.fully_masked == FullyMaskedRow::zero || m.bits.empty() || !has_fully_masked_row(m, lk),
                unsupported, "ggml ", what, ": a fully masked row under FullyMaskedRow::mean_of_values; ggml's "
                "flash attention gives such a row 0 (FullyMaskedRow::zero)");
  std::vector<float> q32(static_cast<std::size_t>(q.numel()));
  for (std::int64_t i = 0; i < q.numel(); ++i) q32[static_cast<std::size_t>(i)] = q.load(i);
  std::vector<float> sinks32;
  if (sinks != nullptr) {
    sinks32.resize(static_cast<std::size_t>(Hq));
    for (std::int64_t h = 0; h < Hq; ++h) sinks32[static_cast<std::size_t>(h)] = sinks->load(h);
  }
  std::vector<float> result(static_cast<std::size_t>(B * Lq * Hq * Dv));

  Context ctx(8);
  ggml_tensor* tq = ctx.tensor(GGML_TYPE_F32, Dk, Lq, Hq, B, q32.data());
  ggml_tensor* tk = ctx.tensor(k.type, k.d, lk, hkv, B, k.data);
  ggml_tensor* tv = ctx.tensor(v.type, v.d, lk, hkv, B, v.data);
  ggml_tensor* tm = m.bits.empty() ? nullptr : ctx.tensor(GGML_TYPE_F16, lk, Lq, m.mh, m.mb, m.bits.data());
  ggml_tensor* r = ggml_flash_attn_ext(ctx.get(), tq, tk, tv, tm, params.scale, 0.0f, params.softcap);
  if (sinks != nullptr) ggml_flash_attn_ext_add_sinks(r, ctx.tensor(GGML_TYPE_F32, Hq, 1, 1, 1, sinks32.data()));
  r->data = result.data();
  e.compute(ctx.get(), r, what);

  // result [Dv, Hq, Lq, B] → out (B, Hq, Lq, Dv)
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i) {
        const float* src = result.data() + ((b * Lq + i) * Hq + h) * Dv;
        const std::int64_t dst = ((b * Hq + h) * Lq + i) * Dv;
        for (std::int64_t d = 0; d < Dv; ++d) out.store(dst + d, src[d]);
      }

  Arithmetic a;
  const bool tiled = k.type == v.type && (k.type == GGML_TYPE_F16 || k.type == GGML_TYPE_F32) && Lq >= 64;
  if (v.type == GGML_TYPE_F16 && !tiled) a.accumulation = DType::f16;
  a.rounding.scaled_q = ggml_is_quantized(k.type);
  return a;
}

}  // namespace kvlab::ggmlk
