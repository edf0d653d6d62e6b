// The bad-input table: invalid calls through the Backend interface, each of which
// must raise kvlab::Error whose message names the offending value. Nothing may abort,
// crash or trip a sanitizer (this binary also runs under ASan+UBSan).
//
// The table is data so that every backend (SIMD, Vulkan) can be run against it later:
// a backend must reject exactly what the oracle rejects.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kvlab/backend.h"
#include "reference/mask.h"
#include "reference/reference_backend.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_bad_input {
namespace {

struct BadCall {
  std::string name;
  std::function<void(Backend&)> call;
  std::string needle;  // must appear in Error::what()
};

DTensor T(Backend& be, DType dt, Shape s) {
  DTensor t = be.allocate(dt, std::move(s));
  be.fill(t, 0);
  return t;
}

QuantSpec affine(int bits, int group) { return QuantSpec{QuantMode::affine, bits, group}; }

void quantize(Backend& be, const QuantSpec& spec, std::int64_t d, DType x_dtype = DType::f32) {
  // Output shapes are only plausible guesses here (the QuantSpec is invalid on purpose);
  // guard the arithmetic so the test itself cannot divide by zero.
  const std::int64_t words = std::max<std::int64_t>(1, d * spec.bits / 32);
  const std::int64_t groups = std::max<std::int64_t>(1, d / std::max(1, spec.group_size));
  be.quantize({T(be, x_dtype, {2, d}), Rounding::mlx_cpu, {T(be, DType::u32, {2, words}), T(be, x_dtype, {2, groups}), T(be, x_dtype, {2, groups}), spec}});
}

struct Attn {
  std::int64_t b = 1, hq = 4, hkv = 2, lq = 3, lk = 5, dk = 8, dv = 8;
  DType q_dtype = DType::f32, kv_dtype = DType::f32;
  AttentionParams params{};
};

void attend(Backend& be, const Attn& a, const DTensor* mask = nullptr, const DTensor* sinks = nullptr,
            std::int64_t k_batch = -1) {
  const std::int64_t kb = k_batch < 0 ? a.b : k_batch;
  be.sdpa({T(be, a.q_dtype, {a.b, a.hq, a.lq, a.dk}), T(be, a.kv_dtype, {kb, a.hkv, a.lk, a.dk}),
          T(be, a.kv_dtype, {kb, a.hkv, a.lk, a.dv}), a.params, mask, sinks, T(be, a.q_dtype, {a.b, a.hq, a.lq, a.dv})});
}

void rope(Backend& be, Shape shape, RopeParams p, std::optional<DTensor> per_row = {}, DType dt = DType::f32) {
  Offsets off;
  off.per_row = std::move(per_row);
  be.rope({T(be, dt, shape), p, off, T(be, dt, shape)});
}

RopeParams rope_dims(int dims) {
  RopeParams p;
  p.dims = dims;
  return p;
}

std::vector<BadCall> bad_calls() {
  std::vector<BadCall> t;
  // --- quantization parameters (docs/quantization.md §Format table; 1-bit affine is valid since
  // MLX 0.32.4) ---
  for (int bits : {0, 7, 9, 16}) {
    t.push_back({"affine_bits_" + std::to_string(bits), [bits](Backend& be) { quantize(be, affine(bits, 64), 128); },
                 "bits " + std::to_string(bits)});
  }
  t.push_back({"affine_group_48", [](Backend& be) { quantize(be, affine(4, 48), 96); }, "group_size 48"});
  t.push_back({"affine_group_0", [](Backend& be) { quantize(be, affine(4, 0), 128); }, "group_size 0"});
  t.push_back({"affine_d_not_multiple_of_group", [](Backend& be) { quantize(be, affine(4, 64), 96); }, "96"});
  t.push_back({"affine_integer_input", [](Backend& be) { quantize(be, affine(4, 64), 128, DType::i32); }, "i32"});
  t.push_back({"affine_scales_wrong_dtype", [](Backend& be) {
                 be.quantize({T(be, DType::f16, {2, 64}), Rounding::mlx_cpu, {T(be, DType::u32, {2, 8}), T(be, DType::f32, {2, 1}), T(be, DType::f16, {2, 1}), affine(4, 64)}});
               }, "f32"});
  t.push_back({"affine_wq_wrong_shape", [](Backend& be) {
                 be.quantize({T(be, DType::f32, {2, 64}), Rounding::mlx_cpu, {T(be, DType::u32, {2, 7}), T(be, DType::f32, {2, 1}), T(be, DType::f32, {2, 1}), affine(4, 64)}});
               }, "(2, 7)"});
  t.push_back({"affine_dequant_words_vs_groups", [](Backend& be) {
                 be.dequantize({{T(be, DType::u32, {2, 16}), T(be, DType::f32, {2, 1}), T(be, DType::f32, {2, 1}), affine(4, 64)}, T(be, DType::f32, {2, 128})});
               }, "16"});
  t.push_back({"mxfp4_group_64", [](Backend& be) {
                 be.quantize({T(be, DType::f32, {1, 64}), Rounding::mlx_gpu, {T(be, DType::u32, {1, 8}), T(be, DType::u8, {1, 1}), {}, QuantSpec{QuantMode::mxfp4, 4, 64}, {}}});
               }, "group_size 64"});
  t.push_back({"nvfp4_bits_8", [](Backend& be) {
                 be.quantize({T(be, DType::f32, {1, 32}), Rounding::mlx_gpu, {T(be, DType::u32, {1, 8}), T(be, DType::u8, {1, 2}), {}, QuantSpec{QuantMode::nvfp4, 8, 16}, {}}});
               }, "bits 8"});
  t.push_back({"global_scale_on_mxfp8", [](Backend& be) {
                 be.quantize({T(be, DType::f32, {1, 32}), Rounding::mlx_gpu, {T(be, DType::u32, {1, 8}), T(be, DType::u8, {1, 1}), {}, QuantSpec{QuantMode::mxfp8, 8, 32}, 2.0f}});
               }, "global_scale"});
  // --- attention (docs/kernels.md §Attention) ---
  t.push_back({"sdpa_hq_not_multiple_of_hkv", [](Backend& be) { Attn a; a.hq = 6; a.hkv = 4; attend(be, a); }, "6"});
  t.push_back({"sdpa_dk_mismatch", [](Backend& be) {
                 be.sdpa({T(be, DType::f32, {1, 2, 3, 64}), T(be, DType::f32, {1, 2, 5, 32}), T(be, DType::f32, {1, 2, 5, 32}),
                         AttentionParams{}, nullptr, nullptr, T(be, DType::f32, {1, 2, 3, 32})});
               }, "32"});
  t.push_back({"sdpa_dtype_mismatch", [](Backend& be) { Attn a; a.kv_dtype = DType::f16; attend(be, a); }, "f16"});
  t.push_back({"sdpa_batch_mismatch", [](Backend& be) { Attn a; a.b = 2; attend(be, a, nullptr, nullptr, 3); }, "3"});
  t.push_back({"sdpa_zero_keys", [](Backend& be) { Attn a; a.lk = 0; attend(be, a); }, "0"});
  t.push_back({"sdpa_rank_3_query", [](Backend& be) {
                 be.sdpa({T(be, DType::f32, {2, 3, 8}), T(be, DType::f32, {1, 2, 5, 8}), T(be, DType::f32, {1, 2, 5, 8}),
                         AttentionParams{}, nullptr, nullptr, T(be, DType::f32, {1, 2, 3, 8})});
               }, "rank 3"});
  t.push_back({"sdpa_boolean_mask_without_array", [](Backend& be) {
                 Attn a; a.params.mask.kind = MaskKind::boolean; attend(be, a);
               }, "mask"});
  t.push_back({"sdpa_mask_array_bad_shape", [](Backend& be) {
                 Attn a; a.params.mask.kind = MaskKind::boolean;
                 const DTensor m = T(be, DType::u8, {1, 1, 3, 4});
                 attend(be, a, &m);
               }, "(1, 1, 3, 4)"});
  t.push_back({"sdpa_sinks_wrong_length", [](Backend& be) {
                 Attn a; const DTensor s = T(be, DType::f32, {3}); attend(be, a, nullptr, &s);
               }, "(3,)"});
  t.push_back({"sdpa_left_padding_wrong_length", [](Backend& be) {
                 Attn a; a.b = 2; a.params.mask.kind = MaskKind::causal; a.params.mask.left_padding = {0, 1, 2};
                 attend(be, a);
               }, "3"});
  t.push_back({"sdpa_negative_softcap", [](Backend& be) { Attn a; a.params.softcap = -1.5f; attend(be, a); }, "-1.5"});
  t.push_back({"sdpa_negative_window", [](Backend& be) {
                 Attn a; a.params.mask.kind = MaskKind::causal; a.params.mask.window = -4; attend(be, a);
               }, "-4"});
  t.push_back({"quantized_sdpa_missing_biases", [](Backend& be) {
                 const QuantSpec s = affine(4, 32);
                 QuantizedDTensor k{T(be, DType::u32, {1, 2, 5, 4}), T(be, DType::f32, {1, 2, 5, 1}), DTensor{}, s};
                 be.quantized_sdpa({T(be, DType::f32, {1, 2, 3, 32}), k, k, AttentionParams{}, nullptr, nullptr,
                                   T(be, DType::f32, {1, 2, 3, 32})});
               }, "bias"});
  // --- RoPE (docs/kernels.md §RoPE) ---
  t.push_back({"rope_odd_dims", [](Backend& be) { rope(be, {1, 2, 3, 8}, rope_dims(5)); }, "5"});
  t.push_back({"rope_dims_above_d", [](Backend& be) { rope(be, {1, 2, 3, 8}, rope_dims(10)); }, "10"});
  t.push_back({"rope_zero_dims", [](Backend& be) { rope(be, {1, 2, 3, 8}, rope_dims(0)); }, "0"});
  t.push_back({"rope_rank_2", [](Backend& be) { rope(be, {3, 8}, rope_dims(8)); }, "rank 2"});
  t.push_back({"rope_offsets_wrong_length", [](Backend& be) {
                 rope(be, {2, 4, 3, 8}, rope_dims(8), T(be, DType::i32, {3}));
               }, "3"});
  t.push_back({"rope_offsets_float", [](Backend& be) {
                 rope(be, {2, 4, 3, 8}, rope_dims(8), T(be, DType::f32, {2}));
               }, "f32"});
  t.push_back({"rope_freqs_wrong_length", [](Backend& be) {
                 RopeParams p = rope_dims(8); p.freqs = {1.0f, 2.0f, 3.0f}; rope(be, {1, 1, 3, 8}, p);
               }, "3"});
  t.push_back({"rope_integer_input", [](Backend& be) { rope(be, {1, 1, 3, 8}, rope_dims(8), {}, DType::u32); }, "u32"});
  // --- cache data movement ---
  t.push_back({"kv_scatter_slot_out_of_range", [](Backend& be) {
                 const Tensor slots = Tensor::from_ints(DType::i32, {1, 2}, std::vector<std::int64_t>{3, 9});
                 be.kv_scatter({T(be, DType::f32, {1, 2, 2, 4}), slots.view(), T(be, DType::f32, {1, 2, 8, 4})});
               }, "9"});
  t.push_back({"kv_gather_index_out_of_range", [](Backend& be) {
                 const Tensor idx = Tensor::from_ints(DType::i32, {2}, std::vector<std::int64_t>{0, 5});
                 be.kv_gather({T(be, DType::f16, {3, 2, 4, 8}), idx.view(), T(be, DType::f16, {2, 2, 4, 8})});
               }, "5"});
  t.push_back({"kv_copy_negative_length", [](Backend& be) {
                 const SeqBlock blk{0, 0, 0, 0, -2};
                 be.kv_copy_blocks({T(be, DType::u32, {1, 2, 4, 8}), std::span(&blk, 1), T(be, DType::u32, {1, 2, 4, 8})});
               }, "-2"});
  t.push_back({"kv_roll_shifts_wrong_length", [](Backend& be) {
                 be.kv_roll({T(be, DType::f32, {2, 2, 4, 8}), Tensor(DType::i32, {3}).view(), T(be, DType::f32, {2, 2, 4, 8})});
               }, "3"});
  t.push_back({"kv_scatter_dtype_mismatch", [](Backend& be) {
                 be.kv_scatter({T(be, DType::f16, {1, 2, 1, 4}), Tensor(DType::i32, {1, 1}).view(), T(be, DType::f32, {1, 2, 8, 4})});
               }, "f16"});
  // --- core ---
  t.push_back({"tensor_negative_dimension", [](Backend& be) { (void)be.allocate(DType::f32, {2, -3}); }, "-3"});
  t.push_back({"tensor_overruns_buffer", [](Backend& be) {
                 DTensor d = T(be, DType::f32, {4});
                 d.shape = {8};
                 be.fill(d, 0);
               }, "16 bytes"});
  t.push_back({"causal_mask_zero_queries", [](Backend&) {
                 (void)ref::create_causal_mask(0, 4, 0, {}, {}, ref::MaskForm::boolean);
               }, "N = 0"});
  return t;
}

// gtest prints parameters into test names; print the case name, not raw bytes.
void PrintTo(const BadCall& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCall> {};

TEST_P(BadInput, RaisesErrorNamingTheValue) {
  ReferenceBackend be;
  const BadCall& c = GetParam();
  try {
    c.call(be);
    FAIL() << c.name << ": no kvlab::Error was raised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos)
        << c.name << ": message \"" << e.what() << "\" does not name \"" << c.needle << "\"";
  }
}

TEST(BadInputTable, HasAtLeast25Cases) { EXPECT_GE(bad_calls().size(), 25u); }

INSTANTIATE_TEST_SUITE_P(Reference, BadInput, ::testing::ValuesIn(bad_calls()),
                         [](const ::testing::TestParamInfo<BadCall>& case_info) { return case_info.param.name; });

}  // namespace
}  // namespace test_bad_input
}  // namespace kvlab
