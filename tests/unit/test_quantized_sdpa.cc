// Unit tests of the reference attention over quantized K/V (reference/quantized_sdpa.h).
// The contract is "sdpa() over K and V dequantized to f32", so most expectations are
// that call; one test uses K/V whose quantization is exact, which needs no dequantizer.
//
// Tolerance. quantized_sdpa(q, Kq, Vq) and sdpa(q32, deq(Kq), deq(Vq)) evaluate the same
// double expression over the same values: deq() is f32 in both, and q in f16/bf16
// converts to f32 exactly. So both round the same double o, once: the former to q's
// dtype T, the latter to f32. Hence
//   T = f32:  bit-identical;
//   T = f16/bf16:  |RN_T(o) − RN_f32(o)| ≤ ½ulp_T(o) + ½ulp_f32(o) ≤ 1 ulp_T(RN_f32(o)).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/sdpa.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_quantized_sdpa {
namespace {

using ::kvlab::testing::bit_equal;
using ::kvlab::testing::random_normal;
using ::kvlab::testing::SeededRng;
using ref::QuantizedTensor;

double ulp(double x, DType t) {  // subnormal spacing below the normals
  int e = 0;
  std::frexp(std::max(std::abs(x), t == DType::f16 ? 0x1p-14 : 0x1p-126), &e);
  return std::ldexp(dtype_epsilon(t), e - 1);
}

Tensor cast(const Tensor& t, DType dtype) { return Tensor::from_f32(t.to_f32(), dtype); }

ref::QuantizedView view_of(const QuantizedTensor& x) {
  const bool has_biases = x.biases.rank() > 0 && x.biases.numel() > 0;
  return {x.wq.view(), x.scales.view(), has_biases ? x.biases.view() : ConstTensorView{}, x.spec};
}

QuantizedTensor quantize(const Tensor& x, const QuantSpec& spec, Rounding rounding = Rounding::mlx_cpu) {
  if (spec.mode == QuantMode::affine) return ref::affine_quantize(x, spec, rounding);
  return ref::fp_quantize(x, spec, rounding);
}

QuantSpec affine(int bits, int group) { return QuantSpec::make(QuantMode::affine, bits, group); }

AttentionParams params_of(float scale, MaskSpec mask = {}, float softcap = 0) {
  return AttentionParams{scale, softcap, std::move(mask), FullyMaskedRow::zero};
}

// The tolerance of the file comment, checked element-wise.
::testing::AssertionResult equals_sdpa_over_dequantized(const Tensor& q, const QuantizedTensor& k,
                                                        const QuantizedTensor& v, const AttentionParams& p,
                                                        const Tensor* mask = nullptr, const Tensor* sinks = nullptr) {
  const Tensor actual = ref::quantized_sdpa(q, k, v, p, mask, sinks);
  const Tensor expected = ref::sdpa(cast(q, DType::f32), ref::dequantize_to_f32(view_of(k)),
                                    ref::dequantize_to_f32(view_of(v)), p, mask, sinks);
  if (actual.dtype() != q.dtype()) return ::testing::AssertionFailure() << "out dtype " << dtype_name(actual.dtype());
  if (q.dtype() == DType::f32) return bit_equal(actual, expected);
  if (actual.shape() != expected.shape()) return ::testing::AssertionFailure() << shape_str(actual.shape());
  for (std::int64_t i = 0; i < actual.numel(); ++i) {
    const double a = actual.view().load(i), e = expected.view().load(i);
    if (!(std::abs(a - e) <= ulp(e, q.dtype()))) {
      return ::testing::AssertionFailure() << "flat index " << i << ": " << a << " vs " << e;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(QuantizedSdpa, AffineEveryBitsAndGroupEqualsSdpaOverDequantized) {
  KVLAB_SEEDED_RNG(rng, 41);
  const Tensor q = random_normal(rng, DType::f32, {1, 4, 3, 128});
  const Tensor k = random_normal(rng, DType::f32, {1, 2, 9, 128}), v = random_normal(rng, DType::f32, {1, 2, 9, 128});
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int group : {32, 64, 128}) {
      SCOPED_TRACE(::testing::Message() << "bits " << bits << " group " << group);
      const Rounding rounding = (bits + group / 32) % 2 == 0 ? Rounding::mlx_cpu : Rounding::mlx_gpu;
      const QuantizedTensor qk = quantize(k, affine(bits, group), rounding);
      const QuantizedTensor qv = quantize(v, affine(bits, group), rounding);
      // dequantize_to_f32 is the affine dequantizer with an f32 output, nothing else.
      EXPECT_TRUE(bit_equal(ref::dequantize_to_f32(view_of(qk)), ref::affine_dequantize(qk, DType::f32)));
      EXPECT_TRUE(equals_sdpa_over_dequantized(q, qk, qv, params_of(0.088f, MaskSpec{MaskKind::causal, 0, {}, {}})));
    }
  }
}

// Affine groups holding the integers 0..n (n = 2^bits − 1, both ends present) quantize
// exactly: scale −1, bias n, code n − g, and n − g decodes back to g
// (docs/quantization.md §Affine parameters). mxfp8 groups whose amax is 448 get scale 2^0, so
// e4m3-representable values survive too. Then quantized attention must equal sdpa over the original
// K and V, whatever the dequantizer does internally.
TEST(QuantizedSdpa, ExactlyQuantizableKvEqualsPlainSdpa) {
  KVLAB_SEEDED_RNG(rng, 43);
  const std::int64_t lk = 7;
  Tensor k(DType::f32, {2, 2, lk, 64}), v_affine(DType::f32, {2, 2, lk, 32}), v_fp8(DType::f32, {2, 2, lk, 32});
  const std::vector<float> e4m3{0, 1, -1, 0.5f, -2, 3, 1.5f, -0.25f, 6, 12, -448};
  for (std::int64_t e = 0; e < k.numel(); ++e) {
    k.view().store(e, e % 32 == 0 ? 15.0f : e % 32 == 1 ? 0.0f : static_cast<float>(rng.integer(0, 15)));
  }
  for (std::int64_t e = 0; e < v_affine.numel(); ++e) {
    v_affine.view().store(e, e % 32 == 5 ? 7.0f : e % 32 == 9 ? 0.0f : static_cast<float>(rng.integer(0, 7)));
    const auto pick = static_cast<std::size_t>(rng.integer(0, static_cast<std::int64_t>(e4m3.size()) - 1));
    v_fp8.view().store(e, e % 32 == 3 ? 448.0f : e4m3[pick]);
  }
  const Tensor q = random_normal(rng, DType::f32, {2, 8, 3, 64}, 0.05);  // Hq 8 over Hkv 2
  const Tensor sinks = random_normal(rng, DType::f32, {8});
  const AttentionParams p = params_of(0.125f, MaskSpec{MaskKind::causal, 3, {1, 0}, {}});
  const QuantizedTensor qk = quantize(k, affine(4, 32));
  EXPECT_TRUE(bit_equal(ref::quantized_sdpa(q, qk, quantize(v_affine, affine(3, 32)), p, nullptr, &sinks),
                        ref::sdpa(q, k, v_affine, p, nullptr, &sinks)));
  EXPECT_TRUE(bit_equal(ref::quantized_sdpa(q, qk, quantize(v_fp8, QuantSpec::make(QuantMode::mxfp8)), p),
                        ref::sdpa(q, k, v_fp8, p)));
}

TEST(QuantizedSdpa, GqaMasksSinksSoftcapAndDvNotDk) {
  KVLAB_SEEDED_RNG(rng, 47);
  const std::int64_t batch = 2, hq = 8, lq = 3, lk = 10;  // R = 4, Dk 64, Dv 96
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor q = random_normal(rng, t, {batch, hq, lq, 64});
    // K and V with their own specs (and, for half q, scales/biases in q's dtype).
    const QuantizedTensor qk = quantize(random_normal(rng, t, {batch, 2, lk, 64}), affine(4, 64));
    const QuantizedTensor qv = quantize(random_normal(rng, t, {batch, 2, lk, 96}), affine(8, 32), Rounding::mlx_gpu);
    const Tensor sinks = random_normal(rng, t, {hq});
    Tensor per_head(DType::u8, {batch, hq, lq, lk}), additive(DType::f32, {1, 1, lq, lk});
    for (std::int64_t e = 0; e < per_head.numel(); ++e) per_head.view().store_int(e, rng.integer(0, 3) != 0);
    for (std::int64_t e = 0; e < additive.numel(); ++e) {
      additive.view().store(e, e % 4 == 1 ? -INFINITY : static_cast<float>(rng.uniform(-1, 0.5)));
    }
    EXPECT_TRUE(equals_sdpa_over_dequantized(q, qk, qv, params_of(0.125f)));
    EXPECT_TRUE(equals_sdpa_over_dequantized(q, qk, qv, params_of(0.125f, {MaskKind::causal, 4, {0, 3}, {2, 0}}, 5.0f),
                                             nullptr, &sinks));
    EXPECT_TRUE(equals_sdpa_over_dequantized(q, qk, qv, params_of(0.125f, {MaskKind::boolean, 0, {}, {}}), &per_head,
                                             &sinks));
    EXPECT_TRUE(equals_sdpa_over_dequantized(q, qk, qv, params_of(0.125f, {MaskKind::additive, 0, {}, {}}), &additive));
    const Tensor out = ref::quantized_sdpa(q, qk, qv, params_of(0.125f));
    EXPECT_EQ(out.shape(), (Shape{batch, hq, lq, 96}));
    EXPECT_EQ(out.dtype(), t);
  }
}

TEST(QuantizedSdpa, FpModesEqualSdpaOverDequantized) {
  KVLAB_SEEDED_RNG(rng, 53);
  const Tensor q = random_normal(rng, DType::bf16, {1, 4, 2, 64});
  const Tensor k = random_normal(rng, DType::bf16, {1, 1, 6, 64}), v = random_normal(rng, DType::bf16, {1, 1, 6, 32});
  const QuantSpec mxfp8 = QuantSpec::make(QuantMode::mxfp8), mxfp4 = QuantSpec::make(QuantMode::mxfp4);
  const QuantSpec nvfp4 = QuantSpec::make(QuantMode::nvfp4);
  const AttentionParams p = params_of(0.125f, MaskSpec{MaskKind::causal, 0, {}, {}});
  EXPECT_TRUE(equals_sdpa_over_dequantized(q, quantize(k, mxfp8), quantize(v, mxfp8), p));
  EXPECT_TRUE(equals_sdpa_over_dequantized(q, quantize(k, mxfp4, Rounding::mlx_gpu), quantize(v, nvfp4), p));
  EXPECT_TRUE(equals_sdpa_over_dequantized(q, quantize(k, nvfp4), quantize(v, affine(5, 32)), p));
  EXPECT_TRUE(equals_sdpa_over_dequantized(cast(q, DType::f32), quantize(k, affine(6, 64)), quantize(v, mxfp8), p));
  // dequantize_to_f32 is the fp dequantizer with an f32 output (no global scale).
  const QuantizedTensor qk = quantize(k, mxfp4);
  EXPECT_TRUE(bit_equal(ref::dequantize_to_f32(view_of(qk)), ref::fp_dequantize(qk, std::nullopt, DType::f32)));
}

TEST(QuantizedSdpa, ViewOverloadAndDequantizeShapes) {
  KVLAB_SEEDED_RNG(rng, 59);
  const Tensor q = random_normal(rng, DType::f16, {1, 2, 2, 32});
  const QuantizedTensor qk = quantize(random_normal(rng, DType::f16, {1, 1, 5, 32}), affine(3, 32));
  const QuantizedTensor qv = quantize(random_normal(rng, DType::f16, {1, 1, 5, 64}), affine(2, 64));
  Tensor out(DType::f16, {1, 2, 2, 64});
  ref::quantized_sdpa(q.view(), view_of(qk), view_of(qv), params_of(0.2f), nullptr, nullptr, out.view());
  EXPECT_TRUE(bit_equal(out, ref::quantized_sdpa(q, qk, qv, params_of(0.2f))));
  // Any rank >= 1: D comes from the code width (3 words of 3-bit codes hold 32).
  const QuantizedTensor flat = quantize(random_normal(rng, DType::f32, {3, 32}), affine(3, 32));
  EXPECT_EQ(ref::dequantize_to_f32(view_of(flat)).shape(), (Shape{3, 32}));
  EXPECT_EQ(ref::dequantize_to_f32(view_of(flat)).dtype(), DType::f32);
}

// ---------------------------------------------------------------------------------------
// Invalid input. The problems are zero-filled with valid shapes, so only the checks run
// before any dequantization; each case breaks one thing.

struct Packed {
  Tensor wq, scales, biases;  // biases rank 0 = absent
  QuantSpec spec;
  // Codes, scales and biases of (B, Hkv, Lk, D) under spec, zero-filled.
  static Packed of(QuantSpec spec, Shape shape) {
    const std::int64_t d = shape.back();
    Shape w = shape, g = shape;
    w.back() = d * spec.bits / 32;
    g.back() = d / spec.group_size;
    const DType sd = spec.has_biases() ? DType::f32 : DType::u8;
    return {Tensor(DType::u32, w), Tensor(sd, g), spec.has_biases() ? Tensor(DType::f32, g) : Tensor(), spec};
  }
  QuantizedTensor tensor() const { return {wq, scales, biases, spec}; }
};

struct Problem {  // valid as constructed: B 2, Hq 4, Hkv 2, Lq 3, Lk 5, Dk 64, Dv 64
  Tensor q{DType::f32, {2, 4, 3, 64}}, out{DType::f32, {2, 4, 3, 64}};
  Packed k = Packed::of(QuantSpec::make(QuantMode::affine, 4, 64), {2, 2, 5, 64});
  Packed v = Packed::of(QuantSpec::make(QuantMode::affine, 8, 32), {2, 2, 5, 64});
  AttentionParams params;
  std::optional<Tensor> sinks;
  void run_views() const {
    ConstTensorView s;
    if (sinks) s = sinks->view();
    Tensor o = out;
    ref::quantized_sdpa(q.view(), view_of(k.tensor()), view_of(v.tensor()), params, nullptr, sinks ? &s : nullptr,
                        o.view());
  }
  void run_tensors() const {
    ref::quantized_sdpa(q, k.tensor(), v.tensor(), params, nullptr, sinks ? &*sinks : nullptr);
  }
};

struct BadCase {
  const char* what;
  std::function<void(Problem&)> edit;
  std::vector<std::string> words;              // each must appear in the message
  std::vector<std::string> tensor_words = {};  // for the Tensor overload, when they differ
};

using P = Problem;
Tensor u32(Shape s) { return Tensor(DType::u32, std::move(s)); }
Tensor f32(Shape s) { return Tensor(DType::f32, std::move(s)); }
QuantSpec raw(QuantMode mode, int bits, int group) { return QuantSpec{mode, bits, group}; }  // unvalidated

const std::vector<BadCase> kBadCases = {
    {"K words", [](P& p) { p.k.wq = u32({2, 2, 5, 7}); }, {"K codes have 7 words", "= 8"}},
    // The Tensor overload takes Dv from V's codes (8 words: 32), so the scales disagree.
    {"V words use V's spec", [](P& p) { p.v.wq = u32({2, 2, 5, 8}); }, {"V codes have 8 words", "64·8/32 = 16"},
     {"V scales", "(2, 2, 5, 2)", "(2, 2, 5, 1)"}},
    {"K scales width", [](P& p) { p.k.scales = f32({2, 2, 5, 2}); }, {"K scales", "(2, 2, 5, 2)", "(2, 2, 5, 1)"}},
    {"V scales Hkv", [](P& p) { p.v.scales = f32({2, 1, 5, 2}); }, {"V scales", "(2, 1, 5, 2)", "(2, 2, 5, 2)"}},
    {"K biases Lk", [](P& p) { p.k.biases = f32({2, 2, 4, 1}); }, {"K biases", "(2, 2, 4, 1)"}},
    {"K biases missing", [](P& p) { p.k.biases = Tensor(); }, {"K biases are missing", "affine"}},
    {"V biases dtype", [](P& p) { p.v.biases = Tensor(DType::bf16, {2, 2, 5, 2}); }, {"V biases", "bf16", "f32"}},
    {"K scales u8", [](P& p) { p.k.scales = Tensor(DType::u8, {2, 2, 5, 1}); }, {"K scales", "u8"}},
    {"K codes i32", [](P& p) { p.k.wq = Tensor(DType::i32, {2, 2, 5, 8}); }, {"K codes", "i32"}},
    {"K codes rank 3", [](P& p) { p.k.wq = u32({2, 5, 8}); }, {"K codes", "rank 3"}},
    {"K bits 7", [](P& p) { p.k.spec = raw(QuantMode::affine, 7, 64); }, {"K spec", "bits 7"}},
    {"V group 48", [](P& p) { p.v.spec = raw(QuantMode::affine, 8, 48); }, {"V spec", "group_size 48"}},
    {"Dk vs K group", [](P& p) { p.k = Packed::of(raw(QuantMode::affine, 4, 128), {2, 2, 5, 128}); },
     {"K head dim D = 64", "group_size 128"}},
    {"fp V with biases", [](P& p) { p.v = Packed::of(QuantSpec::make(QuantMode::mxfp8), {2, 2, 5, 64});
                                    p.v.biases = f32({2, 2, 5, 2}); }, {"V biases", "mxfp8"}},
    {"fp V scales f32", [](P& p) { p.v = Packed::of(QuantSpec::make(QuantMode::mxfp8), {2, 2, 5, 64});
                                   p.v.scales = f32({2, 2, 5, 2}); }, {"V scales", "f32", "u8"}},
    {"K/V Lk", [](P& p) { p.v = Packed::of(p.v.spec, {2, 2, 6, 64}); }, {"Lk = 5", "Lk = 6"}},
    {"K/V Hkv", [](P& p) { p.v = Packed::of(p.v.spec, {2, 1, 5, 64}); }, {"Hkv = 2", "Hkv = 1"}},
    {"batch", [](P& p) { p.k = Packed::of(p.k.spec, {3, 2, 5, 64}); }, {"B = 2", "B = 3"}},
    {"Hq % Hkv", [](P& p) { p.q = f32({2, 3, 3, 64}); p.out = f32({2, 3, 3, 64}); }, {"Hq = 3", "Hkv = 2"}},
    {"q rank 3", [](P& p) { p.q = f32({4, 3, 64}); }, {"q", "rank 3"}},
    {"q u32", [](P& p) { p.q = u32({2, 4, 3, 64}); }, {"q", "u32"}},
    {"mask without array", [](P& p) { p.params.mask.kind = MaskKind::boolean; }, {"boolean", "none was given"}},
    {"sinks length", [](P& p) { p.sinks = f32({3}); }, {"sinks", "(3,)", "(4,)"}},
    {"softcap", [](P& p) { p.params.softcap = -2.0f; }, {"softcap = -2"}},
};

void expect_rejected(const BadCase& c, const std::vector<std::string>& words,
                     const std::function<void(const Problem&)>& run) {
  SCOPED_TRACE(c.what);
  Problem p;
  c.edit(p);
  try {
    run(p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(QuantizedSdpaInvalid, EveryBadInputIsNamed) {
  Problem ok;
  EXPECT_NO_THROW(ok.run_views());
  EXPECT_NO_THROW(ok.run_tensors());
  for (const BadCase& c : kBadCases) {
    expect_rejected(c, c.words, [](const Problem& p) { p.run_views(); });
    expect_rejected(c, c.tensor_words.empty() ? c.words : c.tensor_words, [](const Problem& p) { p.run_tensors(); });
  }
}

TEST(QuantizedSdpaInvalid, OutputMustMatchQAndV) {
  // out is the authority on Dv, so a narrower out is a V code-width mismatch.
  for (const auto& [out, word] : {std::pair{Tensor(DType::f16, {2, 4, 3, 64}), "f16"},
                                  std::pair{f32({2, 4, 3, 32}), "V codes have 16 words"},
                                  std::pair{f32({4, 3, 64}), "rank 3"}}) {
    Problem p;
    p.out = out;
    try {
      p.run_views();
      ADD_FAILURE() << "no error for " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}

TEST(QuantizedSdpaInvalid, DequantizeChecksTheCodeWidth) {
  // 4 words of 3-bit codes are 42.67 elements: no D fits.
  const Packed bad{u32({2, 4}), f32({2, 1}), f32({2, 1}), QuantSpec::make(QuantMode::affine, 3, 32)};
  EXPECT_THROW(
      {
        try {
          ref::dequantize_to_f32(view_of(bad.tensor()));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("4 words per row"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  const Packed fine = Packed::of(QuantSpec::make(QuantMode::affine, 3, 32), {2, 32});
  EXPECT_EQ(ref::dequantize_to_f32(view_of(fine.tensor())).shape(), (Shape{2, 32}));
}

}  // namespace
}  // namespace test_quantized_sdpa
}  // namespace kvlab
