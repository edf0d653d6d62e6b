// Reference scaled dot-product attention. The contract is the header comment of sdpa.h;
// this file is the oracle, so it is written as plain loops over the formula with every
// sum in double and one rounding at the very end.
#include "reference/sdpa.h"
#include "reference/attention_core.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/mask.h"

namespace kvlab::ref {

namespace {

const char* mask_kind_name(MaskKind kind) {
  switch (kind) {
    case MaskKind::none: return "none";
    case MaskKind::causal: return "causal";
    case MaskKind::boolean: return "boolean";
    case MaskKind::additive: return "additive";
  }
  return "?";
}

std::string name(const char* op, const char* what) { return cat(op, " ", what); }

void require_data(const ConstTensorView& t, const std::string& what) {
  KVLAB_REQUIRE(t.data != nullptr, invalid_argument, what, " of shape ", shape_str(t.shape), " has no data");
}

// Every axis of a rank-4 operand must be positive; `axes` names them in the message.
void require_positive_dims(const ConstTensorView& t, const std::string& what, const char* const (&axes)[4]) {
  for (int a = 0; a < 4; ++a) {
    KVLAB_REQUIRE(t.dim(a) > 0, invalid_argument, what, " has ", axes[a], " = ", t.dim(a), " (shape ",
                  shape_str(t.shape), "); every size must be positive");
  }
}

bool hides(double additive) { return std::isinf(additive) && additive < 0; }

// x rounded once to out's dtype. Going double -> f32 -> f16/bf16 with two nearest
// roundings can round twice (a double just above an f16 midpoint lands on it in f32 and
// then ties to even, downwards). Rounding the f32 intermediate to *odd* instead keeps
// the information "inexact, and on which side", so the second RNE rounding is correct;
// this holds because f32 carries at least 2 more significand bits than f16 and bf16
// (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
// using rounding to odd", IEEE TC 2008).
void store_rounded_once(const TensorView& out, std::int64_t index, double x) {
  float y = static_cast<float>(x);
  if (out.dtype != DType::f32 && std::isfinite(x) && static_cast<double>(y) != x) {
    if (std::fabs(static_cast<double>(y)) > std::fabs(x)) y = std::nextafter(y, 0.0f);  // truncate
    y = std::bit_cast<float>(std::bit_cast<std::uint32_t>(y) | 1u);  // sign-magnitude: odd neighbour
  }
  out.store(index, y);
}

}  // namespace

namespace detail {

void validate_attention(const char* op, const ConstTensorView& q, const ConstTensorView& k,
                        const ConstTensorView& v, const AttentionParams& params,
                        const ConstTensorView* mask_array, const ConstTensorView* sinks,
                        const ConstTensorView& out, KvDtype kv_dtype) {
  require_rank(q, 4, name(op, "q").c_str());
  require_rank(k, 4, name(op, "k").c_str());
  require_rank(v, 4, name(op, "v").c_str());
  require_rank(out, 4, name(op, "out").c_str());
  require_float(q, name(op, "q").c_str());
  if (kv_dtype == KvDtype::same_as_q) {
    require_dtype(k, q.dtype, name(op, "k (must match q's dtype)").c_str());
    require_dtype(v, q.dtype, name(op, "v (must match q's dtype)").c_str());
  } else {
    require_float(k, name(op, "k").c_str());
    require_float(v, name(op, "v").c_str());
  }
  require_dtype(out, q.dtype, name(op, "out (must match q's dtype)").c_str());

  require_positive_dims(q, name(op, "q"), {"B", "Hq", "Lq", "Dk"});
  require_positive_dims(k, name(op, "k"), {"B", "Hkv", "Lk", "Dk"});
  require_positive_dims(v, name(op, "v"), {"B", "Hkv", "Lk", "Dv"});
  require_positive_dims(out, name(op, "out"), {"B", "Hq", "Lq", "Dv"});

  const std::int64_t batch = q.dim(0), hq = q.dim(1), lq = q.dim(2), dk = q.dim(3);
  const std::int64_t hkv = k.dim(1), lk = k.dim(2), dv = v.dim(3);
  KVLAB_REQUIRE(k.dim(0) == batch && v.dim(0) == batch, shape_mismatch, op, ": batch sizes differ: q has B = ",
                batch, ", k has B = ", k.dim(0), ", v has B = ", v.dim(0));
  KVLAB_REQUIRE(v.dim(1) == hkv, shape_mismatch, op, ": k has Hkv = ", hkv, " heads but v has Hkv = ", v.dim(1));
  KVLAB_REQUIRE(v.dim(2) == lk, shape_mismatch, op, ": k has Lk = ", lk, " keys but v has Lk = ", v.dim(2));
  KVLAB_REQUIRE(k.dim(3) == dk, shape_mismatch, op, ": q has Dk = ", dk, " but k has Dk = ", k.dim(3));
  KVLAB_REQUIRE(hq % hkv == 0, shape_mismatch, op, ": Hq = ", hq, " is not a multiple of Hkv = ", hkv,
                " (grouped-query attention needs Hq % Hkv == 0)");
  require_shape(out, {batch, hq, lq, dv}, name(op, "out").c_str());
  require_data(q, name(op, "q"));
  KVLAB_REQUIRE(out.data != nullptr, invalid_argument, op, " out of shape ", shape_str(out.shape), " has no data");

  KVLAB_REQUIRE(std::isfinite(params.scale), invalid_argument, op, ": scale = ", params.scale, " is not finite");
  KVLAB_REQUIRE(std::isfinite(params.softcap) && params.softcap >= 0, invalid_argument, op, ": softcap = ",
                params.softcap, " must be finite and >= 0 (0 disables it)");

  validate_mask_spec(params.mask, batch);
  const MaskKind kind = params.mask.kind;
  const bool wants_array = kind == MaskKind::boolean || kind == MaskKind::additive;
  KVLAB_REQUIRE(wants_array || mask_array == nullptr, invalid_argument, op, ": a mask array of shape ",
                shape_str(mask_array->shape), " was given but mask kind ", mask_kind_name(kind),
                " takes no array");
  KVLAB_REQUIRE(!wants_array || mask_array != nullptr, invalid_argument, op, ": mask kind ", mask_kind_name(kind),
                " needs a mask array of shape (1|B, 1|Hq, Lq, Lk), none was given");
  if (wants_array) {
    const ConstTensorView& m = *mask_array;
    require_rank(m, 4, name(op, "mask").c_str());
    KVLAB_REQUIRE((m.dim(0) == 1 || m.dim(0) == batch) && (m.dim(1) == 1 || m.dim(1) == hq) && m.dim(2) == lq &&
                      m.dim(3) == lk,
                  shape_mismatch, op, " mask has shape ", shape_str(m.shape), ", expected (1|B, 1|Hq, Lq, Lk) = (1|",
                  batch, ", 1|", hq, ", ", lq, ", ", lk, ")");
    if (kind == MaskKind::boolean) require_dtype(m, DType::u8, name(op, "boolean mask").c_str());
    else require_float(m, name(op, "additive mask").c_str());
    require_data(m, name(op, "mask"));
  }
  if (sinks != nullptr) {
    require_shape(*sinks, {hq}, name(op, "sinks (one logit per query head)").c_str());
    require_float(*sinks, name(op, "sinks").c_str());
    require_data(*sinks, name(op, "sinks"));
  }
}

void attend(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
            const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
            const TensorView& out) {
  const std::int64_t batch = q.dim(0), hq = q.dim(1), lq = q.dim(2), dk = q.dim(3);
  const std::int64_t hkv = k.dim(1), lk = k.dim(2), dv = v.dim(3);
  const std::int64_t group = hq / hkv;  // R: query heads per kv head
  const MaskKind kind = params.mask.kind;
  const double scale = params.scale, softcap = params.softcap;
  const std::int64_t mask_b = mask_array ? mask_array->dim(0) : 1, mask_h = mask_array ? mask_array->dim(1) : 1;

  std::vector<double> score(static_cast<std::size_t>(lk));
  std::vector<bool> visible(static_cast<std::size_t>(lk));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < hq; ++h) {
      // The Hq axis splits as (Hkv, R): consecutive query heads share kv head h / R.
      const std::int64_t kv_head = h / group;
      const std::int64_t kv_base = (b * hkv + kv_head) * lk;  // row of key 0 in k and v
      for (std::int64_t i = 0; i < lq; ++i) {
        const std::int64_t q_row = ((b * hq + h) * lq + i) * dk;
        // Size-1 mask axes broadcast over batch and heads.
        const std::int64_t mask_row = (((mask_b == 1 ? 0 : b) * mask_h + (mask_h == 1 ? 0 : h)) * lq + i) * lk;
        bool any_visible = false;
        double max_logit = -INFINITY;
        for (std::int64_t j = 0; j < lk; ++j) {
          // Visibility first: a hidden key's K and V are never read, so poison (NaN) in
          // a masked-out cache slot cannot reach the output.
          bool keep = true;
          double add = 0;
          switch (kind) {
            case MaskKind::none: break;
            case MaskKind::causal: keep = causal_visible(params.mask, b, i, j, lq, lk); break;
            case MaskKind::boolean: keep = mask_array->load_int(mask_row + j) != 0; break;
            case MaskKind::additive:
              add = mask_array->load(mask_row + j);
              keep = !hides(add);
              break;
          }
          visible[static_cast<std::size_t>(j)] = keep;
          if (!keep) continue;
          double dot = 0;
          for (std::int64_t c = 0; c < dk; ++c) {
            dot += static_cast<double>(q.load(q_row + c)) * static_cast<double>(k.load((kv_base + j) * dk + c));
          }
          double s = scale * dot;
          if (softcap > 0) s = softcap * std::tanh(s / softcap);  // capped before the mask is added
          s += add;
          score[static_cast<std::size_t>(j)] = s;
          any_visible = true;
          max_logit = std::max(max_logit, s);
        }

        const std::int64_t out_row = ((b * hq + h) * lq + i) * dv;
        if (!any_visible) {
          // Unspecified in MLX (docs/kernels.md §Attention); the policy picks one backend's answer.
          // It depends on the mask alone, so sinks do not change it (see sdpa.h).
          for (std::int64_t c = 0; c < dv; ++c) {
            double mean = 0;
            if (params.fully_masked == FullyMaskedRow::mean_of_values) {
              for (std::int64_t j = 0; j < lk; ++j) mean += static_cast<double>(v.load((kv_base + j) * dv + c));
              mean /= static_cast<double>(lk);
            }
            store_rounded_once(out, out_row + c, mean);
          }
          continue;
        }

        // Softmax with the max subtracted so no exponent overflows; the sink joins the
        // max and the denominator but carries no value vector.
        double denominator = 0;
        if (sinks != nullptr) {
          const double sink = sinks->load(h);
          max_logit = std::max(max_logit, sink);
          denominator += std::exp(sink - max_logit);
        }
        for (std::int64_t j = 0; j < lk; ++j) {
          const auto u = static_cast<std::size_t>(j);
          score[u] = visible[u] ? std::exp(score[u] - max_logit) : 0.0;  // now unnormalised weight
          denominator += score[u];
        }
        for (std::int64_t c = 0; c < dv; ++c) {
          double o = 0;
          for (std::int64_t j = 0; j < lk; ++j) {
            if (!visible[static_cast<std::size_t>(j)]) continue;
            const double p = score[static_cast<std::size_t>(j)] / denominator;
            o += p * static_cast<double>(v.load((kv_base + j) * dv + c));
          }
          store_rounded_once(out, out_row + c, o);
        }
      }
    }
  }
}

}  // namespace detail

void validate_sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                   const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
                   const ConstTensorView& out) {
  detail::validate_attention("sdpa", q, k, v, params, mask_array, sinks, out, detail::KvDtype::same_as_q);
  require_data(k, "sdpa k");
  require_data(v, "sdpa v");
}

void sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
          const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
          const TensorView& out) {
  validate_sdpa(q, k, v, params, mask_array, sinks, out);
  detail::attend(q, k, v, params, mask_array, sinks, out);
}

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
            const Tensor* mask_array, const Tensor* sinks) {
  // The output shape needs q's and v's ranks first; everything else is checked by the
  // view overload.
  require_rank(q.view(), 4, "sdpa q");
  require_rank(v.view(), 4, "sdpa v");
  Tensor out(q.dtype(), {q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  ConstTensorView mask_view, sinks_view;
  if (mask_array != nullptr) mask_view = mask_array->view();
  if (sinks != nullptr) sinks_view = sinks->view();
  sdpa(q.view(), k.view(), v.view(), params, mask_array ? &mask_view : nullptr, sinks ? &sinks_view : nullptr,
       out.view());
  return out;
}

}  // namespace kvlab::ref
