// Batch lifecycle properties (docs/semantics.md §Batch rotating cache,
// docs/lifecycle.md §Batch lifecycle, docs/traces.md §T4, docs/traces.md §T5,
// docs/upstream-bugs.md rows 19/20/24/25/26/41/44/45/51):
//   L1 BatchRotatingKVCache through a BatchGenerator-like life: right-padded prompts over
//      several chunks (last chunk possibly one token), decode, chunks, trim, filter (also
//      with bad indices), extend (fresh, empty, merged, restored, itself), merge of rings
//      that wrapped on their own, state round trips (also while a right pad is pending).
//      After every step: each row's offset, and extract == the newest min(offset,
//      max_size) real tokens of its log (while a right pad is pending: or rejected).
//   L2 filter / extend (BatchKVCache and BatchRotatingKVCache) leave the surviving rows'
//      attention outputs bit-identical.
// The row model is batch_util.h's RowLog: token t of row `id` is content(·, id, t, ·).
#include <algorithm>
#include <memory>
#include <string>

#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "property_tests/batch_util.h"
#include "property_tests/properties.h"
#include "property_tests/repro_line.h"

namespace kvlab::prop {

namespace {

using namespace batch;  // NOLINT: the helpers of this family

// L1's rig: the backend, the geometry and the row writes. Every ring went through
// BatchHooks::wrap and is reached through the Cache interface.
struct RotatingRig {
  const BatchHooks& bh;
  ReferenceBackend be;
  std::int64_t heads = 1, dim = 16, max_size = 4;
  std::int64_t next_id = 0;
  // What the last fresh() did, for the case's repro line: stored nothing, a left-padded
  // prompt of `tokens` columns (pads up to `lpad`), or a right-padded one (pads up to `rpad`).
  struct Made {
    bool right = false;
    std::int64_t tokens = 0, lpad = 0, rpad = 0;
  } made;

  void write(Cache& cache, std::vector<RowLog>& rows, std::int64_t n, bool pending) {
    cache.update(be.upload(next_block(Stream::key, rows, n, heads, dim, pending)),
                 be.upload(next_block(Stream::value, rows, n, heads, dim, pending)));
    for (RowLog& r : rows) {
      // Each concat first rolls the pads a row already wrote to its front (mlx-lm's
      // _update_concat with _lengths: docs/semantics.md §Batch rotating cache,
      // docs/traces.md §T5), so the offset counts only the newest.
      if (pending) r.pads = 0;
      advance(r, n, pending);
    }
  }

  // A right-padded prompt on every row (mlx-lm prepare(lengths=, right_padding=)):
  // real lengths 0..8, then pads to a common length, at least one pad somewhere.
  std::int64_t start_prompt(Cache& cache, std::vector<RowLog>& rows) {
    std::vector<std::int64_t> lens;
    for (std::size_t b = 0; b < rows.size(); ++b) lens.push_back(*rc::gen::inRange<std::int64_t>(0, 9));
    std::int64_t total = std::max<std::int64_t>(1, *std::max_element(lens.begin(), lens.end()));
    if (std::all_of(lens.begin(), lens.end(), [&](std::int64_t l) { return l == total; })) ++total;
    std::vector<std::int32_t> lengths, rp;
    for (std::size_t b = 0; b < rows.size(); ++b) {
      rows[b].real_left = lens[b];
      rows[b].pad_left = total - lens[b];
      rows[b].pads = 0;
      // A row whose prompt ends in pads may keep max_size − 1 real columns after it (see
      // RowLog::short_ok) until its next update.
      rows[b].short_ok = total > lens[b];
      lengths.push_back(static_cast<std::int32_t>(lens[b]));
      rp.push_back(static_cast<std::int32_t>(total - lens[b]));
    }
    verbs(cache).prepare({}, lengths, rp);
    return total;
  }

  static void finish_prompt(Cache& cache, std::vector<RowLog>& rows) {
    verbs(cache).finalize();
    for (RowLog& r : rows) r.pads = 0;
  }

  // A fresh batch of 1..max_b rows: left-padded prompts (lengths 1..12) in chunks, a
  // right-padded prompt over several chunks ending in finalize (docs/traces.md §T5), or (1 in 8)
  // nothing stored yet.
  std::unique_ptr<Cache> fresh(std::int64_t max_b, std::vector<RowLog>& rows) {
    const std::int64_t count = *rc::gen::inRange<std::int64_t>(1, max_b + 1);
    const int kind = *rc::gen::weightedElement<int>({{4, 0}, {3, 1}, {1, 2}});
    std::vector<RowLog> mine;
    std::unique_ptr<Cache> cache;
    if (kind == 1) {
      for (std::int64_t b = 0; b < count; ++b) mine.push_back({next_id++, 0});
      cache = bh.wrap(
          std::make_unique<BatchRotatingKVCache>(be, max_size, std::vector<std::int32_t>(mine.size(), 0)));
      made = {true, start_prompt(*cache, mine), 0, 0};
      for (const RowLog& r : mine) made.rpad = std::max(made.rpad, r.pad_left);
      for (std::int64_t left = made.tokens; left > 0;) {
        const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(left, 6) + 1);
        write(*cache, mine, n, true);
        left -= n;
      }
      finish_prompt(*cache, mine);
    } else {
      std::vector<std::int32_t> lp;
      std::int64_t longest = 0;
      for (std::int64_t b = 0; b < count; ++b) {
        const std::int64_t len = kind == 2 ? 0 : *rc::gen::inRange<std::int64_t>(1, 13);
        longest = std::max(longest, len);
        mine.push_back({next_id++, len});
      }
      for (RowLog& r : mine) {
        const std::int64_t pad = kind == 2 ? *rc::gen::inRange<std::int64_t>(0, 4) : longest - r.count;
        lp.push_back(static_cast<std::int32_t>(pad));
        r.count = -pad;
      }
      cache = bh.wrap(std::make_unique<BatchRotatingKVCache>(be, max_size, lp));
      made = {false, kind == 0 ? longest : 0, *std::max_element(lp.begin(), lp.end()), 0};
      if (kind == 0)
        for (const std::int64_t n : gen_split(longest)) write(*cache, mine, n, false);
    }
    rows.insert(rows.end(), mine.begin(), mine.end());
    return cache;
  }

  // extract(i) (the rows of the ring it hands out) == the newest min(count, max_size) real
  // tokens of row i.
  void check_extract(const Cache& cache, const RowLog& r, std::int64_t i, const std::string& at) {
    const std::int64_t real = std::max<std::int64_t>(0, r.count), want = std::min(real, max_size);
    const FetchedKV f = held_rows(*verbs(cache).extract_sequence(i));
    const std::int64_t n = f.length();
    if (!(n == want || (r.short_ok && n == max_size - 1 && n < real)))
      RC_FAIL(at + ": extract holds " + std::to_string(n) + " tokens of " + std::to_string(real) + " (max_size " +
              std::to_string(max_size) + ")");
    if (n == 0) return;
    expect_same_tensor(be.download(f.keys), row_block(Stream::key, r.id, real - n, n, heads, dim), at + " keys");
    expect_same_tensor(be.download(f.values), row_block(Stream::value, r.id, real - n, n, heads, dim), at + " values");
  }

  void check(const Cache& cache, const std::vector<RowLog>& rows, bool pending, const char* when) {
    RC_ASSERT(verbs(cache).batch_size() == static_cast<std::int64_t>(rows.size()));
    const std::vector<std::int32_t> off = cache.offsets();
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const std::string at = "BatchRotatingKVCache row " + std::to_string(b) + " after " + when;
      if (off[b] != rows[b].offset())
        RC_FAIL(at + ": offset " + std::to_string(off[b]) + " vs log " + std::to_string(rows[b].offset()));
      if (!pending) {
        check_extract(cache, rows[b], static_cast<std::int64_t>(b), at);
        continue;
      }
      // While a right pad is pending: rejected, or exactly the real tokens (PR #1746).
      bool rejected = false;
      try {
        verbs(cache).extract_sequence(static_cast<std::int64_t>(b));
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::misuse) RC_FAIL(at + ": extract while a right pad is pending: " + e.what());
        rejected = true;
      }
      if (!rejected) check_extract(cache, rows[b], static_cast<std::int64_t>(b), at + " (right pad pending)");
    }
  }

  // Each row extracted, continued alone by 0..3 decodes (its ring may wrap), merged back.
  // Each row extracted and continued alone by 0..3 decodes (`continued` tells whether any
  // was), then the singles merged.
  std::unique_ptr<Cache> merge_rows(const Cache& cache, std::vector<RowLog>& rows, bool& continued) {
    std::vector<std::unique_ptr<Cache>> singles;
    std::vector<const Cache*> ptrs;
    for (std::size_t b = 0; b < rows.size(); ++b) {
      singles.push_back(verbs(cache).extract_sequence(static_cast<std::int64_t>(b)));
      RowLog& r = rows[b];
      r.count = std::max<std::int64_t>(r.count, 0);
      for (std::int64_t d = *rc::gen::inRange<std::int64_t>(0, 4); d > 0; --d) {
        singles.back()->update(be.upload(row_block(Stream::key, r.id, r.count, 1, heads, dim)),
                               be.upload(row_block(Stream::value, r.id, r.count, 1, heads, dim)));
        advance(r, 1, false);
        continued = true;
      }
      ptrs.push_back(singles.back().get());
    }
    return bh.wrap(bh.merge(be, ptrs));
  }
};

}  // namespace

void batch_rotating_lifecycle(const Hooks&, const BatchHooks& bh) {
  RotatingRig rig{bh, {}};
  rig.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  rig.max_size = *rc::gen::inRange<std::int64_t>(2, 9);
  std::vector<RowLog> rows;
  CaseSize& size = last_failure_size();
  size = {1, 0};
  auto cache = rig.fresh(6, rows);
  Pending pending;
  RC_LOG() << "max_size " << rig.max_size << ", fresh rows " << rows_str(rows) << "\n";
  // The case as a `cache kind=batch_rotating` line (repro_line.h), logged if a check fails.
  BatchCase line_case;
  line_case.kind = Kind::batch_rotating;
  line_case.batch = static_cast<std::int64_t>(rows.size());
  line_case.heads = rig.heads, line_case.dim = rig.dim, line_case.max_size = rig.max_size;
  ReproScript line;
  const ReproOnFailure log_line(line_case, line);
  line.note("the property's K/V go through update(), not attend()");
  const auto say = [&line](const cs::Command& c) { line.tokens.push_back(cs::script_str({c})); };
  const auto say_fresh = [&](const RotatingRig::Made& m) {
    line_case.lpad = std::max(line_case.lpad, m.lpad);
    line_case.rpad = std::max(line_case.rpad, m.rpad);
  };
  say_fresh(rig.made);
  if (rig.made.right) {
    say({cs::Verb::right_chunk, rig.made.tokens, 0, {}});
    say({cs::Verb::finalize, 1, 0, {}});
  } else if (rig.made.tokens > 0) {
    say({cs::Verb::update, rig.made.tokens, 0, {}});
  }
  rig.check(*cache, rows, false, "prefill");
  const auto script = *rc::gen::container<std::vector<Draw>>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 13)),
      rc::gen::weightedElement<Draw>({{4, kDecode}, {2, kChunk}, {3, kPrompt}, {1, kTrim}, {1, kFilter},
                                      {1, kBadFilter}, {2, kExtend}, {2, kMerge}, {2, kState}}));
  for (Draw d : script) {
    ++size.steps;
    if (d == kPrompt && pending) d = kChunk;
    if (d == kPrompt && std::any_of(rows.begin(), rows.end(), [](const RowLog& r) { return r.count < 0; }))
      d = kDecode;  // a prompt needs every row's left padding consumed
    if (d == kMerge && pending) d = kState;
    if (d == kExtend && rows.size() >= 6) d = kFilter;
    const cs::Verb verb = d.verb;
    if (verb == cs::Verb::merge) {
      say(d);
      bool continued = false;
      cache = rig.merge_rows(*cache, rows, continued);
      if (continued) line.note("rows continued alone between their extract and the merge (j merges them as they are)");
    } else if (verb == cs::Verb::update) {
      if (pending && pending.left == 0) {
        RotatingRig::finish_prompt(*cache, rows);
        pending = {};
        say({cs::Verb::finalize, 1, 0, {}});
      } else {
        const std::int64_t most = pending ? pending.left : 2 * rig.max_size + 2;
        // In a pending prompt, decode = a one-token chunk (mlx-vlm 75f50e84,
        // docs/upstream-bugs.md row 25).
        const std::int64_t n = d.n == 1 ? 1 : gen_chunk(most);
        if (!pending) say({cs::Verb::update, n, 0, {}});  // a prompt's columns are in its rN
        rig.write(*cache, rows, n, pending.on);
        if (pending) pending.left -= n;
        size.tokens += n;
      }
    } else if (verb == cs::Verb::right_chunk) {
      pending = {true, rig.start_prompt(*cache, rows)};
      // The whole right-padded prompt is one rN here; the property writes it in pieces.
      say({cs::Verb::right_chunk, pending.left, 0, {}});
      for (const RowLog& r : rows) line_case.rpad = std::max(line_case.rpad, r.pad_left);
    } else if (verb == cs::Verb::trim) {
      std::int64_t most = 0;
      for (const RowLog& r : rows) most = std::max(most, r.count);
      const std::int64_t n = *rc::gen::inRange<std::int64_t>(0, most + 1);
      if (pending) {
        if (n > 0) line.note("a trim rejected while a right pad is pending");
        expect_rejected([&] { cache->trim(n); }, ErrorKind::misuse, "trim while a right pad is pending");
      } else if (!cache->is_trimmable() && n > 0) {
        say({cs::Verb::trim, n, 0, {}});  // tN leaves a wrapped ring as it is
        expect_rejected([&] { cache->trim(n); }, ErrorKind::misuse, "trim of a ring that evicted tokens");
      } else {
        if (n > 0) say({cs::Verb::trim, n, 0, {}});
        const std::int64_t removed = cache->trim(n);
        if (removed != n) RC_FAIL("trim(" + std::to_string(n) + ") removed " + std::to_string(removed));
        for (RowLog& r : rows) r.count -= n;
      }
    } else if (verb == cs::Verb::filter && d.keep.empty()) {
      const std::vector<std::int32_t> idx = gen_keep(rows.size());
      say({cs::Verb::filter, 0, 0, idx});
      verbs(*cache).filter(idx);
      rows = pick(rows, idx);
    } else if (verb == cs::Verb::filter) {
      const std::vector<std::int32_t> idx = gen_bad_keep(rows.size());
      line.note("a rejected filter");
      expect_rejected([&] { verbs(*cache).filter(idx); }, ErrorKind::invalid_argument,
                      "filter(" + list_str(idx) + ") of " + std::to_string(rows.size()) + " rows");
    } else if (verb == cs::Verb::extend) {
      std::vector<RowLog> joined;
      const int kind = *rc::gen::inRange(0, 4);
      std::unique_ptr<Cache> other;
      if (kind == 3 && rows.size() * 2 <= 6) {
        joined = rows;  // with itself
      } else {
        other = rig.fresh(6 - static_cast<std::int64_t>(rows.size()), joined);
        bool continued = false;
        if (kind == 1) other = rig.merge_rows(*other, joined, continued);  // capacity = its columns, maybe wrapped rows
        if (kind == 2) other = bh.wrap(bh.restore(rig.be, other->state()));
      }
      const Cache& with = other ? *other : *cache;
      if (pending) {
        line.note("an extend rejected while a right pad is pending");
        expect_rejected([&] { verbs(*cache).extend(with); }, ErrorKind::misuse, "extend while a right pad is pending");
      } else {
        if (!other) {
          line.note("extend by itself");
        } else {
          // The line's new rows attend one left-padded chunk; the property's may be a
          // right-padded prompt, empty, or merged rows.
          if (rig.made.right || rig.made.tokens == 0 || kind == 1) line.note("extend by another kind of batch");
          say_fresh(rig.made);
          say({cs::Verb::extend, std::max<std::int64_t>(1, rig.made.tokens),
               static_cast<std::int64_t>(joined.size()), {}});
        }
        verbs(*cache).extend(with);
        rows.insert(rows.end(), joined.begin(), joined.end());
      }
    } else {
      say({cs::Verb::reload, 1, 0, {}});
      cache = bh.wrap(bh.restore(rig.be, cache->state()));
    }
    RC_LOG() << draw_name(d) << " -> rows " << rows_str(rows)
             << (pending ? " pending " + std::to_string(pending.left) : "") << "\n";
    rig.check(*cache, rows, pending.on, draw_name(d));
  }
  if (pending) {
    if (pending.left > 0) rig.write(*cache, rows, pending.left, true);
    RotatingRig::finish_prompt(*cache, rows);
    say({cs::Verb::finalize, 1, 0, {}});
    rig.check(*cache, rows, false, "finalize");
  }
}

namespace {

// L2's caches: BatchKVCaches or BatchRotatingKVCaches behind BatchHooks::wrap, attended
// through the Cache interface.
struct AttendRig {
  const BatchHooks& bh;
  ReferenceBackend be;
  Config cfg;
  AttendOptions opts;
  std::int64_t next_id = 0;
  bool rotating = false;

  // Attends the rows' next n columns (token index c − lp: padding queries are unspecified,
  // docs/kernels.md §Fully masked rows, and never compared); returns the output (B, Hq, n, Dv).
  Tensor step(Cache& c, std::vector<RowLog>& rows, std::int64_t n) {
    const AttendResult r = attend(c, be.upload(next_block(Stream::query, rows, n, cfg.q_heads(), cfg.dk, false)),
                                  be.upload(next_block(Stream::key, rows, n, cfg.kv_heads, cfg.dk, false)),
                                  be.upload(next_block(Stream::value, rows, n, cfg.kv_heads, cfg.dv, false)), opts);
    for (RowLog& row : rows) advance(row, n, false);
    return be.download(r.out);
  }

  // 1..max_b left-padded prompts of 1..10 tokens, prefilled through attend in chunks.
  std::unique_ptr<Cache> fresh(std::int64_t max_b, std::vector<RowLog>& rows) {
    const std::int64_t count = *rc::gen::inRange<std::int64_t>(1, max_b + 1);
    std::vector<RowLog> mine;
    std::vector<std::int32_t> lp;
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < count; ++b) {
      mine.push_back({next_id++, *rc::gen::inRange<std::int64_t>(1, 11)});
      longest = std::max(longest, mine.back().count);
    }
    for (RowLog& r : mine) {
      lp.push_back(static_cast<std::int32_t>(longest - r.count));
      r.count -= longest;
    }
    std::unique_ptr<Cache> c;
    if (rotating) c = std::make_unique<BatchRotatingKVCache>(be, cfg.max_size, lp);
    else c = std::make_unique<BatchKVCache>(be, lp);
    c = bh.wrap(std::move(c));
    for (const std::int64_t n : gen_split(longest)) step(*c, mine, n);
    rows.insert(rows.end(), mine.begin(), mine.end());
    return c;
  }

  // A copy to change beside the original (a real copy, then wrapped like the original).
  std::unique_ptr<Cache> clone(const Cache& c) { return bh.wrap(clone_cache(c)); }
};

}  // namespace

// The same step, attended on a cache and on its filtered or extended copy, gives the
// surviving rows bit-identical outputs: each row sees the same real keys in the same
// order at the same positions, and the reference SDPA never reads a hidden key (the
// argument of B3). Ring steps are chunks of 2..4 tokens, whose keys come back in
// temporal order on both sides (a single-token ring write returns physical order, which
// an extend that re-linearises changes; the sums would then differ in rounding only).
void batch_attend_survives_filter_extend(const Hooks&, const BatchHooks& bh) {
  AttendRig rig{bh, {}, {}, {}};
  rig.rotating = *rc::gen::arbitrary<bool>();
  rig.cfg.kind = rig.rotating ? Kind::rotating : Kind::kv;
  rig.cfg.kv_heads = *rc::gen::inRange<std::int64_t>(1, 3);
  rig.cfg.q_ratio = *rc::gen::inRange<std::int64_t>(1, 3);
  rig.cfg.dk = rig.cfg.dv = 16;
  rig.cfg.rope_dims = *rc::gen::element(0, 16);
  rig.cfg.max_size = rig.rotating ? *rc::gen::inRange<std::int64_t>(3, 11) : 0;
  rig.opts = attend_options(rig.cfg);
  std::vector<RowLog> rows;
  std::unique_ptr<Cache> batch = rig.fresh(5, rows);
  CaseSize& size = last_failure_size();
  size = {0, 0};
  for (int round = *rc::gen::inRange(1, 5); round > 0; --round) {
    const bool extend = rows.size() < 6 && *rc::gen::arbitrary<bool>();
    std::unique_ptr<Cache> copy = rig.clone(*batch);
    std::vector<RowLog> kept;
    std::vector<std::int32_t> from;  // copy row j continues batch row from[j] (−1: joined)
    if (extend) {
      const std::unique_ptr<Cache> other = rig.fresh(6 - static_cast<std::int64_t>(rows.size()), kept);
      std::vector<RowLog> joined = kept;
      kept = rows;
      kept.insert(kept.end(), joined.begin(), joined.end());
      for (std::size_t b = 0; b < kept.size(); ++b)
        from.push_back(b < rows.size() ? static_cast<std::int32_t>(b) : -1);
      verbs(*copy).extend(*other);
    } else {
      from = gen_keep(rows.size());
      kept = pick(rows, from);
      verbs(*copy).filter(from);
    }
    const std::int64_t n = rig.rotating ? *rc::gen::inRange<std::int64_t>(2, 5) : *rc::gen::inRange<std::int64_t>(1, 5);
    ++size.steps;
    size.tokens += n;
    RC_LOG() << (extend ? "extend" : "filter") << " then " << n << " tokens: rows " << rows_str(rows) << " -> "
             << rows_str(kept) << "\n";
    std::vector<RowLog> before = rows;
    const Tensor want = rig.step(*batch, before, n);
    const Tensor got = rig.step(*copy, kept, n);
    for (std::size_t j = 0; j < from.size(); ++j) {
      if (from[j] < 0) continue;
      expect_same_tensor(slice_row(got, static_cast<std::int64_t>(j), 0, n), slice_row(want, from[j], 0, n),
                         std::string(rig.rotating ? "BatchRotatingKVCache" : "BatchKVCache") + " row " +
                             std::to_string(j) + " after " + (extend ? "extend" : "filter") + " (vs before)");
    }
    batch = std::move(copy);
    rows = kept;
  }
}

}  // namespace kvlab::prop
