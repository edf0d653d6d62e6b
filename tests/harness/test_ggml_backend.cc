// The ggml backend (kernels/ggml) through the harness: the arithmetic it declares per call
// (which the attention tolerance reads), bad input as kvlab::Error before ggml could assert
// (abort), what ggml cannot express as UNIMPLEMENTED, and the static_kv variant's kept
// block copies. Without the ggml engine (tools/ggml/engine.sh) every test is skipped with
// the reason.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/backends.h"
#include "harness/spine.h"
#include "kvlab/error.h"

namespace kvlab::harness {
namespace {

std::unique_ptr<Backend> ggml_or_skip_reason(const std::string& name, std::string& reason) {
  try {
    return make_backend(name);
  } catch (const Error& e) {
    reason = e.what();
    return nullptr;
  }
}

#define KVLAB_GGML_OR_SKIP(var, name)                          \
  std::string var##_reason;                                    \
  std::unique_ptr<Backend> var = ggml_or_skip_reason(name, var##_reason); \
  if (!var) GTEST_SKIP() << var##_reason

CaseResult run_ggml_line(Backend& b, const std::string& line) {
  std::unique_ptr<Backend> reference = make_backend("reference");
  return run_case(parse_problem(line), b, *reference, {});
}

constexpr const char* kQ8 =
    "quantized_sdpa B=1 Hq=4 Hkv=2 Lq=1 Lk=70 Dk=64 Dv=64 dtype=f16 kmode=q8_0 kbits=8 kgroup=32 vmode=q8_0 "
    "vbits=8 vgroup=32 mask=causal";

TEST(GgmlBackend, DeclaresTheArithmeticOfThePathItsLastAttentionTook) {
  KVLAB_GGML_OR_SKIP(b, "ggml");
  // f16 V, one query row: ggml's one-row kernel keeps P·V in an f16 vector.
  EXPECT_EQ(run_ggml_line(*b, "sdpa B=1 Hq=2 Hkv=1 Lq=1 Lk=600 Dk=64 Dv=64 dtype=f16 mask=none").status, Status::passed);
  EXPECT_EQ(b->accumulation(), DType::f16);
  EXPECT_FALSE(b->attention_rounding().scaled_q);
  // bf16 V: widened to f32 and accumulated in f32.
  EXPECT_EQ(run_ggml_line(*b, "sdpa B=1 Hq=2 Hkv=1 Lq=3 Lk=600 Dk=64 Dv=64 dtype=bf16 mask=causal").status, Status::passed);
  EXPECT_EQ(b->accumulation(), DType::f32);
  // f16 K = V with 64 query rows: the tiled kernel, f32 throughout.
  EXPECT_EQ(run_ggml_line(*b, "sdpa B=1 Hq=2 Hkv=1 Lq=64 Lk=70 Dk=64 Dv=64 dtype=f16 mask=causal").status, Status::passed);
  EXPECT_EQ(b->accumulation(), DType::f32);
  // A block K: q quantized to q8_0 for the dot (declared as scaled_q), V widened to f32.
  run_ggml_line(*b, kQ8);
  EXPECT_EQ(b->accumulation(), DType::f32);
  EXPECT_TRUE(b->attention_rounding().scaled_q);
}

TEST(GgmlBackend, WhatGgmlCannotExpressIsUnimplementedWithTheReason) {
  KVLAB_GGML_OR_SKIP(b, "ggml");
  const CaseResult f32_mask =
      run_ggml_line(*b, "sdpa B=1 Hq=2 Hkv=1 Lq=3 Lk=20 Dk=32 Dv=32 dtype=f32 mask=additive mask_dtype=f32");
  EXPECT_EQ(f32_mask.status, Status::unimplemented);
  EXPECT_NE(f32_mask.reason.find("not an f16 value"), std::string::npos) << f32_mask.reason;
  // ggml gives a fully masked row 0: the mean_of_values policy is not ggml's ...
  const CaseResult mean = run_ggml_line(*b, "sdpa B=1 Hq=2 Hkv=1 Lq=8 Lk=5 Dk=32 Dv=32 dtype=f32 mask=causal "
                                  "fully_masked=mean_of_values");
  EXPECT_EQ(mean.status, Status::unimplemented) << mean.reason;
  // ... but where no row is fully masked the policy does not matter.
  EXPECT_EQ(run_ggml_line(*b, "sdpa B=1 Hq=2 Hkv=1 Lq=3 Lk=5 Dk=32 Dv=32 dtype=f32 mask=causal fully_masked=mean_of_values")
                .status,
            Status::passed);
  EXPECT_EQ(run_ggml_line(*b, "quantized_sdpa B=1 Hq=2 Hkv=1 Lq=1 Lk=20 Dk=64 Dv=64 dtype=f16 kbits=4 vbits=4").status,
            Status::unimplemented);
  EXPECT_EQ(run_ggml_line(*b, "affine_quantize B=1 H=1 T=4 D=64 dtype=f16 bits=4").status, Status::unimplemented);
  // RoPE: ggml's CPU rope computes f32 and f16, with int32 positions.
  EXPECT_EQ(run_ggml_line(*b, "rope B=2 H=2 T=8 D=64 dims=64 dtype=f16 traditional=1 offset=7").status, Status::passed);
  EXPECT_EQ(run_ggml_line(*b, "rope B=2 H=2 T=8 D=64 dims=64 dtype=bf16").status, Status::unimplemented);
  EXPECT_EQ(run_ggml_line(*b, "rope B=1 H=1 T=3 D=8 dims=8 offset=2147483646").status,
            Status::unimplemented);
}

TEST(GgmlBackend, ShapesGgmlWouldAssertOnAreErrorsNotAborts) {
  KVLAB_GGML_OR_SKIP(b, "ggml");
  // ggml_flash_attn_ext asserts n_head % n_head_kv == 0 and equal head dims: kvlab's checks
  // run first and throw.
  const DTensor q = b->upload(Tensor(DType::f16, {1, 3, 1, 32})), k = b->upload(Tensor(DType::f16, {1, 2, 4, 32}));
  const DTensor v = b->upload(Tensor(DType::f16, {1, 2, 4, 32})), out = b->allocate(DType::f16, {1, 3, 1, 32});
  const DTensor k48 = b->upload(Tensor(DType::f16, {1, 3, 4, 48}));
  const AttentionParams params;
  EXPECT_THROW(b->sdpa({q, k, v, params, nullptr, nullptr, out}), Error);
  EXPECT_THROW(b->sdpa({q, k48, v, params, nullptr, nullptr, out}), Error);
}

// q8_0 K and V (1, 1, 8, 32) whose codes come from `salt`; f16 scales 2^-6.
Tensor q8_words(std::uint32_t salt) {
  std::vector<std::int64_t> words(8 * 8);
  std::uint32_t x = salt;
  for (std::int64_t& w : words) {
    x = x * 1664525u + 1013904223u;
    w = x;
  }
  return Tensor::from_ints(DType::u32, {1, 1, 8, 8}, words);
}

std::vector<std::byte> attend_q8(Backend& b, const DTensor& q, const QuantizedDTensor& kv, const DTensor& out) {
  const AttentionParams params;
  b.quantized_sdpa({q, kv, kv, params, nullptr, nullptr, out});
  std::vector<std::byte> bytes(out.nbytes());
  b.download(out, bytes.data());
  return bytes;
}

TEST(GgmlBackend, StaticKvKeepsBlockCopiesOnlyForTheSameBuffersAndBytes) {
  KVLAB_GGML_OR_SKIP(plain, "ggml");
  std::unique_ptr<Backend> kept = make_backend("ggml:static_kv");
  // The same buffers rewritten with other codes between two calls (as memory freed by one
  // case and reused by the next): the kept copy must not stand in for the new bytes.
  const QuantSpec spec = QuantSpec::make(QuantMode::q8_0);
  const std::vector<float> scale(8, 0x1p-6f);
  const Tensor scales = Tensor::from_values(DType::f16, {1, 1, 8, 1}, scale);
  const std::vector<float> qv(32, 0.5f);
  const Tensor q = Tensor::from_values(DType::f16, {1, 1, 1, 32}, qv);
  std::vector<std::byte> answers[2][2];
  int i = 0;
  for (Backend* b : {plain.get(), kept.get()}) {
    const DTensor dq = b->upload(q), out = b->allocate(DType::f16, {1, 1, 1, 32});
    const QuantizedDTensor kv{b->upload(q8_words(1)), b->upload(scales), {}, spec, {}};
    answers[i][0] = attend_q8(*b, dq, kv, out);
    const Tensor other = q8_words(2);
    b->upload(kv.wq, other.data());
    answers[i][1] = attend_q8(*b, dq, kv, out);
    ++i;
  }
  EXPECT_NE(answers[0][0], answers[0][1]);  // the codes matter
  EXPECT_EQ(answers[1][0], answers[0][0]);
  EXPECT_EQ(answers[1][1], answers[0][1]);
}

}  // namespace
}  // namespace kvlab::harness
