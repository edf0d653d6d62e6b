// QuantizedKVCache's adopting constructor: packed K/V + offset become a cache without a
// round trip through quantization or a state (what BatchQuantizedKVCache::extract hands
// over). Expected values come from hand-packed codes and the affine formula
// x = scale·q + bias (docs/quantization.md §Affine dequantization), or from a cache fed the same
// tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cache/batch_quantized_kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/seq_ops.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_quantized_adopt {
namespace {

using testing::expect_same_state;

using testing::bit_equal;
using testing::random_uniform;
constexpr Rounding kRound = Rounding::mlx_cpu;

// 4-bit codes of a (1, 1, rows, 32) block: element i of row r holds (i + r) % 16, packed
// little-endian, eight codes per u32 word (docs/quantization.md §Bit packing); scale 0.5, bias −1
// per group.
struct HandPacked {
  Tensor wq{DType::u32, {1, 1, 3, 4}}, scales{DType::f32, {1, 1, 3, 1}}, biases{DType::f32, {1, 1, 3, 1}};
  HandPacked() {
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t w = 0; w < 4; ++w) {
        std::uint32_t word = 0;
        for (std::uint32_t k = 0; k < 8; ++k)
          word |= static_cast<std::uint32_t>((8 * w + k + r) % 16) << (4 * k);
        wq.view().store_int(r * 4 + w, word);
      }
      scales.view().store(r, 0.5f);
      biases.view().store(r, -1.0f);
    }
  }
  // The decoded value of element i of row r.
  static float value(std::int64_t r, std::int64_t i) { return 0.5f * static_cast<float>((i + r) % 16) - 1.0f; }
};

QuantizedDTensor upload(Backend& be, const Tensor& wq, const Tensor& scales, const Tensor* biases,
                        const QuantSpec& spec) {
  QuantizedDTensor q;
  q.spec = spec;
  q.wq = be.upload(wq);
  q.scales = be.upload(scales);
  if (biases != nullptr) q.biases = be.upload(*biases);
  return q;
}

// A deep copy: the cache takes its arguments over, so each test keeps its own.
QuantizedDTensor copy(Backend& be, const QuantizedDTensor& q) {
  QuantizedDTensor out;
  out.spec = q.spec;
  out.wq = be.upload(be.download(q.wq));
  out.scales = be.upload(be.download(q.scales));
  if (q.biases) out.biases = be.upload(be.download(q.biases));
  return out;
}

TEST(QuantizedKVCacheAdopt, KeepsHandPackedBitsAndDecodesByTheFormula) {
  ReferenceBackend be;
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 4, 32);
  const HandPacked k;
  QuantizedDTensor keys = upload(be, k.wq, k.scales, &k.biases, spec);
  QuantizedDTensor values = copy(be, keys);
  const BufferPtr key_codes = keys.wq.buffer;
  QuantizedKVCache cache(be, spec, kRound, keys, values, 3);
  EXPECT_EQ(cache.offset(), 3);
  EXPECT_EQ(cache.capacity(), 3);
  EXPECT_EQ(cache.key_buffer().wq.buffer, key_codes) << "adopted, not copied";
  // Re-quantizing the decoded rows would not give scale 0.5 / bias −1 back (the affine
  // quantizer anchors the group on its extreme, docs/quantization.md §Affine parameters): the bits
  // must be the input's.
  const FetchedQuantizedKV f = cache.fetch();
  EXPECT_TRUE(bit_equal(be.download(f.keys.wq), k.wq));
  EXPECT_TRUE(bit_equal(be.download(f.keys.scales), k.scales));
  EXPECT_TRUE(bit_equal(be.download(f.keys.biases), k.biases));
  DTensor out = be.allocate(DType::f32, {1, 1, 3, 32});
  be.dequantize({{f.keys.wq, f.keys.scales, f.keys.biases, spec}, out});
  const Tensor x = be.download(out);
  for (std::int64_t r = 0; r < 3; ++r)
    for (std::int64_t i = 0; i < 32; ++i)
      ASSERT_EQ(x.view().load(r * 32 + i), HandPacked::value(r, i)) << "row " << r << " element " << i;
}

// For every mode and width: adopting what a cache fetched gives that cache back, and
// both continue identically (the adopted rounding and spec are used for new tokens).
TEST(QuantizedKVCacheAdopt, EqualsTheCacheItWasFetchedFromAndContinuesLikeIt) {
  KVLAB_SEEDED_RNG(rng, 0xAD0B7);
  ReferenceBackend be;
  const std::vector<QuantSpec> specs = {
      QuantSpec::make(QuantMode::affine, 3, 32), QuantSpec::make(QuantMode::affine, 5, 64),
      QuantSpec::make(QuantMode::affine, 6, 32), QuantSpec::make(QuantMode::affine, 8, 64),
      QuantSpec::make(QuantMode::mxfp4),         QuantSpec::make(QuantMode::nvfp4)};
  for (const QuantSpec& spec : specs) {
    SCOPED_TRACE(to_string(spec));
    const std::int64_t dk = 128, dv = 64, n = rng.integer(1, 9);
    QuantizedKVCache fed(be, spec, Rounding::mlx_gpu);
    fed.update_quantized(be.upload(random_uniform(rng, DType::f32, {2, 2, n, dk}, -2, 2)),
                         be.upload(random_uniform(rng, DType::f32, {2, 2, n, dv}, -2, 2)));
    const FetchedQuantizedKV live = fed.fetch();
    QuantizedKVCache adopted(be, spec, Rounding::mlx_gpu, live.keys, live.values, n);
    expect_same_state(adopted.state(), fed.state());
    const Tensor k = random_uniform(rng, DType::f32, {2, 2, 3, dk}, -2, 2);
    const Tensor v = random_uniform(rng, DType::f32, {2, 2, 3, dv}, -2, 2);
    fed.update_quantized(be.upload(k), be.upload(v));
    adopted.update_quantized(be.upload(k), be.upload(v));
    expect_same_state(adopted.state(), fed.state());
  }
}

TEST(QuantizedKVCacheAdopt, RowsPastTheOffsetAreCapacityAndPoison) {
  KVLAB_SEEDED_RNG(rng, 0xAD0B8);
  ReferenceBackend be;
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 4, 64);
  const Tensor k = random_uniform(rng, DType::f32, {1, 1, 5, 64}, -1, 1);
  QuantizedKVCache fed(be, spec, kRound);
  fed.update_quantized(be.upload(k), be.upload(k));
  const FetchedQuantizedKV five = fed.fetch();
  QuantizedKVCache adopted(be, spec, kRound, copy(be, five.keys), copy(be, five.values), 3);
  EXPECT_EQ(adopted.offset(), 3);
  EXPECT_EQ(adopted.capacity(), 5);
  const Tensor scales = be.download(adopted.key_buffer().scales);
  const Tensor codes = be.download(adopted.key_buffer().wq);
  for (std::int64_t r = 3; r < 5; ++r) {
    EXPECT_TRUE(std::isnan(scales.view().load(r))) << "row " << r;
    EXPECT_EQ(codes.view().load_int(r * spec.packed_words(64)), 0xFFFFFFFFll) << "row " << r;
  }
  // The two rows of capacity take the next two tokens without growing.
  adopted.update_quantized(be.upload(k.slice(2, 3, 5)), be.upload(k.slice(2, 3, 5)));
  EXPECT_EQ(adopted.capacity(), 5);
  expect_same_state(adopted.state(), fed.state());
}

TEST(QuantizedKVCacheAdopt, BatchExtractAdoptsTheRowsBits) {
  KVLAB_SEEDED_RNG(rng, 0xAD0B9);
  ReferenceBackend be;
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 5, 32);
  BatchQuantizedKVCache batch(be, {2, 0}, spec, kRound);
  const Tensor k = random_uniform(rng, DType::f32, {2, 1, 4, 64}, -1, 1);
  batch.update_quantized(be.upload(k), be.upload(k));
  const auto row = batch.extract(0);  // left padding 2: tokens 2, 3 of row 0
  QuantizedKVCache alone(be, spec, kRound);
  const Tensor mine = k.slice(0, 0, 1).slice(2, 2, 4);
  alone.update_quantized(be.upload(mine), be.upload(mine));
  EXPECT_EQ(row->capacity(), 2);
  expect_same_state(row->state(), alone.state());
}

TEST(QuantizedKVCacheAdopt, RejectsInconsistentPartsNamingThem) {
  ReferenceBackend be;
  const QuantSpec b4 = QuantSpec::make(QuantMode::affine, 4, 32);
  const HandPacked h;
  const auto good = [&] { return upload(be, h.wq, h.scales, &h.biases, b4); };
  const auto adopt = [&](QuantizedDTensor k, QuantizedDTensor v, std::int64_t offset, QuantSpec spec) {
    QuantizedKVCache c(be, spec, kRound, std::move(k), std::move(v), offset);
  };
  EXPECT_KVLAB_ERROR(adopt(good(), good(), 3, QuantSpec::make(QuantMode::affine, 8, 32)), invalid_argument,
                     "affine:b4:g32");
  EXPECT_KVLAB_ERROR(adopt(good(), good(), 0, b4), invalid_argument, "offset = 0");
  EXPECT_KVLAB_ERROR(adopt(good(), good(), 4, b4), invalid_argument, "offset = 4");
  QuantizedDTensor no_biases = good();
  no_biases.biases = {};
  EXPECT_KVLAB_ERROR(adopt(good(), no_biases, 3, b4), invalid_argument, "values without the biases");
  QuantizedDTensor float_codes = good();
  float_codes.wq = be.upload(Tensor(DType::f32, {1, 1, 3, 4}));
  EXPECT_KVLAB_ERROR(adopt(float_codes, good(), 3, b4), dtype_mismatch, "keys.wq of dtype f32");
  QuantizedDTensor wide = good();
  wide.wq = be.upload(Tensor(DType::u32, {1, 1, 3, 5}));
  EXPECT_KVLAB_ERROR(adopt(wide, good(), 3, b4), shape_mismatch, "5 words per row, but 1 groups of 32 (D = 32)");
  QuantizedDTensor short_scales = good();
  short_scales.scales = be.upload(Tensor(DType::f32, {1, 1, 2, 1}));
  EXPECT_KVLAB_ERROR(adopt(good(), short_scales, 3, b4), shape_mismatch, "values.scales (1, 1, 2, 1)");
  QuantizedDTensor f16_biases = good();
  f16_biases.biases = be.upload(Tensor(DType::f16, {1, 1, 3, 1}));
  EXPECT_KVLAB_ERROR(adopt(f16_biases, good(), 3, b4), shape_mismatch, "keys.biases f16");
  const Tensor wq2 = h.wq.slice(2, 0, 2), s2 = h.scales.slice(2, 0, 2), b2 = h.biases.slice(2, 0, 2);
  EXPECT_KVLAB_ERROR(adopt(good(), upload(be, wq2, s2, &b2, b4), 2, b4), shape_mismatch, "disagree on (B, H, L)");
  const QuantSpec fp = QuantSpec::make(QuantMode::mxfp4);
  const Tensor u8_scales(DType::u8, {1, 1, 3, 1});
  const Tensor fp_codes(DType::u32, {1, 1, 3, fp.packed_words(32)});
  EXPECT_KVLAB_ERROR(adopt(upload(be, fp_codes, u8_scales, &h.biases, fp), upload(be, fp_codes, u8_scales, nullptr, fp),
                           3, fp),
                     invalid_argument, "keys with biases");
  EXPECT_KVLAB_ERROR(adopt(upload(be, fp_codes, h.scales, nullptr, fp), upload(be, fp_codes, u8_scales, nullptr, fp), 3,
                           fp),
                     dtype_mismatch, "keys.scales of dtype f32");
}

}  // namespace
}  // namespace test_quantized_adopt
}  // namespace kvlab
