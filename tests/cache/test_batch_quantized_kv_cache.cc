// BatchQuantizedKVCache (docs/semantics.md §Batch quantized cache): BatchKVCache's flows on packed
// data. Every row's stored bits must equal quantizing that row's tokens alone (quantization is per
// token row), so the checks compare codes, scales and biases bit for bit with a
// QuantizedKVCache fed the same tokens, and read token ids back through dequantize.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cache/batch_quantized_kv_cache.h"
#include "cache/seq_ops.h"
#include "reference/mask.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_batch_quantized_kv_cache {
namespace {

using testing::token_block;
using testing::token_ids;
using Ids = std::vector<float>;
using Rows = std::vector<std::vector<float>>;
using I32 = std::vector<std::int32_t>;
constexpr float kPad = -1.0f;
constexpr std::int64_t kHeads = 2, kDk = 64, kDv = 32;

const QuantSpec kSpec = QuantSpec::make(QuantMode::affine, 4, 32);
constexpr Rounding kRound = Rounding::mlx_cpu;

Rows shifted(Rows rows, float d) {
  for (auto& r : rows)
    for (float& x : r) x += d;
  return rows;
}

// Keys carry the token id, values id + 1000.
FetchedQuantizedKV put(Cache& cache, const Rows& rows) {
  Backend& be = cache.backend();
  return cache.update_quantized(token_block(be, rows, kHeads, kDk), token_block(be, shifted(rows, 1000), kHeads, kDv));
}

std::unique_ptr<QuantizedKVCache> single(Backend& be, const Ids& ids, QuantSpec spec = kSpec) {
  auto c = std::make_unique<QuantizedKVCache>(be, spec, kRound);
  if (!ids.empty()) put(*c, {ids});
  return c;
}

// Token ids of batch row b read back through dequantize (error far below 0.5).
Ids ids_of(Backend& be, const QuantizedDTensor& q, std::int64_t b = 0) {
  const std::int64_t d = seq::width(q.scales) * q.spec.group_size;
  DTensor out = be.allocate(DType::f32, {seq::batch(q.wq), seq::heads(q.wq), seq::length(q.wq), d});
  be.dequantize({{q.wq, q.scales, q.biases, q.spec}, out});
  Ids ids = token_ids(be, out, b);
  for (float& x : ids) x = std::round(x);
  return ids;
}

bool same_bits(Backend& be, const DTensor& a, const DTensor& b) {
  if (a.dtype != b.dtype || a.shape != b.shape) return false;
  const Tensor ta = be.download(a), tb = be.download(b);
  return std::memcmp(ta.data(), tb.data(), ta.nbytes()) == 0;
}

bool same_bits(Backend& be, const FetchedQuantizedKV& a, const FetchedQuantizedKV& b) {
  bool same = true;
  for (const auto& [x, y] : {std::pair{&a.keys, &b.keys}, std::pair{&a.values, &b.values}}) {
    same = same && same_bits(be, x->wq, y->wq) && same_bits(be, x->scales, y->scales);
    if (x->spec.has_biases()) same = same && same_bits(be, x->biases, y->biases);
  }
  return same;
}

// Row b's real tokens; checks that extract(b) holds exactly the bits of quantizing those
// tokens alone, that its offset is the row's, and that values mirror keys.
Ids row(const BatchQuantizedKVCache& cache, std::int64_t b) {
  Backend& be = cache.backend();
  const auto out = cache.extract(b);
  EXPECT_EQ(out->offset(), std::max(0, cache.offsets()[static_cast<std::size_t>(b)])) << "row " << b;
  if (out->offset() == 0) return {};
  const FetchedQuantizedKV kv = out->fetch();
  const Ids ids = ids_of(be, kv.keys);
  EXPECT_EQ(ids_of(be, kv.values), shifted({ids}, 1000)[0]);
  const auto alone = single(be, ids, cache.spec());
  EXPECT_TRUE(same_bits(be, kv, alone->fetch())) << "row " << b << " differs from quantizing it alone";
  return ids;
}

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a kvlab::Error";
  return Error(ErrorKind::internal, "none");
}

bool mentions(const Error& e, const std::string& s) { return std::string(e.what()).find(s) != std::string::npos; }

TEST(BatchQuantizedKVCache, AppendixA3OnPackedData) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {1, 3, 0}, kSpec, kRound);
  EXPECT_TRUE(cache.is_quantized());
  const FetchedQuantizedKV kv = put(cache, {{0, 1, 3, 5}, {0, 0, 0, 7}, {2, 6, 8, 9}});
  EXPECT_EQ(cache.offsets(), (I32{3, 1, 4}));
  EXPECT_EQ(cache.idx(), 4);
  EXPECT_EQ(cache.kv_length(), 4);
  EXPECT_EQ(kv.keys.wq.shape, (Shape{3, kHeads, 4, kSpec.packed_words(kDk)}));
  EXPECT_EQ(kv.values.scales.shape, (Shape{3, kHeads, 4, kDv / 32}));
  EXPECT_EQ(ids_of(be, kv.keys, 1), (Ids{0, 0, 0, 7}));
  EXPECT_EQ(row(cache, 0), (Ids{1, 3, 5}));
  EXPECT_EQ(row(cache, 1), (Ids{7}));
  EXPECT_EQ(row(cache, 2), (Ids{2, 6, 8, 9}));
  // Decode mask: create_causal_mask(1, _idx = 4, left_padding) (mlx-vlm#1208).
  const CacheMask m = cache.make_mask(1, 0);
  EXPECT_EQ(m.spec.kind, MaskKind::causal);
  const Tensor ref = ref::create_causal_mask(1, 4, 0, cache.left_padding(), {}, ref::MaskForm::boolean);
  const std::vector<std::int64_t> want = {0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(ref.to_ints(), want);
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t j = 0; j < 5; ++j)
      EXPECT_EQ(ref::causal_visible(m.spec, b, 0, j, 1, 5), want[static_cast<std::size_t>(b * 5 + j)] == 1);

  cache.filter({1});
  EXPECT_EQ(ids_of(be, cache.fetch().keys), (Ids{7}));
  EXPECT_EQ(cache.left_padding(), (I32{0}));
  EXPECT_EQ(cache.idx(), 1);
  EXPECT_EQ(cache.offsets(), (I32{1}));
}

TEST(BatchQuantizedKVCache, RightPaddingFlowRollsEveryComponent) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {0, 0}, kSpec, kRound);
  cache.prepare(std::nullopt, I32{2, 0});
  put(cache, {{10, 11, kPad, kPad}, {20, 21, 22, 23}});
  EXPECT_EQ(cache.offsets(), (I32{4, 4}));
  const Error e = error_of([&] { cache.extract(0); });  // mlx-lm PR #1746
  EXPECT_EQ(e.kind(), ErrorKind::misuse);
  cache.finalize();
  EXPECT_EQ(cache.offsets(), (I32{2, 4}));
  EXPECT_EQ(cache.left_padding(), (I32{2, 0}));
  // Columns 0–1 of row 0 received wrapped unused capacity: poison in every component.
  const QuantizedDTensor k = cache.key_buffer();
  const Tensor wq = be.download(k.wq), scales = be.download(k.scales), biases = be.download(k.biases);
  const std::int64_t words = seq::width(k.wq), groups = seq::width(k.scales);
  EXPECT_EQ(wq.view().load_int(0), 0xFFFFFFFFll);
  EXPECT_EQ(wq.view().load_int(words), 0xFFFFFFFFll);
  EXPECT_TRUE(std::isnan(scales.view().load(groups)) && std::isnan(biases.view().load(0)));
  EXPECT_EQ(row(cache, 0), (Ids{10, 11}));
  EXPECT_EQ(row(cache, 1), (Ids{20, 21, 22, 23}));
}

// Chunked, padded batched updates store exactly the bits of each row quantized alone.
TEST(BatchQuantizedKVCache, EachRowEqualsQuantizingItAlone) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {2, 0, 1}, kSpec, kRound);
  put(cache, {{kPad, kPad, 2, -2}, {3, 4, 5, 6}, {kPad, 7, 8, 9}});
  put(cache, {{10, 11}, {12, 13}, {-14, 15}});
  EXPECT_EQ(row(cache, 0), (Ids{2, -2, 10, 11}));
  EXPECT_EQ(row(cache, 1), (Ids{3, 4, 5, 6, 12, 13}));
  EXPECT_EQ(row(cache, 2), (Ids{7, 8, 9, -14, 15}));
}

TEST(BatchQuantizedKVCache, MergeThenExtractIsTheIdentity) {
  ReferenceBackend be;
  auto a = single(be, {1, 2, 3}), none = single(be, {}), c = single(be, {7, 8, 9, 10, 11});
  const QuantizedKVCache* parts[] = {a.get(), none.get(), c.get()};
  auto batch = BatchQuantizedKVCache::merge(be, parts);  // mlx-lm#941 / #1322: no such path upstream
  EXPECT_EQ(batch->left_padding(), (I32{2, 5, 0}));
  EXPECT_EQ(batch->offsets(), (I32{3, 0, 5}));
  EXPECT_EQ(batch->capacity(), 5);
  for (std::int64_t b = 0; b < 3; ++b) {
    const auto out = batch->extract(b);
    EXPECT_EQ(out->offset(), parts[b]->offset());
    if (out->offset() > 0) {
      EXPECT_TRUE(same_bits(be, out->fetch(), parts[b]->fetch())) << "row " << b;
    }
  }
  EXPECT_TRUE(batch->extract(1)->empty());
  put(*batch, {{4}, {1}, {12}});
  EXPECT_EQ(row(*batch, 0), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(row(*batch, 1), (Ids{1}));
}

TEST(BatchQuantizedKVCache, FilterThenExtendPreservesRows) {
  ReferenceBackend be;
  BatchQuantizedKVCache a(be, {2, 0, 1}, kSpec, kRound);
  put(a, {{kPad, kPad, 1, 2}, {3, 4, 5, 6}, {kPad, 7, 8, 9}});
  a.filter({2, 0});
  auto x = single(be, {20, 21, 22, 23, 24, 25, 26});
  const QuantizedKVCache* parts[] = {x.get()};
  auto b = BatchQuantizedKVCache::merge(be, parts);
  a.extend(*b);
  BatchQuantizedKVCache placeholder(be, {0}, kSpec, kRound);
  a.extend(placeholder);  // an empty side keeps its own batch size (mlx-lm#1141)
  EXPECT_EQ(a.offsets(), (I32{3, 2, 7, 0}));
  EXPECT_EQ(a.idx(), 7);
  const std::vector<Ids> want = {{7, 8, 9}, {1, 2}, {20, 21, 22, 23, 24, 25, 26}, {}};
  for (std::int64_t r = 0; r < 4; ++r) EXPECT_EQ(row(a, r), want[static_cast<std::size_t>(r)]) << "row " << r;
  put(a, {{10}, {11}, {27}, {40}});
  EXPECT_EQ(row(a, 1), (Ids{1, 2, 11}));
  EXPECT_EQ(row(a, 3), (Ids{40}));
}

TEST(BatchQuantizedKVCache, TrimGrowthAndBytes) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {0, 1}, kSpec, kRound);
  put(cache, {{1, 2, 3}, {kPad, 4, 5}});
  EXPECT_EQ(cache.capacity(), 256);
  // codes D·4/32 words + f32 scales and biases per group, keys and values, whole capacity.
  const std::int64_t per_row = (kDk / 8 + 2 * kDk / 32 + kDv / 8 + 2 * kDv / 32) * 4;
  EXPECT_EQ(cache.nbytes(), static_cast<std::size_t>(2 * kHeads * 256 * per_row));
  EXPECT_TRUE(cache.is_trimmable());  // mlx-vlm says False; see the header for why not here
  EXPECT_EQ(cache.trim(1), 1);
  EXPECT_EQ(be.download(cache.key_buffer().wq).view().load_int(2 * kDk / 8), 0xFFFFFFFFll);  // row 0 col 2 poisoned
  put(cache, {{6}, {7}});
  EXPECT_EQ(row(cache, 0), (Ids{1, 2, 6}));
  EXPECT_EQ(row(cache, 1), (Ids{4, 7}));
}

// docs/upstream-bugs.md §U1: mlx-vlm's first allocation (dim // (32 // bits)) breaks for 5 bits at
// D = 128; the packed width here is D·bits/32 = 20 words.
TEST(BatchQuantizedKVCache, OddBitWidthsAllocateTheRealPackedWidth) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {1, 0}, QuantSpec::make(QuantMode::affine, 5, 32), kRound);
  cache.update_quantized(token_block(be, {{kPad, 1}, {2, 3}}, 1, 128), token_block(be, {{kPad, 1}, {2, 3}}, 1, 128));
  EXPECT_EQ(seq::width(cache.key_buffer().wq), 20);
  EXPECT_EQ(ids_of(be, cache.extract(1)->fetch().keys), (Ids{2, 3}));
}

TEST(BatchQuantizedKVCache, FpModesHaveNoBiases) {
  ReferenceBackend be;
  const QuantSpec fp = QuantSpec::make(QuantMode::mxfp8);
  auto a = single(be, {1, 2}, fp), b = single(be, {3}, fp);
  const QuantizedKVCache* parts[] = {a.get(), b.get()};
  auto batch = BatchQuantizedKVCache::merge(be, parts);
  EXPECT_FALSE(batch->key_buffer().biases);
  EXPECT_TRUE(same_bits(be, batch->extract(0)->fetch(), a->fetch()));
  EXPECT_TRUE(same_bits(be, batch->extract(1)->fetch(), b->fetch()));
  auto back = BatchQuantizedKVCache::from_state(be, batch->state());
  EXPECT_EQ(back->offsets(), (I32{2, 1}));
  EXPECT_EQ(back->state().tensors.size(), 6u);  // 4 components + left_padding + offset
}

TEST(BatchQuantizedKVCache, OffsetsAreValueSnapshots) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {1, 0}, kSpec, kRound);
  const I32 before = cache.offsets();
  put(cache, {{kPad, 1}, {2, 3}});
  I32 snap = cache.offsets();
  snap[1] = 42;
  EXPECT_EQ(before, (I32{-1, 0}));
  EXPECT_EQ(cache.offsets(), (I32{1, 2}));
}

TEST(BatchQuantizedKVCache, StateRoundTripsAndRejectsCorruption) {
  ReferenceBackend be;
  BatchQuantizedKVCache cache(be, {1, 0}, kSpec, Rounding::mlx_gpu);
  cache.prepare(std::nullopt, I32{0, 1});
  put(cache, {{kPad, 1, 2}, {3, 4, kPad}});
  const CacheState good = cache.state();
  auto back = BatchQuantizedKVCache::from_state(be, good);
  EXPECT_EQ(back->spec(), kSpec);
  EXPECT_EQ(back->rounding(), Rounding::mlx_gpu);
  EXPECT_EQ(back->right_padding(), (I32{0, 1}));
  for (BatchQuantizedKVCache* c : {&cache, back.get()}) {
    c->finalize();
    put(*c, {{5}, {6}});
  }
  // Padding columns may differ physically (the restored capacity is _idx, so the roll
  // wraps other junk to the front); what attention may see may not.
  EXPECT_EQ(back->offsets(), cache.offsets());
  EXPECT_EQ(back->left_padding(), cache.left_padding());
  for (std::int64_t b = 0; b < 2; ++b) {
    EXPECT_TRUE(same_bits(be, back->extract(b)->fetch(), cache.extract(b)->fetch())) << "row " << b;
  }
  EXPECT_EQ(row(*back, 0), (Ids{1, 2, 5}));
  EXPECT_EQ(row(*back, 1), (Ids{3, 4, 6}));

  auto expect_corrupt = [&](CacheState s, const std::string& field) {
    const Error e = error_of([&] { BatchQuantizedKVCache::from_state(be, s); });
    EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
    EXPECT_TRUE(mentions(e, field)) << e.what();
  };
  CacheState s = good;
  s.meta["bits"] = "7";
  expect_corrupt(s, "'bits'");
  s = good;
  s.meta["mode"] = "int3";
  expect_corrupt(s, "'mode'");
  s = good;
  s.tensors.at("keys.wq") = good.tensors.at("keys.wq").slice(3, 0, 4);
  expect_corrupt(s, "'keys' codes");
  s = good;
  s.tensors.at("values.biases") = good.tensors.at("values.biases").slice(1, 0, 1);
  expect_corrupt(s, "'values.biases'");
  s = good;
  s.tensors.emplace("keys.extra", good.tensors.at("offset"));
  expect_corrupt(s, "'keys.extra'");
  s = good;
  s.tensors.erase("offset");
  expect_corrupt(s, "'offset'");
}

TEST(BatchQuantizedKVCache, MisuseIsANamedErrorAndChangesNothing) {
  ReferenceBackend be;
  EXPECT_EQ(error_of([&] { BatchQuantizedKVCache bad(be, {0}, QuantSpec{QuantMode::affine, 7, 64}, kRound); }).kind(),
            ErrorKind::invalid_argument);
  BatchQuantizedKVCache cache(be, {1, 0}, kSpec, kRound);
  put(cache, {{kPad, 1}, {2, 3}});
  Error e = error_of([&] {
    cache.update(token_block(be, {{4}, {5}}, kHeads, kDk), token_block(be, {{4}, {5}}, kHeads, kDv));
  });
  EXPECT_EQ(e.kind(), ErrorKind::misuse);  // mlx-swift-lm#71
  e = error_of([&] {
    cache.update_quantized(token_block(be, {{4}, {5}}, kHeads, 48), token_block(be, {{4}, {5}}, kHeads, 48));
  });
  EXPECT_TRUE(mentions(e, "48")) << e.what();
  BatchQuantizedKVCache eight(be, {0}, QuantSpec::make(QuantMode::affine, 8, 32), kRound);
  put(eight, {{9}});
  e = error_of([&] { cache.extend(eight); });
  EXPECT_TRUE(mentions(e, to_string(eight.spec()))) << e.what();
  BatchQuantizedKVCache gpu(be, {0}, kSpec, Rounding::mlx_gpu);
  EXPECT_EQ(error_of([&] { cache.extend(gpu); }).kind(), ErrorKind::invalid_argument);
  e = error_of([&] { cache.filter({2}); });
  EXPECT_TRUE(mentions(e, "batch index 2")) << e.what();
  auto a = single(be, {1}), b8 = single(be, {2}, QuantSpec::make(QuantMode::affine, 8, 32));
  const QuantizedKVCache* parts[] = {a.get(), b8.get()};
  e = error_of([&] { BatchQuantizedKVCache::merge(be, parts); });
  EXPECT_TRUE(mentions(e, "cache 1")) << e.what();
  EXPECT_EQ(cache.offsets(), (I32{1, 2}));
  EXPECT_EQ(eight.offsets(), (I32{1}));
  EXPECT_EQ(row(cache, 1), (Ids{2, 3}));
}

}  // namespace
}  // namespace test_batch_quantized_kv_cache
}  // namespace kvlab
