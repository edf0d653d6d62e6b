// QuantizedKVCache (docs/semantics.md §Quantized cache), KVCache → QuantizedKVCache (to_quantized)
// and the per-layer quantization policy (docs/lifecycle.md §Quantization policy,
// docs/upstream-bugs.md rows 8, 9, 34–36, 53, 54).
//
// Expectations come from the oracle applied to the whole token history in one call
// (quantization is per token row, so how the cache chunked it must not matter), from
// the worked examples of docs/quantization.md §Worked examples, and from hand arithmetic for shapes
// and bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/reference_backend.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_quantized_kv_cache {
namespace {

// (B, H, T, D) tokens, seeded per case: each token row has its own magnitude and sign
// skew so groups hit both anchors (min- and max-dominated,
// docs/quantization.md §Affine parameters).
Tensor random_tokens(DType dtype, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d,
                     std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor out(dtype, {b, h, t, d});
  const TensorView v = out.view();
  for (std::int64_t row = 0; row < b * h * t; ++row) {
    const float scale = std::exp(2.0f * uniform(rng)), shift = uniform(rng);
    for (std::int64_t i = 0; i < d; ++i) v.store(row * d + i, scale * (normal(rng) + shift));
  }
  return out;
}

// The token rows `rows` of x (B, H, T, D), in that order.
Tensor pick_rows(const Tensor& x, const std::vector<std::int64_t>& rows) {
  const std::int64_t bh = x.dim(0) * x.dim(1), t = x.dim(2), d = x.dim(3);
  const auto n = static_cast<std::int64_t>(rows.size());
  Tensor out(x.dtype(), {x.dim(0), x.dim(1), n, d});
  for (std::int64_t i = 0; i < bh; ++i)
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t e = 0; e < d; ++e)
        out.view().store((i * n + r) * d + e, x.view().load((i * t + rows[static_cast<std::size_t>(r)]) * d + e));
  return out;
}

std::vector<std::byte> bytes_of(const Tensor& t) { return {t.data(), t.data() + t.nbytes()}; }

ref::QuantizedTensor download(Backend& be, const QuantizedDTensor& q) {
  return {be.download(q.wq), be.download(q.scales), q.biases ? be.download(q.biases) : Tensor(), q.spec};
}

// Bit-exact comparison of every component, shapes and dtypes included.
void expect_same_packed(const ref::QuantizedTensor& got, const ref::QuantizedTensor& want, const std::string& what) {
  EXPECT_EQ(got.wq.shape(), want.wq.shape()) << what;
  EXPECT_EQ(got.scales.dtype(), want.scales.dtype()) << what;
  EXPECT_TRUE(bytes_of(got.wq) == bytes_of(want.wq)) << what << ": codes differ";
  EXPECT_TRUE(bytes_of(got.scales) == bytes_of(want.scales)) << what << ": scales differ";
  ASSERT_EQ(got.biases.rank(), want.biases.rank()) << what << ": biases present on one side only";
  if (want.biases.rank() > 0) {
    EXPECT_TRUE(bytes_of(got.biases) == bytes_of(want.biases)) << what << ": biases differ";
  }
}

ref::QuantizedTensor oracle(const Tensor& x, const QuantSpec& spec, Rounding r) {
  return spec.has_biases() ? ref::affine_quantize(x, spec, r) : ref::fp_quantize(x, spec, r);
}

// Feeds k/v to the cache in chunks of the given sizes; returns the last fetch.
FetchedQuantizedKV feed(Backend& be, QuantizedKVCache& cache, const Tensor& k, const Tensor& v,
                        const std::vector<std::int64_t>& splits, std::int64_t from = 0) {
  FetchedQuantizedKV last;
  for (const std::int64_t s : splits) {
    last = cache.update_quantized(be.upload(k.slice(2, from, from + s)), be.upload(v.slice(2, from, from + s)));
    from += s;
  }
  return last;
}

QuantSpec affine(int bits, int group) { return QuantSpec::make(QuantMode::affine, bits, group); }

struct ChunkCase {
  int bits, group;
  DType dtype;
  Rounding rounding;
  std::vector<std::int64_t> splits;
};

void check_chunking(const ChunkCase& c, std::int64_t dk, std::int64_t dv, QuantMode mode = QuantMode::affine) {
  ReferenceBackend be;
  const QuantSpec spec = QuantSpec::make(mode, c.bits, c.group);
  std::int64_t total = 0;
  for (const std::int64_t s : c.splits) total += s;
  const Tensor k = random_tokens(c.dtype, 2, 2, total, dk, 11u + static_cast<std::uint32_t>(c.bits));
  const Tensor v = random_tokens(c.dtype, 2, 2, total, dv, 97u + static_cast<std::uint32_t>(c.group));
  QuantizedKVCache cache(be, spec, c.rounding);
  const FetchedQuantizedKV kv = feed(be, cache, k, v, c.splits);
  const std::string what = to_string(spec) + " " + std::string(dtype_name(c.dtype)) + " " +
                           std::string(rounding_name(c.rounding)) + " T=" + std::to_string(total);
  EXPECT_EQ(kv.length(), total) << what;
  EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{static_cast<std::int32_t>(total)}) << what;
  expect_same_packed(download(be, kv.keys), oracle(k, spec, c.rounding), what + " keys");
  expect_same_packed(download(be, kv.values), oracle(v, spec, c.rounding), what + " values");
}

// Row-wise quantization is per token: any chunking of the history stores exactly the
// bits of one quantize call over all of it. Splits cross the 256-row growth both on
// and off a step boundary (cut-to-prev rule); B = 2, H = 2, Dk != Dv.
TEST(QuantizedKVCache, ChunkedUpdatesEqualOneShotQuantization) {
  const std::vector<ChunkCase> cases = {
      {2, 32, DType::f32, Rounding::mlx_cpu, {1, 1, 1}},   {3, 64, DType::f16, Rounding::mlx_gpu, {5, 300, 2}},
      {4, 64, DType::bf16, Rounding::mlx_cpu, {256, 1}},   {5, 128, DType::f32, Rounding::mlx_gpu, {3, 254, 1}},
      {6, 32, DType::f16, Rounding::mlx_cpu, {7, 9}},      {8, 128, DType::bf16, Rounding::mlx_gpu, {1, 300}},
  };
  for (const ChunkCase& c : cases) check_chunking(c, 256, 128);
}

TEST(QuantizedKVCache, EveryAffineBitWidthAndGroupSize) {
  for (const int bits : {2, 3, 4, 5, 6, 8})
    for (const int group : {32, 64, 128})
      check_chunking({bits, group, DType::f32, Rounding::mlx_cpu, {2, 3}}, 128, 256);
}

// fp modes are the optional extra: u8 scales, no biases.
TEST(QuantizedKVCache, FpModesStoreScalesOnly) {
  check_chunking({4, 32, DType::f32, Rounding::mlx_cpu, {2, 3}}, 64, 32, QuantMode::mxfp4);
  check_chunking({8, 32, DType::bf16, Rounding::mlx_gpu, {1, 4}}, 64, 64, QuantMode::mxfp8);
  ReferenceBackend be;
  QuantizedKVCache cache(be, QuantSpec::make(QuantMode::nvfp4), Rounding::mlx_cpu);
  const Tensor k = random_tokens(DType::f16, 1, 1, 2, 64, 5);
  const FetchedQuantizedKV kv = feed(be, cache, k, k, {2});
  EXPECT_FALSE(kv.keys.biases);
  EXPECT_EQ(kv.keys.scales.dtype, DType::u8);
  // 64 elements at 4 bits = 32 bytes of codes + 64/16 = 4 u8 scales, per row and side.
  EXPECT_EQ(cache.nbytes(), std::size_t{2 * 256 * (32 + 4)});
}

// docs/quantization.md §Worked examples: the worked examples, derived from the kernel formulas
// independently of the oracle. Every stored token carries the same row, so every row has these
// words.
TEST(QuantizedKVCache, MatchesTheWorkedExamplesOfTheSpec) {
  ReferenceBackend be;
  struct Example {
    int bits;
    DType dtype;
    float first, expected_scale, expected_bias;
    std::vector<std::uint32_t> words;
  };
  const std::vector<Example> examples = {
      {4, DType::f16, -8.0f, -2.091796875f, 23.0f, {0xbccddeefu, 0x8899aabbu, 0x44556677u, 0x00112233u}},
      {3, DType::f32, 0.0f, 31.0f / -7.0f, 31.0f, {0x6dbb6dffu, 0x26db924bu, 0x00124a49u}},
  };
  for (const Example& ex : examples) {
    Tensor x(ex.dtype, {1, 1, 3, 32});
    for (std::int64_t i = 0; i < 3 * 32; ++i) x.view().store(i, ex.first + static_cast<float>(i % 32));
    QuantizedKVCache cache(be, affine(ex.bits, 32), Rounding::mlx_cpu);
    const FetchedQuantizedKV kv = feed(be, cache, x, x, {2, 1});
    const ref::QuantizedTensor q = download(be, kv.keys);
    ASSERT_EQ(q.wq.shape(), (Shape{1, 1, 3, static_cast<std::int64_t>(ex.words.size())}));
    for (std::int64_t row = 0; row < 3; ++row) {
      for (std::size_t w = 0; w < ex.words.size(); ++w)
        EXPECT_EQ(q.wq.view().load_int(row * static_cast<std::int64_t>(ex.words.size()) + static_cast<std::int64_t>(w)),
                  ex.words[w])
            << ex.bits << "-bit row " << row << " word " << w;
      EXPECT_EQ(q.scales.view().load(row), ex.expected_scale);
      EXPECT_EQ(q.biases.view().load(row), ex.expected_bias);
    }
  }
}

// What attention reads: the backend's dequantization of the fetched K equals the
// oracle's dequantization of the oracle's quantization of the tokens, and stays within
// one step |scale| of the tokens (reference/affine_quantize.h error bound).
TEST(QuantizedKVCache, DequantizedFetchMatchesOracleAndTokens) {
  ReferenceBackend be;
  for (const int bits : {3, 4, 8}) {
    const QuantSpec spec = affine(bits, 64);
    const Tensor k = random_tokens(DType::f32, 2, 2, 9, 128, 31u + static_cast<std::uint32_t>(bits));
    QuantizedKVCache cache(be, spec, Rounding::mlx_cpu);
    const FetchedQuantizedKV kv = feed(be, cache, k, k, {4, 1, 4});
    const DTensor out = be.allocate(DType::f32, k.shape());
    be.dequantize({{kv.keys.wq, kv.keys.scales, kv.keys.biases, spec}, out});
    const Tensor got = be.download(out);
    const ref::QuantizedTensor want_q = ref::affine_quantize(k, spec, Rounding::mlx_cpu);
    EXPECT_TRUE(bytes_of(got) == bytes_of(ref::affine_dequantize(want_q))) << "bits " << bits;
    for (std::int64_t i = 0; i < k.numel(); ++i) {
      const float step = std::fabs(want_q.scales.view().load(i / 64));
      ASSERT_LE(std::fabs(got.view().load(i) - k.view().load(i)), step * 1.001f + 1e-6f)
          << "bits " << bits << " i " << i;
    }
  }
}

// docs/upstream-bugs.md §U1: mlx-lm allocates dim // (32 // bits) words (D 128: 21 at 5 bits, 25 at
// 6 bits; D 256: 25 at 3 bits) and its first update fails. The width is D·bits/32.
TEST(QuantizedKVCache, FirstAllocationUsesDTimesBitsOver32Words) {
  ReferenceBackend be;
  const struct { std::int64_t d; int bits; std::int64_t words; } cases[] = {{128, 5, 20}, {128, 6, 24}, {256, 3, 24}};
  for (const auto& c : cases) {
    QuantizedKVCache cache(be, affine(c.bits, 64), Rounding::mlx_cpu);
    const Tensor x = random_tokens(DType::f16, 1, 2, 1, c.d, 3);
    const FetchedQuantizedKV kv = feed(be, cache, x, x, {1});
    EXPECT_EQ(cache.key_buffer().wq.shape, (Shape{1, 2, 256, c.words})) << c.bits << " bits, D " << c.d;
    EXPECT_EQ(cache.value_buffer().scales.shape, (Shape{1, 2, 256, c.d / 64}));
    expect_same_packed(download(be, kv.keys), ref::affine_quantize(x, affine(c.bits, 64), Rounding::mlx_cpu),
                       std::to_string(c.bits) + " bits");
  }
}

TEST(QuantizedKVCache, GrowthFollowsKVCacheSteps) {
  ReferenceBackend be;
  QuantizedKVCache cache(be, affine(4, 64), Rounding::mlx_cpu);
  const Tensor x = random_tokens(DType::f32, 1, 1, 303, 64, 8);
  feed(be, cache, x, x, {3});
  EXPECT_EQ(cache.capacity(), 256);
  feed(be, cache, x, x, {300}, 3);
  EXPECT_EQ(cache.capacity(), 3 + 512);  // cut to prev (off a step boundary) + 2 steps
  EXPECT_EQ(cache.kv_length(), 303);
}

// 4-bit g64 over f16 is 4 + 2·16/64 = 4.5 bits per element of capacity
// (docs/semantics.md §Quantized cache; docs/quantization.md §P15: nothing else, in particular no
// float shadow copy).
TEST(QuantizedKVCache, NbytesIsExactPackedCapacity) {
  ReferenceBackend be;
  QuantizedKVCache cache(be, affine(4, 64), Rounding::mlx_cpu);
  EXPECT_EQ(cache.nbytes(), 0u);
  const Tensor x = random_tokens(DType::f16, 1, 1, 1, 128, 2);
  feed(be, cache, x, x, {1});
  // per side: codes 256·16 words·4 B = 16384, scales and biases 256·2 groups·2 B = 1024 each.
  EXPECT_EQ(cache.nbytes(), std::size_t{2 * (16384 + 1024 + 1024)});
  EXPECT_EQ(cache.nbytes(), std::size_t{2 * 256 * 128 * 9 / 16});  // 4.5 bits = 9/16 byte
  QuantizedKVCache three(be, affine(3, 32), Rounding::mlx_cpu);
  const Tensor y = random_tokens(DType::bf16, 2, 1, 1, 64, 2);
  feed(be, three, y, y, {1});
  // per row: 6 words (24 B) + 2 bf16 scales (4 B) + 2 biases (4 B) = 32 B = 64 elements · 4 bits.
  EXPECT_EQ(three.nbytes(), std::size_t{2 * 2 * 256 * 32});
}

TEST(QuantizedKVCache, TrimLowersOffsetPoisonsRowsAndContinues) {
  ReferenceBackend be;
  const QuantSpec spec = affine(4, 32);
  QuantizedKVCache cache(be, spec, Rounding::mlx_cpu);
  EXPECT_TRUE(cache.is_trimmable());
  const Tensor x = random_tokens(DType::f16, 1, 2, 7, 32, 4);
  const FetchedQuantizedKV before = feed(be, cache, x, x, {5});
  EXPECT_EQ(cache.trim(2), 2);
  EXPECT_EQ(before.length(), 5);  // fetched tensors are fresh copies, untouched by trim
  const Tensor scales = be.download(cache.key_buffer().scales), biases = be.download(cache.value_buffer().biases);
  const Tensor codes = be.download(cache.key_buffer().wq);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t row = 0; row < cache.capacity(); ++row) {
      const std::int64_t i = h * cache.capacity() + row;
      EXPECT_EQ(std::isnan(scales.view().load(i)), row >= 3) << "head " << h << " row " << row;
      EXPECT_EQ(std::isnan(biases.view().load(i)), row >= 3) << "head " << h << " row " << row;
      if (row >= 3) {
        EXPECT_EQ(codes.view().load_int(i * 4), 0xFFFFFFFF);
      }
    }
  // Continue with tokens 5, 6 after the kept 0..2: the cache holds tokens {0,1,2,5,6}.
  const FetchedQuantizedKV kv = feed(be, cache, x, x, {2}, 5);
  const Tensor kept_then_new = pick_rows(x, {0, 1, 2, 5, 6});
  expect_same_packed(download(be, kv.keys), ref::affine_quantize(kept_then_new, spec, Rounding::mlx_cpu), "after trim");
  EXPECT_EQ(cache.trim(100), 5);  // clamps to what is stored (docs/semantics.md §Common rules)
  EXPECT_EQ(cache.kv_length(), 0);
}

TEST(QuantizedKVCache, MaskAndOffsetsBehaveLikeKVCache) {
  ReferenceBackend be;
  QuantizedKVCache cache(be, affine(8, 64), Rounding::mlx_cpu);
  KVCache plain(be);
  for (const auto& [n, window] : {std::pair{1, 0}, std::pair{4, 0}, std::pair{1, 8}, std::pair{3, 2}}) {
    const CacheMask a = cache.make_mask(n, window), b = plain.make_mask(n, window);
    EXPECT_EQ(a.spec.kind, b.spec.kind) << n << "/" << window;
    EXPECT_EQ(a.spec.window, b.spec.window);
  }
  const Tensor x = random_tokens(DType::f32, 1, 1, 3, 64, 1);
  feed(be, cache, x, x, {2});
  const std::vector<std::int32_t> snapshot = cache.offsets();  // read before the update
  feed(be, cache, x, x, {1}, 2);
  EXPECT_EQ(snapshot, std::vector<std::int32_t>{2});  // a value, not an alias (mlx-lm#1097)
  EXPECT_EQ(cache.offsets(), std::vector<std::int32_t>{3});
}

// mlx-swift-lm#71 / SwiftLM#71: the plain path on a quantized cache was a fatalError.
TEST(QuantizedKVCache, WrongUpdatePathIsMisuseAndChangesNothing) {
  ReferenceBackend be;
  QuantizedKVCache cache(be, affine(4, 64), Rounding::mlx_cpu);
  const Tensor x = random_tokens(DType::f32, 1, 1, 3, 64, 6);
  feed(be, cache, x, x, {2});
  const CacheState before = cache.state();
  try {
    cache.update(be.upload(x.slice(2, 2, 3)), be.upload(x.slice(2, 2, 3)));
    FAIL() << "update() on a quantized cache must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::misuse);
    EXPECT_NE(std::string(e.what()).find("update_quantized"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.offset(), 2);
  EXPECT_TRUE(bytes_of(cache.state().tensors.at("keys.wq")) == bytes_of(before.tensors.at("keys.wq")));
  KVCache plain(be);
  try {
    plain.update_quantized(be.upload(x), be.upload(x));
    FAIL() << "update_quantized() on a KVCache must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::misuse);
  }
  EXPECT_TRUE(plain.empty());
}

void expect_error(const std::function<void()>& f, ErrorKind kind, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an Error naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(QuantizedKVCache, InvalidInputIsANamedErrorAndChangesNothing) {
  ReferenceBackend be;
  expect_error([&] { QuantizedKVCache c(be, QuantSpec{QuantMode::affine, 7, 64}, Rounding::mlx_cpu); },
               ErrorKind::invalid_argument, "7");
  expect_error([&] { QuantizedKVCache c(be, QuantSpec{QuantMode::affine, 4, 48}, Rounding::mlx_cpu); },
               ErrorKind::invalid_argument, "48");
  QuantizedKVCache cache(be, affine(4, 64), Rounding::mlx_cpu);
  const Tensor bad_d = random_tokens(DType::f32, 1, 1, 1, 96, 1);
  const Tensor ok = random_tokens(DType::f32, 1, 1, 1, 64, 1);
  expect_error([&] { cache.update_quantized(be.upload(bad_d), be.upload(ok)); }, ErrorKind::invalid_argument, "96");
  expect_error([&] { cache.update_quantized(be.upload(ok), be.upload(bad_d)); }, ErrorKind::invalid_argument, "96");
  EXPECT_TRUE(cache.empty());
  EXPECT_EQ(cache.nbytes(), 0u);
  feed(be, cache, ok, ok, {1});
  const CacheState before = cache.state();
  const Tensor f16 = random_tokens(DType::f16, 1, 1, 1, 64, 1);
  const Tensor heads = random_tokens(DType::f32, 1, 3, 1, 64, 1);
  const Tensor wide = random_tokens(DType::f32, 1, 1, 1, 128, 1);
  expect_error([&] { cache.update_quantized(be.upload(f16), be.upload(f16)); }, ErrorKind::dtype_mismatch, "f16");
  expect_error([&] { cache.update_quantized(be.upload(heads), be.upload(heads)); }, ErrorKind::shape_mismatch,
               "(1, 3, 1, 64)");
  expect_error([&] { cache.update_quantized(be.upload(ok), be.upload(wide)); }, ErrorKind::shape_mismatch,
               "(1, 1, 1, 128)");
  expect_error([&] { cache.trim(-1); }, ErrorKind::invalid_argument, "-1");
  const CacheState after = cache.state();
  EXPECT_EQ(after.meta, before.meta);
  for (const auto& [name, t] : before.tensors) EXPECT_TRUE(bytes_of(after.tensors.at(name)) == bytes_of(t)) << name;
}

TEST(QuantizedKVCache, StateRoundTripsAndContinuesBitExactly) {
  ReferenceBackend be;
  QuantizedKVCache cache(be, affine(6, 32), Rounding::mlx_gpu);
  const Tensor k = random_tokens(DType::bf16, 2, 2, 9, 64, 21), v = random_tokens(DType::bf16, 2, 2, 9, 32, 22);
  feed(be, cache, k, v, {4, 3});
  const CacheState s = cache.state();
  const std::map<std::string, std::string> meta = {
      {"offset", "7"}, {"bits", "6"}, {"group_size", "32"}, {"mode", "affine"}, {"rounding", "mlx_gpu"}};
  EXPECT_EQ(s.meta, meta);
  EXPECT_EQ(s.tensors.size(), 6u);
  EXPECT_EQ(s.tensors.at("values.wq").shape(), (Shape{2, 2, 7, 6}));  // sliced to [:offset]
  auto restored = QuantizedKVCache::from_state(be, s);
  EXPECT_EQ(restored->offsets(), cache.offsets());
  EXPECT_EQ(restored->spec(), cache.spec());
  EXPECT_EQ(restored->rounding(), Rounding::mlx_gpu);
  const FetchedQuantizedKV a = feed(be, cache, k, v, {2}, 7);
  const FetchedQuantizedKV b = feed(be, *restored, k, v, {2}, 7);
  expect_same_packed(download(be, b.keys), download(be, a.keys), "restored keys");
  expect_same_packed(download(be, b.values), download(be, a.values), "restored values");
  const CacheState empty_state = QuantizedKVCache(be, affine(4, 64), Rounding::mlx_cpu).state();
  EXPECT_TRUE(empty_state.tensors.empty());
  EXPECT_TRUE(QuantizedKVCache::from_state(be, empty_state)->empty());
}

// maclocal-api#46: the offset was inferred from (or lost with) the quantized tensors.
// Every inconsistency is `corrupt` and names the field.
TEST(QuantizedKVCache, CorruptStatesAreRejectedNamingTheField) {
  ReferenceBackend be;
  QuantizedKVCache cache(be, affine(5, 64), Rounding::mlx_cpu);
  const Tensor x = random_tokens(DType::f16, 1, 2, 3, 128, 9);
  feed(be, cache, x, x, {3});
  const CacheState good = cache.state();
  ASSERT_NO_THROW(QuantizedKVCache::from_state(be, good));
  const std::vector<std::pair<std::string, std::function<void(CacheState&)>>> mutations = {
      {"KVCache", [](CacheState& s) { s.class_name = "KVCache"; }},
      {"'offset'", [](CacheState& s) { s.meta.erase("offset"); }},
      {"'offset' is 7", [](CacheState& s) { s.meta["offset"] = "7"; }},
      {"'offset' = '3x'", [](CacheState& s) { s.meta["offset"] = "3x"; }},
      {"'offset' = '-3'", [](CacheState& s) { s.meta["offset"] = "-3"; }},
      {"'bits'", [](CacheState& s) { s.meta["bits"] = "7"; }},
      {"'keys.wq' has 20 words", [](CacheState& s) { s.meta["bits"] = "4"; }},  // 4 bits would need 16
      {"'group_size'", [](CacheState& s) { s.meta.erase("group_size"); }},
      {"'mode'", [](CacheState& s) { s.meta["mode"] = "int4"; }},
      {"'rounding'", [](CacheState& s) { s.meta["rounding"] = "metal"; }},
      {"'keys.biases'", [](CacheState& s) { s.tensors.erase("keys.biases"); }},
      {"'keys.wq' has 21 words",  // mlx-lm's dim // (32 // bits) width for D 128 at 5 bits
       [](CacheState& s) { s.tensors["keys.wq"] = Tensor(DType::u32, {1, 2, 3, 21}); }},
      {"'values.scales'",
       [](CacheState& s) { s.tensors["values.scales"] = s.tensors["values.scales"].slice(2, 0, 2); }},
      {"'values.biases'", [](CacheState& s) { s.tensors["values.biases"] = Tensor(DType::f32, {1, 2, 3, 2}); }},
      {"'keys.scales'", [](CacheState& s) { s.tensors["keys.scales"] = Tensor(DType::u32, {1, 2, 3, 2}); }},
      {"'keys.extra'", [](CacheState& s) { s.tensors["keys.extra"] = Tensor(DType::f16, {1}); }},
      {"'offset' is 3 but it stores no tensors", [](CacheState& s) { s.tensors.clear(); }},
  };
  for (const auto& [needle, mutate] : mutations) {
    CacheState s = good;
    mutate(s);
    expect_error([&] { QuantizedKVCache::from_state(be, s); }, ErrorKind::corrupt, needle);
  }
}

// to_quantized (docs/semantics.md §Quantized cache): same offset (and capacity, so nbytes is
// mlx-lm's); the live rows equal the oracle's quantization of the stored tokens.
TEST(ToQuantized, PreservesOffsetCapacityAndContent) {
  ReferenceBackend be;
  KVCache plain(be);
  const Tensor k = random_tokens(DType::f32, 1, 2, 310, 64, 41), v = random_tokens(DType::f32, 1, 2, 310, 128, 42);
  plain.update(be.upload(k.slice(2, 0, 3)), be.upload(v.slice(2, 0, 3)));
  plain.update(be.upload(k.slice(2, 3, 303)), be.upload(v.slice(2, 3, 303)));
  plain.trim(1);  // offset 302, capacity 515
  const QuantSpec spec = affine(4, 64);
  auto q = to_quantized(plain, spec, Rounding::mlx_cpu);
  EXPECT_EQ(q->offset(), 302);
  EXPECT_EQ(q->capacity(), 515);
  EXPECT_EQ(plain.offset(), 302);  // the source is left as it was
  // per row and head: keys 8 words + f32 scale + bias = 40 B, values 16 words + 2 + 2 = 80 B.
  EXPECT_EQ(q->nbytes(), std::size_t{515 * 2 * (40 + 80)});
  const FetchedQuantizedKV kv = q->fetch();
  expect_same_packed(download(be, kv.keys), ref::affine_quantize(k.slice(2, 0, 302), spec, Rounding::mlx_cpu), "keys");
  expect_same_packed(download(be, kv.values), ref::affine_quantize(v.slice(2, 0, 302), spec, Rounding::mlx_cpu),
                     "values");
  const FetchedQuantizedKV next = feed(be, *q, k, v, {8}, 302);
  expect_same_packed(download(be, next.keys), ref::affine_quantize(k, spec, Rounding::mlx_cpu), "continued keys");
  EXPECT_TRUE(to_quantized(KVCache(be), spec, Rounding::mlx_cpu)->empty());
  expect_error([&] { to_quantized(plain, affine(4, 128), Rounding::mlx_cpu); }, ErrorKind::invalid_argument, "64");
}

// A stand-in for a non-attention layer (mlx-lm ArraysCache: SSM state) in hybrid models.
class StateSpaceStub final : public Cache {
 public:
  using Cache::Cache;
  std::string_view class_name() const override { return "ArraysCache"; }
  std::int64_t kv_length() const override { return 0; }
  std::vector<std::int32_t> offsets() const override { return {0}; }
  CacheMask make_mask(std::int64_t, int) const override { return {}; }
  bool is_trimmable() const override { return false; }
  std::int64_t trim(std::int64_t) override { return 0; }
  bool empty() const override { return true; }
  std::size_t nbytes() const override { return 0; }
  CacheState state() const override { return {"ArraysCache", {}, {}}; }
  std::vector<SequenceContent> content(ContentForm) const override { return {SequenceContent{}}; }  // no K/V
  std::vector<BackingBuffer> buffers() const override { return {}; }
};

std::unique_ptr<Cache> kv_with(ReferenceBackend& be, std::int64_t tokens, std::int64_t dim = 64) {
  auto c = std::make_unique<KVCache>(be);
  if (tokens > 0) {
    const Tensor x = random_tokens(DType::f32, 1, 1, tokens, dim, static_cast<std::uint32_t>(tokens));
    c->update(be.upload(x), be.upload(x));
  }
  return c;
}

// mlx-lm#495 (fixing #477): decided per layer with offset >= start, not from layer 0
// (here an SSM layer, which the old code would have used to skip the whole model).
TEST(QuantizePolicy, DecidesPerLayerWithInclusiveStart) {
  ReferenceBackend be;
  std::vector<std::unique_ptr<Cache>> layers;
  layers.push_back(std::make_unique<StateSpaceStub>(be));
  layers.push_back(kv_with(be, 10));
  layers.push_back(kv_with(be, 9));
  layers.push_back(std::make_unique<QuantizedKVCache>(be, affine(8, 64), Rounding::mlx_cpu));
  layers.push_back(nullptr);
  layers.push_back(kv_with(be, 12));
  const Cache* already = layers[3].get();
  const auto report = maybe_quantize_kv_caches(layers, affine(4, 64), Rounding::mlx_cpu, 10);
  ASSERT_EQ(report.size(), 6u);
  const std::vector<std::string> actions = {"skipped", "quantized", "below-start", "already-quantized", "skipped",
                                            "quantized"};
  for (std::size_t i = 0; i < report.size(); ++i) {
    EXPECT_EQ(report[i].layer, i);
    EXPECT_EQ(report[i].action, actions[i]) << "layer " << i << ": " << report[i].reason;
  }
  EXPECT_NE(report[1].reason.find(">= quantized_kv_start 10"), std::string::npos) << report[1].reason;
  EXPECT_EQ(layers[0]->class_name(), "ArraysCache");
  auto* q = dynamic_cast<QuantizedKVCache*>(layers[1].get());
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->offset(), 10);
  EXPECT_EQ(q->spec(), affine(4, 64));
  EXPECT_NE(dynamic_cast<KVCache*>(layers[2].get()), nullptr);
  EXPECT_EQ(layers[3].get(), already);  // untouched, still 8 bits
  EXPECT_EQ(layers[5]->kv_length(), 12);
  // start 0 (generate_step's default) converts even an empty KVCache, as mlx-lm does.
  std::vector<std::unique_ptr<Cache>> fresh;
  fresh.push_back(kv_with(be, 0));
  EXPECT_EQ(maybe_quantize_kv_caches(fresh, affine(4, 64), Rounding::mlx_cpu, 0)[0].action, "quantized");
  EXPECT_TRUE(fresh[0]->is_quantized() && fresh[0]->empty());
}

TEST(QuantizePolicy, ErrorsReplaceNoLayer) {
  ReferenceBackend be;
  std::vector<std::unique_ptr<Cache>> layers;
  layers.push_back(kv_with(be, 4));
  layers.push_back(kv_with(be, 4, 96));  // 96 is not a multiple of group 64
  const Cache* first = layers[0].get();
  expect_error([&] { maybe_quantize_kv_caches(layers, affine(4, 64), Rounding::mlx_cpu, 0); },
               ErrorKind::invalid_argument, "96");
  EXPECT_EQ(layers[0].get(), first);
  expect_error([&] { maybe_quantize_kv_caches(layers, QuantSpec{QuantMode::affine, 7, 64}, Rounding::mlx_cpu, 0); },
               ErrorKind::invalid_argument, "7");
  expect_error([&] { maybe_quantize_kv_caches(layers, affine(4, 64), Rounding::mlx_cpu, -1); },
               ErrorKind::invalid_argument, "-1");
  EXPECT_EQ(layers[0].get(), first);
}

// mlx-lm#1573 / #1583: RotatingKVCache.to_quantized raises NotImplementedError, so
// --kv-bits crashed sliding-window models mid-generation. Here the ring stays plain,
// reported with the reason, and the neighbouring full-attention layer is converted.
TEST(QuantizePolicy, KeepsRotatingLayersUnquantizedWithTheReason) {
  ReferenceBackend be;
  std::vector<std::unique_ptr<Cache>> layers;
  auto ring = std::make_unique<RotatingKVCache>(be, 4);
  const Tensor x = random_tokens(DType::f32, 1, 1, 6, 64, 77);
  ring->update(be.upload(x), be.upload(x));
  layers.push_back(std::move(ring));
  layers.push_back(kv_with(be, 6));
  const Cache* kept = layers[0].get();
  std::vector<QuantizeDecision> report;
  ASSERT_NO_THROW(report = maybe_quantize_kv_caches(layers, affine(4, 64), Rounding::mlx_cpu, 0));
  EXPECT_EQ(report[0].action, "kept-unquantized");
  EXPECT_NE(report[0].reason.find("mlx-lm#1573"), std::string::npos) << report[0].reason;
  EXPECT_EQ(layers[0].get(), kept);
  EXPECT_EQ(report[1].action, "quantized");
  EXPECT_TRUE(layers[1]->is_quantized());
}

}  // namespace
}  // namespace test_quantized_kv_cache
}  // namespace kvlab
