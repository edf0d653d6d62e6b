// L3 (docs/semantics.md §Prefix cache, docs/upstream-bugs.md rows 42/48): prefix reuse
// through KV, ring and quantized layers: a PrefixCache hit holds exactly the reused tokens
// of the request and continues to the caches built from all of them, whatever the live
// caches it was taken from did since.
#include <algorithm>
#include <memory>
#include <string>

#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "cache/seq_ops.h"
#include "property_tests/batch_util.h"
#include "property_tests/properties.h"

namespace kvlab::prop {

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
  // Feeds tokens [p0, end) of t in random chunks (single tokens write a ring in place).
  void feed(LayerCaches& caches, const Tokens& t, std::int64_t p0) {
    for (const std::int64_t n : gen_split(static_cast<std::int64_t>(t.size()) - p0)) {
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

enum class PrefixOp { session, extend, trim, insert, fetch };

}  // namespace

// Live sessions (layer caches fed a token sequence) are stored in a PrefixCache, then
// keep changing — more tokens, decode-sized ring writes that wrap, trims — while requests
// derived from them are fetched. A hit must hold exactly the reused tokens of the
// request in every layer (whatever happened to the live caches since: stored entries are
// deep copies, vllm-mlx#642), and continuing it with the remaining tokens must give the
// layers built from the whole request (a ring reused through a raw slice, or a wrapped
// one, does not: mlx-vlm#1715 / #1748).
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
  struct Live {
    Tokens t;
    LayerCaches c;
  };
  std::vector<Live> live;
  const auto insert = [&](Live& s) {
    if (!s.t.empty()) bh.prefix_insert(pc, model, format, s.t, s.c);
  };
  CaseSize& size = last_failure_size();
  size = {0, 0};
  auto script = *rc::gen::container<std::vector<PrefixOp>>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 13)),
      rc::gen::weightedElement<PrefixOp>({{2, PrefixOp::session}, {3, PrefixOp::extend}, {1, PrefixOp::trim},
                                          {2, PrefixOp::insert}, {4, PrefixOp::fetch}}));
  script.insert(script.begin(), PrefixOp::session);
  for (const PrefixOp op : script) {
    ++size.steps;
    if (op == PrefixOp::session || live.size() == 0) {
      Live s{gen_prefix_tokens(1), rig.make()};
      rig.feed(s.c, s.t, 0);
      size.tokens += static_cast<std::int64_t>(s.t.size());
      live.push_back(std::move(s));
      insert(live.back());
      RC_LOG() << "session " << live.size() - 1 << " " << rc::toString(live.back().t) << " inserted\n";
      continue;
    }
    Live& s = live[*rc::gen::inRange<std::size_t>(0, live.size())];
    if (op == PrefixOp::extend) {
      const std::size_t from = s.t.size();
      const Tokens more = *rc::gen::container<Tokens>(static_cast<std::size_t>(*rc::gen::inRange(1, 5)),
                                                      rc::gen::inRange<std::int32_t>(1, 4));
      s.t.insert(s.t.end(), more.begin(), more.end());
      rig.feed(s.c, s.t, static_cast<std::int64_t>(from));
      size.tokens += static_cast<std::int64_t>(more.size());
      RC_LOG() << "live session extended to " << rc::toString(s.t) << "\n";
    } else if (op == PrefixOp::trim) {
      const bool trimmable = std::all_of(s.c.begin(), s.c.end(), [](const auto& c) { return c->is_trimmable(); });
      if (!trimmable || s.t.size() < 2) continue;
      const auto k = *rc::gen::inRange<std::int64_t>(1, static_cast<std::int64_t>(s.t.size()));
      for (auto& c : s.c) RC_ASSERT(c->trim(k) == k);
      s.t.resize(s.t.size() - static_cast<std::size_t>(k));
      RC_LOG() << "live session trimmed to " << rc::toString(s.t) << "\n";
    } else if (op == PrefixOp::insert) {
      insert(s);
      RC_LOG() << "live session inserted at " << rc::toString(s.t) << "\n";
    } else {
      // A request sharing a prefix with a live session: cut, then maybe diverge.
      const auto cut = *rc::gen::inRange<std::ptrdiff_t>(1, static_cast<std::ptrdiff_t>(s.t.size()) + 1);
      Tokens req(s.t.begin(), s.t.begin() + cut);
      const Tokens tail = *rc::gen::container<Tokens>(static_cast<std::size_t>(*rc::gen::inRange(0, 4)),
                                                      rc::gen::inRange<std::int32_t>(1, 4));
      req.insert(req.end(), tail.begin(), tail.end());
      PrefixFetch got = bh.prefix_fetch(pc, model, format, req);
      RC_LOG() << "fetch " << rc::toString(req) << ": " << match_kind_name(got.kind) << " reusing " << got.reused
               << "\n";
      if (got.kind == MatchKind::miss) continue;
      const auto reused = static_cast<std::int64_t>(got.reused);
      RC_ASSERT(got.remaining == Tokens(req.begin() + reused, req.end()));
      rig.check(got.caches, req, reused, std::string("fetch (") + std::string(match_kind_name(got.kind)) + ")");
      rig.feed(got.caches, req, reused);
      rig.check(got.caches, req, static_cast<std::int64_t>(req.size()), "the fetched caches continued to the request");
    }
  }
}

}  // namespace kvlab::prop
