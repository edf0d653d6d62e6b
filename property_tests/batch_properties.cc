// Batch-cache properties (spec §4.9, §4.11, §5.5, Appendix C "Batch caches").
//   B1 BatchKVCache rows == token logs == single KVCaches, through filter/extend/merge/state
//   B2 the same for BatchQuantizedKVCache (several bit widths): bits equal QuantizedKVCache
//   B3 attend on a BatchKVCache (B >= 2, unequal prompts) == attend on each row's KVCache
// Row r's token t carries content(stream, row id, t, ·) (prop_model.h), so a row's data
// is a pure function of its id and token count: the model is just (id, count) per row.
#include <algorithm>
#include <memory>
#include <optional>
#include <span>

#include "cache/batch_kv_cache.h"
#include "cache/batch_quantized_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "property_tests/batch_util.h"
#include "property_tests/properties.h"

namespace kvlab::prop {

namespace {

using batch::block;
using batch::expect_same_tensor;
using batch::gen_split;
using batch::row_block;

// ---- the two batch kinds behind one interface ---------------------------------------

struct PlainOps {
  using Batch = BatchKVCache;
  using Single = KVCache;
  std::int64_t heads = 1, dim = 32;

  std::unique_ptr<Batch> make(Backend& be, std::vector<std::int32_t> lp) const {
    return std::make_unique<Batch>(be, std::move(lp));
  }
  void update(Batch& c, Backend& be, const Tensor& k, const Tensor& v) const { c.update(be.upload(k), be.upload(v)); }
  std::unique_ptr<Single> single(Backend& be, std::int64_t id, std::int64_t n) const {
    auto c = std::make_unique<Single>(be);
    if (n > 0)
      c->update(be.upload(row_block(Stream::key, id, 0, n, heads, dim)),
                be.upload(row_block(Stream::value, id, 0, n, heads, dim)));
    return c;
  }
  // `got` (an extracted row) holds exactly tokens [0, n) of row `id`, and equals the
  // cache built from those tokens alone.
  void check_row(Backend& be, const Single& got, std::int64_t id, std::int64_t n, std::size_t b) const {
    const std::string at = "BatchKVCache row " + std::to_string(b);
    if (got.offset() != n) RC_FAIL(at + ": extract offset " + std::to_string(got.offset()) + " vs log " + std::to_string(n));
    const FetchedKV f = got.fetch();
    expect_same_tensor(be.download(f.keys), row_block(Stream::key, id, 0, n, heads, dim), at + " keys");
    expect_same_tensor(be.download(f.values), row_block(Stream::value, id, 0, n, heads, dim), at + " values");
    check_same_state(got.state(), single(be, id, n)->state());
  }
  static std::unique_ptr<Batch> merge(Backend& be, std::span<const Single* const> rows) {
    return Batch::merge(be, rows);
  }
};

struct QuantOps {
  using Batch = BatchQuantizedKVCache;
  using Single = QuantizedKVCache;
  std::int64_t heads = 1, dim = 64;
  QuantSpec spec{};
  Rounding rounding = Rounding::mlx_cpu;

  std::unique_ptr<Batch> make(Backend& be, std::vector<std::int32_t> lp) const {
    return std::make_unique<Batch>(be, std::move(lp), spec, rounding);
  }
  void update(Batch& c, Backend& be, const Tensor& k, const Tensor& v) const {
    c.update_quantized(be.upload(k), be.upload(v));
  }
  std::unique_ptr<Single> single(Backend& be, std::int64_t id, std::int64_t n) const {
    auto c = std::make_unique<Single>(be, spec, rounding);
    if (n > 0)
      c->update_quantized(be.upload(row_block(Stream::key, id, 0, n, heads, dim)),
                          be.upload(row_block(Stream::value, id, 0, n, heads, dim)));
    return c;
  }
  // Quantization is per token row, so the row's bits equal quantizing its tokens alone.
  void check_row(Backend& be, const Single& got, std::int64_t id, std::int64_t n, std::size_t b) const {
    const std::string at = "BatchQuantizedKVCache row " + std::to_string(b);
    if (got.offset() != n) RC_FAIL(at + ": extract offset " + std::to_string(got.offset()) + " vs log " + std::to_string(n));
    RC_ASSERT(got.spec().bits == spec.bits);
    RC_ASSERT(got.spec().group_size == spec.group_size);
    check_same_state(got.state(), single(be, id, n)->state());
  }
  static std::unique_ptr<Batch> merge(Backend& be, std::span<const Single* const> rows) {
    return Batch::merge(be, rows);
  }
};

struct Row {
  std::int64_t id = 0, count = 0;
};

// A fresh batch of 1..max_b prompts (lengths 1..12): left-padded and prefilled in random
// chunks, or (allow_right, 1 in 4) right-padded in one chunk with prepare/finalize.
template <class Ops>
std::unique_ptr<typename Ops::Batch> fresh_batch(const Ops& ops, Backend& be, std::int64_t max_b, bool allow_right,
                                                 std::int64_t& next_id, std::vector<Row>& rows) {
  const std::int64_t count = *rc::gen::inRange<std::int64_t>(1, max_b + 1);
  std::vector<std::int64_t> lens, ids;
  for (std::int64_t b = 0; b < count; ++b) {
    lens.push_back(*rc::gen::inRange<std::int64_t>(1, 13));
    ids.push_back(next_id++);
  }
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  const bool right = allow_right && *rc::gen::inRange(0, 4) == 0;
  std::vector<std::int32_t> pad;
  for (const std::int64_t l : lens) pad.push_back(static_cast<std::int32_t>(longest - l));
  std::unique_ptr<typename Ops::Batch> cache;
  if (right) {
    cache = ops.make(be, std::vector<std::int32_t>(static_cast<std::size_t>(count), 0));
    cache->prepare(std::nullopt, pad);
    const auto tok = [&lens](std::int64_t b, std::int64_t j) {
      return j < lens[static_cast<std::size_t>(b)] ? j : std::int64_t{-1};
    };
    ops.update(*cache, be, block(Stream::key, ids, longest, ops.heads, ops.dim, tok),
               block(Stream::value, ids, longest, ops.heads, ops.dim, tok));
    cache->finalize();
  } else {
    cache = ops.make(be, pad);
    std::int64_t c0 = 0;
    for (const std::int64_t n : gen_split(longest)) {
      const auto tok = [&pad, c0](std::int64_t b, std::int64_t j) {
        return c0 + j - pad[static_cast<std::size_t>(b)] >= 0 ? c0 + j - pad[static_cast<std::size_t>(b)]
                                                             : std::int64_t{-1};
      };
      ops.update(*cache, be, block(Stream::key, ids, n, ops.heads, ops.dim, tok),
                 block(Stream::value, ids, n, ops.heads, ops.dim, tok));
      c0 += n;
    }
  }
  for (std::size_t b = 0; b < lens.size(); ++b) rows.push_back({ids[b], lens[b]});
  return cache;
}

template <class Ops>
void check_rows(const Ops& ops, Backend& be, const typename Ops::Batch& cache, const std::vector<Row>& rows) {
  RC_ASSERT(cache.batch_size() == static_cast<std::int64_t>(rows.size()));
  const std::vector<std::int32_t> off = cache.offsets();
  for (std::size_t b = 0; b < rows.size(); ++b) {
    if (off[b] != rows[b].count)
      RC_FAIL("row " + std::to_string(b) + ": offset " + std::to_string(off[b]) + " vs log " +
              std::to_string(rows[b].count));
    ops.check_row(be, *cache.extract(static_cast<std::int64_t>(b)), rows[b].id, rows[b].count, b);
  }
}

enum class Op { decode, chunk, filter, extend, merge, state };

template <class Ops>
void rows_match_logs(const Ops& ops) {
  ReferenceBackend be;
  std::int64_t next_id = 0;
  std::vector<Row> rows;
  auto cache = fresh_batch(ops, be, 8, true, next_id, rows);
  check_rows(ops, be, *cache, rows);
  const auto script = *rc::gen::container<std::vector<Op>>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 9)), rc::gen::weightedElement<Op>({{3, Op::decode}, {2, Op::chunk}, {1, Op::filter},
                                                             {1, Op::extend}, {1, Op::merge}, {1, Op::state}}));
  CaseSize& size = last_failure_size();
  size = {static_cast<std::int64_t>(script.size()), 0};
  for (const Op op : script) {
    if (op == Op::decode || op == Op::chunk) {
      const std::int64_t n = op == Op::decode ? 1 : *rc::gen::inRange<std::int64_t>(2, 7);
      std::vector<std::int64_t> ids;
      for (const Row& r : rows) ids.push_back(r.id);
      const auto tok = [&rows](std::int64_t b, std::int64_t j) { return rows[static_cast<std::size_t>(b)].count + j; };
      ops.update(*cache, be, block(Stream::key, ids, n, ops.heads, ops.dim, tok),
                 block(Stream::value, ids, n, ops.heads, ops.dim, tok));
      for (Row& r : rows) r.count += n;
      size.tokens += n;
    } else if (op == Op::filter) {
      const auto keep = *rc::gen::container<std::vector<bool>>(rows.size(), rc::gen::arbitrary<bool>());
      std::vector<std::int32_t> idx;
      for (std::size_t b = 0; b < rows.size(); ++b)
        if (keep[b]) idx.push_back(static_cast<std::int32_t>(b));
      if (idx.empty()) idx.push_back(static_cast<std::int32_t>(rows.size() - 1));
      if (*rc::gen::arbitrary<bool>()) std::reverse(idx.begin(), idx.end());
      cache->filter(idx);
      std::vector<Row> kept;
      for (const std::int32_t i : idx) kept.push_back(rows[static_cast<std::size_t>(i)]);
      rows = kept;
    } else if (op == Op::extend) {
      if (rows.size() >= 8) continue;
      auto other = fresh_batch(ops, be, 8 - static_cast<std::int64_t>(rows.size()), true, next_id, rows);
      cache->extend(*other);
    } else if (op == Op::merge) {  // merge of the extracted rows, then extract, is the identity
      std::vector<std::unique_ptr<typename Ops::Single>> singles;
      std::vector<const typename Ops::Single*> ptrs;
      for (std::size_t b = 0; b < rows.size(); ++b) {
        singles.push_back(cache->extract(static_cast<std::int64_t>(b)));
        ptrs.push_back(singles.back().get());
      }
      cache = Ops::merge(be, ptrs);
    } else {
      cache = Ops::Batch::from_state(be, cache->state());
    }
    check_rows(ops, be, *cache, rows);
  }
}

// ---- B3: batched attention == per-row attention (spec §5.5) ----------------------------

// Rows [j0, j0 + n) of (B, H, S, D) tensor `t`, batch row b, as (1, H, n, D).
Tensor slice_row(const Tensor& t, std::int64_t b, std::int64_t j0, std::int64_t n) {
  const std::int64_t heads = t.dim(1), cols = t.dim(2), dim = t.dim(3);
  Tensor out(t.dtype(), {1, heads, n, dim});
  const ConstTensorView src = t.view();
  const TensorView dst = out.view();
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t d = 0; d < dim; ++d)
        dst.store((h * n + j) * dim + d, src.load(((b * heads + h) * cols + j0 + j) * dim + d));
  return out;
}

}  // namespace

void batch_kv_rows_match_logs(const Hooks&, const BatchHooks&) {
  PlainOps ops;
  ops.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  rows_match_logs(ops);
}

void batch_quantized_rows_match_logs(const Hooks&, const BatchHooks&) {
  QuantOps ops;
  ops.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  const int bits = *rc::gen::element(2, 3, 4, 5, 6, 8);
  const int group = *rc::gen::element(32, 64);
  ops.spec = QuantSpec::make(QuantMode::affine, bits, group);
  ops.rounding = *rc::gen::element(Rounding::mlx_cpu, Rounding::mlx_gpu);
  RC_TAG(bits);
  rows_match_logs(ops);
}

// Each row of the batch sees exactly its own real keys, in the same order and with the
// same RoPE positions (offset = −left_padding at the start, so column c of row b is
// token c − lp_b), as the row's own KVCache. The reference SDPA never reads a hidden key
// and reduces each (row, head, query) over the visible keys in key order, so the two
// computations perform the same floating-point operations: the comparison is bit-exact
// (tolerance 0), not a derived bound. Padding queries are unspecified (spec §0.7) and
// are not compared.
void batch_attend_equals_per_row(const Hooks& hooks, const BatchHooks&) {
  Config cfg;
  cfg.kind = Kind::kv;
  cfg.kv_heads = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.q_ratio = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.dk = cfg.dv = 32;
  cfg.rope_dims = *rc::gen::element(0, 16, 32);
  const AttendOptions opts = attend_options(cfg);
  const auto count = *rc::gen::inRange<std::int64_t>(2, 5);
  std::vector<std::int64_t> lens, ids;
  for (std::int64_t b = 0; b < count; ++b) {
    lens.push_back(*rc::gen::inRange<std::int64_t>(1, 13));
    ids.push_back(b);
  }
  if (lens[0] == lens[1]) lens[1] = lens[0] % 12 + 1;  // unequal prompt lengths
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<std::int32_t> pad;
  for (const std::int64_t l : lens) pad.push_back(static_cast<std::int32_t>(longest - l));

  ReferenceBackend be;
  BatchKVCache cache(be, pad);
  std::vector<std::unique_ptr<KVCache>> singles;
  for (std::int64_t b = 0; b < count; ++b) singles.push_back(std::make_unique<KVCache>(be));
  std::vector<std::int64_t> chunks = gen_split(longest);
  const auto decodes = *rc::gen::container<std::vector<std::int64_t>>(
      static_cast<std::size_t>(*rc::gen::inRange(0, 6)), rc::gen::weightedOneOf<std::int64_t>({{3, rc::gen::just<std::int64_t>(1)},
                                                                     {1, rc::gen::inRange<std::int64_t>(2, 6)}}));
  const std::size_t prefill_chunks = chunks.size();
  chunks.insert(chunks.end(), decodes.begin(), decodes.end());
  CaseSize& size = last_failure_size();
  size = {static_cast<std::int64_t>(chunks.size()), 0};

  std::int64_t c0 = 0;  // columns written so far
  for (std::size_t step = 0; step < chunks.size(); ++step) {
    const std::int64_t n = chunks[step];
    size.tokens += n;
    // Token index of row b at column c0 + j: c − lp_b (negative = padding).
    const auto tok = [&pad, c0](std::int64_t b, std::int64_t j) {
      const std::int64_t t = c0 + j - pad[static_cast<std::size_t>(b)];
      return t >= 0 ? t : std::int64_t{-1};
    };
    const AttendResult r = hooks.attend(cache, be.upload(block(Stream::query, ids, n, cfg.q_heads(), cfg.dk, tok)),
                                        be.upload(block(Stream::key, ids, n, cfg.kv_heads, cfg.dk, tok)),
                                        be.upload(block(Stream::value, ids, n, cfg.kv_heads, cfg.dv, tok)), opts);
    const Tensor out = be.download(r.out);
    for (std::int64_t b = 0; b < count; ++b) {
      std::int64_t j0 = 0;
      while (j0 < n && tok(b, j0) < 0) ++j0;
      if (j0 == n) continue;  // the row has no real token in this chunk yet
      const std::int64_t p0 = tok(b, j0), m = n - j0;
      const AttendResult rs = attend(*singles[static_cast<std::size_t>(b)],
                                     be.upload(row_block(Stream::query, b, p0, m, cfg.q_heads(), cfg.dk)),
                                     be.upload(row_block(Stream::key, b, p0, m, cfg.kv_heads, cfg.dk)),
                                     be.upload(row_block(Stream::value, b, p0, m, cfg.kv_heads, cfg.dv)), opts);
      expect_same_tensor(slice_row(out, b, j0, m), be.download(rs.out),
                         "row " + std::to_string(b) + (step < prefill_chunks ? " prefill" : " decode") + " chunk " +
                             std::to_string(step) + " (batched vs alone)");
    }
    c0 += n;
  }
}

}  // namespace kvlab::prop
