// L3 (docs/semantics.md §Prefix cache, docs/upstream-bugs.md rows 42/48): prefix reuse
// through KV, ring and quantized layers: a PrefixCache hit holds exactly the reused tokens
// of the request and continues to the caches built from all of them, whatever the live
// caches it was taken from did since.
#include <algorithm>
#include <memory>
#include <string>

#include "cache/cache_script.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "cache/seq_ops.h"
#include "property_tests/batch_util.h"
#include "property_tests/properties.h"
#include "property_tests/repro_line.h"

namespace kvlab::prop {

namespace cs = kvlab::cache_script;
using batch::expect_same_tensor;
using batch::gen_split;
namespace {

// ---- L3: prefix reuse through KV, ring and quantized layers -------------------------------

using Tokens = std::vector<std::int32_t>;
enum class LayerKind { kv, ring, quantized };

struct PrefixRig {
  const BatchHooks& bh;
  ReferenceBackend be;
  std::vector<LayerKind> kinds;
  std::int64_t max_size = 4;
  static constexpr std::int64_t kHeads = 1, kDim = 32;
  const QuantSpec spec = QuantSpec::make(QuantMode::affine, 4, 32);

  CacheFormat format() const {
    std::vector<std::string> layers;
    for (const LayerKind k : kinds)
      layers.push_back(k == LayerKind::kv     ? CacheFormat::kv()
                       : k == LayerKind::ring ? CacheFormat::rotating(max_size, 0)
                                              : CacheFormat::quantized(spec, Rounding::mlx_cpu));
    return CacheFormat(layers);
  }
  // Position p of a sequence carries content(s, 1000·layer + tokens[p], p, ·): equal
  // prefixes give equal data, so a stored prefix is exactly what a request would build.
  Tensor data(Stream s, std::size_t layer, const Tokens& t, std::int64_t p0, std::int64_t n) const {
    Tensor out(DType::f32, {1, kHeads, n, kDim});
    const TensorView v = out.view();
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t d = 0; d < kDim; ++d)
          v.store((h * n + j) * kDim + d, content(s, static_cast<std::int64_t>(1000 * layer) +
                                                          t[static_cast<std::size_t>(p0 + j)], p0 + j, h, d));
    return out;
  }
  LayerCaches make() {
    LayerCaches out;
    for (const LayerKind k : kinds) {
      if (k == LayerKind::kv) out.push_back(std::make_unique<KVCache>(be));
      else if (k == LayerKind::ring) out.push_back(std::make_unique<RotatingKVCache>(be, max_size, 0));
      else out.push_back(std::make_unique<QuantizedKVCache>(be, spec, Rounding::mlx_cpu));
    }
    return out;
  }
  // Feeds tokens [p0, end) of t in random chunks (single tokens write a ring in place),
  // each a `w` command of the line.
  void feed(LayerCaches& caches, const Tokens& t, std::int64_t p0, ReproScript& line) {
    for (const std::int64_t n : gen_split(static_cast<std::int64_t>(t.size()) - p0)) {
      cs::Command w{cs::Verb::write_ids, 0, 0, {}};
      w.ids.assign(t.begin() + p0, t.begin() + p0 + n);
      line.tokens.push_back(cs::script_str({w}));
      for (std::size_t l = 0; l < caches.size(); ++l) {
        const DTensor k = be.upload(data(Stream::key, l, t, p0, n)), v = be.upload(data(Stream::value, l, t, p0, n));
        if (caches[l]->is_quantized()) caches[l]->update_quantized(k, v);
        else caches[l]->update(k, v);
      }
      p0 += n;
    }
  }
  // Every layer holds exactly the first n tokens of t: offset n; KV rows [0, n); the
  // quantized bits of those rows; a ring's newest min(n, max_size) rows.
  void check(const LayerCaches& caches, const Tokens& t, std::int64_t n, const std::string& what) {
    RC_ASSERT(caches.size() == kinds.size());
    for (std::size_t l = 0; l < caches.size(); ++l) {
      const std::string at = what + ", layer " + std::to_string(l);
      const Cache& c = *caches[l];
      if (c.offsets().at(0) != n)
        RC_FAIL(at + ": offset " + std::to_string(c.offsets()[0]) + ", expected " + std::to_string(n));
      if (kinds[l] == LayerKind::quantized) {
        QuantizedKVCache alone(be, spec, Rounding::mlx_cpu);
        if (n > 0)
          alone.update_quantized(be.upload(data(Stream::key, l, t, 0, n)), be.upload(data(Stream::value, l, t, 0, n)));
        check_same_state(c.state(), alone.state());
        continue;
      }
      const SequenceContent held = c.content().at(0);
      const FetchedKV f{held.part("keys"), held.part("values")};
      std::int64_t m = n;
      if (kinds[l] != LayerKind::kv) {
        m = std::min(n, max_size);
        if (f.length() < m)
          RC_FAIL(at + ": the ring holds " + std::to_string(f.length()) + " of its newest " + std::to_string(m));
      }
      if (m == 0) continue;
      const auto newest = [&](const DTensor& x) { return be.download(seq::slice(be, x, f.length() - m, f.length())); };
      expect_same_tensor(newest(f.keys), data(Stream::key, l, t, n - m, m), at + " keys");
      expect_same_tensor(newest(f.values), data(Stream::value, l, t, n - m, m), at + " values");
    }
  }
};

// Short sequences over three token ids: requests share prefixes with what is stored.
Tokens gen_prefix_tokens(std::size_t min_len) {
  return *rc::gen::container<Tokens>(static_cast<std::size_t>(*rc::gen::inRange<std::size_t>(min_len, 9)),
                                     rc::gen::inRange<std::int32_t>(1, 4));
}

}  // namespace

// The live caches of one layer stack, fed a token sequence, go through the commands of
// the cache language's prefix scripts (cache/cache_script.h): `g` a request (the store's
// best match replaces the live caches; the remaining tokens follow as `w`), `w` more
// tokens (decode-sized ring writes that wrap), `t` a trim, `i` an insert. Requests are
// derived from the live tokens or from what was inserted, cut and continued. A hit must
// hold exactly the reused tokens of the request in every layer, whatever the live caches
// did since it was stored (stored entries are deep copies, vllm-mlx#642), and continuing
// it must give the layers built from the whole request (a ring reused through a raw
// slice, or a wrapped one, does not: mlx-vlm#1715 / #1748). A failing case prints its
// commands as a `cache` line of layer 0's kind.
void prefix_reuse_continues(const Hooks&, const BatchHooks& bh) {
  PrefixRig rig{bh, {}, {}};
  const auto layers = *rc::gen::inRange<std::size_t>(1, 3);
  for (std::size_t l = 0; l < layers; ++l)
    rig.kinds.push_back(
        *rc::gen::weightedElement<LayerKind>({{2, LayerKind::ring}, {1, LayerKind::kv}, {1, LayerKind::quantized}}));
  rig.max_size = *rc::gen::inRange<std::int64_t>(2, 7);
  const CacheFormat format = rig.format();
  const std::string model = "m";
  PrefixCache pc;

  BatchCase line_case;
  line_case.kind = rig.kinds[0] == LayerKind::kv ? Kind::kv : rig.kinds[0] == LayerKind::ring ? Kind::rotating
                                                                                               : Kind::quantized;
  line_case.heads = PrefixRig::kHeads, line_case.dim = PrefixRig::kDim, line_case.max_size = rig.max_size;
  if (line_case.kind == Kind::quantized) line_case.spec = rig.spec;
  ReproScript line;
  if (layers > 1) line.note("layers after the first (" + format.describe() + "; the line replays layer 0)");
  line.note("token data: the property's depends on id and position, the line's on the id");
  const ReproOnFailure log_line(line_case, line);

  LayerCaches live = rig.make();
  Tokens log;                   // the tokens the live caches hold
  std::vector<Tokens> stored;   // every sequence inserted
  CaseSize& size = last_failure_size();
  size = {0, 0};
  const auto command = [](cs::Verb v) { return cs::Command{v, 0, 0, {}}; };
  auto script = *rc::gen::container<cs::Script>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 13)),
      rc::gen::weightedElement<cs::Command>({{4, command(cs::Verb::get)}, {3, command(cs::Verb::write_ids)},
                                             {1, command(cs::Verb::trim)}, {2, command(cs::Verb::insert)}}));
  // A first request on the empty store, stored once fed.
  script.insert(script.begin(), {command(cs::Verb::get), command(cs::Verb::insert)});
  for (const cs::Command& c : script) {
    ++size.steps;
    if (c.verb == cs::Verb::write_ids) {
      const Tokens more = *rc::gen::container<Tokens>(static_cast<std::size_t>(*rc::gen::inRange(1, 5)),
                                                      rc::gen::inRange<std::int32_t>(1, 4));
      const auto from = static_cast<std::int64_t>(log.size());
      log.insert(log.end(), more.begin(), more.end());
      rig.feed(live, log, from, line);
      size.tokens += static_cast<std::int64_t>(more.size());
      rig.check(live, log, static_cast<std::int64_t>(log.size()), "the live caches extended");
    } else if (c.verb == cs::Verb::trim) {
      const bool trimmable = std::all_of(live.begin(), live.end(), [](const auto& x) { return x->is_trimmable(); });
      if (!trimmable || log.size() < 2) continue;
      const auto k = *rc::gen::inRange<std::int64_t>(1, static_cast<std::int64_t>(log.size()));
      for (auto& x : live) RC_ASSERT(x->trim(k) == k);
      log.resize(log.size() - static_cast<std::size_t>(k));
      line.tokens.push_back("t" + std::to_string(k));
    } else if (c.verb == cs::Verb::insert) {
      if (log.empty()) continue;
      bh.prefix_insert(pc, model, format, log, live);
      stored.push_back(log);
      line.tokens.push_back("i");
    } else {
      // A request: a fresh sequence, or the live tokens or a stored sequence cut and
      // continued by up to three tokens.
      const auto base = *rc::gen::inRange<std::size_t>(0, stored.size() + 2);
      Tokens req;
      if (base == 0 || (base == 1 && log.empty())) {
        req = gen_prefix_tokens(1);
      } else {
        const Tokens& from = base == 1 ? log : stored[base - 2];
        const auto cut = *rc::gen::inRange<std::ptrdiff_t>(1, static_cast<std::ptrdiff_t>(from.size()) + 1);
        req.assign(from.begin(), from.begin() + cut);
        const Tokens tail = *rc::gen::container<Tokens>(static_cast<std::size_t>(*rc::gen::inRange(0, 4)),
                                                        rc::gen::inRange<std::int32_t>(1, 4));
        req.insert(req.end(), tail.begin(), tail.end());
      }
      cs::Command g = command(cs::Verb::get);
      g.ids = req;
      line.tokens.push_back(cs::script_str({g}));
      PrefixFetch got = bh.prefix_fetch(pc, model, format, req);
      RC_LOG() << "request " << rc::toString(req) << ": " << match_kind_name(got.kind) << " reusing " << got.reused
               << "\n";
      const auto reused = static_cast<std::int64_t>(got.reused);
      RC_ASSERT(got.remaining == Tokens(req.begin() + reused, req.end()));
      if (got.kind == MatchKind::miss) {
        RC_ASSERT(reused == 0);
        live = rig.make();
      } else {
        rig.check(got.caches, req, reused, std::string("fetch (") + std::string(match_kind_name(got.kind)) + ")");
        live = std::move(got.caches);
      }
      log.assign(req.begin(), req.begin() + reused);
      rig.feed(live, req, reused, line);
      log = req;
      size.tokens += static_cast<std::int64_t>(req.size()) - reused;
      rig.check(live, log, static_cast<std::int64_t>(log.size()), "the fetched caches continued to the request");
    }
  }
}

}  // namespace kvlab::prop
