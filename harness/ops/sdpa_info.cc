// sdpa and quantized_sdpa (reference/sdpa.h, reference/quantized_sdpa.h).
//
// q (B, Hq, Lq, Dk), k (B, Hkv, Lk, Dk), v (B, Hkv, Lk, Dv), normal(0,1) in `dtype`.
// mask: none | causal (with window=W, and lpad/rpad giving batch row b the padding
// ⌊pad·b/(B−1)⌋, i.e. unequal padding from 0 to pad) | bool / additive (a random array
// of shape (B or 1, Hq or 1, Lq, Lk) by mask_dims, additive in mask_dtype, hiding ~25% of
// keys, every key j ≡ 2 (mod 5) of the array's batch rows b ≡ 1 (mod 3), and all of query
// row 0 of its first slice, a fully masked row). fully_masked picks the policy of rows
// that see no key. Under the zero policy every K/V row that no query of its kv head may
// see is filled with NaN poison (quantized: poisoned scales), so a backend that reads a
// key the mask hides fails loudly instead of being slightly off (the mean_of_values
// policy reads every key, so nothing is poisoned).
// special (sdpa only) puts inf/NaN into visible inputs at fixed places: v_inf (+inf and
// −inf in two V elements), k_inf / k_ninf (±inf in element 0 of key 7 of kv head 0, with
// q[0] = 1 so the score is ±inf), q_nan (one q element), k_nan (one element of key 7);
// the outputs must then match the oracle's NaN elements exactly (Budget). special=uniform
// is finite: q = 0, so every visible key gets the same weight, and V shifted by +2 (a
// nonzero mean, as real V channels have): the output is V's mean over the visible keys, and
// a P·V sum kept in T stagnates once its ulp exceeds twice the values added (ggml's f16
// accumulator: harness/known/ggml G6).
// quantized_sdpa: kdtype / vdtype is the dtype K / V have before quantization, i.e. of
// their scales and biases (`q`: q's dtype).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "harness/ops/ops.h"
#include "harness/rng.h"
#include "reference/fp_quantize.h"
#include "reference/quantize.h"
#include "reference/mask.h"
#include "reference/quantized_sdpa.h"

namespace kvlab::harness::ops {

namespace {

std::vector<ParamSpec> attention_params() {
  return {int_param("B", 1, true),          int_param("Hq", 4, true),        int_param("Hkv", 4, true),
          int_param("Lq", 4, true),         int_param("Lk", 16, true),       int_param("Dk", 64, true),
          int_param("Dv", 64, true),        dtype_param(),                   word_param("mask", {"none", "causal", "bool", "additive"}, true),
          int_param("window", 0, true, 0),  int_param("lpad", 0, true, 0),   int_param("rpad", 0, true, 0),
          int_param("sinks", 0, true, 0),   real_param("softcap", "0"),      real_param("scale", "0"),
          word_param("fully_masked", {"zero", "mean_of_values"}, true),
          word_param("mask_dims", {"B1", "11", "1H", "BH"}, true),
          word_param("mask_dtype", {"f32", "f16", "bf16"}, true)};
}

std::vector<std::int32_t> padding(const Problem& p, std::string_view key) {
  const std::int64_t pad = p.integer(key), B = p.integer("B");
  if (pad == 0 || p.word("mask") != "causal") return {};
  std::vector<std::int32_t> out;
  for (std::int64_t b = 0; b < B; ++b) out.push_back(static_cast<std::int32_t>(B > 1 ? pad * b / (B - 1) : pad));
  return out;
}

AttentionParams attention(const Problem& p) {
  AttentionParams a;
  const double scale = p.real("scale");
  a.scale = static_cast<float>(scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(p.integer("Dk"))));
  a.softcap = static_cast<float>(p.real("softcap"));
  const std::string& m = p.word("mask");
  a.mask.kind = m == "causal" ? MaskKind::causal : m == "bool" ? MaskKind::boolean : m == "additive" ? MaskKind::additive : MaskKind::none;
  a.mask.window = p.int32("window");
  a.mask.left_padding = padding(p, "lpad");
  a.mask.right_padding = padding(p, "rpad");
  a.fully_masked = p.word("fully_masked") == "zero" ? FullyMaskedRow::zero : FullyMaskedRow::mean_of_values;
  return a;
}

// The mask array's leading dims: (B or 1, Hq or 1).
std::pair<std::int64_t, std::int64_t> mask_dims(const Problem& p) {
  const std::string& d = p.word("mask_dims");
  return {d[0] == 'B' ? p.integer("B") : 1, d[1] == 'H' ? p.integer("Hq") : 1};
}

// Per (b, kv head, key j), flat: whether no query of that kv head may see key j (the
// oracle's visibility rule; an invalid mask, which the oracle rejects, hides nothing).
std::vector<bool> hidden_keys(const Problem& p, const Tensor* mask) {
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv");
  const std::int64_t Lq = p.integer("Lq"), Lk = p.integer("Lk");
  std::vector<bool> hidden(static_cast<std::size_t>(std::max<std::int64_t>(B * Hkv * Lk, 0)), false);
  if (p.word("fully_masked") != "zero" || Hkv <= 0 || Hq % Hkv != 0) return hidden;
  const AttentionParams a = attention(p);
  if (a.mask.kind == MaskKind::none) return hidden;
  if (a.mask.kind == MaskKind::causal) {
    try {
      ref::validate_mask_spec(a.mask, B);
    } catch (const Error&) {
      return hidden;
    }
  }
  const std::int64_t R = Hq / Hkv;
  auto visible = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    if (a.mask.kind == MaskKind::causal) return ref::causal_visible(a.mask, b, i, j, Lq, Lk);
    const std::int64_t mb = mask->dim(0), mh = mask->dim(1);
    const std::int64_t at = (((mb == 1 ? 0 : b) * mh + (mh == 1 ? 0 : h)) * Lq + i) * Lk + j;
    if (a.mask.kind == MaskKind::boolean) return mask->view().load_int(at) != 0;
    const float x = mask->view().load(at);
    return !(std::isinf(x) && x < 0);
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (std::int64_t j = 0; j < Lk; ++j) {
        bool seen = false;
        for (std::int64_t h = kvh * R; h < (kvh + 1) * R && !seen; ++h)
          for (std::int64_t i = 0; i < Lq && !seen; ++i) seen = visible(b, h, i, j);
        hidden[static_cast<std::size_t>((b * Hkv + kvh) * Lk + j)] = !seen;
      }
  return hidden;
}

// Rows (b, h, j) of a (B, Hkv, Lk, W) tensor that are hidden get `bits` in every element.
void poison_rows(const std::vector<bool>& hidden, Tensor& t, std::uint32_t bits) {
  const std::int64_t W = t.shape()[3];
  for (std::int64_t i = 0, elements = t.numel(); i < elements; ++i) {
    if (hidden[static_cast<std::size_t>(i / W)]) store_bits(t, i, bits);
  }
}

// The mask array (bool / additive), or nothing; added to `prep` by add_mask_and_sinks.
std::optional<Tensor> mask_array(const Problem& p) {
  const std::int64_t Lq = p.integer("Lq"), Lk = p.integer("Lk");
  const std::string& m = p.word("mask");
  if (m != "bool" && m != "additive") return std::nullopt;
  const auto [mb, mh] = mask_dims(p);
  const CounterRng rng(p.line(), "mask");
  Tensor mask(m == "bool" ? DType::u8 : dtype_from_name(p.word("mask_dtype")), {mb, mh, Lq, Lk});
  for (std::int64_t i = 0, elements = mask.numel(); i < elements; ++i) {
    const std::int64_t j = i % std::max<std::int64_t>(Lk, 1), b = i / std::max<std::int64_t>(mh * Lq * Lk, 1);
    bool keep = rng.uniform(static_cast<std::uint64_t>(2 * i)) < 0.75;
    if ((b % 3 == 1 && j % 5 == 2) || i < Lk) keep = false;
    if (m == "bool") {
      mask.view().store_int(i, keep ? 1 : 0);
    } else {
      const double bias = 0.5 * (rng.uniform(static_cast<std::uint64_t>(2 * i + 1)) - 0.5);
      mask.view().store(i, keep ? static_cast<float>(bias) : -std::numeric_limits<float>::infinity());
    }
  }
  return mask;
}

void add_mask_and_sinks(const Problem& p, Prepared& prep, std::optional<Tensor> mask) {
  if (mask) prep.add_input("mask", std::move(*mask));
  if (p.flag("sinks")) prep.add_input("sinks", random_normal(p, "sinks", DType::f32, {p.integer("Hq")}));
}

// sdpa's special=...: inf/NaN at fixed visible places (clamped into the shape).
void inject_special(const Problem& p, Tensor& q, Tensor& k, Tensor& v) {
  const std::string& s = p.word("special");
  const std::int64_t Hkv = p.integer("Hkv"), Lq = p.integer("Lq"), Lk = p.integer("Lk");
  const std::int64_t Dk = p.integer("Dk"), Dv = p.integer("Dv");
  if (s == "none" || q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return;
  constexpr float inf = std::numeric_limits<float>::infinity();
  const std::int64_t key = std::min<std::int64_t>(7, Lk - 1);
  if (s == "v_inf") {
    v.view().store(std::min<std::int64_t>(5, Lk - 1) * Dv + std::min<std::int64_t>(3, Dv - 1), inf);
    v.view().store(((Hkv - 1) * Lk + std::min<std::int64_t>(9, Lk - 1)) * Dv + std::min<std::int64_t>(4, Dv - 1), -inf);
  } else if (s == "k_inf" || s == "k_ninf") {
    k.view().store(key * Dk, s == "k_inf" ? inf : -inf);
    q.view().store(0, 1.0f);
  } else if (s == "q_nan") {
    q.view().store(std::min<std::int64_t>(2, Lq - 1) * Dk + std::min<std::int64_t>(5, Dk - 1),
                   std::numeric_limits<float>::quiet_NaN());
  } else if (s == "k_nan") {
    k.view().store(key * Dk + std::min<std::int64_t>(4, Dk - 1), std::numeric_limits<float>::quiet_NaN());
  } else if (s == "uniform") {
    for (std::int64_t i = 0; i < q.numel(); ++i) q.view().store(i, 0.0f);
    for (std::int64_t i = 0; i < v.numel(); ++i) v.view().store(i, v.view().load(i) + 2.0f);
  }
}

const DTensor* optional_input(const Bound& in, std::string_view name) { return in.find(name); }

// q, K, V (for quantized K/V: the values before quantization, at most a byte per code
// plus a padding word per row, two parameters per group, and the f32 dequantization
// the budget makes), the mask, sinks, the output, and the f32 copies attention_budget
// makes of q, K and V.
Footprint attention_footprint(const Problem& p, bool quantized) {
  const DType dtype = dtype_from_name(p.word("dtype"));
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv");
  const std::int64_t Lq = p.integer("Lq"), Lk = p.integer("Lk"), Dk = p.integer("Dk"), Dv = p.integer("Dv");
  Footprint f;
  f.add(dtype, {B, Hq, Lq, Dk}).add(DType::f32, {B, Hq, Lq, Dk}).add(dtype, {B, Hq, Lq, Dv});
  for (const std::int64_t D : {Dk, Dv}) {
    f.add(dtype, {B, Hkv, Lk, D}).add(DType::f32, {B, Hkv, Lk, D});
    if (quantized) {
      f.add(DType::u8, {B, Hkv, Lk, D}).add(DType::u32, {B, Hkv, Lk}).add(DType::f32, {B, Hkv, Lk, D});
      f.add(DType::f32, {B, Hkv, Lk, D / 16 + 1}).add(DType::f32, {B, Hkv, Lk, D / 16 + 1});
    }
  }
  if (p.word("mask") == "bool" || p.word("mask") == "additive") {
    const auto [mb, mh] = mask_dims(p);
    f.add(DType::f32, {mb, mh, Lq, Lk});
  }
  // The oracle's per-row scratch (scores and visibility per key, a row of Dk and Dv),
  // sized by the lengths alone: counted also when B = 0 (fuzzed: B=0 Dv=2147483648).
  f.add(DType::f32, {Lk, 3}).add(DType::f32, {Dk, 2}).add(DType::f32, {Dv, 2});
  return f.add(DType::f32, {Hq});
}

// Every query row against every key (scores over Dk, values over Dv), twice: the oracle
// and the tolerance object's bound; plus a pass over the tensors.
std::uint64_t attention_work(const Problem& p, bool quantized) {
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Lq = p.integer("Lq"), Lk = p.integer("Lk");
  const std::int64_t D = std::max<std::int64_t>(p.integer("Dk"), 0) + std::max<std::int64_t>(p.integer("Dv"), 0);
  return Footprint{}.add(DType::u8, {B, Hq, Lq, Lk, D, 2}).add_bytes(attention_footprint(p, quantized).bytes()).bytes();
}

// Tolerance of sdpa and quantized_sdpa (one object: quantized_sdpa is sdpa over the
// dequantized K/V, so only the K/V values differ).
// The oracle accumulates in double and rounds once. A backend with f32 accumulation:
//  * logits: s = scale·<q, k> may use q·scale rounded to T first (MLX does), then a
//    dot product of Dk terms: |Δs| ≤ δ = (eps_T + (Dk+2)·u)·S + u·max|mask|, where
//    S = max over (row, key) of |scale|·Σ|q_d·k_d| (u = 2^-24). softcap's tanh has slope
//    ≤ 1, so it does not amplify δ.
//  * softmax: each weight p_j changes by a factor within e^{±2δ}, so Σ|Δp_j| ≤ 2δ and
//    |Δo| ≤ 2δ·max|v|; exp, the normalizer and the Lk-term sum of p_j·v_j add
//    γ = (Lk + 4)·u relative each, i.e. 2γ·max|v|.
//  * output: P may be rounded to T before P·V (flash-attention style) and out is
//    rounded to T: 2·eps_T·max|v|.
//   budget = max|v|·(2·eps_T + 2δ + 2γ) + denorm_T, uniform over the output.
// Norm check: the RMS error may not exceed half that worst-case budget
//   (NMSE ≤ budget² / (4·mean(ref²))): errors of a correct kernel are random and far
//   below the worst case, so many elements each just under budget means a bug.
//
// Precision ceiling (Budget::precision_nmse_max, f16/bf16 outputs): the budget above
// follows the output dtype and a worst case over Lk, and its norm bound is relative to
// mean(ref²) ~ e/Lk (long softmax averages are small), so a kernel whose running softmax
// sum and P·V accumulator are half precision passes it on long sequences: at Lk 4096 its
// NMSE is ~0.02 (f16) / ~2 (bf16, the sum stagnates) against budget bounds of ~3 / ~200
// (tests/harness/test_precision_ceiling.cc). The kernels declare f32 accumulation
// (Backend::accumulation); what that allows, as NMSE against the oracle's once-rounded
// output, u = unit roundoff of T (2^-11 f16, 2^-8 bf16), from independent roundings whose
// relative errors are uniform in ±u (mean square u²/3), each term taken at 3x its mean
// square (a norm over the output, not a worst case):
//  * the final rounding to T, on both sides: 2·u²/3 → 2u²;
//  * P rounded to T before P·V: o moves by Σ p_j ε_j v_j, mean square u²/3·Σp_j²v_j²,
//    about u²/3·o² for the zero-mean values of the cases → u²; V rounded to its dtype
//    (quantized: dequantized into the scales' dtype T_v) likewise → u_v²;
//  * q·scale (and dequantized K) rounded to T: the logit s_j moves by scale·Σ_d q_d k_d ε_d,
//    mean square (u_q² + u_k²)/3·σ², σ² = max over (row, key) of scale²·Σ_d q_d² k_d², and o
//    by about that relative → (u_q² + u_k²)·σ²;
//  * the logits rounded to T before the softmax (a matmul that returns T, as mlx-lm's
//    quantized attention does): s_j moves by ε_j·s_j → u²·s_max², s_max = max |scale·<q, k>|
//    (scale 4 puts s in the hundreds: then this term dominates);
//  * f32 accumulation: the Lk + Dk + 8 roundings of a sum, each relative 2^-24 at most
//    and independent, add as a random walk: mean square (Lk + Dk + 8)·2^-48/3, at 3x → γ²
//    = (Lk + Dk + 8)·2^-48 (its worst case, all roundings one way, is (Lk + Dk + 8)²·2^-48:
//    at Lk 65536 it alone would be 64u² for f16 and hide a rounding per key block);
//  * subnormal outputs: an absolute denorm_T per element → denorm_T² / mean(ref²).
//   ceiling = 2u² + γ² + denorm_T² / mean(ref²) for every f32 kernel, plus a term for each
//   intermediate rounding the backend declares (Backend::attention_rounding; the spine
//   drops the others): u² (P), u_v² + u_k²·σ² (dequantized K/V), u_q²·σ² (q·scale),
//   u²·s_max² (logits).
// At Lk 4096, Dk 64 (σ² ≈ 3, s_max² ≈ 20), declaring all four: ~30u²; declaring none
// (kvlab's SIMD and Vulkan kernels): ~2u², which one running state rounded to T once per
// 256 keys exceeds at Lk 32 768 (tests/harness/test_precision_ceiling.cc). A correct
// kernel's result before the final rounding is within ~1e-5 relative of the oracle's, so
// most elements round alike and its NMSE sits orders of magnitude below the ceiling.
// MLX's quantized attention accumulates P·V in T and exceeds it (harness/known/mlx, D6); a
// running accumulator kept in T at every one of the Lk adds errs by ~√Lk·u relative plus
// the stagnation of the sum, far beyond it.
// f32 outputs: none (the budget is derived from f32 arithmetic already).
// Budget::expected_rounding_mismatches of an f16/bf16 attention output, for a backend
// that declares f32 arithmetic and rounds nothing to T but its output. Such a kernel's
// value before that rounding is within a few f32 rounding errors per add of the exact
// one, so its T value differs from the oracle's correctly rounded one only where the
// exact value lies that close to a rounding boundary: a small fraction of the elements.
// A rigorous bound of that error (partial sums bounded by Σp|v|) is far too loose to use
// (the outputs average thousands of zero-mean values: |o| is ~1 % of Σp|v|/Σp), so the
// allowance is measured on the very inputs instead: the mismatches of a plain f32 twin in
// the least favourable order any f32 kernel may use, one accumulator over all keys
// (rounding errors grow as the square root of the run: a flash-decoding kernel's runs of
// a chunk are shorter), f32 dot products in sequence, the scale after them. A running
// state rounded to T once per block of keys, or partials rounded to T before they are
// combined, errs by ~u_T·|o| instead of ~√Lk·2^-24·|o|, and alters many times as many
// elements (tests/harness/test_precision_ceiling.cc). Rows no key is visible to, and
// cases with inf/NaN inputs, are left out.
std::int64_t f32_twin_mismatches(const Problem& p, const Prepared& prep, const Tensor& ref) {
  const AttentionParams a = attention(p);
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv"), Lq = p.integer("Lq");
  const std::int64_t Lk = p.integer("Lk"), Dk = p.integer("Dk"), Dv = p.integer("Dv");
  const xt::xarray<float> q = prep.input("q").to_f32(), k = prep.input("k").to_f32(), v = prep.input("v").to_f32();
  const xt::xarray<float> r = ref.to_f32();
  std::optional<std::vector<float>> mask;
  std::optional<xt::xarray<float>> sinks;
  std::int64_t mb = 1, mh = 1;
  for (std::size_t i = 0; i < prep.input_names.size(); ++i) {
    if (prep.input_names[i] == "mask") {
      const Tensor& m = prep.inputs[i];
      if (m.dtype() == DType::u8) {  // boolean: 1 keeps, 0 hides
        const auto* bytes = m.view().as<const std::uint8_t>();
        mask.emplace(bytes, bytes + m.numel());
      } else {
        const xt::xarray<float> values = m.to_f32();
        mask.emplace(values.begin(), values.end());
      }
      mb = m.shape()[0];
      mh = m.shape()[1];
    }
    if (prep.input_names[i] == "sinks") sinks = prep.inputs[i].to_f32();
  }
  const bool boolean = a.mask.kind == MaskKind::boolean;
  const DType t = ref.dtype();
  std::vector<float> acc(static_cast<std::size_t>(Dv));
  std::int64_t differ = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kvh = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Lq; ++i) {
        const float* qrow = q.data() + ((b * Hq + h) * Lq + i) * Dk;
        const std::int64_t mrow = (((mb == 1 ? 0 : b) * mh + (mh == 1 ? 0 : h)) * Lq + i) * Lk;
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = 0; j < Lk; ++j) {
          float add = 0;
          if (a.mask.kind == MaskKind::causal && !ref::causal_visible(a.mask, b, i, j, Lq, Lk)) continue;
          if (mask) {
            add = (*mask)[static_cast<std::size_t>(mrow + j)];
            if (boolean ? add == 0 : add == -std::numeric_limits<float>::infinity()) continue;
            if (boolean) add = 0;
          }
          const float* krow = k.data() + ((b * Hkv + kvh) * Lk + j) * Dk;
          const float* vrow = v.data() + ((b * Hkv + kvh) * Lk + j) * Dv;
          float s = 0;
          for (std::int64_t d = 0; d < Dk; ++d) s += qrow[d] * krow[d];
          s *= a.scale;
          if (a.softcap > 0) s = a.softcap * std::tanh(s / a.softcap);
          s += add;
          if (s > m) {
            const float c = std::exp(m - s);
            l *= c;
            for (float& x : acc) x *= c;
            m = s;
          }
          const float w = std::exp(s - m);
          l += w;
          for (std::int64_t d = 0; d < Dv; ++d) acc[static_cast<std::size_t>(d)] += w * vrow[d];
        }
        if (l == 0) continue;  // no visible key: the fully-masked policy, not arithmetic
        if (sinks) {
          const float sink = sinks->data()[h], top = std::max(m, sink);
          const float c = std::exp(m - top);
          l = l * c + std::exp(sink - top);
          for (float& x : acc) x *= c;
        }
        const float* want = r.data() + ((b * Hq + h) * Lq + i) * Dv;
        for (std::int64_t d = 0; d < Dv; ++d) {
          const float mine = round_to_dtype(acc[static_cast<std::size_t>(d)] / l, t);
          if (std::isfinite(want[d]) && mine != want[d]) ++differ;
        }
      }
    }
  }
  return differ;
}

Budget attention_budget(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask,
                        const Tensor& ref, DType k_dtype, DType v_dtype) {
  constexpr double u = 0x1p-24;
  const DType t = ref.dtype();
  const double eps = dtype_epsilon(t);
  const double denorm = t == DType::f32 ? 0x1p-149 : (t == DType::f16 ? 0x1p-24 : 0x1p-133);
  const AttentionParams a = attention(p);
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv");
  const std::int64_t Lq = p.integer("Lq"), Lk = p.integer("Lk"), Dk = p.integer("Dk");
  const xt::xarray<float> qf = q.to_f32(), kf = k.to_f32(), vf = v.to_f32();
  double S = 0, sigma2 = 0, smax2 = 0;
  // Rows of q (B, Hq, Lq, Dk) and K (B, Hkv, Lk, Dk), row-major: O(B·Hq·Lq·Lk·Dk) terms,
  // so the rows are addressed once, not each element through four indices.
  const auto row = [Dk](const xt::xarray<float>& x, std::int64_t r) { return x.data() + r * Dk; };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Lq; ++i) {
        const float* qrow = row(qf, (b * Hq + h) * Lq + i);
        for (std::int64_t j = 0; j < Lk; ++j) {
          const float* krow = row(kf, (b * Hkv + hk) * Lk + j);
          double acc = 0, acc2 = 0, dot = 0;
          for (std::int64_t d = 0; d < Dk; ++d) {
            const double x = static_cast<double>(qrow[d]) * static_cast<double>(krow[d]);
            acc += std::abs(x);
            acc2 += x * x;
            dot += x;
          }
          const double scale = static_cast<double>(a.scale);
          if (std::isfinite(acc)) S = std::max(S, std::abs(scale) * acc);
          if (std::isfinite(acc2)) sigma2 = std::max(sigma2, scale * scale * acc2);
          if (std::isfinite(dot)) smax2 = std::max(smax2, scale * scale * dot * dot);
        }
      }
    }
  }
  double max_v = 0, max_mask = 0;
  for (const float x : vf) {
    if (std::isfinite(x)) max_v = std::max(max_v, std::abs(static_cast<double>(x)));
  }
  if (mask != nullptr && mask->dtype() != DType::u8) {
    for (const float x : mask->to_f32()) {
      if (std::isfinite(x)) max_mask = std::max(max_mask, std::abs(static_cast<double>(x)));
    }
  }
  const double delta = (eps + static_cast<double>(Dk + 2) * u) * S + u * max_mask;
  const double gamma = static_cast<double>(Lk + 4) * u;
  const double budget = max_v * (2 * eps + 2 * delta + 2 * gamma) + denorm;
  // Over the finite reference elements: compare_values leaves inf/NaN out of the NMSE.
  double sum_sq = 0;
  std::int64_t finite = 0;
  for (const float x : ref.to_f32()) {
    if (!std::isfinite(x)) continue;
    sum_sq += static_cast<double>(x) * static_cast<double>(x);
    ++finite;
  }
  const double mean_sq = sum_sq / static_cast<double>(std::max<std::int64_t>(finite, 1));
  Budget out{{budget}, mean_sq > 0 ? budget * budget / (4 * mean_sq) : -1};
  if (t != DType::f32 && mean_sq > 0) {
    auto unit = [](DType x) { return x == DType::f32 ? 0x1p-24 : dtype_epsilon(x) / 2; };
    const double uo = unit(t), uq = unit(q.dtype()), uk = unit(k_dtype), uv = unit(v_dtype);
    const double g2 = static_cast<double>(Lk + Dk + 8) * u * u;
    Budget::RoundingTerms& r = out.rounding_terms;
    r.probabilities = uo * uo;
    r.dequantized_kv = uv * uv + uk * uk * sigma2;
    r.scaled_q = uq * uq * sigma2;
    r.logits = uo * uo * smax2;
    out.precision_nmse_max =
        2 * uo * uo + g2 + denorm * denorm / mean_sq + r.probabilities + r.dequantized_kv + r.scaled_q + r.logits;
  }
  return out;
}

std::vector<Problem> attention_shrink(const Problem& p, std::vector<Problem> generic) {
  const std::int64_t hq = p.integer("Hq"), hkv = p.integer("Hkv");
  std::vector<Problem> out;
  // Heads shrink together (Hq % Hkv must hold): first to one kv head, then to one head.
  if (hq > 1) out.push_back(p.with("Hq", "1").with("Hkv", "1"));
  if (hkv > 1) out.push_back(p.with("Hq", std::to_string(hq / hkv)).with("Hkv", "1"));
  if (p.real("softcap") != 0) out.push_back(p.with("softcap", "0"));
  for (Problem& g : generic) out.push_back(std::move(g));
  return out;
}

// Traffic, the part shared by sdpa and quantized_sdpa: q read, out written, the mask
// array (bool: 1 byte, additive: f32 per (b, query, key)) and the sinks (Hq f32) read
// when present. Flops: 2·Dk per logit (q·k) and 2·Dv per weighted value (p·v) for every
// (b, query head, query, key), the dense count also under a causal mask; softmax's exp
// and the normalization are not counted.
Traffic attention_traffic(const Problem& p) {
  const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Lq = p.integer("Lq"), Lk = p.integer("Lk");
  const std::int64_t Dk = p.integer("Dk"), Dv = p.integer("Dv"), es = dtype_bytes(p);
  const std::string& mask = p.word("mask");
  const std::int64_t mask_bytes = mask == "bool" ? B * Lq * Lk : (mask == "additive" ? B * Lq * Lk * 4 : 0);
  const std::int64_t sink_bytes = p.flag("sinks") ? Hq * 4 : 0;
  return {B * Hq * Lq * Dk * es + mask_bytes + sink_bytes, B * Hq * Lq * Dv * es, 2 * B * Hq * Lq * Lk * (Dk + Dv)};
}

// sdpa: plus K (B, Hkv, Lk, Dk) and V (B, Hkv, Lk, Dv) in `dtype`, each read once.
Traffic sdpa_traffic(const Problem& p) {
  Traffic t = attention_traffic(p);
  const std::int64_t rows = p.integer("B") * p.integer("Hkv") * p.integer("Lk");
  t.read_bytes += rows * (p.integer("Dk") + p.integer("Dv")) * dtype_bytes(p);
  return t;
}

// quantized_sdpa: plus packed K and V (codes, scales, biases per side's spec), each read
// once: the point of a fused kernel, the dequantized K/V never exist in memory.
Traffic quantized_sdpa_traffic(const Problem& p) {
  Traffic t = attention_traffic(p);
  const std::int64_t rows = p.integer("B") * p.integer("Hkv") * p.integer("Lk"), es = dtype_bytes(p);
  for (const char* side : {"k", "v"}) {
    const std::string s(side);
    const QuantSpec spec{quant_mode_from_name(p.word(s + "mode")), p.int32(s + "bits"), p.int32(s + "group")};
    t.read_bytes += packed_bytes(spec, rows * p.integer(s == "k" ? "Dk" : "Dv"), es);
  }
  return t;
}

class Sdpa final : public OpInfo {
 public:
  std::string_view name() const override { return "sdpa"; }
  std::string_view summary() const override { return "attention: GQA, masks, sinks, softcap, Dv != Dk"; }
  std::vector<ParamSpec> declared_params() const override {
    std::vector<ParamSpec> ps = attention_params();
    ps.push_back(word_param("special", {"none", "v_inf", "k_inf", "k_ninf", "q_nan", "k_nan", "uniform"}, true));
    return ps;
  }

  std::uint64_t footprint(const Problem& p) const override { return attention_footprint(p, false).bytes(); }
  TrafficModel traffic_model() const override { return sdpa_traffic; }
  std::uint64_t work(const Problem& p) const override { return attention_work(p, false); }

  Prepared prepare(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv");
    const std::int64_t Lq = p.integer("Lq"), Lk = p.integer("Lk"), Dk = p.integer("Dk"), Dv = p.integer("Dv");
    Prepared prep;
    Tensor q = random_normal(p, "q", dtype, {B, Hq, Lq, Dk});
    Tensor k = random_normal(p, "k", dtype, {B, Hkv, Lk, Dk});
    Tensor v = random_normal(p, "v", dtype, {B, Hkv, Lk, Dv});
    inject_special(p, q, k, v);
    std::optional<Tensor> mask = mask_array(p);
    const std::vector<bool> hidden = hidden_keys(p, mask ? &*mask : nullptr);
    poison_rows(hidden, k, payload_nan_bits(dtype));
    poison_rows(hidden, v, payload_nan_bits(dtype));
    prep.add_input("q", std::move(q));
    prep.add_input("k", std::move(k));
    prep.add_input("v", std::move(v));
    add_mask_and_sinks(p, prep, std::move(mask));
    prep.outputs.push_back({"out", dtype, {B, Hq, Lq, Dv}, false, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    b.sdpa({in["q"], in["k"], in["v"], attention(p), optional_input(in, "mask"), optional_input(in, "sinks"),
           out.tensors[0]});
  }

  Budget budget(const Problem& p, const Prepared& prep, std::size_t, const Tensor& ref) const override {
    const Tensor* mask = nullptr;
    for (std::size_t i = 0; i < prep.input_names.size(); ++i) {
      if (prep.input_names[i] == "mask") mask = &prep.inputs[i];
    }
    const DType dtype = prep.input("k").dtype();
    Budget b = attention_budget(p, prep.input("q"), prep.input("k"), prep.input("v"), mask, ref, dtype, dtype);
    if (ref.dtype() != DType::f32 && p.word("special") == "none") {
      b.expected_rounding_mismatches = static_cast<double>(f32_twin_mismatches(p, prep, ref));
    }
    b.nan_where_reference_nan = p.word("special") != "none";
    return b;
  }

  std::vector<Problem> shrink_candidates(const Problem& p) const override {
    return attention_shrink(p, OpInfo::shrink_candidates(p));
  }
};

QuantSpec side_spec(const Problem& p, char side) {
  const std::string s(1, side);
  QuantSpec q{quant_mode_from_name(p.word(s + "mode")), p.int32(s + "bits"), p.int32(s + "group")};
  q.validate();
  return q;
}

class QuantizedSdpa final : public OpInfo {
 public:
  std::string_view name() const override { return "quantized_sdpa"; }
  std::string_view summary() const override { return "attention over packed K/V (any affine/fp spec per side)"; }
  std::vector<ParamSpec> declared_params() const override {
    std::vector<ParamSpec> ps = attention_params();
    for (const char* side : {"k", "v"}) {
      const std::string s(side);
      ps.push_back(word_param(s + "mode", quant_mode_names()));
      ps.push_back(int_param(s + "bits", 4));
      ps.push_back(int_param(s + "group", 64));
    }
    for (const char* side : {"k", "v"}) ps.push_back(word_param(std::string(side) + "dtype", {"q", "f32", "f16", "bf16"}, true));
    return ps;
  }

  std::uint64_t footprint(const Problem& p) const override { return attention_footprint(p, true).bytes(); }
  TrafficModel traffic_model() const override { return quantized_sdpa_traffic; }
  std::uint64_t work(const Problem& p) const override { return attention_work(p, true); }

  Prepared prepare(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv");
    const std::int64_t Lq = p.integer("Lq"), Lk = p.integer("Lk"), Dk = p.integer("Dk"), Dv = p.integer("Dv");
    Prepared prep;
    prep.add_input("q", random_normal(p, "q", dtype, {B, Hq, Lq, Dk}));
    std::optional<Tensor> mask = mask_array(p);
    const std::vector<bool> hidden = hidden_keys(p, mask ? &*mask : nullptr);
    for (const char side : {'k', 'v'}) {
      const QuantSpec spec = side_spec(p, side);
      const std::string& kv_name = p.word(std::string(1, side) + "dtype");
      const DType kv_dtype = kv_name == "q" ? dtype : dtype_from_name(kv_name);
      const Tensor x = random_normal(p, std::string(1, side), kv_dtype, {B, Hkv, Lk, side == 'k' ? Dk : Dv});
      ref::QuantizedTensor q = ref::quantize(x, spec, Rounding::mlx_cpu);
      // Poisoned scales for hidden rows, whose dequantized values are then inf/NaN: a float
      // NaN (scales in the input dtype) or E8M0 0xFF = +inf. E4M3 (nvfp4) has no such
      // code, so those rows stay clean.
      switch (spec.format().scale) {
        case ScaleEncoding::input_dtype: poison_rows(hidden, q.scales, payload_nan_bits(kv_dtype)); break;
        case ScaleEncoding::f16: poison_rows(hidden, q.scales, payload_nan_bits(DType::f16)); break;
        case ScaleEncoding::e8m0: poison_rows(hidden, q.scales, 0xFF); break;
        case ScaleEncoding::e4m3: break;
      }
      const std::string s(1, side);
      prep.add_input(s + "wq", std::move(q.wq));
      prep.add_input(s + "scales", std::move(q.scales));
      if (spec.has_biases()) prep.add_input(s + "biases", std::move(q.biases));
    }
    add_mask_and_sinks(p, prep, std::move(mask));
    prep.outputs.push_back({"out", dtype, {B, Hq, Lq, Dv}, false, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    auto side = [&](char c) {
      const std::string s(1, c);
      const DTensor* biases = in.find(s + "biases");
      return QuantizedDTensor{in[s + "wq"], in[s + "scales"], biases ? *biases : DTensor{}, side_spec(p, c)};
    };
    b.quantized_sdpa({in["q"], side('k'), side('v'), attention(p), optional_input(in, "mask"),
                     optional_input(in, "sinks"), out.tensors[0]});
  }

  Budget budget(const Problem& p, const Prepared& prep, std::size_t, const Tensor& ref) const override {
    auto dequantized = [&](char c) {
      const std::string s(1, c);
      const QuantSpec spec = side_spec(p, c);
      ref::QuantizedView view{prep.input(s + "wq").view(), prep.input(s + "scales").view(),
                              spec.has_biases() ? prep.input(s + "biases").view() : ConstTensorView{},
                              spec};
      return ref::dequantize_to_f32(view);
    };
    const Tensor* mask = nullptr;
    for (std::size_t i = 0; i < prep.input_names.size(); ++i) {
      if (prep.input_names[i] == "mask") mask = &prep.inputs[i];
    }
    const Tensor v = dequantized('v');
    // K and V dequantized into their scales' dtype (kdtype / vdtype) before attention.
    auto kv_dtype = [&](char c) {
      const std::string& n = p.word(std::string(1, c) + "dtype");
      return n == "q" ? prep.input("q").dtype() : dtype_from_name(n);
    };
    const Budget base = attention_budget(p, prep.input("q"), dequantized('k'), v, mask, ref, kv_dtype('k'), kv_dtype('v'));
    // Terms of affine sides dequantized the fused way (kernels/simd/quantized_decode.cc),
    // u = 2^-24, k and v = c·s + b:
    //  * K by one FMA, fl(c·s + b), where the oracle rounds c·s first: per element at most
    //    u·|c·s| + 2u·|k| ≤ 3u·|k| + u·|b| apart (|c·s| ≤ |k| + |b|), so the logits move by
    //    3u·S + u·S_b more, S_b = max over (row, key) of |scale|·Σ_g |b_g|·Σ_{d∈g}|q_d|.
    //    δ of attention_budget holds (Dk+2)·u·S, so 2·max|v|·3u·S ≤ 3/(Dk+2) of the base
    //    budget: the budget grows by that fraction plus 2·max|v|·u·S_b.
    //  * V factored, o = Σ_t (p_t·s_t)·c_t + Σ_t p_t·b_t: its Lk-term sums round relative
    //    to Σ p·|s·c| + Σ p·|b| ≤ max|v| + 2·max|b| instead of max|v|, so the γ·max|v|
    //    part of the bound grows by 2γ·max|b_V|, γ = (Lk+4)·u.
    // The norm check keeps its ratio to the point-wise bound.
    constexpr double u = 0x1p-24;
    const std::int64_t B = p.integer("B"), Hq = p.integer("Hq"), Hkv = p.integer("Hkv"), Lq = p.integer("Lq");
    const std::int64_t Lk = p.integer("Lk"), Dk = p.integer("Dk");
    double budget = base.per_element[0];
    const QuantSpec ks = side_spec(p, 'k');
    // Biased formats only: the fused decode's terms come from the per-group biases.
    if (ks.has_biases()) {
      const xt::xarray<float> q = prep.input("q").to_f32(), kb = prep.input("kbiases").to_f32();
      const std::int64_t gs = ks.group_size, groups = Dk / gs;
      const double scale = std::abs(static_cast<double>(attention(p).scale));
      double s_b = 0, max_v = 0;
      std::vector<double> q_abs(static_cast<std::size_t>(groups));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
          for (std::int64_t i = 0; i < Lq; ++i) {
            for (std::int64_t g = 0; g < groups; ++g) {
              double a = 0;
              for (std::int64_t d = g * gs; d < (g + 1) * gs; ++d) a += std::abs(static_cast<double>(q(b, h, i, d)));
              q_abs[static_cast<std::size_t>(g)] = a;
            }
            for (std::int64_t j = 0; j < Lk; ++j) {
              double acc = 0;
              for (std::int64_t g = 0; g < groups; ++g) {
                acc += std::abs(static_cast<double>(kb(b, h / (Hq / Hkv), j, g))) * q_abs[static_cast<std::size_t>(g)];
              }
              if (std::isfinite(acc)) s_b = std::max(s_b, scale * acc);
            }
          }
      for (const float x : v.to_f32()) {
        if (std::isfinite(x)) max_v = std::max(max_v, std::abs(static_cast<double>(x)));
      }
      budget += base.per_element[0] * 3 / static_cast<double>(Dk + 2) + 2 * max_v * u * s_b;
    }
    if (side_spec(p, 'v').has_biases()) {
      double max_vb = 0;
      for (const float x : prep.input("vbiases").to_f32()) {
        if (std::isfinite(x)) max_vb = std::max(max_vb, std::abs(static_cast<double>(x)));
      }
      budget += 2 * static_cast<double>(Lk + 4) * u * max_vb;
    }
    const double ratio = budget / base.per_element[0];
    Budget out{{budget}, base.nmse_max > 0 ? base.nmse_max * ratio * ratio : base.nmse_max};
    // The fused decode's terms are f32 roundings, ~u_f32 relative: beside the precision
    // ceiling's half-precision terms they are nothing, so the ceiling stays.
    out.precision_nmse_max = base.precision_nmse_max;
    out.rounding_terms = base.rounding_terms;
    return out;
  }

  std::vector<Problem> shrink_candidates(const Problem& p) const override {
    return attention_shrink(p, OpInfo::shrink_candidates(p));
  }
};

}  // namespace

const OpInfo& sdpa() {
  static const Sdpa op;
  return op;
}
const OpInfo& quantized_sdpa() {
  static const QuantizedSdpa op;
  return op;
}

}  // namespace kvlab::harness::ops
