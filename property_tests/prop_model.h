// The property framework (DESIGN.md "Observables"): a per-sequence token-log model of a
// single-sequence cache, deterministic K/V/Q content per (row, absolute position, head,
// feature), an attention oracle over the model, and checks that compare what a cache
// shows with what the model says it must show.
//
// Why a token log and not a second cache: every observable is a function of "which
// absolute positions does the cache hold / does query P see", and the stored data of
// position p is content(p) (roped at p when it came in through attend, quantized per
// row when the cache is quantized). So the model never stores tensors, only offsets,
// per-position flags and, for rotating caches, the live row count (which parts ways with
// min(offset, max) after a chunk, spec §4.3).
//
// Faults are injected only through Hooks (test-only code in property_tests/zoo/): the
// production hooks call the real cache/attend/registry functions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "cache/attend.h"
#include "cache/cache.h"
#include "cache/quantized_kv_cache.h"
#include "reference/reference_backend.h"

namespace kvlab::prop {

enum class Stream : std::uint32_t { key = 1, value = 2, query = 3 };
// Deterministic content in [-1, 1): a hash of (stream, row, absolute position, head,
// feature). Equal positions give equal data in every run, so any chunking of the same
// token sequence feeds a cache identical inputs.
float content(Stream s, std::int64_t b, std::int64_t pos, std::int64_t head, std::int64_t d);

enum class Kind : std::uint8_t { kv, rotating, quantized };
const char* kind_name(Kind k);

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
  float scale() const;
  std::int64_t q_heads() const { return kv_heads * q_ratio; }
};
std::ostream& operator<<(std::ostream& os, const Config& c);
void showValue(const Config& c, std::ostream& os);

// Head dims for the generators: CI uses {32, 64, 128} (cheap, still hits the
// Appendix B.1 widths at 128); KVLAB_PROP_DIMS=real (label property-deep) uses the
// model dims 64/80/128/256 (80 only for unquantized caches: not a multiple of a group).
bool real_dims();

// The token-log model.
struct Model {
  Config cfg;
  bool quantized = false;  // the cache stores quantized data now
  std::int64_t offset = 0;
  std::int64_t stored = 0;  // rotating: live rows (may exceed max_size after a chunk)
  std::vector<std::uint8_t> roped;  // per absolute position [0, offset): K stored roped

  // The positions an update of n tokens returns, in temporal order (spec §4.1, §4.3).
  std::vector<std::int64_t> returned_positions(std::int64_t n) const;
  // The positions the cache holds now in temporal order (rotating: temporal()).
  std::vector<std::int64_t> held_positions() const;
  // Applies an update of n tokens (roped or not) to the log.
  void append(std::int64_t n, bool roped_keys);
  void trim(std::int64_t n);
  bool trimmable() const { return cfg.kind != Kind::rotating || offset < cfg.max_size; }
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
};
Hooks production_hooks();
std::unique_ptr<Cache> extract_rotating(Backend& be, const Cache& cache);  // the correct snapshot

// The system under test: a backend, the cache, the hooks and a memo of expected rows.
class Sut {
 public:
  Sut(const Config& cfg, const Hooks& hooks);
  ReferenceBackend be;
  Config cfg;
  const Hooks& hooks;
  std::unique_ptr<Cache> cache;
  void replace(std::unique_ptr<Cache> c) { cache = hooks.wrap(std::move(c)); }

  // (B, H, n, D) f32 rows the model says are stored at `positions` (K roped per flag).
  Tensor expected(Stream s, const std::vector<std::int64_t>& positions, const Model& m);
  // Raw (un-roped) inputs for positions [p0, p0 + n): (B, heads, n, D).
  Tensor raw(Stream s, std::int64_t p0, std::int64_t n);

 private:
  // Memo of rows per position, (B, H, D) each: [0] raw keys, [1] roped keys, [2] values.
  // Content is a pure function of the config and the position, so it is computed once
  // per case (the content checks after every command would otherwise dominate CI time).
  const float* row(int which, std::int64_t pos);
  std::vector<std::vector<float>> memo_[3];
};

AttendOptions attend_options(const Config& cfg);

// --- checks (RC_ASSERT / RC_FAIL inside; usable from any property) -----------------
// Offsets, kind, kv_length, trimmability and logical content against the model.
void check_observables(Sut& sut, const Model& m);
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
// index into the returned keys.
Tensor oracle_attention(Sut& sut, const Model& after, const std::vector<std::int64_t>& positions, std::int64_t n);

// Bit-exact comparison of two tensors; returns a description of the first difference.
std::string first_difference(const Tensor& a, const Tensor& b, double tol = 0.0);

}  // namespace kvlab::prop
