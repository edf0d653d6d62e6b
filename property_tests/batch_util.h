// Helpers shared by the batch-cache properties (batch_properties.cc,
// batch_rotating_prefix.cc, batch_lifecycle.cc): deterministic (B, H, S, D) blocks whose
// row b, column s holds content(row id, token index) or a padding value, chunk
// splitting, the per-row token log with its pending right-padded prompt, and the checks
// for operations that must be rejected.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "cache/batch_cache.h"
#include "cache/cache_script.h"
#include "kvlab/error.h"
#include "property_tests/prop_model.h"

namespace kvlab::prop::batch {

constexpr float kPadValue = 7.5f;  // finite and far from content's [-1, 1): visible if ever attended

// (B, heads, S, D) f32: row b, column j holds content(s, rowid[b], tok(b, j), h, d), or
// kPadValue where tok(b, j) < 0 (padding).
template <class F>
Tensor block(Stream s, const std::vector<std::int64_t>& rowid, std::int64_t cols, std::int64_t heads,
             std::int64_t dim, F tok) {
  const auto rows = static_cast<std::int64_t>(rowid.size());
  Tensor t(DType::f32, {rows, heads, cols, dim});
  const TensorView v = t.view();
  for (std::int64_t b = 0; b < rows; ++b)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t p = tok(b, j);
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < dim; ++d)
          v.store(((b * heads + h) * cols + j) * dim + d,
                  p < 0 ? kPadValue : content(s, rowid[static_cast<std::size_t>(b)], p, h, d));
    }
  return t;
}

// Tokens [p0, p0 + n) of one row: (1, heads, n, dim).
inline Tensor row_block(Stream s, std::int64_t rowid, std::int64_t p0, std::int64_t n, std::int64_t heads,
                        std::int64_t dim) {
  return block(s, {rowid}, n, heads, dim, [p0](std::int64_t, std::int64_t j) { return p0 + j; });
}

// Columns [j0, j0 + n) of batch row b of a (B, H, S, D) tensor, as (1, H, n, D).
inline Tensor slice_row(const Tensor& t, std::int64_t b, std::int64_t j0, std::int64_t n) {
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

inline void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::string d = first_difference(a, b);
  if (!d.empty()) RC_FAIL(what + ": " + d);
}

// The batch verbs of a property's batch cache, wrapped or not (Error{misuse} for a cache
// without them).
template <class C>  // Cache or const Cache
auto& verbs(C& cache) {
  auto* b = cache.batch();
  KVLAB_REQUIRE(b != nullptr, misuse, "a ", cache.class_name(), " has no batch verbs");
  return *b;
}

// The float K/V a single cache (a plain or ring row of extract_sequence) holds for
// attention, oldest first: what extract adopted.
inline FetchedKV held_rows(const Cache& single) {
  const SequenceContent held = single.content().at(0);
  return {held.part("keys"), held.part("values")};
}

// Tokens [0, n) of rows by id, (1, heads, n, dim), from a memo that grows geometrically:
// the row checks after every step would otherwise regenerate every row from token 0.
class RowMemo {
 public:
  RowMemo(std::int64_t heads, std::int64_t dim) : heads_(heads), dim_(dim) {}
  Tensor get(Stream s, std::int64_t id, std::int64_t n) {
    Tensor& t = rows_[{static_cast<int>(s), id}];
    const std::int64_t have = t.rank() == 4 ? t.dim(2) : 0;
    if (have < n) t = row_block(s, id, 0, std::max({n, 2 * have, std::int64_t{16}}), heads_, dim_);
    return t.slice(2, 0, n);
  }

 private:
  std::int64_t heads_, dim_;
  std::map<std::pair<int, std::int64_t>, Tensor> rows_;
};

// Chunk lengths (1..8) summing to exactly `total`.
inline std::vector<std::int64_t> gen_split(std::int64_t total) {
  std::vector<std::int64_t> out;
  while (total > 0) {
    const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(total, 8) + 1);
    out.push_back(n);
    total -= n;
  }
  return out;
}

// One chunk of at most `most` tokens: mostly 2..6 (1 when that is all), 1 in 8 a long
// one of 200..300 (when allowed), which crosses the 256-column growth step.
inline std::int64_t gen_chunk(std::int64_t most) {
  if (most >= 200 && *rc::gen::inRange(0, 8) == 0)
    return *rc::gen::inRange<std::int64_t>(200, std::min<std::int64_t>(most, 300) + 1);
  return *rc::gen::inRange<std::int64_t>(std::min<std::int64_t>(most, 2), std::min<std::int64_t>(most, 6) + 1);
}

// One batch row of the token-log model. Token t of row `id` carries content(·, id, t, ·),
// so the row is a pure function of (id, count) and of what a pending right-padded prompt
// wrote: while a prompt is pending, each new column of the row is its next real token
// while real_left > 0, then a right pad; the offset counts those pads until finalize()
// rolls them to the front (prepare/finalize: docs/semantics.md §Batch cache, docs/traces.md §T5).
struct RowLog {
  std::int64_t id = 0;
  std::int64_t count = 0;      // real tokens so far (negative: left padding still ahead)
  std::int64_t real_left = 0;  // pending prompt: real tokens still to come
  std::int64_t pad_left = 0;   // pending prompt: right pads after them
  std::int64_t pads = 0;       // pending prompt: right pads written
  // Rotating only: extract may legitimately hold max_size − 1 tokens (a concat keeps
  // max_size − 1 old columns; a last chunk of pads adds none) until the next update.
  bool short_ok = false;
  std::int64_t offset() const { return count + pads; }
};

// A right-padded prompt in progress: `on`, with `left` columns still to write (0 = all
// written, finalize() next). (Not std::optional: GCC 12 -O2 warns maybe-uninitialized.)
struct Pending {
  bool on = false;
  std::int64_t left = 0;
  explicit operator bool() const { return on; }
};

// Token index of column j of the row's next chunk; negative = padding (left or right).
inline std::int64_t next_token(const RowLog& r, std::int64_t j, bool pending) {
  if (pending && j >= r.real_left) return -1;
  return r.count + j;
}

inline void advance(RowLog& r, std::int64_t n, bool pending) {
  const std::int64_t real = pending ? std::min(n, r.real_left) : n;
  r.count += real;
  if (!pending) {
    r.short_ok = false;
    return;
  }
  r.real_left -= real;
  r.pads += n - real;
  r.pad_left -= n - real;
}

inline std::vector<std::int64_t> ids_of(const std::vector<RowLog>& rows) {
  std::vector<std::int64_t> ids;
  for (const RowLog& r : rows) ids.push_back(r.id);
  return ids;
}

// (B, heads, n, dim) of the rows' next n columns.
inline Tensor next_block(Stream s, const std::vector<RowLog>& rows, std::int64_t n, std::int64_t heads,
                         std::int64_t dim, bool pending) {
  return block(s, ids_of(rows), n, heads, dim, [&](std::int64_t b, std::int64_t j) {
    return next_token(rows[static_cast<std::size_t>(b)], j, pending);
  });
}

// Row indices for filter: a random non-empty subset in random order.
inline std::vector<std::int32_t> gen_keep(std::size_t rows) {
  const auto keep = *rc::gen::container<std::vector<bool>>(rows, rc::gen::arbitrary<bool>());
  std::vector<std::int32_t> idx;
  for (std::size_t b = 0; b < rows; ++b)
    if (keep[b]) idx.push_back(static_cast<std::int32_t>(b));
  if (idx.empty()) idx.push_back(static_cast<std::int32_t>(*rc::gen::inRange<std::size_t>(0, rows)));
  if (*rc::gen::arbitrary<bool>()) std::reverse(idx.begin(), idx.end());
  return idx;
}

// Indices filter must reject: a valid subset plus a duplicate or an index outside
// [0, rows) (mlx-lm indexes arrays with them: duplicates clone a row, vlm#1441).
inline std::vector<std::int32_t> gen_bad_keep(std::size_t rows) {
  std::vector<std::int32_t> idx = gen_keep(rows);
  const int kind = *rc::gen::inRange(0, 3);
  const auto at = *rc::gen::inRange<std::size_t>(0, idx.size() + 1);
  const std::int32_t bad = kind == 0   ? idx[at % idx.size()]  // a duplicate
                           : kind == 1 ? static_cast<std::int32_t>(rows + *rc::gen::inRange<std::size_t>(0, 3))
                                       : -1 - *rc::gen::inRange(0, 3);
  idx.insert(idx.begin() + static_cast<std::ptrdiff_t>(at), bad);
  return idx;
}

inline std::vector<RowLog> pick(const std::vector<RowLog>& rows, const std::vector<std::int32_t>& idx) {
  std::vector<RowLog> out;
  for (const std::int32_t i : idx) out.push_back(rows[static_cast<std::size_t>(i)]);
  return out;
}

// `op` must throw a kvlab::Error of `kind` (an operation the cache rejects cleanly);
// RC_FAIL naming `what` when it throws nothing or something else.
template <class F>
void expect_rejected(F&& op, ErrorKind kind, const std::string& what) {
  try {
    op();
  } catch (const Error& e) {
    if (e.kind() != kind)
      RC_FAIL(what + " threw " + std::string(error_kind_name(e.kind())) + " (" + e.what() + "), expected " +
              std::string(error_kind_name(kind)));
    return;
  }
  RC_FAIL(what + " was accepted; it must be rejected with " + std::string(error_kind_name(kind)));
}

// "[id:count+pads, ...]" for RC_LOG traces of the failing case.
inline std::string rows_str(const std::vector<RowLog>& rows) {
  std::string s = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(rows[i].id) + ":" + std::to_string(rows[i].count);
    if (rows[i].pads > 0 || rows[i].pad_left > 0 || rows[i].real_left > 0)
      s += "(+" + std::to_string(rows[i].pads) + " pads, " + std::to_string(rows[i].real_left) + " real and " +
           std::to_string(rows[i].pad_left) + " pads to come)";
  }
  return s + "]";
}

inline std::string list_str(const std::vector<std::int32_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// ---- the steps of the stateful batch properties (B1, L1) ---------------------------------
// A step is drawn as a command of the cache language (cache/cache_script.h) whose counts
// and rows are drawn when it runs (they depend on the rows and the pending prompt then):
//   u1 a decode, u0 a chunk, r0 a right-padded prompt (its prepare; its columns come in
//   the chunks that follow, then f), t0 a trim, k with no row a filter, k with row -1 a
//   filter the cache must reject, x0p0 an extend, s a state round trip, q a to_quantized
//   check (B1; the language's q is kind kv only), j each row extracted and the singles
//   merged back.
namespace cs = kvlab::cache_script;
using Draw = cs::Command;
inline const Draw kDecode = cs::Command{cs::Verb::update, 1, 0, {}};
inline const Draw kChunk = cs::Command{cs::Verb::update, 0, 0, {}};
inline const Draw kPrompt = cs::Command{cs::Verb::right_chunk, 0, 0, {}};
inline const Draw kTrim = cs::Command{cs::Verb::trim, 0, 0, {}};
inline const Draw kFilter = cs::Command{cs::Verb::filter, 0, 0, {}};
inline const Draw kBadFilter = cs::Command{cs::Verb::filter, 0, 0, {-1}};
inline const Draw kExtend = cs::Command{cs::Verb::extend, 0, 0, {}};
inline const Draw kState = cs::Command{cs::Verb::reload, 1, 0, {}};
inline const Draw kToQuantized = cs::Command{cs::Verb::quantize, 1, 0, {}};
inline const Draw kMerge = cs::Command{cs::Verb::merge, 1, 0, {}};

// The step's name in traces and failure messages.
inline const char* draw_name(const Draw& d) {
  switch (d.verb) {
    case cs::Verb::merge: return "merge";
    case cs::Verb::update: return d.n == 1 ? "decode" : "chunk";
    case cs::Verb::right_chunk: return "prompt";
    case cs::Verb::trim: return "trim";
    case cs::Verb::filter: return d.keep.empty() ? "filter" : "bad filter";
    case cs::Verb::extend: return "extend";
    case cs::Verb::quantize: return "to_quantized";
    default: return "state";
  }
}

// The drawn command as its word of a repro line.
inline std::string word(const cs::Command& c) { return cs::script_str({c}); }

}  // namespace kvlab::prop::batch
