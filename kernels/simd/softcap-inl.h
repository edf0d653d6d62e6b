// The attention logit cap c·tanh(x/c) (Gemma-2 style softcap) of the SIMD attention
// kernels (sdpa.cc, quantized_decode.cc), defined for every input on every target.
//
// Why not Mul(cap, Tanh(Div(x, cap))) as is: Highway 1.0.3's Tanh converts float lanes to
// int inside its exp; on the SCALAR/EMU128 targets that is a C++ float-to-int conversion,
// undefined behaviour for NaN and ±inf (clang's UBSan: "nan is outside the range of
// representable values of type 'int'"). Scores can be NaN (NaN poison in hidden keys,
// which are masked after the cap) or ±inf (scale·(−inf) in padding lanes). So only finite
// quotients reach Tanh; the others get the limit the oracle's std::tanh gives:
// tanh(±inf) = ±1, NaN stays NaN (reference/sdpa.cc caps with std::tanh).
//
// Include inside a Highway foreach_target TU, after <hwy/contrib/math/math-inl.h>.
// Functions live in kvlab::simd::HWY_NAMESPACE.

// Highway's per-target include guard: toggled each time foreach_target re-includes.
#if defined(KVLAB_SIMD_SOFTCAP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVLAB_SIMD_SOFTCAP_INL_H_
#undef KVLAB_SIMD_SOFTCAP_INL_H_
#else
#define KVLAB_SIMD_SOFTCAP_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {

// cap·tanh(x/cap) lane-wise; `cap` > 0 in every lane.
template <class DF, class VF = hwy::HWY_NAMESPACE::Vec<DF>>
HWY_INLINE VF Softcap(DF df, VF x, VF cap) {
  namespace hn = hwy::HWY_NAMESPACE;
  const VF q = hn::Div(x, cap);
  const auto finite = hn::IsFinite(q);
  const VF capped = hn::Mul(cap, hn::Tanh(df, hn::IfThenElseZero(finite, q)));
  return hn::IfThenElse(finite, capped, hn::IfThenElse(hn::IsNaN(q), q, hn::CopySign(cap, q)));
}

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVLAB_SIMD_SOFTCAP_INL_H_ toggle
