// TurboQuantKVCache (docs/semantics.md §TurboQuant cache; docs/turboquant.md §A6): dequantized
// reads equal the reference codec, one basis per cache (vlm#973), the two meanings of fractional
// bits, the exact bits accounting, growth/trim/poison, state round trips, misuse errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "cache/turboquant_kv_cache.h"
#include "reference/bitpack.h"
#include "reference/reference_backend.h"
#include "reference/turboquant.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_turboquant_kv_cache {
namespace {

using testing::bit_equal;
using testing::expect_error;
using testing::SeededRng;

Tensor gaussian(SeededRng& rng, Shape shape, DType dtype = DType::f32) {
  return testing::random_normal(rng, dtype, std::move(shape));
}

// Reference dequantization of x (B, H, S, D) through a side's codecs, with host tensors
// and the ref:: kernels only (no cache, no backend).
Tensor ref_roundtrip(const Tensor& x, const TurboQuantSide& side, DType out_dtype) {
  Tensor out(out_dtype, x.shape());
  for (const TurboQuantPart& p : side.parts) {
    Shape lead(x.shape().begin(), x.shape().end() - 1);
    Tensor norms(DType::f16, lead);
    lead.push_back(ref::packed_word_count(p.codec.dim, p.codec.bits));
    Tensor idx(DType::u32, lead);
    ref::turboquant_encode(x.view(), p.codec, norms.view(), idx.view());
    ref::turboquant_decode(norms.view(), idx.view(), p.codec, out.view());
  }
  return out;
}

double relative_mse(const Tensor& x, const Tensor& y) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double a = x.view().load(i), e = a - y.view().load(i);
    num += e * e;
    den += a * a;
  }
  return num / den;
}

TEST(TurboQuantKVCache, FetchedKVEqualsReferenceCodecWithDocumentedSeeds) {
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 1001);
  for (double bits : {3.0, 3.5}) {
    TurboQuantKVCache cache(be, bits, 5);
    const Tensor k = gaussian(rng, {2, 2, 7, 128}), v = gaussian(rng, {2, 2, 7, 96});
    const FetchedKV got = cache.update(be.upload(k), be.upload(v));
    EXPECT_TRUE(bit_equal(be.download(got.keys), ref_roundtrip(k, cache.key_side(), DType::f32))) << bits;
    EXPECT_TRUE(bit_equal(be.download(got.values), ref_roundtrip(v, cache.value_side(), DType::f32))) << bits;
    // Seeds: keys seed, values seed + 1; split: low codec side seed, high codec + 97.
    const auto& ks = cache.key_side().parts;
    if (bits == 3.0) {
      ASSERT_EQ(ks.size(), 1u);
      EXPECT_EQ(ks[0].codec.signs, ref::make_turboquant_codec(128, 3, 5).signs);
      EXPECT_EQ(cache.value_side().parts[0].codec.rotation, ref::make_turboquant_codec(96, 3, 6).rotation);
    } else {
      ASSERT_EQ(ks.size(), 2u);
      EXPECT_EQ(ks[0].codec.bits, 3);
      EXPECT_EQ(ks[1].codec.bits, 4);
      EXPECT_EQ(ks[0].codec.signs, ref::make_turboquant_codec(64, 3, 5).signs);
      EXPECT_EQ(ks[1].codec.signs, ref::make_turboquant_codec(64, 4, 5 + 97).signs);
      EXPECT_EQ(cache.value_side().parts[1].codec.rotation, ref::make_turboquant_codec(48, 4, 6 + 97).rotation);
    }
  }
}

TEST(TurboQuantKVCache, F16InputsAreReturnedAsF16) {
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 1002);
  TurboQuantKVCache cache(be, 4);
  const Tensor k = gaussian(rng, {1, 2, 5, 64}, DType::f16), v = gaussian(rng, {1, 2, 5, 64}, DType::f16);
  const FetchedKV got = cache.update(be.upload(k), be.upload(v));
  EXPECT_EQ(got.keys.dtype, DType::f16);
  EXPECT_TRUE(bit_equal(be.download(got.keys), ref_roundtrip(k, cache.key_side(), DType::f16)));
}

TEST(TurboQuantKVCache, ChunkingDoesNotChangeBitsOneBasisPerCache) {
  // vlm#973: prefill 17 must equal prefill 16 + decode 1 bit for bit.
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 973);
  const Tensor k = gaussian(rng, {1, 2, 18, 128}), v = gaussian(rng, {1, 2, 18, 80});
  const auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t b) { return be.upload(t.slice(2, a, b)); };
  for (double bits : {2.0, 4.0}) {
    TurboQuantKVCache whole(be, bits), split(be, bits);
    const FetchedKV a = whole.update(rows(k, 0, 17), rows(v, 0, 17));
    split.update(rows(k, 0, 16), rows(v, 0, 16));
    const FetchedKV b = split.update(rows(k, 16, 17), rows(v, 16, 17));
    EXPECT_TRUE(bit_equal(be.download(a.keys), be.download(b.keys))) << bits;
    EXPECT_TRUE(bit_equal(be.download(a.values), be.download(b.values))) << bits;
  }
  // Split codecs pick their outlier channels from the first tensor (as mlx-vlm), so the
  // invariance holds once that first chunk is fixed: 16 + 2 == 16 + 1 + 1.
  TurboQuantKVCache two(be, 3.5), ones(be, 3.5);
  two.update(rows(k, 0, 16), rows(v, 0, 16));
  ones.update(rows(k, 0, 16), rows(v, 0, 16));
  const FetchedKV a = two.update(rows(k, 16, 18), rows(v, 16, 18));
  ones.update(rows(k, 16, 17), rows(v, 16, 17));
  const FetchedKV b = ones.update(rows(k, 17, 18), rows(v, 17, 18));
  EXPECT_TRUE(bit_equal(be.download(a.keys), be.download(b.keys)));
  EXPECT_TRUE(bit_equal(be.download(a.values), be.download(b.values)));
}

TEST(TurboQuantKVCache, FractionalBitsAccuracyAndExactAccounting) {
  // docs/turboquant.md §A6 on isotropic N(0,1) data, D = 128, split_channels.
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 2525);
  const Tensor k = gaussian(rng, {1, 4, 256, 128}), v = gaussian(rng, {1, 4, 256, 128});
  for (const auto& [bits, bound, code_bits] :
       {std::tuple{2.5, 9.5e-2, 2.5}, std::tuple{3.5, 2.75e-2, 3.5}, std::tuple{3.0, 1.0, 3.0}}) {
    TurboQuantKVCache cache(be, bits, 0);
    const FetchedKV got = cache.update(be.upload(k), be.upload(v));
    const double rk = relative_mse(k, be.download(got.keys)), rv = relative_mse(v, be.download(got.values));
    const auto& parts = cache.key_side().parts;
    std::printf("[ split    ] bits %.1f: %s\n", bits, cache.describe().c_str());
    std::printf("[ split    ]   rel MSE K %.4f V %.4f (bound %.4g)  code bits/elt %.4f  storage bits/elt %.4f"
                " (norms %zu x 16/D)\n",
                rk, rv, bound, cache.code_bits_per_element(), cache.bits_per_element(), parts.size());
    if (bound < 1.0) {
      EXPECT_LE(rk, bound) << bits;
      EXPECT_LE(rv, bound) << bits;
      ASSERT_EQ(parts.size(), 2u);
      EXPECT_EQ(parts[0].codec.dim, 64);  // round(0.5·128) = 64 outlier channels, 64 others
      EXPECT_EQ(parts[1].codec.dim, 64);
    }
    // (64·⌈b⌉ + 64·⌊b⌋)/128 code bits, plus 16/D per stored norm (two for a split side).
    EXPECT_DOUBLE_EQ(cache.code_bits_per_element(), code_bits);
    EXPECT_DOUBLE_EQ(cache.bits_per_element(KVSide::keys), code_bits + 16.0 * static_cast<double>(parts.size()) / 128);
    // nbytes is exactly the storage: capacity 256 rows, B·H = 4, K and V.
    EXPECT_EQ(static_cast<double>(cache.nbytes()) * 8, cache.bits_per_element() * 4 * 256 * (128 + 128));
  }
}

TEST(TurboQuantKVCache, BothMeaningsOfThreePointFive) {
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 35);
  const Tensor k = gaussian(rng, {1, 1, 3, 128}), v = gaussian(rng, {1, 1, 3, 128});
  TurboQuantKVCache vlm(be, 3.5, 0, {}, {}, FractionalBits::k_floor_v_ceil);
  EXPECT_EQ(vlm.key_bits(), 3.0);
  EXPECT_EQ(vlm.value_bits(), 4.0);
  TurboQuantKVCache paper(be, 3.5);
  EXPECT_EQ(paper.key_bits(), 3.5);
  EXPECT_EQ(paper.value_bits(), 3.5);
  vlm.update(be.upload(k), be.upload(v));
  paper.update(be.upload(k), be.upload(v));
  std::printf("[ meaning  ] %s\n[ meaning  ] %s\n", vlm.describe().c_str(), paper.describe().c_str());
  EXPECT_NE(vlm.describe().find("k_floor_v_ceil"), std::string::npos);
  EXPECT_NE(paper.describe().find("split_channels"), std::string::npos);
  EXPECT_DOUBLE_EQ(vlm.bits_per_element(KVSide::keys), 3.125);   // 3 + 16/128
  EXPECT_DOUBLE_EQ(vlm.bits_per_element(KVSide::values), 4.125);  // 4 + 16/128
  EXPECT_DOUBLE_EQ(paper.code_bits_per_element(KVSide::keys), 3.5);
  EXPECT_DOUBLE_EQ(paper.bits_per_element(KVSide::keys), 3.75);  // two f16 norms
  // Overrides win under both meanings; a fractional override is split.
  TurboQuantKVCache over(be, 3.5, 0, 2.5, 8.0, FractionalBits::k_floor_v_ceil);
  EXPECT_EQ(over.key_bits(), 2.5);
  EXPECT_EQ(over.value_bits(), 8.0);
  TurboQuantKVCache whole(be, 3.0, 0, {}, {}, FractionalBits::k_floor_v_ceil);
  EXPECT_EQ(whole.key_bits(), 3.0);
  EXPECT_EQ(whole.value_bits(), 3.0);
}

TEST(TurboQuantKVCache, OutlierChannelsAreTheLargestMeanAbs) {
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 17);
  Tensor k = gaussian(rng, {1, 2, 8, 6});
  for (std::int64_t r = 0; r < 16; ++r) {
    k.view().store(r * 6 + 4, 50.0f);
    k.view().store(r * 6 + 1, -40.0f);
    k.view().store(r * 6 + 5, 30.0f);
  }
  TurboQuantKVCache cache(be, 2.5);
  cache.update(be.upload(k), be.upload(k));
  EXPECT_EQ(cache.key_side().parts[1].codec.channels, (std::vector<std::int32_t>{1, 4, 5}));  // round(0.5·6) = 3
  EXPECT_EQ(cache.key_side().parts[0].codec.channels, (std::vector<std::int32_t>{0, 2, 3}));
}

TEST(TurboQuantKVCache, GrowthTrimPoisonAndBookkeeping) {
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 256);
  TurboQuantKVCache cache(be, 3);
  EXPECT_TRUE(cache.empty());
  EXPECT_EQ(cache.nbytes(), 0u);
  const Tensor k = gaussian(rng, {2, 2, 300, 64}), v = gaussian(rng, {2, 2, 300, 64});
  const auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t b) { return be.upload(t.slice(2, a, b)); };
  cache.update(rows(k, 0, 10), rows(v, 0, 10));
  EXPECT_EQ(cache.capacity(), 256);
  cache.update(rows(k, 10, 300), rows(v, 10, 300));
  EXPECT_EQ(cache.capacity(), 10 + 512);  // cut to 10 off a step boundary, then ceil(290/256)·256
  EXPECT_EQ(cache.kv_length(), 300);
  EXPECT_EQ(cache.offsets(), (std::vector<std::int32_t>{300}));
  // 64 ch × 3 b = 6 words + one f16 norm per row per side.
  EXPECT_EQ(cache.nbytes(), std::size_t{2} * 2 * 2 * 522 * (6 * 4 + 2));
  EXPECT_EQ(cache.make_mask(1, 0).spec.kind, MaskKind::none);
  EXPECT_EQ(cache.make_mask(3, 0).spec.kind, MaskKind::causal);
  EXPECT_EQ(cache.make_mask(1, 8).spec.window, 8);
  EXPECT_EQ(cache.trim(5), 5);
  EXPECT_EQ(cache.offset(), 295);
  const Tensor norms = be.download(cache.key_side().parts[0].norms);
  const Tensor idx = be.download(cache.key_side().parts[0].indices);
  for (std::int64_t row : {294, 295, 299, 521}) {
    EXPECT_EQ(std::isnan(norms.view().load(row)), row >= 295) << row;  // (0, 0, row, 0)
    EXPECT_EQ(idx.view().load_int(row * 6) == 0xFFFFFFFF, row >= 295) << row;
  }
  const FetchedKV got = cache.fetch();
  EXPECT_EQ(got.length(), 295);
  EXPECT_TRUE(bit_equal(be.download(got.keys), ref_roundtrip(k.slice(2, 0, 295), cache.key_side(), DType::f32)));
  EXPECT_EQ(cache.trim(1000), 295);
  EXPECT_EQ(cache.fetch().length(), 0);
}

TEST(TurboQuantKVCache, StateRoundTripContinuesIdentically) {
  ReferenceBackend be;
  KVLAB_SEEDED_RNG(rng, 4);
  const Tensor k = gaussian(rng, {1, 2, 40, 128}), v = gaussian(rng, {1, 2, 40, 64});
  const auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t b) { return be.upload(t.slice(2, a, b)); };
  for (const auto& [bits, meaning] :
       {std::pair{3.5, FractionalBits::split_channels}, std::pair{3.5, FractionalBits::k_floor_v_ceil},
        std::pair{2.0, FractionalBits::split_channels}}) {
    TurboQuantKVCache a(be, bits, 11, {}, {}, meaning);
    a.update(rows(k, 0, 30), rows(v, 0, 30));
    a.trim(2);
    const CacheState st = a.state();
    auto b = TurboQuantKVCache::from_state(be, st);
    EXPECT_EQ(b->describe(), a.describe());
    EXPECT_EQ(b->offset(), 28);
    const FetchedKV fa = a.update(rows(k, 30, 40), rows(v, 30, 40));
    const FetchedKV fb = b->update(rows(k, 30, 40), rows(v, 30, 40));
    EXPECT_TRUE(bit_equal(be.download(fa.keys), be.download(fb.keys))) << a.describe();
    EXPECT_TRUE(bit_equal(be.download(fa.values), be.download(fb.values))) << a.describe();
    const CacheState sa = a.state(), sb = b->state();
    EXPECT_EQ(sa.meta, sb.meta);
    for (const auto& [name, t] : sa.tensors) EXPECT_TRUE(bit_equal(t, sb.tensors.at(name))) << name;
  }
  // A fresh cache and one trimmed to 0 round-trip too (the latter keeps its codecs).
  TurboQuantKVCache fresh(be, 2.5, 3);
  EXPECT_EQ(TurboQuantKVCache::from_state(be, fresh.state())->describe(), fresh.describe());
  fresh.update(rows(k, 0, 4), rows(v, 0, 4));
  fresh.trim(4);
  auto reloaded = TurboQuantKVCache::from_state(be, fresh.state());
  EXPECT_EQ(reloaded->key_side().parts[1].codec.channels, fresh.key_side().parts[1].codec.channels);
}

TEST(TurboQuantKVCache, MisuseAndCorruptStateErrorsNameTheValue) {
  ReferenceBackend be;
  expect_error([&] { TurboQuantKVCache(be, 3.25); }, ErrorKind::invalid_argument, {"3.25"});
  expect_error([&] { TurboQuantKVCache(be, 0.5); }, ErrorKind::invalid_argument, {"0.5"});
  expect_error([&] { TurboQuantKVCache(be, 9); }, ErrorKind::invalid_argument, {"bits = 9"});
  expect_error([&] { TurboQuantKVCache(be, 4, 0, 1.75); }, ErrorKind::invalid_argument, {"key_bits = 1.75"});
  expect_error([&] { TurboQuantKVCache(be, 4, 0, {}, NAN); }, ErrorKind::invalid_argument, {"value_bits"});
  TurboQuantKVCache cache(be, 3.5);
  expect_error([&] { (void)cache.bits_per_element(); }, ErrorKind::misuse, {"update() first"});
  const Tensor one(DType::f32, {1, 1, 2, 1}), k(DType::f32, {1, 2, 3, 64}), v(DType::f32, {1, 2, 3, 32});
  expect_error([&] { cache.update(be.upload(one), be.upload(one)); }, ErrorKind::invalid_argument,
               {"head dim 1", "3.5"});
  SeededRng rng(6);
  cache.update(be.upload(testing::random_normal(rng, DType::f32, {1, 2, 3, 64})),
               be.upload(testing::random_normal(rng, DType::f32, {1, 2, 3, 32})));
  const auto before = cache.state();
  expect_error(
      [&] {
        cache.update(be.upload(Tensor(DType::f16, {1, 2, 1, 64})), be.upload(Tensor(DType::f16, {1, 2, 1, 32})));
      },
      ErrorKind::dtype_mismatch, {"f16"});
  expect_error([&] { cache.update(be.upload(Tensor(DType::f32, {1, 2, 1, 128})), be.upload(v)); },
               ErrorKind::shape_mismatch, {"(1, 2, 1, 128)"});
  expect_error(
      [&] {
        cache.update(be.upload(Tensor(DType::f32, {3, 2, 1, 64})), be.upload(Tensor(DType::f32, {3, 2, 1, 32})));
      },
      ErrorKind::shape_mismatch, {"(3, 2, 1, 64)"});
  expect_error([&] { cache.update_quantized(be.upload(k), be.upload(v)); }, ErrorKind::misuse, {"update()"});
  expect_error([&] { cache.trim(-1); }, ErrorKind::invalid_argument, {"-1"});
  expect_error([&] { (void)cache.make_mask(0, 0); }, ErrorKind::invalid_argument, {"N = 0"});
  EXPECT_EQ(cache.state().meta, before.meta) << "a rejected update changes nothing";
  EXPECT_EQ(cache.offset(), 3);

  const auto corrupt = [&](auto edit, std::vector<std::string> needles) {
    CacheState st = before;
    edit(st);
    expect_error([&] { TurboQuantKVCache::from_state(be, st); }, ErrorKind::corrupt, needles);
  };
  corrupt([](CacheState& s) { s.meta.erase("seed"); }, {"'seed'"});
  corrupt([](CacheState& s) { s.meta["bits"] = "3.3"; }, {"'bits'", "3.3"});
  corrupt([](CacheState& s) { s.meta["meaning"] = "kv"; }, {"'meaning'", "kv"});
  corrupt([](CacheState& s) { s.meta["keys.high_channels"] = "1,2"; }, {"keys.high_channels", "32"});
  corrupt([](CacheState& s) { s.meta["values.high_channels"] = "40,1"; }, {"values.high_channels", "40"});
  corrupt([](CacheState& s) { s.meta["offset"] = "4"; }, {"offset"});
  corrupt([](CacheState& s) { s.tensors.erase("keys.low.norms"); }, {"keys.low.norms"});
  corrupt([](CacheState& s) { s.tensors["keys.low.indices"] = Tensor(DType::u32, {1, 2, 3, 5}); },
          {"keys.low.indices", "(1, 2, 3, 5)"});
  corrupt([](CacheState& s) { s.tensors["extra"] = Tensor(DType::f32, {1}); }, {"extra"});
  corrupt([](CacheState& s) { s.class_name = "KVCache"; }, {"KVCache"});
}

}  // namespace
}  // namespace test_turboquant_kv_cache
}  // namespace kvlab
