// Unit tests of the reference SDPA (reference/sdpa.h). Expectations come from hand
// softmax, from structure (one-hot values reveal which keys got weight; q = 0 makes the
// weights uniform), from a naive softmax written here, or from an equivalent call. Its
// validation of invalid calls is tested in test_sdpa_invalid.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/mask.h"
#include "reference/sdpa.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_sdpa {
namespace {

using ::kvlab::testing::bit_equal;
using ::kvlab::testing::random_normal;
using Index = std::vector<std::int64_t>;

Tensor rnd(::kvlab::testing::SeededRng& rng, Shape s) { return random_normal(rng, DType::f32, std::move(s)); }

double at(const Tensor& t, std::initializer_list<std::int64_t> idx) {
  return t.view().load(row_major_index(t.shape(), idx));
}

// One unit in the last place of dtype t at |x| (subnormal spacing below the normals).
double ulp(double x, DType t) {
  int e = 0;
  std::frexp(std::max(std::abs(x), t == DType::f16 ? 0x1p-14 : 0x1p-126), &e);
  return std::ldexp(dtype_epsilon(t), e - 1);
}

// |actual − expected| ≤ ulps·ulp_t(expected) + slack, element-wise. The default slack
// covers two double evaluations of one sum in different orders (~Lk·2^-53·Σ|p·v|).
::testing::AssertionResult within_ulps(const Tensor& actual, const std::vector<double>& expected, DType t,
                                       double ulps = 1, double slack = 1e-12) {
  if (static_cast<std::size_t>(actual.numel()) != expected.size()) return ::testing::AssertionFailure() << "sizes";
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double a = actual.view().load(static_cast<std::int64_t>(i)), e = expected[i];
    if (!(std::abs(a - e) <= ulps * ulp(e, t) + slack)) {
      return ::testing::AssertionFailure() << "flat index " << i << ": got " << a << ", expected " << e;
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = t.view().load(static_cast<std::int64_t>(i));
  return out;
}

Tensor cast(const Tensor& t, DType dtype) { return Tensor::from_f32(t.to_f32(), dtype); }

// out[idx] = src[source(idx)] over every index of `shape`, element bytes copied (any dtype).
Tensor gather(const Tensor& src, const Shape& shape, const std::function<Index(Index)>& source) {
  Tensor out(src.dtype(), shape);
  const std::size_t es = dtype_size(src.dtype());
  Index idx(shape.size(), 0);
  for (std::int64_t e = 0; e < out.numel(); ++e) {
    std::int64_t flat = 0;
    const Index s = source(idx);
    for (std::size_t a = 0; a < s.size(); ++a) flat = flat * src.shape()[a] + s[a];
    std::memcpy(out.data() + static_cast<std::size_t>(e) * es, src.data() + static_cast<std::size_t>(flat) * es, es);
    for (std::size_t a = shape.size(); a-- > 0 && ++idx[a] == shape[a];) idx[a] = 0;
  }
  return out;
}

// K or V with each kv head repeated R times in place: head h of the result is head h/R.
Tensor expand_heads(const Tensor& x, std::int64_t r) {
  return gather(x, {x.dim(0), x.dim(1) * r, x.dim(2), x.dim(3)}, [r](Index i) { i[1] /= r; return i; });
}
// Element a of `axis` of the result is element perm[a] of x.
Tensor permute_axis(const Tensor& x, std::size_t axis, const Index& perm) {
  return gather(x, x.shape(), [&](Index i) { i[axis] = perm[static_cast<std::size_t>(i[axis])]; return i; });
}
// A (1|B, 1|Hq, Lq, Lk) or 2-D (Lq, Lk) mask spelled out as (B, Hq, Lq, Lk).
Tensor materialize(const Tensor& m, std::int64_t batch, std::int64_t hq) {
  return gather(m, {batch, hq, m.dim(-2), m.dim(-1)}, [&m](Index i) {
    if (m.rank() == 2) return Index{i[2], i[3]};
    return Index{m.dim(0) == 1 ? 0 : i[0], m.dim(1) == 1 ? 0 : i[1], i[2], i[3]};
  });
}

// v[b, h, j, :] = e_j: the output row then *is* the weight vector over the keys.
Tensor one_hot_values(std::int64_t batch, std::int64_t lk) {
  Tensor v(DType::f32, {batch, 1, lk, lk});
  for (std::int64_t row = 0; row < batch * lk; ++row) v.view().store(row * lk + row % lk, 1.0f);  // row = b·Lk + j
  return v;
}

// Attention straight from the formula, without max subtraction (inputs are modest):
// p_j ∝ exp(scale·<q, k_j> + bias(b,h,i,j)), a sink adds exp(sink_h) to the
// denominator, query head h reads kv head h / (Hq/Hkv).
using Bias = std::function<double(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j)>;
const Bias kNoBias = [](std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 0.0; };
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Bias& bias,
                                    const std::vector<double>& sinks = {}) {
  const std::int64_t lk = k.dim(2), r = q.dim(1) / k.dim(1);
  std::vector<double> out;
  for (std::int64_t b = 0; b < q.dim(0); ++b) {
    for (std::int64_t h = 0; h < q.dim(1); ++h) {
      for (std::int64_t i = 0; i < q.dim(2); ++i) {
        std::vector<double> w;
        double total = sinks.empty() ? 0.0 : std::exp(sinks[static_cast<std::size_t>(h)]);
        for (std::int64_t j = 0; j < lk; ++j) {
          double dot = 0;
          for (std::int64_t c = 0; c < q.dim(3); ++c) dot += at(q, {b, h, i, c}) * at(k, {b, h / r, j, c});
          w.push_back(std::exp(scale * dot + bias(b, h, i, j)));
          total += w.back();
        }
        for (std::int64_t c = 0; c < v.dim(3); ++c) {
          double o = 0;
          for (std::int64_t j = 0; j < lk; ++j) o += w[static_cast<std::size_t>(j)] / total * at(v, {b, h / r, j, c});
          out.push_back(o);
        }
      }
    }
  }
  return out;
}

AttentionParams with_mask(float scale, MaskSpec mask, FullyMaskedRow policy = FullyMaskedRow::zero) {
  return AttentionParams{scale, 0.0f, std::move(mask), policy};
}
MaskSpec causal(int window = 0, std::vector<std::int32_t> left = {}, std::vector<std::int32_t> right = {}) {
  return MaskSpec{MaskKind::causal, window, std::move(left), std::move(right)};
}
MaskSpec array_mask(MaskKind kind) { return MaskSpec{kind, 0, {}, {}}; }

// Whether a structured causal mask shows key j to (b, i), written from docs/kernels.md §Masks
// directly.
bool sees(const MaskSpec& m, std::int64_t b, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
  const std::int64_t pos = i + (lk - lq);
  const auto ub = static_cast<std::size_t>(b);
  const std::int64_t left = m.left_padding.empty() ? 0 : m.left_padding[ub];
  const std::int64_t right = m.right_padding.empty() ? 0 : m.right_padding[ub];
  return j <= pos && (m.window == 0 || j > pos - m.window) && j >= left && j < lk - right;
}

TEST(Sdpa, OneQueryTwoKeysByHand) {
  // q = [1, 2], k0 = [1, 0], k1 = [0, 1], scale 0.5: logits s = [0.5, 1.0].
  const Tensor q = Tensor::from_values(DType::f32, {1, 1, 1, 2}, std::vector<float>{1, 2});
  const Tensor k = Tensor::from_values(DType::f32, {1, 1, 2, 2}, std::vector<float>{1, 0, 0, 1});
  const Tensor v = Tensor::from_values(DType::f32, {1, 1, 2, 3}, std::vector<float>{1, 0, 2, 0, 1, -2});
  // Unnormalised weights e0, e1 and a sink term es give o = p0·v0 + p1·v1.
  const auto out = [](double e0, double e1, double es) {
    const double p0 = e0 / (e0 + e1 + es), p1 = e1 / (e0 + e1 + es);
    return std::vector<double>{p0, p1, 2 * p0 - 2 * p1};
  };
  const AttentionParams plain = with_mask(0.5f, {});
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, plain), out(std::exp(0.5), std::exp(1.0), 0), DType::f32, 1, 0));
  // A sink of 0.25 joins the denominator only.
  const Tensor sink = Tensor::from_values(DType::f32, {1}, std::vector<float>{0.25f});
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, plain, nullptr, &sink), out(std::exp(0.5), std::exp(1.0), std::exp(0.25)),
                          DType::f32, 1, 0));
  // Softcap 0.75: s' = 0.75·tanh(s/0.75) before the softmax; the sink stays uncapped.
  AttentionParams capped = plain;
  capped.softcap = 0.75f;
  const double c0 = std::exp(0.75 * std::tanh(0.5 / 0.75)), c1 = std::exp(0.75 * std::tanh(1.0 / 0.75));
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, capped), out(c0, c1, 0), DType::f32, 1, 0));
  const Tensor sink2 = Tensor::from_values(DType::f32, {1}, std::vector<float>{2.0f});
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, capped, nullptr, &sink2), out(c0, c1, std::exp(2.0)), DType::f32, 1, 0));
  // Logits 1000 and 1000.5 overflow exp without the max subtraction; softmax is
  // shift-invariant, so the weights are those of logits 0 and 0.5.
  const Tensor big = Tensor::from_values(DType::f32, {1, 1, 1, 2}, std::vector<float>{1000.0f, 1000.5f});
  EXPECT_TRUE(within_ulps(ref::sdpa(big, k, v, with_mask(1.0f, {})), out(1, std::exp(0.5), 0), DType::f32, 1, 0));
}

TEST(Sdpa, MatchesNaiveSoftmaxWithGqaSinksAndDvNotDk) {
  KVLAB_SEEDED_RNG(rng, 20240611);
  const std::int64_t lq = 3, lk = 7;
  // Hq 6 over Hkv 2 (R = 3), Dk 8, Dv 5.
  const Tensor q = rnd(rng, {2, 6, lq, 8}), k = rnd(rng, {2, 2, lk, 8}), v = rnd(rng, {2, 2, lk, 5});
  const Tensor sinks = rnd(rng, {6});
  const float scale = 0.35f;
  // sdpa rounds its double result once (≤ ½ulp); the naive sum differs by the slack.
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, with_mask(scale, {})), naive_attention(q, k, v, scale, kNoBias),
                          DType::f32));
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, with_mask(scale, {}), nullptr, &sinks),
                          naive_attention(q, k, v, scale, kNoBias, values_of(sinks)), DType::f32));
  const MaskSpec window = causal(3);
  const Bias hide = [&](std::int64_t b, std::int64_t, std::int64_t i, std::int64_t j) {
    return sees(window, b, i, j, lq, lk) ? 0.0 : -INFINITY;
  };
  EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, with_mask(scale, window), nullptr, &sinks),
                          naive_attention(q, k, v, scale, hide, values_of(sinks)), DType::f32));
}

TEST(Sdpa, GroupedQueryEqualsExpandedHeads) {
  KVLAB_SEEDED_RNG(rng, 7);
  for (std::int64_t r : {1, 2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "R = " << r);
    const std::int64_t hq = 2 * r;
    const Tensor q = rnd(rng, {2, hq, 3, 8}), k = rnd(rng, {2, 2, 6, 8}), v = rnd(rng, {2, 2, 6, 4});
    const Tensor sinks = rnd(rng, {hq});
    Tensor per_head(DType::u8, {2, hq, 3, 6});
    for (std::int64_t e = 0; e < per_head.numel(); ++e) per_head.view().store_int(e, rng.integer(0, 3) != 0);
    const Tensor ke = expand_heads(k, r), ve = expand_heads(v, r);
    // Same arithmetic on the same values in the same order: bit-identical.
    EXPECT_TRUE(bit_equal(ref::sdpa(q, k, v, with_mask(0.4f, {})), ref::sdpa(q, ke, ve, with_mask(0.4f, {}))));
    const AttentionParams windowed = with_mask(0.4f, causal(2, {0, 1}));
    EXPECT_TRUE(bit_equal(ref::sdpa(q, k, v, windowed, nullptr, &sinks),
                          ref::sdpa(q, ke, ve, windowed, nullptr, &sinks)));
    const AttentionParams boolean = with_mask(0.4f, array_mask(MaskKind::boolean));
    EXPECT_TRUE(bit_equal(ref::sdpa(q, k, v, boolean, &per_head), ref::sdpa(q, ke, ve, boolean, &per_head)));
  }
}

// q = 0 gives every visible key weight exactly 1/n; one-hot values make each output row
// that weight vector, so out[b, 0, i, j] = sees(i, j) / n_i (0 for fully masked rows).
void expect_one_hot_weights(const MaskSpec& m, std::int64_t batch, std::int64_t lq, std::int64_t lk) {
  Tensor k(DType::f32, {batch, 1, lk, 4});
  for (std::int64_t e = 0; e < k.numel(); ++e) k.view().store(e, static_cast<float>(e % 7) - 3.0f);  // irrelevant
  const Tensor out = ref::sdpa(Tensor(DType::f32, {batch, 1, lq, 4}), k, one_hot_values(batch, lk), with_mask(1, m));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < lq; ++i) {
      std::int64_t n = 0, weighted = 0;
      for (std::int64_t j = 0; j < lk; ++j) n += sees(m, b, i, j, lq, lk);
      for (std::int64_t j = 0; j < lk; ++j) {
        const double expected = sees(m, b, i, j, lq, lk) ? 1.0 / static_cast<double>(n) : 0.0;
        EXPECT_NEAR(at(out, {b, 0, i, j}), expected, ulp(expected, DType::f32)) << b << ", " << i << ", " << j;
        weighted += at(out, {b, 0, i, j}) != 0;
      }
      EXPECT_EQ(weighted, n) << "b " << b << " i " << i;
    }
  }
}

TEST(Sdpa, CausalIsAlignedToTheLowerRight) {
  for (auto [lq, lk] : {std::pair<std::int64_t, std::int64_t>{3, 7}, {1, 5}, {4, 4}}) {
    SCOPED_TRACE(::testing::Message() << "Lq " << lq << " Lk " << lk);
    expect_one_hot_weights(causal(), 1, lq, lk);
    // Spelled out: the first query sees keys 0 ..= Lk − Lq, the last one every key.
    EXPECT_TRUE(sees(causal(), 0, 0, lk - lq, lq, lk) && !sees(causal(), 0, 0, lk - lq + 1, lq, lk));
    EXPECT_TRUE(sees(causal(), 0, lq - 1, lk - 1, lq, lk));
  }
}

TEST(Sdpa, WindowSeesExactlyMinOfWAndPositionPlusOneKeys) {
  for (int w : {1, 2, 3, 5}) {
    for (auto [lq, lk] : {std::pair<std::int64_t, std::int64_t>{6, 6}, {3, 8}, {1, 4}}) {
      SCOPED_TRACE(::testing::Message() << "W " << w << " Lq " << lq << " Lk " << lk);
      expect_one_hot_weights(causal(w), 1, lq, lk);
      for (std::int64_t i = 0; i < lq; ++i) {  // the count, independently of sees()
        const std::int64_t pos = i + lk - lq;
        std::int64_t n = 0;
        for (std::int64_t j = 0; j < lk; ++j) n += sees(causal(w), 0, i, j, lq, lk);
        EXPECT_EQ(n, std::min<std::int64_t>(w, pos + 1)) << "query at position " << pos;
      }
    }
  }
}

TEST(Sdpa, LeftAndRightPaddingHideKeysPerBatchRow) {
  // Row 0 hides key 5 (right 1), row 1 keys 0 and 1 (left 2); row 2 hides every key
  // (left 5 + right 2 > Lk), so all its queries are fully masked and give 0.
  for (int w : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "window " << w);
    expect_one_hot_weights(causal(w, {0, 2, 5}, {1, 0, 2}), 3, 4, 6);
  }
}

TEST(Sdpa, StructuredCausalEqualsBooleanAndAdditiveArrays) {
  KVLAB_SEEDED_RNG(rng, 99);
  const std::int64_t lq = 3, lk = 7;
  const Tensor q = rnd(rng, {2, 4, lq, 8}), k = rnd(rng, {2, 2, lk, 8}), v = rnd(rng, {2, 2, lk, 6});
  using Pads = std::vector<std::int32_t>;
  for (int w : {0, 1, 3}) {
    for (const auto& [left, right] : {std::pair<Pads, Pads>{{}, {}}, {{1, 3}, {}}, {{}, {2, 0}}, {{2, 6}, {1, 0}}}) {
      SCOPED_TRACE(::testing::Message() << "window " << w << ", paddings " << left.size() << " " << right.size());
      for (FullyMaskedRow policy : {FullyMaskedRow::zero, FullyMaskedRow::mean_of_values}) {
        const Tensor structured = ref::sdpa(q, k, v, with_mask(0.5f, causal(w, left, right), policy));
        // create_causal_mask gives (Lq, Lk) without padding; sdpa takes rank 4 only.
        const auto as_4d = [](const Tensor& m) { return m.rank() == 4 ? m : materialize(m, 1, 1); };
        const Tensor boolean = as_4d(ref::create_causal_mask(lq, lk - lq, w, left, right, ref::MaskForm::boolean));
        EXPECT_TRUE(bit_equal(structured, ref::sdpa(q, k, v, with_mask(0.5f, array_mask(MaskKind::boolean), policy),
                                                    &boolean)));
        for (DType dtype : {DType::f32, DType::bf16}) {
          const Tensor additive =
              as_4d(ref::create_causal_mask(lq, lk - lq, w, left, right, ref::MaskForm::additive, dtype));
          EXPECT_TRUE(bit_equal(structured, ref::sdpa(q, k, v, with_mask(0.5f, array_mask(MaskKind::additive), policy),
                                                      &additive)));
        }
      }
    }
  }
}

TEST(Sdpa, PerHeadMasksSelectKeysPerHead) {
  KVLAB_SEEDED_RNG(rng, 5);
  const std::int64_t batch = 2, hq = 4, lq = 2, lk = 5;
  const Tensor q = rnd(rng, {batch, hq, lq, 8}), k = rnd(rng, {batch, 2, lk, 8}), v = rnd(rng, {batch, 2, lk, 3});
  // Exactly one visible key per (b, h, i): its weight is exactly 1, so the output is
  // that key's value row of kv head h / 2.
  const auto chosen = [&](std::int64_t b, std::int64_t h, std::int64_t i) { return (b * 3 + h * 2 + i) % lk; };
  Tensor boolean(DType::u8, {batch, hq, lq, lk}), additive(DType::f32, {batch, hq, lq, lk});
  for (std::int64_t e = 0; e < boolean.numel(); ++e) {
    const std::int64_t j = e % lk, i = e / lk % lq, h = e / (lk * lq) % hq, b = e / (lk * lq * hq);
    boolean.view().store_int(e, j == chosen(b, h, i));
    additive.view().store(e, j == chosen(b, h, i) ? 0.0f : -INFINITY);
  }
  const Tensor by_bool = ref::sdpa(q, k, v, with_mask(1.0f, array_mask(MaskKind::boolean)), &boolean);
  for (std::int64_t e = 0; e < by_bool.numel(); ++e) {
    const std::int64_t c = e % 3, i = e / 3 % lq, h = e / (3 * lq) % hq, b = e / (3 * lq * hq);
    EXPECT_EQ(at(by_bool, {b, h, i, c}), at(v, {b, h / 2, chosen(b, h, i), c})) << b << ", " << h << ", " << i;
  }
  EXPECT_TRUE(bit_equal(by_bool, ref::sdpa(q, k, v, with_mask(1.0f, array_mask(MaskKind::additive)), &additive)));
}

TEST(Sdpa, BroadcastMasksEqualMaterializedMasks) {
  KVLAB_SEEDED_RNG(rng, 11);
  const std::int64_t batch = 2, hq = 4, lq = 3, lk = 5;
  const Tensor q = rnd(rng, {batch, hq, lq, 4}), k = rnd(rng, {batch, 1, lk, 4}), v = rnd(rng, {batch, 1, lk, 4});
  for (MaskKind kind : {MaskKind::boolean, MaskKind::additive}) {
    const AttentionParams p = with_mask(0.7f, array_mask(kind));
    for (const Shape& shape : {Shape{1, 1, lq, lk}, Shape{batch, 1, lq, lk}, Shape{1, hq, lq, lk}}) {
      SCOPED_TRACE(::testing::Message() << (kind == MaskKind::boolean ? "boolean " : "additive ") << shape_str(shape));
      Tensor small(kind == MaskKind::boolean ? DType::u8 : DType::f32, shape);
      for (std::int64_t e = 0; e < small.numel(); ++e) {
        if (kind == MaskKind::boolean) small.view().store_int(e, rng.integer(0, 2) != 0);
        else small.view().store(e, rng.integer(0, 3) == 0 ? -INFINITY : static_cast<float>(rng.uniform(-2, 1)));
      }
      const Tensor full = materialize(small, batch, hq);
      EXPECT_TRUE(bit_equal(ref::sdpa(q, k, v, p, &small), ref::sdpa(q, k, v, p, &full)));
      if (kind == MaskKind::additive) {  // and the additive values really enter the logits
        const Bias bias = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
          return at(full, {b, h, i, j});
        };
        std::vector<double> expected = naive_attention(q, k, v, 0.7f, bias);
        for (double& x : expected) x = std::isnan(x) ? 0.0 : x;  // fully masked: 0/0 here, 0 in sdpa
        EXPECT_TRUE(within_ulps(ref::sdpa(q, k, v, p, &small), expected, DType::f32));
      }
    }
  }
}

TEST(Sdpa, FullyMaskedRowsFollowThePolicy) {
  KVLAB_SEEDED_RNG(rng, 3);
  const std::int64_t hq = 2, lq = 3, lk = 4, dv = 5;
  const Tensor q = rnd(rng, {1, hq, lq, 4}), k = rnd(rng, {1, 1, lk, 4}), v = rnd(rng, {1, 1, lk, dv});
  const Tensor sinks = rnd(rng, {hq});
  std::vector<double> mean(dv, 0.0);  // of V over all Lk keys
  for (std::int64_t e = 0; e < v.numel(); ++e) mean[static_cast<std::size_t>(e % dv)] += v.view().load(e) / lk;
  // Rows (h 0, i 1) and (h 1, i 2) hide every key; the others keep at least one.
  const auto masked = [](std::int64_t h, std::int64_t i) { return h * 3 + i == 1 || h * 3 + i == 5; };
  Tensor boolean(DType::u8, {1, hq, lq, lk}), additive(DType::f32, {1, hq, lq, lk});
  for (std::int64_t e = 0; e < boolean.numel(); ++e) {
    const std::int64_t row = e / lk;
    const bool keep = !masked(row / 3, row % 3) && (e % lk == row % lk || rng.integer(0, 1) == 1);
    boolean.view().store_int(e, keep);
    additive.view().store(e, keep ? 0.0f : -INFINITY);
  }
  // The policy depends on the mask alone, so sinks do not change it (sdpa.h).
  for (const Tensor* sink : {static_cast<const Tensor*>(nullptr), &sinks}) {
    for (MaskKind kind : {MaskKind::boolean, MaskKind::additive}) {
      SCOPED_TRACE(::testing::Message() << (sink ? "sinks " : "") << (kind == MaskKind::boolean ? "bool" : "add"));
      const Tensor& m = kind == MaskKind::boolean ? boolean : additive;
      const Tensor zero = ref::sdpa(q, k, v, with_mask(1, array_mask(kind), FullyMaskedRow::zero), &m, sink);
      const Tensor avg = ref::sdpa(q, k, v, with_mask(1, array_mask(kind), FullyMaskedRow::mean_of_values), &m, sink);
      for (std::int64_t e = 0; e < zero.numel(); ++e) {
        const std::int64_t c = e % dv, row = e / dv;
        if (masked(row / lq, row % lq)) {
          EXPECT_EQ(zero.view().load(e), 0.0);
          const double expected = mean[static_cast<std::size_t>(c)];
          EXPECT_NEAR(avg.view().load(e), expected, ulp(expected, DType::f32));
        } else {
          EXPECT_EQ(zero.view().load(e), avg.view().load(e)) << "the policy touches masked rows only";
        }
      }
    }
  }
  // A structured causal mask whose left padding hides every key.
  const Tensor all_hidden = ref::sdpa(q, k, v, with_mask(1, causal(0, {4}), FullyMaskedRow::mean_of_values));
  for (std::int64_t e = 0; e < all_hidden.numel(); ++e) {
    const double expected = mean[static_cast<std::size_t>(e % dv)];
    EXPECT_NEAR(all_hidden.view().load(e), expected, ulp(expected, DType::f32));
  }
}

TEST(Sdpa, HiddenKeysAreNeverRead) {
  KVLAB_SEEDED_RNG(rng, 13);
  const Tensor q = rnd(rng, {1, 2, 2, 4});
  Tensor k = rnd(rng, {1, 1, 5, 4}), v = rnd(rng, {1, 1, 5, 3});
  const AttentionParams p = with_mask(1.0f, causal(0, {}, {2}));  // keys 3 and 4 hidden
  const Tensor clean = ref::sdpa(q, k, v, p);
  for (std::int64_t e = 3 * 4; e < k.numel(); ++e) k.view().store(e, NAN);  // poison, as in unused cache slots
  for (std::int64_t e = 3 * 3; e < v.numel(); ++e) v.view().store(e, NAN);
  EXPECT_TRUE(bit_equal(clean, ref::sdpa(q, k, v, p)));
}

TEST(Sdpa, DvMayDifferFromDk) {
  KVLAB_SEEDED_RNG(rng, 17);
  const Tensor q = rnd(rng, {1, 4, 2, 8}), k = rnd(rng, {1, 2, 6, 8});
  const Bias hide = [](std::int64_t, std::int64_t, std::int64_t i, std::int64_t j) {
    return j <= i + 4 ? 0 : -INFINITY;  // lower-right causal, Lq 2, Lk 6
  };
  for (std::int64_t dv : {1, 3, 20}) {
    SCOPED_TRACE(::testing::Message() << "Dv " << dv);
    const Tensor v = rnd(rng, {1, 2, 6, dv});
    const Tensor full = ref::sdpa(q, k, v, with_mask(0.3f, causal()));
    EXPECT_TRUE(within_ulps(full, naive_attention(q, k, v, 0.3f, hide), DType::f32));
    for (std::int64_t c = 0; c < dv; ++c) {  // each output column depends on its V column only
      EXPECT_TRUE(bit_equal(full.slice(3, c, c + 1), ref::sdpa(q, k, v.slice(3, c, c + 1), with_mask(0.3f, causal()))));
    }
  }
}

TEST(Sdpa, HalfPrecisionEqualsF32OnTheSameRoundedInputs) {
  KVLAB_SEEDED_RNG(rng, 23);
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor q = random_normal(rng, t, {2, 4, 3, 16}), k = random_normal(rng, t, {2, 2, 6, 16});
    const Tensor v = random_normal(rng, t, {2, 2, 6, 8}), sinks = random_normal(rng, t, {4});
    const AttentionParams p = with_mask(0.25f, causal(4));
    const Tensor half = ref::sdpa(q, k, v, p, nullptr, &sinks);
    const Tensor sinks32 = cast(sinks, DType::f32);
    const Tensor full = ref::sdpa(cast(q, DType::f32), cast(k, DType::f32), cast(v, DType::f32), p, nullptr, &sinks32);
    ASSERT_EQ(half.dtype(), t);
    // Both evaluate the same double o from the same values (t → f32 is exact); half is
    // RN_t(o) and full RN_f32(o), so |half − full| ≤ ½ulp_t + ½ulp_f32 ≤ 1 ulp_t.
    EXPECT_TRUE(within_ulps(half, values_of(full), t, 1, 0));
  }
}

TEST(Sdpa, KeyValuePermutationLeavesOutputUnchanged) {
  KVLAB_SEEDED_RNG(rng, 29);
  const std::int64_t lk = 9;
  const Tensor q = rnd(rng, {2, 4, 3, 8}), k = rnd(rng, {2, 2, lk, 8}), v = rnd(rng, {2, 2, lk, 5});
  const Tensor sinks = rnd(rng, {4});
  Tensor boolean(DType::u8, {2, 1, 3, lk});
  for (std::int64_t e = 0; e < boolean.numel(); ++e) boolean.view().store_int(e, rng.integer(0, 2) != 0);
  Index perm(lk);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.engine());
  const Tensor kp = permute_axis(k, 2, perm), vp = permute_axis(v, 2, perm), mp = permute_axis(boolean, 3, perm);
  AttentionParams capped = with_mask(0.5f, {});
  capped.softcap = 1.5f;
  const AttentionParams masked = with_mask(0.5f, array_mask(MaskKind::boolean));
  // Only the order of the double sums changes (the default slack), which can move the
  // f32 result by at most one ulp.
  EXPECT_TRUE(within_ulps(ref::sdpa(q, kp, vp, with_mask(0.5f, {})), values_of(ref::sdpa(q, k, v, with_mask(0.5f, {}))),
                          DType::f32));
  EXPECT_TRUE(within_ulps(ref::sdpa(q, kp, vp, capped, nullptr, &sinks),
                          values_of(ref::sdpa(q, k, v, capped, nullptr, &sinks)), DType::f32));
  EXPECT_TRUE(
      within_ulps(ref::sdpa(q, kp, vp, masked, &mp), values_of(ref::sdpa(q, k, v, masked, &boolean)), DType::f32));
}

TEST(Sdpa, OutputIsRoundedOnceToHalfPrecision) {
  // q = 0 over 4 keys: weights exactly 1/4, so o = Σv/4 is exact in double. The values
  // make o = 1 + ulp/2 ± 2^-26, just off the midpoint between 1 and 1 + ulp of the half
  // type but within half an f32 ulp of it: rounding through f32 lands on the midpoint
  // and ties to even (1.0); rounding once gives 1 + ulp above it and 1 below.
  for (DType t : {DType::f16, DType::bf16}) {
    const double u = dtype_epsilon(t);  // ulp at 1
    for (double sign : {1.0, -1.0}) {
      for (double side : {1.0, -1.0}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " sign " << sign << " side " << side);
        const std::vector<double> vs{sign * (2 + 2 * u), sign * 2, sign * side * 0x1p-24, 0.0};
        Tensor v(t, {1, 1, 4, 1});
        for (std::int64_t j = 0; j < 4; ++j) {
          v.view().store(j, static_cast<float>(vs[static_cast<std::size_t>(j)]));
          ASSERT_EQ(v.view().load(j), vs[static_cast<std::size_t>(j)]) << "inputs must be exact in t";
        }
        const Tensor out = ref::sdpa(Tensor(t, {1, 1, 1, 2}), Tensor(t, {1, 1, 4, 2}), v, with_mask(1.0f, {}));
        EXPECT_EQ(at(out, {0, 0, 0, 0}), sign * (side > 0 ? 1 + u : 1.0));
      }
    }
  }
}

}  // namespace
}  // namespace test_sdpa
}  // namespace kvlab
