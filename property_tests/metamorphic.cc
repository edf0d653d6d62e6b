// Metamorphic properties: two ways of computing the same attention must agree.
//   M1 incremental decode / any chunking == one-shot prefill (mlx-vlm#973 family); for
//      ChunkedKVCache with its front trimmed before every chunk
//   M2 quantized-cache attention == attention over the dequantized cache (mlx-lm#1467,
//      mlx-vlm#1567: B >= 2 with GQA R > 1)
//   M3 quantized vs full-precision attention within an analytic bound
//   M4 rotating cache (keep 0) == windowed attention over the full history
//   M5 Q and K positions == pre-update offsets; a KV-shared layer reading the producer's
//      result reproduces the producer (mlx-lm#1097, #1384, mlx-vlm#966)
#include <algorithm>
#include <cmath>

#include "cache/kv_cache.h"
#include "property_tests/properties.h"
#include "reference/affine_quantize.h"
#include "reference/rope.h"
#include "reference/sdpa.h"

namespace kvlab::prop {

std::vector<std::int64_t> gen_chunks(std::int64_t max_total) {
  const auto lens = *rc::gen::nonEmpty(rc::gen::container<std::vector<std::int64_t>>(
      rc::gen::weightedOneOf<std::int64_t>({{4, rc::gen::just<std::int64_t>(1)},
                                            {3, rc::gen::inRange<std::int64_t>(2, 8)},
                                            {1, rc::gen::inRange<std::int64_t>(8, 40)}})));
  std::vector<std::int64_t> out;
  std::int64_t total = 0;
  for (const std::int64_t n : lens) {
    if (total + n > max_total) break;
    out.push_back(n);
    total += n;
  }
  if (out.empty()) out.push_back(1);
  return out;
}

Step attend_chunk(Sut& sut, std::int64_t n) {
  Step s;
  s.p0 = sut.cache->offsets().at(0);
  s.n = n;
  const Tensor q = sut.raw(Stream::query, s.p0, n);
  s.r = sut.hooks.attend(*sut.cache, sut.be.upload(q), sut.be.upload(sut.raw(Stream::key, s.p0, n)),
                         sut.be.upload(sut.raw(Stream::value, s.p0, n)), attend_options(sut.cfg));
  s.q_rot = sut.cfg.rope_dims > 0 ? ref::rope(q, attend_options(sut.cfg).rope, static_cast<std::int32_t>(s.p0)) : q;
  return s;
}

void record_case(const std::vector<std::int64_t>& chunks) {
  CaseSize& s = last_failure_size();
  s = {static_cast<std::int64_t>(chunks.size()), 0};
  for (const std::int64_t n : chunks) s.tokens += n;
}

namespace {

Tensor dequantize(Backend& be, const QuantizedDTensor& q) {
  return ref::affine_dequantize(
      ref::QuantizedTensor{be.download(q.wq), be.download(q.scales), be.download(q.biases), q.spec});
}

}  // namespace

void incremental_equals_one_shot(const Hooks& hooks) {
  const Config cfg = *gen_config(*rc::gen::elementOf(std::vector<Kind>{Kind::kv, Kind::quantized, Kind::chunked}));
  const std::vector<std::int64_t> chunks = gen_chunks(48);
  sized(chunks, [&] {
    std::int64_t total = 0;
    for (const std::int64_t n : chunks) total += n;
    Sut one(cfg, hooks), inc(cfg, hooks);
    const Tensor full = one.be.download(attend_chunk(one, total).r.out);
    for (const std::int64_t n : chunks) {
      // llama4 trims the chunked cache's front before each update: evicting at a chunk
      // boundary must never drop a key a later query of this chunk sees (mlx-lm#1673).
      if (cfg.kind == Kind::chunked) hooks.trim_front(inc.cache);
      const Step s = attend_chunk(inc, n);
      // Same keys, same visible set, same accumulation order: bit for bit.
      expect_close(inc.be.download(s.r.out), full.slice(2, s.p0, s.p0 + n), 0.0,
                   "chunk at " + std::to_string(s.p0) + " vs one-shot prefill");
    }
  });
}

void quantized_equals_dequantized(const Hooks& hooks) {
  const Config cfg = *gen_config(Kind::quantized);
  const std::vector<std::int64_t> chunks = gen_chunks(64);
  sized(chunks, [&] {
    Sut sut(cfg, hooks);
    for (const std::int64_t n : chunks) {
      const Step s = attend_chunk(sut, n);
      RC_ASSERT(s.r.quantized_kv.has_value());
      AttentionParams p = attend_options(cfg).attention;
      p.mask = s.r.mask.spec;
      const std::optional<Tensor>& mask = s.r.mask.array;
      const Tensor expected = ref::sdpa(s.q_rot, dequantize(sut.be, s.r.quantized_kv->keys),
                                        dequantize(sut.be, s.r.quantized_kv->values), p, mask ? &*mask : nullptr);
      expect_close(sut.be.download(s.r.out), expected, 1e-5, "quantized attention vs dequantized attention");
    }
  });
}

// Bound for M3. With per-element quantization errors |k̂ − k| ≤ |s_k| and |v̂ − v| ≤ |s_v|
// (|scale| of the element's group — not |scale|/2: the edge/q0 rescale can push the far
// extreme a full step past code n, where the clamp costs up to |scale|, see
// reference/affine_quantize.h), one logit moves by
//   |Δs_j| = scale·|Σ_i q_i (k̂_ji − k_ji)| ≤ δ := scale·max_j Σ_i |q_i|·|s_k(j, g(i))|.
// Softmax weights then satisfy p̂_j / p_j = e^{Δs_j} / Σ_k p_k e^{Δs_k} ∈ [e^{−2δ}, e^{2δ}],
// so Σ_j |p̂_j − p_j| ≤ e^{2δ} − 1, and
//   |ô_d − o_d| ≤ Σ_j p̂_j |v̂_jd − v_jd| + Σ_j |p̂_j − p_j|·|v_jd|
//             ≤ max_j |s_v(j, g(d))| + (e^{2δ} − 1)·max_j |v_jd|   (+ f32 rounding slack).
// Maxima run over every returned key (a superset of the visible ones).
void quantized_within_bound(const Hooks& hooks) {
  Config cfg = *gen_config(Kind::quantized);
  const std::vector<std::int64_t> chunks = gen_chunks(64);
  sized(chunks, [&] {
    Config full_cfg = cfg;
    full_cfg.kind = Kind::kv;
    Sut qs(cfg, hooks), fs(full_cfg, hooks);
    for (const std::int64_t n : chunks) {
      const Step a = attend_chunk(qs, n), b = attend_chunk(fs, n);
      RC_ASSERT(a.r.quantized_kv.has_value() && b.r.kv.has_value());
      const Tensor oq = qs.be.download(a.r.out), of = fs.be.download(b.r.out);
      const Tensor sk = qs.be.download(a.r.quantized_kv->keys.scales);
      const Tensor sv = qs.be.download(a.r.quantized_kv->values.scales);
      const Tensor vf = fs.be.download(b.r.kv->values);
      const std::int64_t lk = sk.dim(2), gk = sk.dim(3), gv = sv.dim(3), gs = cfg.spec.group_size;
      const float *skp = sk.view().as<const float>(), *svp = sv.view().as<const float>();
      const float *vfp = vf.view().as<const float>(), *qp = a.q_rot.view().as<const float>();
      for (std::int64_t bb = 0; bb < cfg.batch; ++bb)
        for (std::int64_t h = 0; h < cfg.q_heads(); ++h) {
          const std::int64_t kh = bb * cfg.kv_heads + h / cfg.q_ratio;
          // Per output feature: max_j |s_v(j, g(d))| and max_j |v_jd| (independent of t).
          std::vector<double> max_sv(static_cast<std::size_t>(cfg.dv)), max_v(static_cast<std::size_t>(cfg.dv));
          for (std::int64_t j = 0; j < lk; ++j)
            for (std::int64_t d = 0; d < cfg.dv; ++d) {
              const auto du = static_cast<std::size_t>(d);
              max_sv[du] = std::max(max_sv[du], static_cast<double>(std::abs(svp[(kh * lk + j) * gv + d / gs])));
              max_v[du] = std::max(max_v[du], static_cast<double>(std::abs(vfp[(kh * lk + j) * cfg.dv + d])));
            }
          for (std::int64_t t = 0; t < n; ++t) {
            // Σ_i |q_i|·|s_k(j, g(i))| = Σ_g |s_k(j, g)|·Σ_{i ∈ g} |q_i|.
            const float* qr = qp + ((bb * cfg.q_heads() + h) * n + t) * cfg.dk;
            std::vector<double> qa(static_cast<std::size_t>(gk));
            for (std::int64_t i = 0; i < cfg.dk; ++i) qa[static_cast<std::size_t>(i / gs)] += std::abs(qr[i]);
            double delta = 0;
            for (std::int64_t j = 0; j < lk; ++j) {
              double s = 0;
              for (std::int64_t g = 0; g < gk; ++g)
                s += std::abs(skp[(kh * lk + j) * gk + g]) * qa[static_cast<std::size_t>(g)];
              delta = std::max(delta, s * static_cast<double>(cfg.scale()));
            }
            for (std::int64_t d = 0; d < cfg.dv; ++d) {
              const auto du = static_cast<std::size_t>(d);
              const double bound = max_sv[du] + std::expm1(2 * delta) * max_v[du] + 1e-5;
              const std::int64_t o = ((bb * cfg.q_heads() + h) * n + t) * cfg.dv + d;
              const double err = std::abs(static_cast<double>(oq.view().load(o)) - of.view().load(o));
              if (!(err <= bound))
                RC_FAIL("quantized vs full attention error " + std::to_string(err) + " exceeds the bound " +
                        std::to_string(bound) + " at position " + std::to_string(a.p0 + t));
            }
          }
        }
    }
  });
}

void rotating_equals_windowed_full(const Hooks& hooks) {
  Config cfg = *gen_config(Kind::rotating);
  cfg.keep = 0;  // sinks are not a window; the stateful model covers keep > 0
  cfg.window = 0;
  const std::vector<std::int64_t> chunks = gen_chunks(96);
  sized(chunks, [&] {
    Config full_cfg = cfg;
    full_cfg.kind = Kind::kv;
    full_cfg.window = static_cast<int>(cfg.max_size);  // sdpa's window-W causal mask over all tokens
    Sut ring(cfg, hooks), full(full_cfg, hooks);
    for (const std::int64_t n : chunks) {
      const Step a = attend_chunk(ring, n), b = attend_chunk(full, n);
      // A one-token ring update returns keys in physical order: equal up to summation order.
      expect_close(ring.be.download(a.r.out), full.be.download(b.r.out), 2e-6,
                   "rotating(max " + std::to_string(cfg.max_size) + ") vs window attention at position " +
                       std::to_string(a.p0));
    }
  });
}

void positions_are_pre_update_offsets(const Hooks& hooks) {
  const Config cfg =
      *gen_config(*rc::gen::elementOf(std::vector<Kind>{Kind::kv, Kind::rotating, Kind::quantized}));
  const std::vector<std::int64_t> chunks = gen_chunks(64);
  sized(chunks, [&] {
    Sut sut(cfg, hooks);
    for (const std::int64_t n : chunks) {
      const std::vector<std::int32_t> before = sut.cache->offsets();
      const Step s = attend_chunk(sut, n);
      RC_ASSERT(s.r.positions == std::vector<std::int32_t>(static_cast<std::size_t>(cfg.batch), before.at(0)));
      RC_ASSERT(sut.cache->offsets() == std::vector<std::int32_t>{static_cast<std::int32_t>(before.at(0) + n)});
      // A KV-shared layer with the producer's own queries must reproduce the producer's
      // output: it ropes at the producer's pre-update positions (mlx-lm#1384).
      const DTensor shared = sut.hooks.attend_shared(sut.be, s.r, sut.be.upload(sut.raw(Stream::query, s.p0, n)),
                                                     attend_options(cfg), *sut.cache);
      expect_close(sut.be.download(shared), sut.be.download(s.r.out), 0.0, "KV-shared layer vs producer");
    }
  });
}

const std::vector<NamedProperty>& all_properties() {
  static const std::vector<NamedProperty> props{
      {"Stateful.KVCache", [](const Hooks& h) { stateful_case(Kind::kv, h); }},
      {"Stateful.RotatingKVCache", [](const Hooks& h) { stateful_case(Kind::rotating, h); }},
      {"Stateful.QuantizedKVCache", [](const Hooks& h) { stateful_case(Kind::quantized, h); }},
      {"M1.IncrementalEqualsOneShot", incremental_equals_one_shot},
      {"M2.QuantizedEqualsDequantized", quantized_equals_dequantized},
      {"M3.QuantizedWithinBound", quantized_within_bound},
      {"M4.RotatingEqualsWindowedFull", rotating_equals_windowed_full},
      {"M5.PositionsArePreUpdateOffsets", positions_are_pre_update_offsets},
      {"Stateful.ChunkedKVCache", [](const Hooks& h) { stateful_case(Kind::chunked, h); }},
      {"Stateful.TurboQuantKVCache", [](const Hooks& h) { stateful_case(Kind::turboquant, h); }},
      {"M7.TurboQuantPrefillSplitInvariant", turboquant_prefill_split_invariant},
      {"R1.RopeVectorOffsetsPerRow", rope_vector_offsets_per_row},
      {"R2.QuantizedBatchGqaPaddedMask", quantized_batch_gqa_padded_mask},
      {"R3.QuantizedPvValueDims", quantized_pv_value_dims},
      {"R4.QuantizePolicyPerLayer", quantize_policy_per_layer},
      {"R5.RestoreRejectsInconsistentOffset", restore_rejects_inconsistent_offset},
      {"R6.StateFileCorruptionIsAnError", state_file_corruption_is_an_error},
      {"R7.TrimmedEmptyRoundTrips", trimmed_empty_round_trips},
  };
  return props;
}

}  // namespace kvlab::prop
