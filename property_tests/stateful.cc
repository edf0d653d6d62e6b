// Stateful model-based tests of KVCache, RotatingKVCache (keep 0 and > 0),
// QuantizedKVCache (every affine bit width, groups 32/64/128, both roundings),
// ChunkedKVCache and TurboQuantKVCache (their model parts: chunked_turboquant.cc).
//
// One Model/Sut/Command type for every kind keeps rc::state instantiated once (compile
// cost, docs/toolchain.md §Test frameworks). After every command the observables
// (docs/design.md §Observables) are checked against the token-log model: offsets, kind, kv_length,
// trimmability, logical content (exact bits; quantized: the packed codes of the per-row quantized
// model rows), what the update returned, attention output, positions, state round trips.
#include <rapidcheck/state.h>

#include <algorithm>
#include <numeric>

#include "property_tests/properties.h"
#include "property_tests/repro_line.h"

namespace kvlab::prop {

namespace {

using Cmd = rc::state::Command<Model, Sut>;
using CmdPtr = std::shared_ptr<const Cmd>;

struct CacheCmd : Cmd {
  virtual std::int64_t tokens() const { return 0; }
  // This command in the cache op's script language (repro_line.h), given the model
  // before it runs: a token, or a note when the language has no such command.
  virtual void script(ReproScript& r, const Model& before) const = 0;
};

// Chunk lengths 1..300: mostly short (CI time), sometimes long enough to cross the
// 256-row growth step of KVCache/QuantizedKVCache (docs/semantics.md §Common rules) in one update.
rc::Gen<std::int64_t> gen_chunk() {
  return rc::gen::weightedOneOf<std::int64_t>({{12, rc::gen::inRange<std::int64_t>(1, 9)},
                                               {6, rc::gen::inRange<std::int64_t>(9, 48)},
                                               {1, rc::gen::inRange<std::int64_t>(48, 301)}});
}

std::int64_t clamp_tokens(const Model& m, std::int64_t n) {
  return std::max<std::int64_t>(1, std::min(n, max_tokens(m.cfg.kind) - m.offset));
}

// update() / update_quantized() chosen by the cache's kind, as a correct model file does.
struct Update : CacheCmd {
  std::int64_t n;
  explicit Update(const Model& m) : n(clamp_tokens(m, *gen_chunk())) {}
  std::int64_t tokens() const override { return n; }
  void checkPreconditions(const Model& m) const override { RC_PRE(m.offset + n <= max_tokens(m.cfg.kind)); }
  void apply(Model& m) const override { m.append(n, false); }
  void run(const Model& m, Sut& sut) const override {
    const std::vector<std::int64_t> pos = m.returned_positions(n);
    Model after = m;
    after.append(n, false);
    const DTensor k = sut.be.upload(sut.raw(Stream::key, m.offset, n));
    const DTensor v = sut.be.upload(sut.raw(Stream::value, m.offset, n));
    if (sut.cache->is_quantized()) {
      const FetchedQuantizedKV f = sut.cache->update_quantized(k, v);
      check_fetched(sut, after, pos, nullptr, &f, false);
    } else {
      const FetchedKV f = sut.cache->update(k, v);
      check_fetched(sut, after, pos, &f, nullptr, m.cfg.kind == Kind::rotating && n == 1);
    }
    // TurboQuant's update returned its decoded content, just checked: no second decode.
    check_observables(sut, after, m.cfg.kind != Kind::turboquant);
  }
  void show(std::ostream& os) const override {
    if (n == 1) os << "Decode";
    else os << "Prefill(" << n << ")";
    os << " [u" << n << "]";
  }
  void script(ReproScript& r, const Model&) const override { r.tokens.push_back("u" + std::to_string(n)); }
};

// The attention step through hooks.attend: q/k/v pre-RoPE at positions offset + t.
struct Attend : CacheCmd {
  std::int64_t n;
  explicit Attend(const Model& m)
      : n(clamp_tokens(m, *rc::gen::weightedOneOf<std::int64_t>({{6, rc::gen::inRange<std::int64_t>(1, 3)},
                                                                  {3, rc::gen::inRange<std::int64_t>(3, 12)},
                                                                  {1, rc::gen::inRange<std::int64_t>(12, 40)}}))) {}
  std::int64_t tokens() const override { return n; }
  void checkPreconditions(const Model& m) const override { RC_PRE(m.offset + n <= max_tokens(m.cfg.kind)); }
  void apply(Model& m) const override { m.append(n, m.cfg.rope_dims > 0); }
  void run(const Model& m, Sut& sut) const override {
    const std::vector<std::int64_t> pos = m.returned_positions(n);
    Model after = m;
    after.append(n, m.cfg.rope_dims > 0);
    sut.attended_keys(m.offset, n, after);
    const DTensor q = sut.be.upload(sut.raw(Stream::query, m.offset, n));
    const DTensor k = sut.be.upload(sut.raw(Stream::key, m.offset, n));
    const DTensor v = sut.be.upload(sut.raw(Stream::value, m.offset, n));
    const AttendResult r = sut.hooks.attend(*sut.cache, q, k, v, attend_options(sut.cfg));
    check_attend(sut, after, pos, n, r);
    if (m.cfg.kind == Kind::turboquant) check_turbo_attend_reads_decoded(sut, r, m.offset, n);
    check_fetched(sut, after, pos, r.kv ? &*r.kv : nullptr, r.quantized_kv ? &*r.quantized_kv : nullptr,
                  m.cfg.kind == Kind::rotating && n == 1);
    check_observables(sut, after, m.cfg.kind != Kind::turboquant);
  }
  void show(std::ostream& os) const override { os << "Attend(" << n << ") [" << token() << "]"; }
  std::string token() const { return n == 1 ? "d" : "p" + std::to_string(n); }
  void script(ReproScript& r, const Model&) const override { r.tokens.push_back(token()); }
};

struct Trim : CacheCmd {
  std::int64_t n;
  explicit Trim(const Model& m) : n(*rc::gen::inRange<std::int64_t>(0, m.offset + 3)) {}
  void checkPreconditions(const Model& m) const override { RC_PRE(m.trimmable()); }
  void apply(Model& m) const override { m.trim(n); }
  void run(const Model& m, Sut& sut) const override {
    RC_ASSERT(sut.cache->trim(n) == std::min(n, m.trim_limit()));
    Model after = m;
    after.trim(n);
    check_observables(sut, after);
  }
  void show(std::ostream& os) const override {
    os << "Trim(" << n << ")";
    if (n > 0) os << " [t" << n << "]";
  }
  // Trim(0) changes nothing: the script has no t0 and needs none.
  void script(ReproScript& r, const Model&) const override {
    if (n > 0) r.tokens.push_back("t" + std::to_string(n));
  }
};

// state() → hooks.restore (cache_from_state): the restored cache has the same state and
// continues like the original (checked by the commands that follow).
struct SaveLoad : CacheCmd {
  explicit SaveLoad(const Model&) {}
  void apply(Model&) const override {}
  void run(const Model& m, Sut& sut) const override {
    const CacheState s = sut.cache->state();
    std::unique_ptr<Cache> restored = sut.hooks.restore(sut.be, s);
    check_same_state(restored->state(), s);
    sut.replace(std::move(restored));
    check_observables(sut, m);
  }
  void show(std::ostream& os) const override { os << "SaveLoad [s]"; }
  void script(ReproScript& r, const Model&) const override { r.tokens.push_back("s"); }
};

// maybe_quantize_kv_caches over this one layer mid-sequence (mlx-lm#495: per layer,
// offset >= start; mlx-lm#1573: a ring layer is kept plain, never raises).
struct QuantizePolicy : CacheCmd {
  std::int64_t start;
  explicit QuantizePolicy(const Model& m) : start(*rc::gen::inRange<std::int64_t>(0, m.offset + 2)) {}
  void checkPreconditions(const Model& m) const override { RC_PRE(allowed(m)); }
  // Chunked and TurboQuant layers have no affine form and must be skipped.
  static bool allowed(const Model& m) {
    return !m.quantized && (m.cfg.kind != Kind::kv || m.cfg.quantizable);
  }
  static bool converts(const Model& m, std::int64_t s) { return m.cfg.kind == Kind::kv && m.offset >= s; }
  void apply(Model& m) const override {
    if (converts(m, start)) m.quantized = true;
  }
  void run(const Model& m, Sut& sut) const override {
    std::vector<std::unique_ptr<Cache>> layers;
    layers.push_back(std::move(sut.cache));
    std::vector<QuantizeDecision> report;
    try {
      report = sut.hooks.quantize_policy(layers, sut.cfg.spec, sut.cfg.rounding, start);
    } catch (...) {
      sut.cache = std::move(layers[0]);
      throw;
    }
    RC_ASSERT(report.size() == 1u);
    const std::string want = m.cfg.kind == Kind::rotating ? "kept-unquantized"
                             : m.cfg.kind != Kind::kv     ? "skipped"
                             : converts(m, start)         ? "quantized"
                                                          : "below-start";
    if (report[0].action != want) RC_FAIL("policy action " + report[0].action + ", expected " + want);
    sut.replace(std::move(layers[0]));
    Model after = m;
    apply(after);
    check_observables(sut, after);
  }
  void show(std::ostream& os) const override { os << "QuantizePolicy(start=" << start << ")"; }
  void script(ReproScript& r, const Model&) const override { r.tokens.push_back("m" + std::to_string(start)); }
};

// Prefix-cache snapshot of a ring (keep 0, B 1): the last min(offset, max) tokens,
// re-adopted (mlx-lm#1114, vllm-mlx#256).
struct Extract : CacheCmd {
  explicit Extract(const Model&) {}
  // Shrinking drops commands; a sequence whose Extract lost its tokens is not a case.
  void checkPreconditions(const Model& m) const override { RC_PRE(allowed(m)); }
  static bool allowed(const Model& m) {
    return m.cfg.kind == Kind::rotating && m.cfg.keep == 0 && m.cfg.batch == 1 && m.offset > 0;
  }
  void apply(Model& m) const override { m.stored = std::min(m.offset, m.cfg.max_size); }
  void run(const Model& m, Sut& sut) const override {
    sut.replace(sut.hooks.extract(sut.be, *sut.cache));
    Model after = m;
    apply(after);
    check_observables(sut, after);
  }
  void show(std::ostream& os) const override { os << "Extract"; }
  void script(ReproScript& r, const Model&) const override { r.tokens.push_back("e"); }
};

// llama4 calls maybe_trim_front() before each chunked layer's update; here it is its own
// command so that updates also run on a cache that was not trimmed (both are legal).
struct TrimFront : CacheCmd {
  explicit TrimFront(const Model&) {}
  void checkPreconditions(const Model& m) const override { RC_PRE(m.cfg.kind == Kind::chunked); }
  void apply(Model& m) const override { m.trim_front(); }
  void run(const Model& m, Sut& sut) const override {
    sut.hooks.trim_front(sut.cache);
    Model after = m;
    after.trim_front();
    check_observables(sut, after);
  }
  void show(std::ostream& os) const override { os << "TrimFront"; }
  // The script also trims a chunked cache's front before every update and attention
  // (llama4's order); only a case that relies on updating an untrimmed cache replays
  // differently, hence the note.
  void script(ReproScript& r, const Model&) const override {
    r.tokens.push_back("c");
    r.note("TrimFront placement (the script also trims before every update/attention)");
  }
};

template <class C>
CmdPtr make(const Model& m) {
  return std::make_shared<const C>(m);
}

// Weighted choice among the commands valid in this state; shrinks towards Update.
rc::Gen<CmdPtr> gen_command(const Model& m) {
  return rc::gen::exec([m]() -> CmdPtr {
    std::vector<std::pair<int, CmdPtr (*)(const Model&)>> menu;
    if (m.offset < max_tokens(m.cfg.kind)) {
      menu.emplace_back(8, &make<Update>);
      menu.emplace_back(5, &make<Attend>);
    }
    if (m.cfg.kind == Kind::chunked) menu.emplace_back(5, &make<TrimFront>);
    // A TurboQuant restore rebuilds its codecs (a Lloyd–Max codebook each): rarer there.
    menu.emplace_back(m.cfg.kind == Kind::turboquant ? 1 : 2, &make<SaveLoad>);
    if (m.trimmable()) menu.emplace_back(2, &make<Trim>);
    if (QuantizePolicy::allowed(m)) menu.emplace_back(1, &make<QuantizePolicy>);
    if (Extract::allowed(m)) menu.emplace_back(1, &make<Extract>);
    int total = 0;
    for (const auto& e : menu) total += e.first;
    // Full size: rc::gen::inRange scales its range with the (already scaled) size, which
    // would starve the commands late in the menu.
    int pick = *rc::gen::resize(100, rc::gen::inRange(0, total));
    for (const auto& e : menu) {
      if (pick < e.first) return e.second(m);
      pick -= e.first;
    }
    return menu.front().second(m);
  });
}

}  // namespace

CaseSize& last_failure_size() {
  static CaseSize size;
  return size;
}

rc::Gen<Config> gen_config(Kind kind) {
  return rc::gen::exec([kind] {
    Config c;
    c.kind = kind;
    // B 1..2 in CI: the rows of a single-sequence cache share one offset and one code
    // path, and every check scales with B (3..8 now and then costs markedly more CI time:
    // docs/ci.md §Test costs).
    // The deep run draws B up to 8; in CI, R1/R2 (regressions.cc), where rows differ
    // (per-row RoPE offsets, per-row padding), and the batch properties run B up to 8.
    c.batch = real_dims() ? *rc::gen::weightedOneOf<std::int64_t>({{3, rc::gen::inRange<std::int64_t>(1, 3)},
                                                                   {1, rc::gen::inRange<std::int64_t>(3, 9)}})
                          : *rc::gen::inRange<std::int64_t>(1, 3);
    c.q_ratio = *rc::gen::elementOf(std::vector<std::int64_t>{1, 2, 4, 8});  // GQA ratios
    c.kv_heads = c.q_ratio == 8 ? 1 : *rc::gen::inRange<std::int64_t>(1, 3);
    std::vector<std::int64_t> dims{32, 32, 32, 64, 64, 128};
    if (real_dims()) dims = kind == Kind::quantized ? std::vector<std::int64_t>{64, 128, 256}
                                                    : std::vector<std::int64_t>{64, 80, 128, 256};
    c.dk = *rc::gen::elementOf(dims);
    c.dv = *rc::gen::weightedOneOf<std::int64_t>({{2, rc::gen::just(c.dk)}, {1, rc::gen::elementOf(dims)}});
    c.rope_dims = static_cast<int>(*rc::gen::elementOf(std::vector<std::int64_t>{0, c.dk, c.dk / 2}));
    const std::int64_t g = std::gcd(c.dk, c.dv);
    std::vector<int> groups;
    for (const int gs : {32, 64, 128})
      if (g % gs == 0) groups.push_back(gs);
    c.quantizable = !groups.empty();
    if (c.quantizable) {
      c.spec = QuantSpec::make(QuantMode::affine, *rc::gen::elementOf(std::vector<int>{2, 3, 4, 5, 6, 8}),
                               *rc::gen::elementOf(groups));
      c.rounding = *rc::gen::elementOf(std::vector<Rounding>{Rounding::mlx_cpu, Rounding::mlx_gpu});
    }
    if (kind == Kind::chunked) gen_chunked_options(c);
    if (kind == Kind::turboquant) gen_turbo_options(c);
    if (kind == Kind::rotating) {
      c.max_size = *rc::gen::weightedOneOf<std::int64_t>({{4, rc::gen::inRange<std::int64_t>(1, 9)},
                                                          {3, rc::gen::inRange<std::int64_t>(9, 40)},
                                                          {1, rc::gen::inRange<std::int64_t>(40, 300)}});
      c.keep = c.max_size == 1 ? 0
                               : *rc::gen::weightedOneOf<std::int64_t>(
                                     {{2, rc::gen::just<std::int64_t>(0)},
                                      {1, rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(c.max_size, 5))}});
      if (c.max_size > 1 && *rc::gen::resize(100, rc::gen::inRange(0, 3)) == 0)
        c.window = static_cast<int>(*rc::gen::inRange<std::int64_t>(1, c.max_size));
    } else if (*rc::gen::resize(100, rc::gen::inRange(0, 4)) == 0) {
      c.window = *rc::gen::inRange(1, 64);
    }
    return c;
  });
}

void stateful_case(Kind kind, const Hooks& hooks) {
  Model m0;
  m0.cfg = *gen_config(kind);
  m0.quantized = kind == Kind::quantized;
  // Up to ~40 commands per case (RapidCheck's size 0..100 scaled); ~20 for TurboQuant,
  // whose updates decode the whole cache and whose restores rebuild codebooks.
  const auto cmds =
      *rc::gen::scale(kind == Kind::turboquant ? 0.2 : 0.4, rc::state::gen::commands(m0, &gen_command));
  // The case as one `cache` problem line, logged with every counterexample (RapidCheck
  // prints the log of the final, shrunk case only). gen_command makes every command,
  // and each is a CacheCmd.
  ReproScript script;
  Model walk = m0;
  for (const auto& c : cmds) {
    c->checkPreconditions(walk);  // a shrunk list may hold invalid steps: runAll discards it too
    static_cast<const CacheCmd&>(*c).script(script, walk);
    c->apply(walk);
  }
  const std::string repro = repro_line(m0.cfg, script).text(prop_backend_name());
  RC_LOG() << repro << "\n";
  Sut sut(m0.cfg, hooks);
  try {
    rc::state::runAll(cmds, m0, sut);
  } catch (...) {
    CaseSize& s = last_failure_size();
    s = {static_cast<std::int64_t>(cmds.size()), 0};
    for (const auto& c : cmds) s.tokens += static_cast<const CacheCmd&>(*c).tokens();
    last_failure_repro() = repro;
    throw;
  }
}

}  // namespace kvlab::prop
