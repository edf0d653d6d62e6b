#include "reference/mask.h"

#include <algorithm>
#include <limits>

namespace kvlab::ref {

namespace {

void require_paddings(std::span<const std::int32_t> padding, const char* what) {
  for (std::size_t b = 0; b < padding.size(); ++b) {
    KVLAB_REQUIRE(padding[b] >= 0, invalid_argument, what, "[", b, "] = ", padding[b], " is negative");
  }
}

// The one visibility rule of docs/kernels.md §Masks, for query position `pos` (= offset + i) over
// keys 0..lk-1 of batch row b.
bool visible(std::int64_t pos, std::int64_t j, std::int64_t lk, int window, std::int64_t left, std::int64_t right) {
  if (j > pos) return false;                       // causal
  if (window > 0 && !(pos < j + window)) return false;  // exactly min(W, pos+1) keys (mlx-lm#390)
  if (j < left) return false;                      // left padding
  if (j >= lk - right) return false;               // right padding
  return true;
}

}  // namespace

void validate_mask_spec(const MaskSpec& spec, std::int64_t batch) {
  KVLAB_REQUIRE(spec.window >= 0, invalid_argument, "mask window ", spec.window, " is negative");
  if (spec.kind != MaskKind::causal) {
    KVLAB_REQUIRE(spec.window == 0 && spec.left_padding.empty() && spec.right_padding.empty(), invalid_argument,
                  "window/padding options are only valid for a causal mask (window ", spec.window, ", ",
                  spec.left_padding.size(), " left paddings, ", spec.right_padding.size(), " right paddings)");
    return;
  }
  for (const auto* pad : {&spec.left_padding, &spec.right_padding}) {
    const char* what = pad == &spec.left_padding ? "left_padding" : "right_padding";
    KVLAB_REQUIRE(pad->empty() || static_cast<std::int64_t>(pad->size()) == batch, shape_mismatch, what, " has ",
                  pad->size(), " entries for batch size ", batch);
    require_paddings(*pad, what);
  }
}

bool causal_visible(const MaskSpec& spec, std::int64_t b, std::int64_t i, std::int64_t j, std::int64_t lq,
                    std::int64_t lk) {
  const auto ub = static_cast<std::size_t>(b);
  const std::int64_t left = spec.left_padding.empty() ? 0 : spec.left_padding[ub];
  const std::int64_t right = spec.right_padding.empty() ? 0 : spec.right_padding[ub];
  return visible(i + (lk - lq), j, lk, spec.window, left, right);
}

Tensor create_causal_mask(std::int64_t n, std::int64_t offset, int window, std::span<const std::int32_t> left_padding,
                          std::span<const std::int32_t> right_padding, MaskForm form, DType additive_dtype) {
  KVLAB_REQUIRE(n > 0, invalid_argument, "mask query count N = ", n, " must be positive");
  KVLAB_REQUIRE(offset >= 0, invalid_argument, "mask offset ", offset, " is negative");
  KVLAB_REQUIRE(window >= 0, invalid_argument, "mask window ", window, " is negative");
  KVLAB_REQUIRE(left_padding.empty() || right_padding.empty() || left_padding.size() == right_padding.size(),
                shape_mismatch, "left_padding has ", left_padding.size(), " entries but right_padding has ",
                right_padding.size());
  require_paddings(left_padding, "left_padding");
  require_paddings(right_padding, "right_padding");
  if (form == MaskForm::additive) require_float(ConstTensorView{nullptr, additive_dtype, {}}, "additive mask dtype");

  const bool padded = !left_padding.empty() || !right_padding.empty();
  const std::int64_t batch = padded ? static_cast<std::int64_t>(std::max(left_padding.size(), right_padding.size())) : 1;
  const std::int64_t lk = offset + n;
  const Shape shape = padded ? Shape{batch, 1, n, lk} : Shape{n, lk};
  Tensor mask(form == MaskForm::boolean ? DType::u8 : additive_dtype, shape);
  const TensorView out = mask.view();
  const float hidden = -std::numeric_limits<float>::infinity();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t left = left_padding.empty() ? 0 : left_padding[static_cast<std::size_t>(b)];
    const std::int64_t right = right_padding.empty() ? 0 : right_padding[static_cast<std::size_t>(b)];
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < lk; ++j) {
        const bool keep = visible(offset + i, j, lk, window, left, right);
        const std::int64_t at = (b * n + i) * lk + j;
        if (form == MaskForm::boolean) out.store_int(at, keep ? 1 : 0);
        else out.store(at, keep ? 0.0f : hidden);
      }
    }
  }
  return mask;
}

}  // namespace kvlab::ref
