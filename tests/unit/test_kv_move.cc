// Tests of the cache data-movement oracle (reference/kv_move.h).
//
// Kernels move bytes, so every check compares raw element bits. Two kinds of fill make
// a destination reveal where each cell came from:
//  * coded(): every element of a tensor gets a distinct bit pattern (flat index + a
//    per-tensor tag). The f16/bf16/f32 patterns run through ±inf into NaN payloads,
//    which any float round trip would alter;
//  * cache_rows(): cell (b, h, t, w) holds cell_bits(token, h, w), so tokens_of() reads
//    a buffer back as token rows and flags any cell whose head/word bits disagree.
// Expected results are written from the formulas or typed from docs/semantics.md and the
// traces of docs/traces.md; none was produced by running the kernels.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "reference/kv_move.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_kv_move {
namespace {

using Rows = std::vector<std::vector<int>>;
using Idx = std::int64_t;
constexpr DType kAllDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::u32, DType::i32, DType::u8};
constexpr int kPad = -1;   // a padding token
constexpr int kJunk = -9;  // unused capacity / poison

std::uint32_t bits_at(const Tensor& t, Idx flat) {
  std::uint32_t v = 0;
  const std::size_t es = dtype_size(t.dtype());
  std::memcpy(&v, t.data() + static_cast<std::size_t>(flat) * es, es);  // little-endian low bytes
  return v;
}
void set_bits(Tensor& t, Idx flat, std::uint32_t v) {
  const std::size_t es = dtype_size(t.dtype());
  std::memcpy(t.data() + static_cast<std::size_t>(flat) * es, &v, es);
}
Idx at(const Tensor& t, Idx b, Idx h, Idx s, Idx w) { return row_major_index(t.shape(), {b, h, s, w}); }
std::uint32_t bits4(const Tensor& t, Idx b, Idx h, Idx s, Idx w) { return bits_at(t, at(t, b, h, s, w)); }

// Distinct patterns per tensor (tag) and element. Bases sit just below +inf so that
// f32/f16/bf16 codes cross into inf and NaN; u8 tests keep tensors under 128 elements.
Tensor coded(DType dt, Shape shape, std::uint32_t tag) {
  Tensor t(dt, std::move(shape));
  std::uint32_t base = 0x40000000u;
  if (dt == DType::f32) base = 0x7F7FFFE0u;
  if (dt == DType::f16) base = 0x7BF0u;
  if (dt == DType::bf16) base = 0x7F70u;
  if (dt == DType::u8) base = 1u;
  const std::uint32_t step = dt == DType::u8 ? 128u : 4096u;
  for (Idx i = 0; i < t.numel(); ++i) set_bits(t, i, base + tag * step + static_cast<std::uint32_t>(i));
  return t;
}

std::string hex(std::uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Compares every cell of a 4-D tensor with expected(b, h, s, w); names the first miss.
::testing::AssertionResult cells_are(const Tensor& t,
                                     const std::function<std::uint32_t(Idx, Idx, Idx, Idx)>& expected) {
  const Shape& s = t.shape();
  for (Idx b = 0; b < s[0]; ++b)
    for (Idx h = 0; h < s[1]; ++h)
      for (Idx i = 0; i < s[2]; ++i)
        for (Idx w = 0; w < s[3]; ++w)
          if (bits4(t, b, h, i, w) != expected(b, h, i, w))
            return ::testing::AssertionFailure()
                   << dtype_name(t.dtype()) << " cell (" << b << ", " << h << ", " << i << ", " << w << ") has bits "
                   << hex(bits4(t, b, h, i, w)) << ", expected " << hex(expected(b, h, i, w));
  return ::testing::AssertionSuccess();
}

std::uint32_t cell_bits(int token, Idx h, Idx w) { return static_cast<std::uint32_t>((token + 16) * 256 + h * 16 + w); }

// A cache buffer (B, H, C, W) whose row b, column t holds token rows[b][t].
Tensor cache_rows(const Rows& rows, DType dt = DType::i32, Idx H = 2, Idx W = 3) {
  Tensor t(dt, {static_cast<Idx>(rows.size()), H, static_cast<Idx>(rows.at(0).size()), W});
  for (Idx b = 0; b < t.dim(0); ++b)
    for (Idx h = 0; h < H; ++h)
      for (Idx i = 0; i < t.dim(2); ++i)
        for (Idx w = 0; w < W; ++w) set_bits(t, at(t, b, h, i, w), cell_bits(rows[size_t(b)].at(size_t(i)), h, w));
  return t;
}
Tensor junk(Idx B, Idx C, DType dt = DType::i32, Idx H = 2, Idx W = 3) {
  return cache_rows(Rows(static_cast<size_t>(B), std::vector<int>(static_cast<size_t>(C), kJunk)), dt, H, W);
}

// Reads a cache buffer back as token rows; a cell that does not match its row's token
// (head or word moved apart from its row) reads as 999.
Rows tokens_of(const Tensor& t) {
  Rows out(static_cast<size_t>(t.dim(0)));
  for (Idx b = 0; b < t.dim(0); ++b)
    for (Idx i = 0; i < t.dim(2); ++i) {
      const int token = static_cast<int>(bits4(t, b, 0, i, 0) / 256) - 16;
      bool whole = true;
      for (Idx h = 0; h < t.dim(1); ++h)
        for (Idx w = 0; w < t.dim(3); ++w) whole = whole && bits4(t, b, h, i, w) == cell_bits(token, h, w);
      out[size_t(b)].push_back(whole ? token : 999);
    }
  return out;
}

Tensor i32(Shape shape, std::vector<std::int64_t> v) { return Tensor::from_ints(DType::i32, std::move(shape), v); }
Tensor i32(std::vector<std::int64_t> v) { return i32({static_cast<Idx>(v.size())}, v); }
Idx mod(Idx a, Idx n) { return ((a % n) + n) % n; }

void scatter(const Tensor& src, const Tensor& slots, Tensor& dst) {
  ref::kv_scatter(src.view(), slots.view(), dst.view());
}
void gather(const Tensor& src, const Tensor& index, Tensor& dst) {
  ref::kv_gather(src.view(), index.view(), dst.view());
}
void copy(const Tensor& src, std::vector<SeqBlock> blocks, Tensor& dst) {
  ref::kv_copy_blocks(src.view(), blocks, dst.view());
}
void roll(const Tensor& src, const Tensor& shifts, Tensor& dst) { ref::kv_roll(src.view(), shifts.view(), dst.view()); }

// ---- each kernel against its index formula, every dtype ---------------------------------

TEST(KvScatter, MatchesFormulaEveryDtype) {
  const std::vector<std::vector<Idx>> slot = {{4, 0, 6}, {6, 0, 1}};  // row 1 is a ring write wrapping past L
  for (DType dt : kAllDtypes) {
    const Tensor src = coded(dt, {2, 2, 3, 3}, 0);
    const Tensor before = coded(dt, {2, 2, 7, 3}, 1);
    Tensor dst = before;
    scatter(src, i32({2, 3}, {4, 0, 6, 6, 0, 1}), dst);
    EXPECT_TRUE(cells_are(dst, [&](Idx b, Idx h, Idx t, Idx w) {
      for (Idx s = 0; s < 3; ++s)
        if (slot[size_t(b)][size_t(s)] == t) return bits4(src, b, h, s, w);
      return bits4(before, b, h, t, w);  // a row not written keeps its bits
    }));
  }
}

TEST(KvScatter, RingWritesWrapAtPerRowCursors) {
  const Idx L = 5, S = 4, cursor[2] = {3, 4};
  for (DType dt : {DType::u32, DType::f16}) {  // packed code words and f16 rows move alike
    std::vector<std::int64_t> slots;
    for (Idx b = 0; b < 2; ++b)
      for (Idx s = 0; s < S; ++s) slots.push_back((cursor[b] + s) % L);
    const Tensor src = coded(dt, {2, 3, S, 4}, 0);
    const Tensor before = coded(dt, {2, 3, L, 4}, 1);
    Tensor dst = before;
    scatter(src, i32({2, S}, slots), dst);
    EXPECT_TRUE(cells_are(dst, [&](Idx b, Idx h, Idx t, Idx w) {
      const Idx s = mod(t - cursor[b], L);  // how far past the cursor slot t lies
      return s < S ? bits4(src, b, h, s, w) : bits4(before, b, h, t, w);
    }));
  }
}

TEST(KvScatter, DecodeStepsKeepTheLastLTokens) {
  // RotatingKVCache decode (keep 0): token n goes to slot n mod L; afterwards slot j
  // holds the newest token congruent to j.
  Tensor ring = junk(1, 3);
  for (int n = 0; n < 8; ++n) scatter(cache_rows({{n}}), i32({1, 1}, {n % 3}), ring);
  EXPECT_EQ(tokens_of(ring), (Rows{{6, 7, 5}}));
}

TEST(KvGather, MatchesFormulaWithRepeats) {
  const Idx index[] = {2, 0, 2, 1};
  for (DType dt : kAllDtypes) {
    const Tensor src = coded(dt, {3, 2, 4, 3}, 0);
    Tensor dst = coded(dt, {4, 2, 4, 3}, 1);
    gather(src, i32({2, 0, 2, 1}), dst);
    EXPECT_TRUE(cells_are(dst, [&](Idx d, Idx h, Idx t, Idx w) { return bits4(src, index[d], h, t, w); }));
  }
}

TEST(KvCopyBlocks, MatchesFormulaEveryDtype) {
  const std::vector<SeqBlock> blocks = {{0, 1, 1, 0, 3}, {2, 0, 0, 2, 2}, {2, 4, 1, 3, 2},
                                        {1, 5, 0, 4, 1}, {0, 0, 0, 0, 0}, {1, 6, 1, 5, 0}};
  for (DType dt : kAllDtypes) {
    const Tensor src = coded(dt, {3, 2, 6, 3}, 0);
    const Tensor before = coded(dt, {2, 2, 5, 3}, 1);
    Tensor dst = before;
    copy(src, blocks, dst);
    EXPECT_TRUE(cells_are(dst, [&](Idx b, Idx h, Idx t, Idx w) {
      for (const SeqBlock& k : blocks)
        if (k.dst_batch == b && k.dst_seq <= t && t < k.dst_seq + k.length)
          return bits4(src, k.src_batch, h, k.src_seq + (t - k.dst_seq), w);
      return bits4(before, b, h, t, w);  // rows no block covers are untouched
    }));
  }
}

TEST(KvCopyBlocks, NoBlocksChangesNothing) {
  const Tensor before = coded(DType::f16, {2, 2, 4, 2}, 1);
  Tensor dst = before;
  copy(coded(DType::f16, {1, 2, 3, 2}, 0), {}, dst);
  EXPECT_TRUE(testing::bit_equal(dst, before));
}

TEST(KvRoll, MatchesFormulaEveryDtype) {
  const std::vector<std::int64_t> shift = {0, 1, -1, 7, -13, std::numeric_limits<std::int32_t>::min()};
  for (DType dt : kAllDtypes) {
    const Tensor src = coded(dt, {6, 2, 5, 2}, 0);
    Tensor dst = coded(dt, {6, 2, 5, 2}, 1);
    roll(src, i32(shift), dst);
    EXPECT_TRUE(
        cells_are(dst, [&](Idx b, Idx h, Idx i, Idx w) { return bits4(src, b, h, mod(i - shift[size_t(b)], 5), w); }));
  }
}

TEST(KvRoll, HandWorkedRowsIncludingInt32Extremes) {
  // Every shift below is 2 mod 5 (INT32_MAX = 5·429496729 + 2, INT32_MIN = −5·429496729 − 3),
  // so each row [0 1 2 3 4] becomes [3 4 0 1 2]: element i moves to i + 2.
  const std::vector<int> row = {0, 1, 2, 3, 4};
  const Tensor src = cache_rows({row, row, row, row, row}, DType::u32);
  Tensor dst = junk(5, 5, DType::u32);
  roll(src, i32({2, -3, 7, std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min()}), dst);
  const std::vector<int> want = {3, 4, 0, 1, 2};
  EXPECT_EQ(tokens_of(dst), (Rows{want, want, want, want, want}));
}

TEST(KvRoll, PropertiesOnRandomShifts) {
  KVLAB_SEEDED_RNG(rng, 20240917);
  for (int round = 0; round < 20; ++round) {
    const Idx B = rng.integer(1, 4), L = rng.integer(1, 9);
    const DType dt = kAllDtypes[rng.integer(0, 5)];
    const Tensor x = coded(dt, {B, 2, L, 2}, 0);
    std::vector<std::int64_t> a, b, ab, by_l, neg_a;
    for (Idx r = 0; r < B; ++r) {
      a.push_back(rng.integer(-3 * L, 1 << 30));
      b.push_back(rng.integer(-(1 << 30), 3 * L));
      ab.push_back(mod(a.back() + b.back(), L));
      by_l.push_back(r % 2 ? L : -L);
      neg_a.push_back(-a.back());
    }
    Tensor y(dt, x.shape()), z(dt, x.shape()), yz(dt, x.shape());
    roll(x, i32(by_l), y);
    EXPECT_TRUE(testing::bit_equal(y, x)) << "roll by ±L is the identity";
    roll(x, i32(a), y);
    roll(y, i32(b), z);
    roll(x, i32(ab), yz);
    EXPECT_TRUE(testing::bit_equal(z, yz)) << "roll a, then b == roll a + b";
    roll(y, i32(neg_a), z);
    EXPECT_TRUE(testing::bit_equal(z, x)) << "roll −a undoes roll a";
  }
}

TEST(KvMove, EmptyExtentsDoNothing) {
  Tensor src(DType::f32, {2, 2, 0, 3}), dst(DType::f32, {2, 2, 0, 3});
  roll(src, i32({5, -7}), dst);  // L == 0: no modulo to take
  // A zero extent beside huge ones: nothing to move, and no size product may overflow.
  const Idx huge = Idx{1} << 40;
  const ConstTensorView e{nullptr, DType::u32, {1, 0, huge, huge}};
  const TensorView f{{nullptr, DType::u32, {1, 0, huge, huge}}};
  const Tensor zero = i32({0}), none = i32({0}, {});
  ref::kv_gather(e, zero.view(), f);
  ref::kv_roll(e, zero.view(), f);
  ref::kv_copy_blocks(e, std::vector<SeqBlock>{{0, huge, 0, 0, 0}}, f);
  ref::kv_gather(e, none.view(), TensorView{{nullptr, DType::u32, {0, 0, huge, huge}}});
  const Tensor no_slots(DType::i32, {0, huge});  // B == 0: S = 2^40 slots, none stored
  ref::kv_scatter(ConstTensorView{nullptr, DType::u32, {0, 1, huge, 1}}, no_slots.view(),
                  TensorView{{nullptr, DType::u32, {0, 1, 4, 1}}});
}

// ---- cache operations of docs/semantics.md, written with the kernels --------------------

TEST(CacheOps, BatchKVCacheExtendRightJustifiesAtMaxIdx) {
  // self: capacity 6, _idx 3, left_padding [1, 0]. other: capacity 4, _idx 4, lp [1].
  // max_idx 4, max_size 6: self shifts right by left = 1 (lp → [2, 1]); other by 0.
  const Tensor self = cache_rows({{kPad, 1, 2, kJunk, kJunk, kJunk}, {3, 4, 5, kJunk, kJunk, kJunk}});
  const Tensor other = cache_rows({{kPad, 6, 7, 8}});
  Tensor out = junk(3, 6);
  copy(self, {{0, 0, 0, 1, 3}, {1, 0, 1, 1, 3}}, out);  // columns [0, _idx) of each row → [left, max_idx)
  copy(other, {{0, 0, 2, 0, 4}}, out);
  EXPECT_EQ(tokens_of(out),
            (Rows{{kJunk, kPad, 1, 2, kJunk, kJunk}, {kJunk, 3, 4, 5, kJunk, kJunk}, {kPad, 6, 7, 8, kJunk, kJunk}}));
  // Layout rule: row b is [lp_b invalid][offset_b real], right-aligned at _idx = 4,
  // with the offsets of before the extend: [2, 3] and [3].
  const int lp[] = {2, 1, 1};
  const Rows real = {{1, 2}, {3, 4, 5}, {6, 7, 8}}, got = tokens_of(out);
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(std::vector<int>(got[b].begin() + lp[b], got[b].begin() + 4), real[b]) << b;
}

TEST(CacheOps, BatchKVCacheFilterGathersThenShiftsByMinPadding) {
  // docs/traces.md §T3: rows [p,1,3,5] [p,p,p,7] [2,6,8,9], lp [1,3,0], _idx 4, capacity 5.
  const Tensor keys = cache_rows({{kPad, 1, 3, 5, kJunk}, {kPad, kPad, kPad, 7, kJunk}, {2, 6, 8, 9, kJunk}});
  auto filter = [&](std::vector<std::int64_t> keep, Idx m) {
    Tensor picked = junk(static_cast<Idx>(keep.size()), 5), out = junk(static_cast<Idx>(keep.size()), 5 - m);
    gather(keys, i32(keep), picked);
    std::vector<SeqBlock> shift;  // keys[..., m:, :]
    for (Idx b = 0; b < static_cast<Idx>(keep.size()); ++b) shift.push_back({b, m, b, 0, 5 - m});
    copy(picked, shift, out);
    return tokens_of(out);
  };
  EXPECT_EQ(filter({1}, 3), (Rows{{7, kJunk}}));                                      // lp [0], _idx 1, offset [1]
  EXPECT_EQ(filter({0, 1}, 1), (Rows{{1, 3, 5, kJunk}, {kPad, kPad, 7, kJunk}}));     // lp [0, 2], _idx 3
  EXPECT_EQ(filter({2, 0}, 0), (Rows{{2, 6, 8, 9, kJunk}, {kPad, 1, 3, 5, kJunk}}));  // min lp 0: no shift
}

TEST(CacheOps, BatchKVCacheFinalizeRollsThenExtractSlices) {
  // docs/traces.md §T3 right-padding flow: prepare(right_padding [2, 0]); update with
  // [[10,11,p,p],[20,21,22,23]]; capacity 6, so two unused columns wrap to the front.
  const Tensor keys = cache_rows({{10, 11, kPad, kPad, kJunk, kJunk}, {20, 21, 22, 23, kJunk, kJunk}});
  Tensor rolled = junk(2, 6);
  roll(keys, i32({2, 0}), rolled);
  EXPECT_EQ(tokens_of(rolled), (Rows{{kJunk, kJunk, 10, 11, kPad, kPad}, {20, 21, 22, 23, kJunk, kJunk}}));
  // lp [2, 0], offset [2, 4], _idx 4. extract(i) = columns [lp_i, _idx) of row i.
  Tensor e0 = junk(1, 2), e1 = junk(1, 4);
  copy(rolled, {{0, 2, 0, 0, 2}}, e0);
  copy(rolled, {{1, 0, 0, 0, 4}}, e1);
  EXPECT_EQ(tokens_of(e0), (Rows{{10, 11}}));
  EXPECT_EQ(tokens_of(e1), (Rows{{20, 21, 22, 23}}));
  // Capacity == _idx: the pads themselves wrap to the front (covered by lp).
  Tensor tight = junk(1, 4);
  roll(cache_rows({{10, 11, kPad, kPad}}), i32({2}), tight);
  EXPECT_EQ(tokens_of(tight), (Rows{{kPad, kPad, 10, 11}}));
}

TEST(CacheOps, BatchKVCacheMergeRightAlignsSingleCaches) {
  // Single caches with offsets 3, 1, 4 and capacities 5, 2, 4: Lmax 4, p = [1, 3, 0].
  const Tensor c[] = {cache_rows({{1, 2, 3, kJunk, kJunk}}), cache_rows({{4, kJunk}}), cache_rows({{5, 6, 7, 8}})};
  const Idx len[] = {3, 1, 4};
  Tensor out = cache_rows({{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}});  // merge allocates zeros
  for (Idx b = 0; b < 3; ++b) copy(c[b], {{0, 0, b, 4 - len[b], len[b]}}, out);
  EXPECT_EQ(tokens_of(out), (Rows{{0, 1, 2, 3}, {0, 0, 0, 4}, {5, 6, 7, 8}}));
}

TEST(CacheOps, RotatingKVCacheTemporalOrderWithSinks) {
  // docs/traces.md §T2 (max_size 6, keep 2) after decode 9: [1,2,7,8,9,6], _idx 5.
  // temporal order = v[:keep] ++ v[_idx:] ++ v[keep:_idx].
  Tensor out = junk(1, 6);
  copy(cache_rows({{1, 2, 7, 8, 9, 6}}), {{0, 0, 0, 0, 2}, {0, 5, 0, 2, 1}, {0, 2, 0, 3, 3}}, out);
  EXPECT_EQ(tokens_of(out), (Rows{{1, 2, 6, 7, 8, 9}}));
}

TEST(CacheOps, BatchRotatingDecodeWrapsThenExtractUnrolls) {
  // docs/traces.md §T4: max_size 4, rows [p,p,1,2] / [5,6,7,8], lp [2,0]; three decodes write
  // columns 0, 1, 2 of the ring (_idx wraps to 0 first).
  Tensor keys = cache_rows({{kPad, kPad, 1, 2}, {5, 6, 7, 8}});
  for (int step = 0; step < 3; ++step)
    scatter(cache_rows({{100 + step}, {200 + step}}), i32({2, 1}, {step, step}), keys);
  EXPECT_EQ(tokens_of(keys), (Rows{{100, 101, 102, 2}, {200, 201, 202, 8}}));
  // extract: lp [-1, -3] clamps to 0; rotated, so roll left by _idx 3, then [0, 4).
  Tensor linear = junk(2, 4);
  roll(keys, i32({-3, -3}), linear);
  EXPECT_EQ(tokens_of(linear), (Rows{{2, 100, 101, 102}, {8, 200, 201, 202}}));
  // The same unrolling as two blocks straight out of the ring: [_idx, C) then [0, _idx).
  Tensor e1 = junk(1, 4);
  copy(keys, {{1, 3, 0, 0, 1}, {1, 0, 0, 1, 3}}, e1);
  EXPECT_EQ(tokens_of(e1), (Rows{{8, 200, 201, 202}}));
}

TEST(CacheOps, BatchRotatingRightPaddedPrefillAcrossChunks) {
  // docs/traces.md §T5: max_size 4, lengths [2, 5], right padding [3, 0].
  const Tensor chunk1 = cache_rows({{10, 11, kPad}, {20, 21, 22}});
  // Chunk 2: roll = max(0, offset − _lengths) = [1, 0]; trim 0; append [[p,p],[23,24]].
  Tensor rolled = junk(2, 3), buf = junk(2, 5);
  roll(chunk1, i32({1, 0}), rolled);
  copy(rolled, {{0, 0, 0, 0, 3}, {1, 0, 1, 0, 3}}, buf);
  scatter(cache_rows({{kPad, kPad}, {23, 24}}), i32({2, 2}, {3, 4, 3, 4}), buf);
  EXPECT_EQ(tokens_of(buf), (Rows{{kPad, 10, 11, kPad, kPad}, {20, 21, 22, 23, 24}}));
  // finalize: roll [2, 0] → lp [3, 0], offset [2, 5], _idx 5.
  Tensor fin = junk(2, 5);
  roll(buf, i32({2, 0}), fin);
  EXPECT_EQ(tokens_of(fin), (Rows{{kPad, kPad, kPad, 10, 11}, {20, 21, 22, 23, 24}}));
  // Decode 12/25: trim 5 → 4 drops the oldest column, rotate, write slot 0.
  Tensor ring = junk(2, 4);
  copy(fin, {{0, 1, 0, 0, 4}, {1, 1, 1, 0, 4}}, ring);
  scatter(cache_rows({{12}, {25}}), i32({2, 1}, {0, 0}), ring);
  EXPECT_EQ(tokens_of(ring), (Rows{{12, kPad, 10, 11}, {25, 22, 23, 24}}));
  // extract with lp [1, -2] → padding [1, 0] after rolling left by _idx 1.
  Tensor linear = junk(2, 4), e0 = junk(1, 3), e1 = junk(1, 4);
  roll(ring, i32({-1, -1}), linear);
  copy(linear, {{0, 1, 0, 0, 3}}, e0);
  copy(linear, {{1, 0, 0, 0, 4}}, e1);
  EXPECT_EQ(tokens_of(e0), (Rows{{10, 11, 12}}));
  EXPECT_EQ(tokens_of(e1), (Rows{{22, 23, 24, 25}}));
}

TEST(CacheOps, BatchQuantizedComponentsMoveTogether) {
  // mlx-vlm BatchQuantizedKVCache keys are (wq u32 (…, D·bits/32), scales, biases (…, D/group)),
  // all with the sequence on axis 2. D 32, 3 bits → 3 code words; group 16 → 2 scales.
  // Each operation runs once per component; a token's three rows must stay in one column.
  // self: _idx 3, lp [0, 1], right padding [1, 0]; other: _idx 2, capacity 2, lp [0].
  const DType dts[] = {DType::u32, DType::f16, DType::bf16};
  const Idx widths[] = {3, 2, 2};
  for (int c = 0; c < 3; ++c) {
    const DType dt = dts[c];
    const Idx W = widths[c];
    Tensor fin = junk(2, 4, dt, 2, W), out = junk(3, 4, dt, 2, W);
    roll(cache_rows({{10, 11, kPad, kJunk}, {kPad, 20, 21, kJunk}}, dt, 2, W), i32({1, 0}), fin);  // finalize
    EXPECT_EQ(tokens_of(fin), (Rows{{kJunk, 10, 11, kPad}, {kPad, 20, 21, kJunk}})) << dtype_name(dt);
    // extend: max_idx 3, max_size 4; other shifts right by 1 (its lp becomes 1).
    copy(fin, {{0, 0, 0, 0, 3}, {1, 0, 1, 0, 3}}, out);
    copy(cache_rows({{31, 32}}, dt, 2, W), {{0, 0, 2, 1, 2}}, out);
    EXPECT_EQ(tokens_of(out), (Rows{{kJunk, 10, 11, kJunk}, {kPad, 20, 21, kJunk}, {kJunk, 31, 32, kJunk}}))
        << dtype_name(dt);
  }
}

// ---- invalid input: kvlab::Error naming the bad value ------------------------------------

using testing::expect_error;

TEST(KvMoveErrors, Scatter) {
  const Tensor src = coded(DType::f16, {2, 1, 2, 3}, 0), before = coded(DType::f16, {2, 1, 4, 3}, 1);
  Tensor dst = before;
  auto run = [&](std::vector<std::int64_t> s) { return [&, s] { scatter(src, i32({2, 2}, s), dst); }; };
  expect_error(run({0, 1, 2, 4}), ErrorKind::invalid_argument, {"slot 4", "batch row 1", "[0, 4)"});
  expect_error(run({-1, 1, 2, 3}), ErrorKind::invalid_argument, {"slot -1", "batch row 0"});
  expect_error(run({0, 1, 3, 3}), ErrorKind::invalid_argument, {"slot 3 repeated", "batch row 1", "0 and 1"});
  EXPECT_TRUE(testing::bit_equal(dst, before)) << "a rejected call must not write";
  // Repeats found by the run-overlap check: one run inside another, two partially
  // overlapping runs, a repeat in the same run order as a wrapped ring; and a row of
  // several disjoint runs out of order, which is valid.
  const Tensor src6 = coded(DType::f16, {1, 1, 6, 3}, 2), before8 = coded(DType::f16, {1, 1, 8, 3}, 3);
  Tensor dst8 = before8;
  auto run6 = [&](std::vector<std::int64_t> s) { return [&, s] { scatter(src6, i32({1, 6}, s), dst8); }; };
  expect_error(run6({5, 6, 7, 0, 1, 6}), ErrorKind::invalid_argument, {"slot 6 repeated", "positions 1 and 5"});
  expect_error(run6({2, 3, 4, 3, 4, 5}), ErrorKind::invalid_argument, {"slot 3 repeated", "positions 1 and 3"});
  expect_error(run6({6, 7, 0, 1, 2, 7}), ErrorKind::invalid_argument, {"slot 7 repeated", "positions 1 and 5"});
  EXPECT_TRUE(testing::bit_equal(dst8, before8)) << "a rejected call must not write";
  EXPECT_NO_THROW(scatter(src6, i32({1, 6}, {3, 1, 2, 7, 0, 5}), dst8));
  expect_error(
      [&] {
        scatter(src, i32({2, 1}, {0, 1}), dst);
      },
      ErrorKind::shape_mismatch, {"slots", "(2, 1)", "(2, 2)"});
  expect_error([&] { scatter(src, Tensor(DType::u32, {2, 2}), dst); }, ErrorKind::dtype_mismatch, {"slots", "u32"});
  Tensor f32_dst(DType::f32, {2, 1, 4, 3}), wide(DType::f16, {2, 1, 4, 4}), short_b(DType::f16, {1, 1, 4, 3});
  expect_error([&] { scatter(src, i32({2, 2}, {0, 1, 0, 1}), f32_dst); }, ErrorKind::dtype_mismatch, {"f16", "f32"});
  expect_error([&] { scatter(src, i32({2, 2}, {0, 1, 0, 1}), wide); }, ErrorKind::shape_mismatch, {"(2, 1, 4, 4)"});
  expect_error([&] { scatter(src, i32({2, 2}, {0, 1, 0, 1}), short_b); }, ErrorKind::shape_mismatch, {"(1, 1, 4, 3)"});
  Tensor rank3(DType::f16, {2, 4, 3});
  expect_error([&] { scatter(src, i32({2, 2}, {0, 1, 0, 1}), rank3); }, ErrorKind::shape_mismatch, {"rank 3"});
}

TEST(KvMoveErrors, Gather) {
  const Tensor src = coded(DType::u32, {3, 2, 4, 2}, 0);
  Tensor dst(DType::u32, {2, 2, 4, 2}), other_l(DType::u32, {2, 2, 5, 2});
  expect_error([&] { gather(src, i32({0, 3}), dst); }, ErrorKind::invalid_argument, {"batch_index[1] = 3", "[0, 3)"});
  expect_error([&] { gather(src, i32({-2, 0}), dst); }, ErrorKind::invalid_argument, {"batch_index[0] = -2"});
  expect_error([&] { gather(src, i32({0}), dst); }, ErrorKind::shape_mismatch, {"batch_index", "(1,)", "(2,)"});
  expect_error([&] { gather(src, i32({0, 1}), other_l); }, ErrorKind::shape_mismatch, {"(2, 2, 5, 2)"});
}

TEST(KvMoveErrors, CopyBlocks) {
  const Tensor src = coded(DType::bf16, {2, 2, 6, 2}, 0), before = coded(DType::bf16, {2, 2, 5, 2}, 1);
  Tensor dst = before;
  auto run = [&](std::vector<SeqBlock> b) { return [&, b] { copy(src, b, dst); }; };
  const Idx big = std::numeric_limits<Idx>::max();
  expect_error(run({{0, 0, 0, 0, 1}, {0, 0, 0, 1, -1}}), ErrorKind::invalid_argument,
               {"block 1", "negative length -1"});
  expect_error(run({{2, 0, 0, 0, 1}}), ErrorKind::invalid_argument, {"src_batch 2", "[0, 2)"});
  expect_error(run({{0, 0, -1, 0, 1}}), ErrorKind::invalid_argument, {"dst_batch -1"});
  expect_error(run({{0, 4, 0, 0, 3}}), ErrorKind::invalid_argument, {"start at 4", "length 3", "length 6"});
  expect_error(run({{0, 0, 0, 3, 3}}), ErrorKind::invalid_argument, {"start at 3", "dst sequence length 5"});
  expect_error(run({{0, -1, 0, 0, 1}}), ErrorKind::invalid_argument, {"start at -1"});
  expect_error(run({{0, big, 0, 0, 1}}), ErrorKind::invalid_argument, {std::to_string(big)});  // no overflow
  expect_error(run({{0, 1, 0, 0, big}}), ErrorKind::invalid_argument, {std::to_string(big)});
  expect_error(run({{0, 0, 1, 0, 2}, {0, 0, 0, 0, 5}, {1, 0, 1, 1, 2}}), ErrorKind::invalid_argument,
               {"blocks 0 and 2 overlap", "dst_batch 1", "[0, 2)", "[1, 3)"});
  // The overlap is with the latest-ending earlier block, not the first one.
  expect_error(run({{0, 4, 0, 3, 2}, {0, 0, 0, 0, 2}, {0, 2, 0, 2, 2}}), ErrorKind::invalid_argument,
               {"blocks 0 and 2 overlap", "[2, 4)", "[3, 5)"});
  EXPECT_TRUE(testing::bit_equal(dst, before)) << "a rejected call must not write";
  copy(src, {{0, 0, 1, 0, 2}, {1, 0, 1, 2, 3}}, dst);  // touching ranges are fine
}

TEST(KvMoveErrors, Roll) {
  const Tensor src = coded(DType::i32, {2, 1, 3, 2}, 0);
  Tensor dst(DType::i32, {2, 1, 3, 2}), longer(DType::i32, {2, 1, 4, 2}), f32_dst(DType::f32, {2, 1, 3, 2});
  expect_error([&] { roll(src, i32({1, 2, 3}), dst); }, ErrorKind::shape_mismatch, {"shifts", "(3,)", "(2,)"});
  expect_error([&] { roll(src, Tensor(DType::f32, {2}), dst); }, ErrorKind::dtype_mismatch, {"shifts", "f32"});
  expect_error([&] { roll(src, i32({1, 2}), longer); }, ErrorKind::shape_mismatch, {"(2, 1, 4, 2)"});
  expect_error([&] { roll(src, i32({1, 2}), f32_dst); }, ErrorKind::dtype_mismatch, {"f32", "i32"});
}

TEST(KvMoveErrors, AliasingAndUnaddressableSizes) {
  Tensor arena(DType::f32, {64});
  std::byte* p = arena.data();
  const ConstTensorView src{p, DType::f32, {1, 1, 4, 2}};  // bytes [0, 32)
  const TensorView overlapping{{p + 16, DType::f32, {1, 1, 4, 2}}}, after{{p + 32, DType::f32, {1, 1, 4, 2}}};
  const Tensor zero = i32({0});
  expect_error([&] { ref::kv_roll(src, zero.view(), overlapping); }, ErrorKind::invalid_argument,
               {"src", "overlaps dst"});
  expect_error([&] { ref::kv_gather(src, zero.view(), overlapping); }, ErrorKind::invalid_argument, {"overlaps"});
  expect_error([&] { ref::kv_copy_blocks(src, std::vector<SeqBlock>{}, overlapping); }, ErrorKind::invalid_argument,
               {"overlaps"});
  ref::kv_roll(src, zero.view(), after);  // adjacent, disjoint ranges of one buffer are fine
  // An index tensor living inside dst would be overwritten while being read.
  const ConstTensorView slots_in_dst{p + 32, DType::i32, {1, 4}};
  expect_error([&] { ref::kv_scatter(src, slots_in_dst, after); }, ErrorKind::invalid_argument, {"slots", "overlaps"});
  // numel fits int64 but the byte count does not: rejected, not wrapped.
  const ConstTensorView absurd{p, DType::f32, {1, 1, 1, Idx{1} << 62}};
  expect_error([&] { ref::kv_roll(absurd, zero.view(), after); }, ErrorKind::invalid_argument,
               {"(1, 1, 1, 4611686018427387904)"});
}

}  // namespace
}  // namespace test_kv_move
}  // namespace kvlab
