#include "cache/cache_script.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>

#include "cache/batch_cache.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "core/split.h"
#include "kvlab/error.h"

namespace kvlab::cache_script {

namespace {

// ---- grammar ---------------------------------------------------------------------------

// A decimal without sign or leading zeros that fits int32; nullopt otherwise.
std::optional<std::int64_t> number(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::int32_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

Command parse_command(std::string_view word, std::string_view text) {
  auto bad = [&](std::string_view why) -> Command {
    fail(ErrorKind::invalid_argument, cat("script '", text, "': command '", word, "' ", why,
                                          " (commands: pN, d, dN, uN, tN, a, s, q, mN, e, c, rN, f, kI_J_..., xRpN, j, wI_J_..., i, gI_J_...)"));
  };
  if (word.empty()) return bad("is empty");
  const char head = word[0];
  const std::string_view rest = word.substr(1);
  auto count = [&](std::int64_t min) {
    const auto n = number(rest);
    if (!n || *n < min) bad(cat("needs a count >= ", min, " without leading zeros"));
    return *n;
  };
  switch (head) {
    case 'p': return {Verb::chunk, count(1), 0, {}};
    case 'd': return {Verb::decode, rest.empty() ? 1 : count(1), 0, {}};
    case 't': return {Verb::trim, count(1), 0, {}};
    case 'u': return {Verb::update, count(1), 0, {}};
    case 'r': return {Verb::right_chunk, count(1), 0, {}};
    case 'm': return {Verb::policy, count(0), 0, {}};
    case 'a':
    case 's':
    case 'f':
    case 'q':
    case 'e':
    case 'c': {
      if (!rest.empty()) return bad("takes no argument");
      const Verb verb = head == 'a'   ? Verb::shared
                        : head == 's' ? Verb::reload
                        : head == 'f' ? Verb::finalize
                        : head == 'q' ? Verb::quantize
                        : head == 'e' ? Verb::extract
                                      : Verb::trim_front;
      return {verb, 0, 0, {}};
    }
    case 'k':
    case 'w':
    case 'g': {
      Command c{head == 'k' ? Verb::filter : head == 'w' ? Verb::write_ids : Verb::get, 0, 0, {}};
      std::vector<std::int32_t>& list = head == 'k' ? c.keep : c.ids;
      for (std::string_view index : split_fields(rest, '_')) {
        const auto i = number(index);
        if (!i) return bad(head == 'k' ? "needs row indices joined by '_'" : "needs token ids joined by '_'");
        list.push_back(static_cast<std::int32_t>(*i));
      }
      return c;
    }
    case 'i':
    case 'j':
      if (!rest.empty()) return bad("takes no argument");
      return {head == 'i' ? Verb::insert : Verb::merge, 0, 0, {}};
    case 'x': {
      const std::size_t at = rest.find('p');
      const auto rows = number(rest.substr(0, at));
      const auto tokens = at == std::string_view::npos ? std::nullopt : number(rest.substr(at + 1));
      if (!rows || !tokens || *rows < 1 || *tokens < 1) return bad("needs the form xRpN with R, N >= 1");
      return {Verb::extend, *tokens, *rows, {}};
    }
    default: return bad("is unknown");
  }
}

std::string command_str(const Command& c) {
  switch (c.verb) {
    case Verb::chunk: return c.n == 1 ? "d" : cat("p", c.n);
    case Verb::decode: return c.n == 1 ? "d" : cat("d", c.n);
    case Verb::update: return cat("u", c.n);
    case Verb::trim: return cat("t", c.n);
    case Verb::shared: return "a";
    case Verb::reload: return "s";
    case Verb::right_chunk: return cat("r", c.n);
    case Verb::finalize: return "f";
    case Verb::filter:
    case Verb::write_ids:
    case Verb::get: {
      std::string s = c.verb == Verb::filter ? "k" : c.verb == Verb::write_ids ? "w" : "g";
      const std::vector<std::int32_t>& list = c.verb == Verb::filter ? c.keep : c.ids;
      for (std::size_t i = 0; i < list.size(); ++i) s += cat(i ? "_" : "", list[i]);
      return s;
    }
    case Verb::insert: return "i";
    case Verb::merge: return "j";
    case Verb::extend: return cat("x", c.rows, "p", c.n);
    case Verb::quantize: return "q";
    case Verb::policy: return cat("m", c.n);
    case Verb::extract: return "e";
    case Verb::trim_front: return "c";
  }
  return "?";
}

// p1 is a decode; consecutive decodes merge into one command.
Script normalized(const Script& script) {
  Script out;
  for (Command c : script) {
    if (c.verb == Verb::chunk && c.n == 1) c.verb = Verb::decode;
    if (c.verb == Verb::decode && !out.empty() && out.back().verb == Verb::decode) {
      out.back().n += c.n;
    } else {
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace

Script parse_script(std::string_view text) {
  KVLAB_REQUIRE(!text.empty(), invalid_argument, "script is empty");
  Script script;
  for (std::string_view word : split_fields(text, '.')) script.push_back(parse_command(word, text));
  const std::string canonical = script_str(script);
  KVLAB_REQUIRE(canonical == text, invalid_argument, "script '", text, "' is not canonical: write '", canonical,
                "' (decodes merge: d.d is d2; p1 is d)");
  return normalized(script);
}

std::string script_str(const Script& script) {
  std::string out;
  for (const Command& c : normalized(script)) out += cat(out.empty() ? "" : ".", command_str(c));
  return out;
}

std::vector<std::string> simpler_scripts(std::string_view text) {
  const Script script = parse_script(text);
  std::vector<std::string> out;
  auto push = [&](const Script& s) {
    if (s.empty()) return;
    const std::string word = script_str(s);
    if (word != text && std::find(out.begin(), out.end(), word) == out.end()) out.push_back(word);
  };
  // Most reduced first: whole commands dropped, then counts cut to their minimum, halved,
  // and less one, then filters keeping one row fewer and id lists one id shorter.
  for (std::size_t i = 0; i < script.size(); ++i) {
    Script s = script;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(i));
    push(s);
  }
  for (const int pass : {0, 1, 2}) {
    for (std::size_t i = 0; i < script.size(); ++i) {
      const Command& c = script[i];
      const bool counted = c.verb == Verb::chunk || c.verb == Verb::decode || c.verb == Verb::update ||
                           c.verb == Verb::trim ||
                           c.verb == Verb::right_chunk || c.verb == Verb::extend;
      if (!counted || c.n <= 1) continue;
      Script s = script;
      s[i].n = pass == 0 ? 1 : (pass == 1 ? c.n / 2 : c.n - 1);
      push(s);
    }
  }
  for (std::size_t i = 0; i < script.size(); ++i) {
    const Command& c = script[i];
    if (c.verb == Verb::extend && c.rows > 1) {
      Script s = script;
      s[i].rows = 1;
      push(s);
    }
    if (c.verb == Verb::filter && c.keep.size() > 1) {
      for (std::size_t j = 0; j < c.keep.size(); ++j) {
        Script s = script;
        s[i].keep.erase(s[i].keep.begin() + static_cast<std::ptrdiff_t>(j));
        push(s);
      }
    }
    if ((c.verb == Verb::write_ids || c.verb == Verb::get) && c.ids.size() > 1) {
      for (std::size_t j = 0; j < c.ids.size(); ++j) {
        Script s = script;
        s[i].ids.erase(s[i].ids.begin() + static_cast<std::ptrdiff_t>(j));
        push(s);
      }
    }
  }
  return out;
}

// ---- set-up -------------------------------------------------------------------------------

const std::vector<std::string>& kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const CacheKindInfo& k : cache_catalogue()) out.emplace_back(k.name);
    return out;
  }();
  return names;
}

bool is_batch(Kind k) { return cache_kind_info(k).batch; }
bool is_packed(Kind k) { return cache_kind_info(k).packed; }

AttendOptions attend_options(const CacheSetup& s) {
  AttendOptions o;
  o.rope.dims = s.rope ? static_cast<int>(s.dim) : 0;
  o.attention.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.dim)));
  o.window = s.window;
  return o;
}

namespace {

// Row b of `rows` gets ⌊pad·b/(rows−1)⌋ (pad itself when rows = 1): unequal padding from
// 0 to pad, the layout of harness/ops/sdpa_info.cc.
std::vector<std::int32_t> spread(std::int64_t pad, std::int64_t rows) {
  std::vector<std::int32_t> out;
  for (std::int64_t b = 0; b < rows; ++b) {
    out.push_back(static_cast<std::int32_t>(rows > 1 ? pad * b / (rows - 1) : pad));
  }
  return out;
}

}  // namespace

std::vector<std::int32_t> left_padding_rule(const CacheSetup& s, std::int64_t rows) { return spread(s.lpad, rows); }
std::vector<std::int32_t> right_padding_rule(const CacheSetup& s, std::int64_t rows) { return spread(s.rpad, rows); }

CacheSetup with_rows(const CacheSetup& s, std::int64_t rows) {
  CacheSetup c = s;
  c.left_padding = left_padding_rule(s, rows);
  return c;
}

namespace {

constexpr std::int64_t kSaturated = std::int64_t{1} << 62;
// Both on [0, 2^62]: no sum or product of two saturated values leaves int64 (a fuzzed
// `cache kind=batch_kv B=3999999999999999999 ...` once overflowed a sum).
std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  a = std::clamp<std::int64_t>(a, 0, kSaturated);
  b = std::clamp<std::int64_t>(b, 0, kSaturated);
  return b > kSaturated - a ? kSaturated : a + b;
}
std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kSaturated / b ? kSaturated : std::min(a * b, kSaturated);
}

}  // namespace

namespace {

bool is_prefix_verb(Verb v) { return v == Verb::write_ids || v == Verb::insert || v == Verb::get; }

// The id table's tokens: 1 + the largest id a `w` writes (0 without one).
std::int64_t id_table_tokens(const Script& script) {
  std::int64_t tokens = 0;
  for (const Command& c : script)
    if (c.verb == Verb::write_ids)
      for (const std::int32_t id : c.ids) tokens = std::max<std::int64_t>(tokens, std::int64_t{id} + 1);
  return tokens;
}

}  // namespace

bool is_prefix_script(const Script& script) {
  return std::any_of(script.begin(), script.end(), [](const Command& c) { return is_prefix_verb(c.verb); });
}

PlanTotals plan_totals(const CacheSetup& setup, const Script& script) {
  PlanTotals t;
  std::int64_t batch = std::min(setup.batch, kSaturated), producer_rows = 0, producer_tokens = 0;
  t.max_batch = batch;
  const std::int64_t entries = is_batch(setup.kind) ? 1 : 0;
  std::int64_t length = 0;  // tokens of the longest row so far (trims ignored: an upper bound)
  auto add = [&](bool main, std::int64_t rows, std::int64_t tokens, std::int64_t times, bool queries = true) {
    const std::int64_t n = sat_mul(sat_mul(rows, tokens), times);
    if (queries) t.q_rows = sat_add(t.q_rows, sat_mul(n, setup.hq));
    if (main) t.kv_rows = sat_add(t.kv_rows, sat_mul(n, setup.hkv));
  };
  // `times` steps of `tokens` queries per row, the keys growing by `tokens` each step
  // when `grows`: Σ over steps of rows·keys·dim·(2·hq·tokens + hkv).
  auto attend = [&](std::int64_t rows, std::int64_t tokens, std::int64_t times, bool grows) {
    const std::int64_t per_key = sat_mul(sat_mul(rows, setup.dim), sat_add(sat_mul(sat_mul(2, setup.hq), tokens), setup.hkv));
    std::int64_t keys = sat_mul(length, times);  // Σ (length + k·tokens), k = 1..times
    if (grows) keys = sat_add(keys, sat_mul(tokens, sat_mul(times, sat_add(times, 1)) / 2));
    t.attention_work = sat_add(t.attention_work, sat_mul(per_key, keys));
    if (grows) length = sat_add(length, sat_mul(tokens, times));
  };
  auto done = [&](std::int64_t times) {
    t.offset_entries = sat_add(t.offset_entries, sat_mul(entries == 1 ? batch : 1, times));
    t.commands = sat_add(t.commands, times);
  };
  for (const Command& c : script) {
    switch (c.verb) {
      case Verb::chunk:
      case Verb::right_chunk:
        add(true, batch, c.n, 1);
        attend(batch, c.n, 1, true);
        producer_rows = batch, producer_tokens = c.n;
        done(1);
        break;
      case Verb::decode:
        add(true, batch, 1, c.n);
        attend(batch, 1, c.n, true);
        producer_rows = batch, producer_tokens = 1;
        done(c.n);
        break;
      case Verb::update:
        add(true, batch, c.n, 1, false);
        length = sat_add(length, c.n);
        done(1);
        break;
      case Verb::shared:
        add(false, producer_rows, producer_tokens, 1);
        attend(producer_rows, producer_tokens, 1, false);
        done(1);
        break;
      case Verb::filter:
        batch = static_cast<std::int64_t>(c.keep.size());
        done(1);
        break;
      case Verb::extend:
        add(true, c.rows, c.n, 1);
        t.attention_work = sat_add(t.attention_work, sat_mul(sat_mul(sat_mul(c.rows, c.n), c.n),
                                                             sat_mul(setup.dim, sat_add(sat_mul(2, setup.hq), setup.hkv))));
        length = std::max(length, c.n);
        batch = sat_add(batch, c.rows);
        t.max_batch = std::max(t.max_batch, batch);
        done(1);
        break;
      case Verb::trim:
      case Verb::reload:
      case Verb::finalize:
      case Verb::quantize:
      case Verb::policy:
      case Verb::extract:
      case Verb::trim_front:
      case Verb::write_ids:
      case Verb::insert:
      case Verb::get:
      case Verb::merge: done(1); break;
    }
  }
  t.kv_rows = sat_add(t.kv_rows, sat_mul(id_table_tokens(script), setup.hkv));
  return t;
}

namespace {

// A kind kv cache's offset through the script, and whether it has been converted: what
// decides an `mN` (the other kinds never convert).
struct KvTrack {
  std::int64_t offset = 0;
  bool quantized = false;
  void after(const Command& c) {
    switch (c.verb) {
      case Verb::chunk:
      case Verb::decode:
      case Verb::update: offset = sat_add(offset, c.n); break;
      case Verb::trim: offset -= std::min(c.n, offset); break;  // KV and quantized caches always trim
      case Verb::quantize: quantized = true; break;
      case Verb::policy: quantized = quantized || offset >= c.n; break;
      default: break;
    }
  }
};

}  // namespace

bool script_quantizes(const CacheSetup& setup, const Script& script) {
  if (setup.kind != Kind::kv) return false;
  KvTrack track;
  for (const Command& c : script) track.after(c);
  return track.quantized;
}

Plan plan_script(const CacheSetup& setup, const Script& script) {
  Plan plan;
  std::int64_t batch = setup.batch;
  std::optional<Step> producer;  // the last attention of the main cache
  KvTrack track;                 // kind kv: converted by a `q` or an `mN`
  auto add = [&](StepKind kind, std::int64_t rows, std::int64_t tokens) {
    plan.steps.push_back({kind, rows, tokens, plan.q_rows, kind == StepKind::shared ? 0 : plan.kv_rows});
    if (kind != StepKind::update) plan.q_rows += rows * setup.hq * tokens;
    if (kind != StepKind::shared) plan.kv_rows += rows * setup.hkv * tokens;
  };
  auto done = [&] {
    plan.offset_entries += is_batch(setup.kind) ? batch : 1;
    ++plan.commands;
  };
  const bool prefix = is_prefix_script(script);
  if (prefix) {
    KVLAB_REQUIRE(setup.kind == Kind::kv || setup.kind == Kind::rotating || setup.kind == Kind::quantized,
                  invalid_argument, "the prefix commands (w, i, g) need kind kv, rotating or quantized (the classes a "
                  "prefix cache stores), not ", kind_names()[static_cast<std::size_t>(setup.kind)]);
    for (const Command& c : script) {
      const bool allowed = is_prefix_verb(c.verb) || c.verb == Verb::trim || c.verb == Verb::reload;
      KVLAB_REQUIRE(allowed, invalid_argument, "command '", command_str(c),
                    "' cannot share a script with the prefix commands w, i, g (their tokens are named by id; "
                    "a prefix script has only w, i, g, tN and s)");
    }
  }
  const std::int64_t table = id_table_tokens(script);
  for (const Command& c : script) {
    const bool batch_only = c.verb == Verb::right_chunk || c.verb == Verb::finalize || c.verb == Verb::filter ||
                            c.verb == Verb::extend || c.verb == Verb::merge;
    KVLAB_REQUIRE(!batch_only || is_batch(setup.kind), invalid_argument, "command '", command_str(c),
                  "' needs a batch kind (batch_kv, batch_rotating, batch_quantized), not ",
                  kind_names()[static_cast<std::size_t>(setup.kind)]);
    switch (c.verb) {
      case Verb::chunk:
      case Verb::right_chunk:
        add(StepKind::main, batch, c.n);
        producer = plan.steps.back();
        done();
        break;
      case Verb::decode:
        for (std::int64_t i = 0; i < c.n; ++i) {
          add(StepKind::main, batch, 1);
          producer = plan.steps.back();
          done();
        }
        break;
      case Verb::update:
        add(StepKind::update, batch, c.n);
        done();
        break;
      case Verb::shared:
        KVLAB_REQUIRE(producer.has_value(), invalid_argument,
                      "command 'a' needs an earlier attention step of the cache");
        add(StepKind::shared, producer->batch, producer->tokens);
        done();
        break;
      case Verb::filter:
        KVLAB_REQUIRE(!c.keep.empty(), invalid_argument, "filter keeps no row");
        batch = static_cast<std::int64_t>(c.keep.size());
        done();
        break;
      case Verb::extend:
        add(StepKind::extend, c.rows, c.n);
        batch += c.rows;
        done();
        break;
      case Verb::quantize:
        KVLAB_REQUIRE(setup.kind == Kind::kv && !track.quantized, invalid_argument,
                      "command 'q' quantizes a plain KVCache once (kind=kv), not ",
                      track.quantized ? "a cache already quantized" : kind_names()[static_cast<std::size_t>(setup.kind)]);
        done();
        break;
      case Verb::extract:
        KVLAB_REQUIRE(setup.kind == Kind::rotating && setup.keep == 0, invalid_argument,
                      "command 'e' snapshots a ring without sinks (kind=rotating keep=0), not kind=",
                      kind_names()[static_cast<std::size_t>(setup.kind)], " keep=", setup.keep);
        done();
        break;
      case Verb::policy:
      case Verb::trim_front: done(); break;
      case Verb::trim:
      case Verb::reload:
      case Verb::finalize:
      case Verb::insert:
      case Verb::get:
      case Verb::merge: done(); break;
      case Verb::write_ids:
        plan.steps.push_back({StepKind::update, 1, table, plan.q_rows, 0});
        done();
        break;
    }
    track.after(c);
  }
  plan.kv_rows += table * setup.hkv;
  const PlanTotals t = plan_totals(setup, script);
  KVLAB_REQUIRE(t.q_rows == plan.q_rows && t.kv_rows == plan.kv_rows && t.offset_entries == plan.offset_entries &&
                    t.commands == plan.commands,
                internal, "plan_totals disagrees with plan_script for script ", script_str(script));
  return plan;
}

}  // namespace kvlab::cache_script
