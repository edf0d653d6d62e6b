// Regression properties for rows of docs/upstream-bugs.md that the stateful and metamorphic
// properties do not reach (each names the upstream bug it guards):
//   R1 RoPE with (B,) offsets == each row roped alone at its own offset, and the input
//      is never modified (mlx-lm#707, vlm#1883, mlx-lm#1003)
//   R2 quantized attention for B >= 2, GQA R > 1 and unequal left padding == attention
//      over the dequantized K/V with the padding mask built independently (mlx-lm#1467,
//      vlm#1567)
//   R3 the P·V step of quantized attention for Dv in {64, 80, 96, 128} (mlx#4250)
//   R4 the quantize policy decides per layer with offset >= start (mlx-lm#495 / #477)
//   R5 a restore whose offset disagrees with the stored rows is an Error, the offset is
//      never inferred from the tensors (maclocal-api#46, docs/upstream-bugs.md §U4)
//   R6 a truncated or count-corrupted state file is an Error and the caches in memory
//      stay as they were (mlx-swift-lm PR #451)
//   R7 a cache trimmed back to no tokens saves, restores to the same state and continues
//      like its un-saved twin (issue 19: the deep run's Decode, Trim(1), SaveLoad failed
//      KVCache with "update with S = 0 tokens")
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <tuple>

#include "cache/batch_quantized_kv_cache.h"
#include "cache/chunked_kv_cache.h"
#include "cache/registry.h"
#include "property_tests/properties.h"
#include "reference/mask.h"
#include "reference/quantized_sdpa.h"
#include "reference/rope.h"
#include "reference/sdpa.h"

namespace kvlab::prop {

namespace {

constexpr float kPad = 7.5f;  // finite and outside content's [-1, 1): visible if a pad is ever attended

// (B, heads, n, dim): row b, column j holds content(s, b, tok(b, j), h, d), or kPad where
// tok(b, j) < 0 (left padding).
template <class F>
Tensor block(Stream s, std::int64_t batch, std::int64_t heads, std::int64_t n, std::int64_t dim, F tok) {
  Tensor t(DType::f32, {batch, heads, n, dim});
  float* out = t.view().as<float>();
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t d = 0; d < dim; ++d) {
          const std::int64_t p = tok(b, j);
          *out++ = p < 0 ? kPad : content(s, b, p, h, d);
        }
  return t;
}

// Tokens [p0, p0 + n) of every row into `cache` through the path its kind requires.
void feed(Backend& be, Cache& cache, const Config& c, std::int64_t p0, std::int64_t n) {
  const auto tok = [p0](std::int64_t, std::int64_t j) { return p0 + j; };
  const DTensor k = be.upload(block(Stream::key, c.batch, c.kv_heads, n, c.dk, tok));
  const DTensor v = be.upload(block(Stream::value, c.batch, c.kv_heads, n, c.dv, tok));
  if (cache.is_quantized()) cache.update_quantized(k, v);
  else cache.update(k, v);
}

// K or V as attention must see it: dequantized to f32, any mode (reference/quantized_sdpa.h).
Tensor dequantized(Backend& be, const QuantizedDTensor& q) {
  const Tensor wq = be.download(q.wq), scales = be.download(q.scales);
  const Tensor biases = q.spec.has_biases() ? be.download(q.biases) : Tensor();
  ref::QuantizedView view{wq.view(), scales.view(), biases.view(), q.spec};
  if (!q.spec.has_biases()) view.biases = {};
  return ref::dequantize_to_f32(view);
}

// Feeds `tokens` to a fresh cache of cfg's kind in 1..3 chunks; a chunked cache trims its
// front between them (as llama4 does) so start_position moves too.
std::unique_ptr<Cache> filled_cache(Backend& be, const Config& cfg, std::int64_t tokens) {
  std::unique_ptr<Cache> c = make_cache(be, cfg);
  std::int64_t at = 0;
  while (at < tokens) {
    const std::int64_t n = std::min(tokens - at, *rc::gen::inRange<std::int64_t>(1, tokens + 1));
    c->maybe_trim_front();
    feed(be, *c, cfg, at, n);
    at += n;
  }
  return c;
}

// A small config of `kind` for the multi-layer properties (R4–R6): B 1..2, one kv head,
// head dim `dim` (32 or 64, so every affine spec of gen_affine_spec fits).
Config small_config(Kind kind, std::int64_t dim, const QuantSpec& spec, Rounding rounding) {
  Config c;
  c.kind = kind;
  c.batch = *rc::gen::inRange<std::int64_t>(1, 3);
  c.dk = c.dv = dim;
  c.quantizable = true;
  c.spec = spec;
  c.rounding = rounding;
  c.max_size = *rc::gen::inRange<std::int64_t>(2, 12);
  c.chunk_size = *rc::gen::inRange<std::int64_t>(1, 12);
  c.tq_bits = *rc::gen::elementOf(std::vector<double>{2, 3, 3.5});
  return c;
}

QuantSpec gen_affine_spec(std::int64_t dim) {
  const int group = *rc::gen::elementOf(dim % 64 == 0 ? std::vector<int>{32, 64} : std::vector<int>{32});
  return QuantSpec::make(QuantMode::affine, *rc::gen::elementOf(std::vector<int>{2, 3, 4, 5, 6, 8}), group);
}

}  // namespace

// ---- R1 -------------------------------------------------------------------------------

void rope_vector_offsets_per_row(const Hooks& hooks) {
  const std::int64_t batch = *rc::gen::inRange<std::int64_t>(1, 9), heads = *rc::gen::inRange<std::int64_t>(1, 4);
  // T = 1 (decode) and T > 1 (prefill): vlm#1883 broke at T = 1 with B >= 2.
  const std::int64_t seq = *rc::gen::weightedOneOf<std::int64_t>(
      {{1, rc::gen::just<std::int64_t>(1)}, {2, rc::gen::inRange<std::int64_t>(2, 17)}});
  const std::int64_t dim = *rc::gen::elementOf(real_dims() ? std::vector<std::int64_t>{64, 80, 128, 256}
                                                            : std::vector<std::int64_t>{32, 64, 128});
  RopeParams p;
  p.dims = static_cast<int>(*rc::gen::elementOf(std::vector<std::int64_t>{dim, dim / 2}));
  p.traditional = *rc::gen::arbitrary<bool>();
  p.base = *rc::gen::elementOf(std::vector<float>{10000.0f, 500000.0f});
  p.scale = *rc::gen::elementOf(std::vector<float>{1.0f, 0.25f});
  // Left padding gives padding tokens negative positions (docs/lifecycle.md §Attention step).
  const auto offsets = *rc::gen::container<std::vector<std::int32_t>>(static_cast<std::size_t>(batch),
                                                                       rc::gen::inRange<std::int32_t>(-16, 5000));
  sized(CaseSize{1, batch * seq}, [&] {
    ReferenceBackend be;
    const Tensor x = block(Stream::query, batch, heads, seq, dim, [](std::int64_t, std::int64_t j) { return j; });
    const DTensor xd = be.upload(x), out = be.allocate(DType::f32, x.shape());
    DTensor offsets_d = be.allocate(DType::i32, {batch});
    be.upload(offsets_d, offsets.data());
    hooks.rope(be, xd, p, Offsets{0, offsets_d}, out);
    // mlx-lm#1003: Yarn/SuScaled RoPE scaled the caller's x in place.
    expect_close(be.download(xd), x, 0.0, "rope modified its input");
    const Tensor got = be.download(out);
    RC_ASSERT(got.shape() == x.shape());
    for (std::int64_t b = 0; b < batch; ++b)  // mlx-lm#707, vlm#1883: each row at its own offset
      expect_close(got.slice(0, b, b + 1), ref::rope(x.slice(0, b, b + 1), p, offsets[idx(b)]), 0.0,
                   "row " + std::to_string(b) + " (offset " + std::to_string(offsets[idx(b)]) +
                       ") vs that row roped alone");
  });
}

// ---- R2 -------------------------------------------------------------------------------

void quantized_batch_gqa_padded_mask(const Hooks& hooks) {
  const Config cfg = *rc::gen::exec([] {  // one generator, so the counterexample shows the final config
    Config c = *gen_config(Kind::quantized);
    c.batch = *rc::gen::inRange<std::int64_t>(2, 9);
    c.q_ratio = *rc::gen::elementOf(std::vector<std::int64_t>{2, 4, 8});
    c.kv_heads = c.q_ratio == 8 ? 1 : *rc::gen::inRange<std::int64_t>(1, 3);
    return c;
  });
  const auto lens = *rc::gen::container<std::vector<std::int64_t>>(static_cast<std::size_t>(cfg.batch),
                                                                    rc::gen::inRange<std::int64_t>(1, 13));
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<std::int32_t> lp;
  for (const std::int64_t l : lens) lp.push_back(static_cast<std::int32_t>(longest - l));
  std::vector<std::int64_t> chunks{longest};  // the left-padded prompt, then decode-sized chunks
  for (const std::int64_t n : gen_chunks(10)) chunks.push_back(n);
  sized(chunks, [&] {
    ReferenceBackend be;
    std::unique_ptr<Cache> cache = hooks.wrap(std::make_unique<BatchQuantizedKVCache>(be, lp, cfg.spec, cfg.rounding));
    const AttendOptions opts = attend_options(cfg);
    std::int64_t idx_before = 0;
    for (const std::int64_t n : chunks) {
      const std::vector<std::int32_t> positions = cache->offsets();  // -lp[b] + idx
      const auto tok = [&](std::int64_t b, std::int64_t j) { return idx_before + j - lp[idx(b)]; };
      const Tensor q = block(Stream::query, cfg.batch, cfg.q_heads(), n, cfg.dk, tok);
      const AttendResult r =
          hooks.attend(*cache, be.upload(q), be.upload(block(Stream::key, cfg.batch, cfg.kv_heads, n, cfg.dk, tok)),
                       be.upload(block(Stream::value, cfg.batch, cfg.kv_heads, n, cfg.dv, tok)), opts);
      RC_ASSERT(r.positions == positions);
      RC_ASSERT(r.quantized_kv.has_value());
      // The oracle: queries roped per row, the dequantized K/V the update returned, and
      // a mask built here from the padding (key j of row b visible to query i iff
      // lp[b] <= j <= idx + i, and the window), shared by every head of the row.
      Tensor offsets_t(DType::i32, {cfg.batch});
      std::copy(positions.begin(), positions.end(), offsets_t.view().as<std::int32_t>());
      const Tensor q_rot = cfg.rope_dims > 0 ? ref::rope(q, opts.rope, offsets_t) : q;
      const Tensor mask = ref::create_causal_mask(n, idx_before, cfg.window, lp, {}, ref::MaskForm::boolean);
      AttentionParams p = opts.attention;
      p.mask.kind = MaskKind::boolean;
      const Tensor expected =
          ref::sdpa(q_rot, dequantized(be, r.quantized_kv->keys), dequantized(be, r.quantized_kv->values), p, &mask);
      const Tensor got = be.download(r.out);
      // Rows of padding queries are unspecified (docs/kernels.md §Attention); compare the real
      // ones.
      for (std::int64_t b = 0; b < cfg.batch; ++b) {
        const std::int64_t first_real = std::clamp<std::int64_t>(lp[idx(b)] - idx_before, 0, n);
        if (first_real == n) continue;
        expect_close(got.slice(0, b, b + 1).slice(2, first_real, n), expected.slice(0, b, b + 1).slice(2, first_real, n),
                     1e-5, "batch row " + std::to_string(b) + " (left pad " + std::to_string(lp[idx(b)]) +
                               ") of quantized GQA attention vs dequantized attention with the padding mask");
      }
      idx_before += n;
    }
  });
}

// ---- R3 -------------------------------------------------------------------------------

void quantized_pv_value_dims(const Hooks& hooks) {
  const Config cfg = *rc::gen::exec([] {
    Config c = *gen_config(Kind::quantized);
    c.dv = *rc::gen::elementOf(std::vector<std::int64_t>{64, 80, 96, 128});
    c.dk = *rc::gen::elementOf(std::vector<std::int64_t>{64, 128});
    c.rope_dims = static_cast<int>(*rc::gen::elementOf(std::vector<std::int64_t>{0, c.dk, c.dk / 2}));
    // 80 fits only nvfp4's group of 16; 96 fits groups of 32 (affine, mxfp4, mxfp8).
    if (c.dv == 80) {
      c.spec = QuantSpec::make(QuantMode::nvfp4);
    } else {
      c.spec = *rc::gen::weightedOneOf<QuantSpec>(
          {{3, rc::gen::map(rc::gen::elementOf(std::vector<int>{2, 3, 4, 5, 6, 8}),
                            [](int bits) { return QuantSpec::make(QuantMode::affine, bits, 32); })},
           {1, rc::gen::elementOf(std::vector<QuantSpec>{QuantSpec::make(QuantMode::mxfp4),
                                                         QuantSpec::make(QuantMode::mxfp8)})}});
    }
    c.quantizable = true;
    return c;
  });
  const std::vector<std::int64_t> chunks = gen_chunks(16);
  sized(chunks, [&] {
    Sut sut(cfg, hooks);
    for (const std::int64_t n : chunks) {
      const Step s = attend_chunk(sut, n);
      RC_ASSERT(s.r.quantized_kv.has_value());
      AttentionParams p = attend_options(cfg).attention;
      p.mask = s.r.mask.spec;
      const std::optional<Tensor>& mask = s.r.mask.array;
      const Tensor expected = ref::sdpa(s.q_rot, dequantized(sut.be, s.r.quantized_kv->keys),
                                        dequantized(sut.be, s.r.quantized_kv->values), p, mask ? &*mask : nullptr);
      expect_close(sut.be.download(s.r.out), expected, 1e-5,
                   "quantized attention (Dv " + std::to_string(cfg.dv) + ", " + to_string(cfg.spec) +
                       ") vs attention over the dequantized cache at " + std::to_string(s.p0));
    }
  });
}

// ---- R4 -------------------------------------------------------------------------------

void quantize_policy_per_layer(const Hooks& hooks) {
  // A hybrid model: layer kinds mixed, every layer fed the same tokens (mlx-lm#477: the
  // old policy looked at layer 0's type and offset only, with `>`).
  const auto kinds = *rc::gen::container<std::vector<Kind>>(
      *rc::gen::inRange<std::size_t>(1, 7),
      rc::gen::elementOf(
          std::vector<Kind>{Kind::kv, Kind::kv, Kind::rotating, Kind::quantized, Kind::chunked, Kind::turboquant}));
  const std::int64_t tokens = *rc::gen::inRange<std::int64_t>(0, 24);
  const std::int64_t start = *rc::gen::inRange<std::int64_t>(0, tokens + 3);
  const auto dim = *rc::gen::elementOf(std::vector<std::int64_t>{32, 64});
  const QuantSpec spec = gen_affine_spec(dim);
  const Rounding rounding = *rc::gen::elementOf(std::vector<Rounding>{Rounding::mlx_cpu, Rounding::mlx_gpu});
  std::vector<Config> cfgs;
  for (const Kind k : kinds) cfgs.push_back(small_config(k, dim, spec, rounding));
  const auto n_layers = static_cast<std::int64_t>(kinds.size());
  sized(CaseSize{n_layers, n_layers * tokens}, [&] {
    ReferenceBackend be;
    std::vector<std::unique_ptr<Cache>> layers;
    std::vector<CacheState> before;
    for (const Config& c : cfgs) {
      layers.push_back(tokens > 0 ? filled_cache(be, c, tokens) : make_cache(be, c));
      before.push_back(layers.back()->state());
    }
    const std::vector<QuantizeDecision> report = hooks.quantize_policy(layers, spec, rounding, start);
    RC_ASSERT(report.size() == kinds.size());
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const Kind k = kinds[i];
      const bool converts = k == Kind::kv && tokens >= start;  // per layer, offset >= start
      const std::string want = k == Kind::kv        ? (converts ? "quantized" : "below-start")
                               : k == Kind::rotating ? "kept-unquantized"
                               : k == Kind::quantized ? "already-quantized"
                                                      : "skipped";
      RC_ASSERT(report[i].layer == i);
      if (report[i].action != want)
        RC_FAIL("layer " + std::to_string(i) + " (" + kind_name(k) + ", offset " + std::to_string(tokens) +
                ", start " + std::to_string(start) + "): action " + report[i].action + ", expected " + want);
      RC_ASSERT(layers[i] != nullptr);
      if (!converts) {
        check_same_state(layers[i]->state(), before[i]);
        continue;
      }
      // Quantization is per token row: the converted layer equals a QuantizedKVCache fed
      // the same tokens.
      Config q = cfgs[i];
      q.kind = Kind::quantized;
      std::unique_ptr<Cache> direct = make_cache(be, q);
      if (tokens > 0) feed(be, *direct, q, 0, tokens);
      RC_ASSERT(layers[i]->is_quantized());
      check_same_state(layers[i]->state(), direct->state());
    }
  });
}

// ---- R5 -------------------------------------------------------------------------------

void restore_rejects_inconsistent_offset(const Hooks& hooks) {
  const Kind kind = *rc::gen::elementOf(std::vector<Kind>{Kind::kv, Kind::quantized, Kind::chunked, Kind::turboquant});
  const auto dim = *rc::gen::elementOf(std::vector<std::int64_t>{32, 64});
  const Config cfg = small_config(kind, dim, gen_affine_spec(dim), Rounding::mlx_cpu);
  const std::int64_t tokens = *rc::gen::inRange<std::int64_t>(1, 40);
  const bool edit_meta = *rc::gen::arbitrary<bool>();
  const std::int64_t delta = *rc::gen::inRange<std::int64_t>(1, 6);
  sized(CaseSize{1, tokens}, [&] {
    ReferenceBackend be;
    const std::unique_ptr<Cache> cache = filled_cache(be, cfg, tokens);
    const CacheState good = cache->state();
    check_same_state(hooks.restore(be, good)->state(), good);  // the state as saved loads as itself
    CacheState bad = good;
    const std::int64_t offset = std::stoll(good.meta.at("offset"));
    std::string what;
    if (edit_meta) {  // maclocal-api#46: an offset that is not the one the rows say
      const std::int64_t wrong = offset + (delta % 2 == 0 ? delta : -std::min(delta, offset));
      bad.meta["offset"] = std::to_string(wrong == offset ? offset + 1 : wrong);
      what = "meta offset " + bad.meta["offset"] + " over rows for offset " + std::to_string(offset);
    } else {  // rows missing: a restore that trusts the shapes would take a shorter offset
      for (auto& [name, t] : bad.tensors) {
        const std::int64_t rows = t.dim(2);
        t = t.slice(2, 0, rows - std::min(delta, rows));
      }
      what = "tensors cut short under meta offset " + std::to_string(offset);
    }
    // Any kvlab::Error rejects it (cache_from_state promises kind corrupt; not pinned here).
    bool rejected = false;
    try {
      (void)hooks.restore(be, bad);
    } catch (const Error&) {
      rejected = true;
    }
    if (!rejected) RC_FAIL(std::string(kind_name(kind)) + " state with " + what + " was restored instead of rejected");
  });
}

// ---- R6 -------------------------------------------------------------------------------

namespace {

enum class Corruption : std::uint8_t { truncate, layer_count, meta_offset, tensor_shape };
void showValue(Corruption c, std::ostream& os) {
  static const char* names[] = {"truncate", "layer_count", "meta_offset", "tensor_shape"};
  os << names[static_cast<int>(c)];
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Rewrites the decimal right after `key` (in the header) to another value with the same
// number of digits, so every other byte offset stays valid. False if `key` is absent.
bool bump_number_after(std::string& bytes, const std::string& key) {
  std::uint64_t header = 0;  // the safetensors header length, u64 little-endian
  for (std::size_t i = 0; i < 8 && i < bytes.size(); ++i)
    header |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  const std::size_t at = bytes.find(key);
  if (at == std::string::npos || at + key.size() >= 8 + header) return false;
  const std::size_t d = at + key.size();
  std::size_t end = d;
  while (end < bytes.size() && bytes[end] >= '0' && bytes[end] <= '9') ++end;
  if (end == d) return false;
  char& last = bytes[end - 1];
  last = last == '9' ? '8' : static_cast<char>(last + 1);
  return true;
}

std::filesystem::path temp_path() {
  static std::atomic<unsigned> counter{0};
  return std::filesystem::temp_directory_path() /
         ("kvlab-prop-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + ".safetensors");
}

}  // namespace

void state_file_corruption_is_an_error(const Hooks& hooks) {
  const auto kinds = *rc::gen::container<std::vector<Kind>>(
      *rc::gen::inRange<std::size_t>(1, 5),
      rc::gen::elementOf(std::vector<Kind>{Kind::kv, Kind::rotating, Kind::quantized, Kind::chunked, Kind::turboquant}));
  const std::size_t n_layers = kinds.size();
  const auto dim = *rc::gen::elementOf(std::vector<std::int64_t>{32, 64});
  const QuantSpec spec = gen_affine_spec(dim);
  std::vector<Config> cfgs;
  std::vector<std::int64_t> tokens;
  for (std::size_t i = 0; i < n_layers; ++i) {
    cfgs.push_back(small_config(kinds[i], dim, spec, Rounding::mlx_cpu));
    tokens.push_back(*rc::gen::inRange<std::int64_t>(1, 24));
  }
  Corruption how = *rc::gen::elementOf(std::vector<Corruption>{Corruption::truncate, Corruption::layer_count,
                                                               Corruption::meta_offset, Corruption::tensor_shape});
  const auto cut = *rc::gen::inRange<std::uint64_t>(0, 1000000);
  // meta_offset needs a layer whose offset the rows pin down (a full ring's does not).
  std::vector<std::size_t> pinned;
  for (std::size_t i = 0; i < n_layers; ++i)
    if (kinds[i] != Kind::rotating) pinned.push_back(i);
  if (how == Corruption::meta_offset && pinned.empty()) how = Corruption::truncate;
  const std::size_t victim = pinned.empty() ? 0 : pinned[*rc::gen::inRange<std::size_t>(0, pinned.size())];
  std::int64_t all_tokens = 0;
  for (const std::int64_t t : tokens) all_tokens += t;
  sized(CaseSize{static_cast<std::int64_t>(n_layers), all_tokens}, [&] {
    ReferenceBackend be;
    std::vector<std::unique_ptr<Cache>> live;
    std::vector<const Cache*> raw;
    for (std::size_t i = 0; i < n_layers; ++i) {
      live.push_back(filled_cache(be, cfgs[i], tokens[i]));
      raw.push_back(live.back().get());
    }
    std::vector<CacheState> before;
    for (const auto& l : live) before.push_back(l->state());
    const std::filesystem::path path = temp_path();
    struct Remove {
      std::filesystem::path p;
      ~Remove() { std::filesystem::remove(p); }
    } remove{path};
    save_caches(path, raw);
    {  // the file as written loads as the caches it came from
      std::vector<std::unique_ptr<Cache>> copy;
      hooks.load_into(path, be, copy);
      RC_ASSERT(copy.size() == n_layers);
      for (std::size_t i = 0; i < n_layers; ++i) check_same_state(copy[i]->state(), before[i]);
    }
    std::string bytes = read_file(path), what;
    switch (how) {
      case Corruption::truncate:
        bytes.resize(static_cast<std::size_t>(cut % bytes.size()));
        what = "file truncated to " + std::to_string(bytes.size()) + " bytes";
        break;
      case Corruption::layer_count:
        RC_ASSERT(bump_number_after(bytes, "\"kvlab.layers\":\""));
        what = "kvlab.layers edited";
        break;
      case Corruption::meta_offset:
        RC_ASSERT(bump_number_after(bytes, "\"L." + std::to_string(victim) + ".meta.offset\":\""));
        what = "layer " + std::to_string(victim) + " meta offset edited";
        break;
      case Corruption::tensor_shape:
        RC_ASSERT(bump_number_after(bytes, "\"shape\":["));
        what = "a tensor's first shape dim edited";
        break;
    }
    write_file(path, bytes);
    std::vector<Cache*> identity;
    for (const auto& l : live) identity.push_back(l.get());
    bool threw = false;
    try {
      hooks.load_into(path, be, live);
    } catch (const Error&) {
      threw = true;
    }
    if (!threw) RC_FAIL("loading a corrupt state file (" + what + ") did not throw");
    // The caches in memory are the same objects with the same content.
    RC_ASSERT(live.size() == n_layers);
    for (std::size_t i = 0; i < n_layers; ++i) {
      if (live[i].get() != identity[i]) RC_FAIL("layer " + std::to_string(i) + " was replaced by a failed load (" + what + ")");
      check_same_state(live[i]->state(), before[i]);
    }
  });
}

// ---- R7 -------------------------------------------------------------------------------

namespace {

// One update of tokens [p0, p0 + n) on both caches through the path their kind requires;
// what they return must agree bit for bit.
void update_both(Backend& be, Cache& twin, Cache& restored, const Config& c, std::int64_t p0, std::int64_t n) {
  const auto tok = [p0](std::int64_t, std::int64_t j) { return p0 + j; };
  const DTensor k = be.upload(block(Stream::key, c.batch, c.kv_heads, n, c.dk, tok));
  const DTensor v = be.upload(block(Stream::value, c.batch, c.kv_heads, n, c.dv, tok));
  const std::string at = " after the restore, update [" + std::to_string(p0) + ", " + std::to_string(p0 + n) + ")";
  if (twin.is_quantized()) {
    const FetchedQuantizedKV a = twin.update_quantized(k, v), b = restored.update_quantized(k, v);
    for (const auto& [x, y, side] : {std::tuple{&a.keys, &b.keys, "keys"}, std::tuple{&a.values, &b.values, "values"}}) {
      expect_close(be.download(y->wq), be.download(x->wq), 0.0, std::string(side) + ".wq" + at);
      expect_close(be.download(y->scales), be.download(x->scales), 0.0, std::string(side) + ".scales" + at);
      if (x->biases) expect_close(be.download(y->biases), be.download(x->biases), 0.0, std::string(side) + ".biases" + at);
    }
  } else {
    const FetchedKV a = twin.update(k, v), b = restored.update(k, v);
    expect_close(be.download(b.keys), be.download(a.keys), 0.0, "keys" + at);
    expect_close(be.download(b.values), be.download(a.values), 0.0, "values" + at);
  }
  if (restored.offsets() != twin.offsets()) RC_FAIL("offsets differ" + at);
  check_same_state(restored.state(), twin.state());
}

}  // namespace

void trimmed_empty_round_trips(const Hooks& hooks) {
  const Kind kind =
      *rc::gen::elementOf(std::vector<Kind>{Kind::kv, Kind::rotating, Kind::quantized, Kind::chunked, Kind::turboquant});
  const auto dim = *rc::gen::elementOf(std::vector<std::int64_t>{32, 64});
  const Rounding rounding = *rc::gen::elementOf(std::vector<Rounding>{Rounding::mlx_cpu, Rounding::mlx_gpu});
  const Config cfg = small_config(kind, dim, gen_affine_spec(dim), rounding);
  // A ring is trimmable only below max_size; the others take up to 48 tokens, past
  // several chunk sizes (a chunked cache trims its front between chunks, as llama4 does).
  const std::vector<std::int64_t> fill = gen_chunks(kind == Kind::rotating ? cfg.max_size - 1 : 48);
  const std::int64_t extra = *rc::gen::inRange<std::int64_t>(0, 3);  // trim past the stored tokens clamps
  const std::vector<std::int64_t> next = gen_chunks(12);
  std::vector<std::int64_t> all = fill;
  all.insert(all.end(), next.begin(), next.end());
  sized(all, [&] {
    ReferenceBackend be;
    const auto build = [&] {
      std::unique_ptr<Cache> c = hooks.wrap(make_cache(be, cfg));
      std::int64_t at = 0;
      for (const std::int64_t n : fill) {
        if (kind == Kind::chunked) hooks.trim_front(c);
        feed(be, *c, cfg, at, n);
        at += n;
      }
      const std::int64_t held = c->kv_length();
      RC_ASSERT(c->is_trimmable());
      RC_ASSERT(c->trim(held + extra) == held);
      RC_ASSERT(c->kv_length() == 0);
      return c;
    };
    const std::unique_ptr<Cache> twin = build(), saved = build();
    const CacheState s = saved->state();
    const std::unique_ptr<Cache> restored = hooks.wrap(hooks.restore(be, s));
    check_same_state(restored->state(), s);
    if (restored->offsets() != twin->offsets()) RC_FAIL("the restored cache has other offsets than its twin");
    std::int64_t p0 = twin->offsets().at(0);
    for (const std::int64_t n : next) {
      update_both(be, *twin, *restored, cfg, p0, n);
      p0 += n;
    }
  });
}

}  // namespace kvlab::prop
