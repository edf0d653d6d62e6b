// ChunkedKVCache and TurboQuantKVCache in the property framework.
//
// Both run the shared stateful machinery (stateful.cc: one rc::state instantiation) with
// their own parts of the model, which live here:
// - ChunkedKVCache (docs/semantics.md §Chunked cache, docs/upstream-bugs.md §U4): the model keeps
//   start_position next to the offset; maybe_trim_front drops the oldest valid − chunk_size rows
//   (mlx-lm#1673 rule); trim never goes below start; the attention oracle applies llama4's chunk
//   rule on absolute positions; state → restore keeps offset and start (U4: mlx-lm reloads with
//   offset = buffer rows).
// - TurboQuantKVCache (docs/semantics.md §TurboQuant cache): the expected content of a logged token
//   is the reference codec's round trip of its row, with codecs rebuilt independently from
//   docs/turboquant.md §Bit widths (seeds, resolve_kv_bits, the split channels picked from the
//   first tensor).
// And two metamorphic properties:
//   M6 attention through a TurboQuant cache == attention over its decoded content (run
//      inside Stateful.TurboQuantKVCache's Attend command)
//   M7 prefill n+1 == prefill n + decode 1, bit for bit, once the codecs exist (vlm#973:
//      the fused L=1 path used another rotation basis than the codec)
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "cache/chunked_kv_cache.h"
#include "cache/registry.h"
#include "property_tests/properties.h"
#include "reference/bitpack.h"
#include "reference/rope.h"
#include "reference/sdpa.h"
#include "reference/turboquant.h"

namespace kvlab::prop {

namespace {

bool fractional(double bits) { return bits != std::floor(bits); }

// The reference codec of (dim, bits, seed), as ref::make_turboquant_codec builds it
// (automatic rotation: RHT for a power-of-two dim, dense Haar otherwise). Its Lloyd–Max
// codebook depends on (dim, bits) only and takes milliseconds to build, up to a second at
// 8 bits (docs/ci.md §Test costs), so the oracle builds each one once per process; the
// rotation is cheap.
TurboQuantCodec codec_for(int dim, int bits, std::uint64_t seed) {
  static std::map<std::pair<int, int>, std::vector<float>> codebooks;
  auto it = codebooks.find({dim, bits});
  if (it == codebooks.end()) {
    std::vector<float> levels;
    for (const double c : ref::turboquant_codebook(dim, bits)) levels.push_back(static_cast<float>(c));
    it = codebooks.emplace(std::pair{dim, bits}, std::move(levels)).first;
  }
  TurboQuantCodec c;
  c.dim = dim;
  c.bits = bits;
  c.codebook = it->second;
  if ((dim & (dim - 1)) == 0) {
    c.signs = ref::turboquant_rht_signs(dim, seed);
  } else {
    for (const double q : ref::turboquant_haar_rotation(dim, seed)) c.rotation.push_back(static_cast<float>(q));
  }
  return c;
}

}  // namespace

// ---- TurboQuant oracle ----------------------------------------------------------------

std::vector<TurboQuantCodec> turbo_codecs(const Config& cfg, bool keys, const Tensor& first) {
  // resolve_kv_bits (docs/turboquant.md §Bit widths) only under k_floor_v_ceil; split_channels
  // keeps `bits` on both sides and splits channels instead. Overrides win under both meanings.
  const bool kv_split = cfg.tq_meaning == FractionalBits::k_floor_v_ceil && fractional(cfg.tq_bits);
  const double bits = keys ? cfg.tq_key_bits.value_or(kv_split ? std::floor(cfg.tq_bits) : cfg.tq_bits)
                           : cfg.tq_value_bits.value_or(kv_split ? std::ceil(cfg.tq_bits) : cfg.tq_bits);
  const std::uint64_t seed = cfg.tq_seed + (keys ? 0 : 1);
  const auto dim = static_cast<int>(first.dim(3));
  if (!fractional(bits)) return {codec_for(dim, static_cast<int>(bits), seed)};
  // _SplitCodec: round((b − ⌊b⌋)·D) (half to even) outlier channels clamped to [1, D−1],
  // by mean |x| over the first tensor's (B, H, S) rows; ties to the higher channel.
  const auto count = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(std::nearbyint((bits - std::floor(bits)) * dim)), 1, dim - 1);
  std::vector<double> score(static_cast<std::size_t>(dim), 0.0);
  const float* x = first.view().as<const float>();
  for (std::int64_t r = 0; r < first.numel() / dim; ++r)
    for (int d = 0; d < dim; ++d) score[static_cast<std::size_t>(d)] += std::abs(static_cast<double>(x[r * dim + d]));
  std::vector<std::int32_t> order(static_cast<std::size_t>(dim));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const double sa = score[static_cast<std::size_t>(a)], sb = score[static_cast<std::size_t>(b)];
    return sa != sb ? sa < sb : a < b;
  });
  std::vector<std::int32_t> high(order.end() - count, order.end()), low;
  std::sort(high.begin(), high.end());
  for (std::int32_t d = 0; d < dim; ++d)
    if (!std::binary_search(high.begin(), high.end(), d)) low.push_back(d);
  TurboQuantCodec lo = codec_for(static_cast<int>(low.size()), static_cast<int>(std::floor(bits)), seed);
  TurboQuantCodec hi = codec_for(static_cast<int>(high.size()), static_cast<int>(std::ceil(bits)),
                                 seed + TurboQuantKVCache::kSplitSeedOffset);
  lo.channels = std::move(low);
  hi.channels = std::move(high);
  return {std::move(lo), std::move(hi)};
}

Tensor turbo_roundtrip(const std::vector<TurboQuantCodec>& parts, const Tensor& x) {
  Tensor out(DType::f32, x.shape());
  for (const TurboQuantCodec& c : parts) {
    Tensor norms(DType::f16, {x.dim(0), x.dim(1), x.dim(2), 1});
    Tensor indices(DType::u32, {x.dim(0), x.dim(1), x.dim(2), ref::packed_word_count(c.dim, c.bits)});
    ref::turboquant_encode(x.view(), c, norms.view(), indices.view());
    ref::turboquant_decode(norms.view(), indices.view(), c, out.view());  // writes c's channels only
  }
  return out;
}

// ---- observables ------------------------------------------------------------------------

// ---- generators -------------------------------------------------------------------------

void gen_chunked_options(Config& c) {
  // Chunks below the 256-row growth step are where mlx-lm#1673 dropped live tokens.
  c.chunk_size = *rc::gen::weightedOneOf<std::int64_t>({{4, rc::gen::inRange<std::int64_t>(1, 9)},
                                                        {3, rc::gen::inRange<std::int64_t>(9, 40)},
                                                        {1, rc::gen::inRange<std::int64_t>(40, 300)}});
}

void gen_turbo_options(Config& c) {
  // Widths 1..4.5 in steps of 0.5; the deep run adds 5..8 in 1 case of 20. The cache
  // builds a Lloyd–Max codebook per codec on every creation and restore, which grows
  // steeply with the width (docs/ci.md §Test costs).
  std::vector<double> low, all;
  for (double b = 1.0; b <= 8.0; b += 0.5) (b <= 4.5 ? low : all).push_back(b);
  all.insert(all.begin(), low.begin(), low.end());
  const auto width = [&] {
    return real_dims() ? rc::gen::weightedOneOf<double>({{19, rc::gen::elementOf(low)}, {1, rc::gen::elementOf(all)}})
                       : rc::gen::elementOf(low);
  };
  c.tq_bits = *width();
  c.tq_seed = *rc::gen::inRange<std::uint64_t>(0, 1000);
  c.tq_meaning = *rc::gen::elementOf(std::vector<FractionalBits>{FractionalBits::split_channels,
                                                                  FractionalBits::k_floor_v_ceil});
  if (*rc::gen::resize(100, rc::gen::inRange(0, 4)) == 0) c.tq_key_bits = *width();
  if (*rc::gen::resize(100, rc::gen::inRange(0, 4)) == 0) c.tq_value_bits = *width();
}

// ---- metamorphic --------------------------------------------------------------------------

void check_turbo_attend_reads_decoded(Sut& sut, const AttendResult& r, std::int64_t p0, std::int64_t n) {
  // r.kv is the decoded content (check_fetched compares it with the codec round trip of
  // the logged tokens, check_observables the cache's fetch()); attention must be exactly
  // attention over it: same keys, same kernel (the reference backend runs ref::sdpa).
  RC_ASSERT(r.kv.has_value() && !r.quantized_kv.has_value());
  const AttendOptions o = attend_options(sut.cfg);
  const Tensor q = sut.raw(Stream::query, p0, n);
  AttentionParams p = o.attention;
  p.mask = r.mask.spec;
  const std::optional<Tensor>& mask = r.mask.array;
  const std::string what = "TurboQuant attention vs attention over the decoded cache at " + std::to_string(p0);
  if (sut.reference_backend()) {
    expect_same(sut.be.download(r.out),
                ref::sdpa(o.rope.dims > 0 ? ref::rope(q, o.rope, static_cast<std::int32_t>(p0)) : q,
                          sut.be.download(r.kv->keys), sut.be.download(r.kv->values), p, mask ? &*mask : nullptr),
                what);
    return;
  }
  // Another backend: this property is about what attention reads (the decoded cache, not
  // the raw tokens), not about the sdpa kernel's numerics (the attend oracle checks those
  // within its tolerance), so the expectation runs the same kernels as attend(): the
  // backend's RoPE (itself checked against the rope op's budget) and the backend's sdpa,
  // and must match bit for bit.
  const DTensor q_rot = sut.be.upload(o.rope.dims > 0 ? sut.backend_rope(q, p0) : q);
  std::optional<DTensor> mask_dev;
  if (mask) mask_dev = sut.be.upload(*mask);
  const DTensor out = sut.be.allocate(q_rot.dtype, {q.dim(0), q.dim(1), q.dim(2), r.kv->values.shape.at(3)});
  sut.be.sdpa({q_rot, r.kv->keys, r.kv->values, p, mask_dev ? &*mask_dev : nullptr, nullptr, out});
  expect_same(sut.be.download(r.out), sut.be.download(out), what);
}

void turboquant_prefill_split_invariant(const Hooks& hooks) {
  const Config cfg = *gen_config(Kind::turboquant);
  // Split codecs pick their channels from the first tensor (as mlx-vlm's), so the codecs
  // are built by a first `warm` chunk; integer widths need none.
  const bool split = fractional(cfg.tq_bits) || (cfg.tq_key_bits && fractional(*cfg.tq_key_bits)) ||
                     (cfg.tq_value_bits && fractional(*cfg.tq_value_bits));
  const std::int64_t warm = *rc::gen::inRange<std::int64_t>(split ? 1 : 0, 9);
  const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, 25);
  const std::vector<std::int64_t> chunks{warm, n, 1};
  sized(chunks, [&] {
    // One cache for both paths: trim keeps the codecs (building them is most of the
    // cost), so the prefill of n + 1 and the prefill of n + decode of 1 run on the same
    // codecs, as in one generation that rolls back and replays.
    Sut sut(cfg, hooks);
    if (warm > 0) attend_chunk(sut, warm);
    const Step whole = attend_chunk(sut, n + 1);
    const Tensor prefill = sut.be.download(whole.r.out).slice(2, n, n + 1);
    const CacheState after_prefill = sut.cache->state();
    RC_ASSERT(sut.cache->trim(n + 1) == n + 1);
    attend_chunk(sut, n);
    const Step decode = attend_chunk(sut, 1);
    // Same codes, same keys, same visible set: the decode equals the prefill's last row.
    expect_same(sut.be.download(decode.r.out), prefill,
                "decode of token " + std::to_string(warm + n) + " vs the prefill of " + std::to_string(n + 1));
    check_same_state(sut.cache->state(), after_prefill);
  });
}

}  // namespace kvlab::prop
