// The property framework (docs/design.md §Observables): a per-sequence token-log model of a
// single-sequence cache, deterministic K/V/Q content per (row, absolute position, head,
// feature), an attention oracle over the model, and checks that compare what a cache
// shows with what the model says it must show.
//
// Why a token log and not a second cache: every observable is a function of "which
// absolute positions does the cache hold / does query P see", and the stored data of
// position p is content(p) (roped at p when it came in through attend, quantized per
// row when the cache is quantized). So the model never stores tensors, only offsets,
// per-position flags and, for rotating caches, the live row count (which parts ways with
// min(offset, max) after a chunk, docs/semantics.md §Rotating cache).
//
// Faults are injected only through Hooks (test-only code in property_tests/zoo/): the
// production hooks call the real cache/attend/registry functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cache/attend.h"
#include "cache/cache.h"
#include "cache/catalogue.h"
#include "cache/quantized_kv_cache.h"
#include "cache/turboquant_kv_cache.h"
#include "reference/reference_backend.h"

namespace kvlab {
void showValue(const QuantSpec& s, std::ostream& os);  // RapidCheck counterexamples
void showValue(CacheKind k, std::ostream& os);         // its class name
}  // namespace kvlab

namespace kvlab::prop {

enum class Stream : std::uint32_t { key = 1, value = 2, query = 3 };
// Deterministic content in [-1, 1): a hash of (stream, row, absolute position, head,
// feature). Equal positions give equal data in every run, so any chunking of the same
// token sequence feeds a cache identical inputs.
float content(Stream s, std::int64_t b, std::int64_t pos, std::int64_t head, std::int64_t d);

// The single-sequence kinds of the catalogue (kv, rotating, quantized, chunked,
// turboquant); the batch kinds have their own rigs (properties.h).
using Kind = CacheKind;
const char* kind_name(Kind k);  // the class name, as counterexamples print it

// One property case's cache geometry and options; printed in every counterexample.
struct Config {
  Kind kind = Kind::kv;
  std::int64_t batch = 1, kv_heads = 1, q_ratio = 1, dk = 32, dv = 32;
  int rope_dims = 0;  // 0 = no RoPE
  int window = 0;     // attend's sliding window (0 = none)
  std::int64_t max_size = 0, keep = 0;  // rotating only
  bool quantizable = false;             // spec fits dk and dv (KVCache → to_quantized allowed)
  QuantSpec spec{};                     // quantized cache / to_quantized target
  Rounding rounding = Rounding::mlx_cpu;
  std::int64_t chunk_size = 0;          // chunked only
  // turboquant only: TurboQuantKVCache(tq_bits, tq_seed, tq_key_bits, tq_value_bits, tq_meaning)
  double tq_bits = 0;
  std::uint64_t tq_seed = 0;
  std::optional<double> tq_key_bits, tq_value_bits;
  FractionalBits tq_meaning = FractionalBits::split_channels;
  float scale() const;
  std::int64_t q_heads() const { return kv_heads * q_ratio; }
};
std::ostream& operator<<(std::ostream& os, const Config& c);
void showValue(const Config& c, std::ostream& os);

// Head dims for the generators: CI uses {32, 64, 128} (cheap, still hits the
// docs/upstream-bugs.md §U1 widths at 128); KVLAB_PROP_DIMS=real (label property-deep) uses the
// model dims 64/80/128/256 (80 only for unquantized caches: not a multiple of a group).
bool real_dims();

// Per case token budget of the stateful tests: keeps the content checks (O(offset) each)
// cheap in CI. TurboQuant decodes its whole content on every fetch, so it gets less.
std::int64_t max_tokens(Kind k);

// The token-log model.
struct Model {
  Config cfg;
  bool quantized = false;  // the cache stores quantized data now
  std::int64_t offset = 0;
  std::int64_t stored = 0;  // rotating: live rows (may exceed max_size after a chunk)
  std::vector<std::uint8_t> roped;  // per absolute position [0, offset): K stored roped
  std::int64_t start = 0;  // chunked: start_position, the tokens dropped from the front
  // turboquant: the first update (its tensor fixes the codecs' split channels,
  // docs/turboquant.md §Bit widths)
  std::int64_t tq_first = 0;
  bool tq_first_roped = false;

  // The positions an update of n tokens returns, in temporal order (docs/semantics.md §KV cache,
  // docs/semantics.md §Rotating cache).
  std::vector<std::int64_t> returned_positions(std::int64_t n) const;
  // The positions the cache holds now in temporal order (rotating: temporal()).
  std::vector<std::int64_t> held_positions() const;
  // Applies an update of n tokens (roped or not) to the log.
  void append(std::int64_t n, bool roped_keys);
  void trim(std::int64_t n);
  bool trimmable() const { return cfg.kind != Kind::rotating || offset < cfg.max_size; }
  // What trim(n) can remove: chunked never goes below start_position
  // (docs/semantics.md §Chunked cache).
  std::int64_t trim_limit() const { return cfg.kind == Kind::chunked ? offset - start : offset; }
  // ChunkedKVCache::maybe_trim_front (mlx-lm#1673 rule: on the valid count).
  void trim_front();
};

// Fault-injection points. production_hooks() calls the real code.
struct Hooks {
  std::function<AttendResult(Cache&, const DTensor&, const DTensor&, const DTensor&, const AttendOptions&)> attend;
  std::function<std::unique_ptr<Cache>(Backend&, const CacheState&)> restore;
  std::function<std::vector<QuantizeDecision>(std::vector<std::unique_ptr<Cache>>&, const QuantSpec&, Rounding,
                                              std::int64_t)>
      quantize_policy;
  // Prefix-cache style snapshot of a rotating cache (keep 0): its last min(offset, max)
  // tokens re-adopted by a fresh cache (mlx-lm#1114 extract semantics).
  std::function<std::unique_ptr<Cache>(Backend&, const Cache&)> extract;
  // Applied to every cache the harness creates or receives (wrapper mutants).
  std::function<std::unique_ptr<Cache>(std::unique_ptr<Cache>)> wrap;
  // A KV-shared layer over a producer's result (cache/attend.h attend_shared); `producer`
  // is the producer layer's cache after its update.
  std::function<DTensor(Backend&, const AttendResult&, const DTensor&, const AttendOptions&, const Cache& producer)>
      attend_shared;
  // The RoPE kernel (Backend::rope): out = rope(x) at `offsets`; x must stay unchanged.
  std::function<void(Backend&, const DTensor& x, const RopeParams&, const Offsets&, const DTensor& out)> rope;
  // ChunkedKVCache::maybe_trim_front on a layer's cache (a mutant may replace the cache).
  std::function<void(std::unique_ptr<Cache>&)> trim_front;
  // Loading a state file into a model's live layer list: every layer replaced by the
  // file's, or a kvlab::Error with `layers` untouched (cache/registry.h load_caches).
  std::function<void(const std::filesystem::path&, Backend&, std::vector<std::unique_ptr<Cache>>& layers)> load_into;
};
Hooks production_hooks();
// A fresh, empty cache of cfg's kind and options.
std::unique_ptr<Cache> make_cache(Backend& be, const Config& cfg);

// The system under test: a backend, the cache, the hooks and a memo of expected rows.
// The backend is the one KVLAB_PROP_BACKEND names (repro_line.h), reference by default;
// the oracle side (expected rows, reference kernels) always runs on the host.
class Sut {
 public:
  Sut(const Config& cfg, const Hooks& hooks);
  std::unique_ptr<Backend> owned_backend;  // before `be`, which refers to it
  Backend& be;
  Config cfg;
  const Hooks& hooks;
  std::unique_ptr<Cache> cache;
  void replace(std::unique_ptr<Cache> c) { cache = hooks.wrap(std::move(c)); }

  // (B, H, n, D) f32 rows the model says are stored at `positions` (K roped per flag;
  // TurboQuant: the codec round trip of those rows, what its fetch() decodes).
  Tensor expected(Stream s, const std::vector<std::int64_t>& positions, const Model& m);
  // Raw (un-roped) inputs for positions [p0, p0 + n): (B, heads, n, D).
  Tensor raw(Stream s, std::int64_t p0, std::int64_t n);

  // True when the backend under test is the reference, whose kernels are the oracle's.
  bool reference_backend() const;
  // x (B, H, n, D) rotated by the backend under test as attend() does it (per-row offsets,
  // every row at p0), after checking it against ref::rope within the rope op's tolerance
  // (harness/ops/rope_info.cc): the numerics are checked here, once per attend.
  Tensor backend_rope(const Tensor& x, std::int64_t p0);
  // An attend() stored keys of positions [p0, p0 + n): on a backend other than the
  // reference, the model's roped rows of those positions become that backend's own
  // rotation of them (backend_rope). Why: what the cache holds, returns and serializes is
  // bookkeeping (which rows, in which order, quantized how), and the backend's RoPE is
  // within a tolerance of the oracle's, not equal, so rows from ref::rope would differ in
  // the last bits (and, once quantized, in scales and codes). With the kernel's own rows
  // the content checks stay bit for bit. On the reference the memo keeps ref::rope's rows.
  void attended_keys(std::int64_t p0, std::int64_t n, const Model& m);

 private:
  // Memo of rows per position, (B, H, D) each: [0] raw keys, [1] roped keys, [2] values;
  // TurboQuant: [3..5] their codec round trips. Content is a pure function of the config
  // and the position (and, for TurboQuant, of the codecs, fixed by the first update), so
  // it is computed once per case (the content checks after every command would
  // otherwise dominate CI time).
  const float* row(int which, std::int64_t pos, const Model& m);
  // expected() with the round trip on (coded) or off.
  Tensor gather(Stream s, const std::vector<std::int64_t>& positions, const Model& m, bool coded);
  std::vector<std::vector<float>> memo_[6];
  std::optional<std::vector<TurboQuantCodec>> turbo_[2];  // keys, values: the oracle's codec parts
};

// ---- TurboQuant oracle (chunked_turboquant.cc) --------------------------------------
// The codec parts (one, or {low, high} for split bits) a TurboQuantKVCache of `cfg` builds
// for one side, rebuilt from docs/turboquant.md §Bit widths and reference/turboquant.h: seeds (keys
// seed, values seed + 1, high part + 97), side bits (resolve_kv_bits under k_floor_v_ceil) and
// the split channels picked from `first`, the first tensor the cache saw (largest mean
// |x|, ties to the higher channel).
std::vector<TurboQuantCodec> turbo_codecs(const Config& cfg, bool keys, const Tensor& first);
// decode(encode(x)) through the reference codec, per token row: (B, H, n, D) f32.
Tensor turbo_roundtrip(const std::vector<TurboQuantCodec>& parts, const Tensor& x);

AttendOptions attend_options(const Config& cfg);

// --- checks (RC_ASSERT / RC_FAIL inside; usable from any property) -----------------
// Offsets, kind, kv_length, trimmability, logical content against the model and the NaN
// poison of unused rows. `content` false skips the logical content of a TurboQuant cache
// (a full decode) right after an update whose result, that same decode, was checked.
void check_observables(Sut& sut, const Model& m, bool content = true);
// Every element of rows [begin, capacity) of a (B, H, capacity, W) block is poison: NaN
// for float dtypes, all-ones for integer codes (spec: unused and evicted slots).
void check_poison(Backend& be, const DTensor& buffer, std::int64_t begin, const std::string& what);
// The K/V an update returned (`positions` = Model::returned_positions before the
// update, `after` = the model after it); order_free for a single-token ring write.
void check_fetched(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, const FetchedKV* kv,
                   const FetchedQuantizedKV* qkv, bool order_free);
// An attend result for the last n of `positions` as queries, against the oracle.
void check_attend(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, std::int64_t n,
                  const AttendResult& r);
// Exact state equality (class, meta, tensors bit for bit).
void check_same_state(const CacheState& a, const CacheState& b);

// The attention oracle: double-precision softmax over the positions each query sees,
// positions (Model::returned_positions) with the cache's mask rule: causal, window by
// index into the returned keys; chunked: llama4's rule on absolute positions (same
// chunk, k <= q, and q − k < window when a window is set).
Tensor oracle_attention(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, std::int64_t n);

// Bit-exact comparison of two tensors; returns a description of the first difference.
std::string first_difference(const Tensor& a, const Tensor& b, double tol = 0.0);
// RC_FAIL naming `what` and the first difference beyond `tol`, unless the tensors agree.
void expect_same(const Tensor& actual, const Tensor& expected, const std::string& what, double tol = 0.0);
inline void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  expect_same(a, b, what, tol);
}

// A non-negative index for std::vector.
inline std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

}  // namespace kvlab::prop
