// cache: cache-level cases (issue 4). One problem is a cache kind, its shape and a
// command script (cache/cache_script.h); invoke() builds the cache over the backend
// under test and runs the script, every attention through attend() (snapshot → RoPE →
// update → SDPA / quantized SDPA) or attend_shared(), so the backend's RoPE, quantize,
// data-movement and attention kernels run in sequence exactly as a model drives them.
// The spine runs the same script over the reference backend and compares:
//   attn        every attention output of the script, concatenated (step after step,
//               each (B, Hq, S, D) block flattened to rows of D) — within the budget below
//   offsets     offsets() after every command, concatenated (int32, bit-exact)
//   kv_length   kv_length() after every command (int32, bit-exact)
//   content     the final logical content (cache_script::cache_content): the real tokens
//               of every row in temporal order; plain kinds "keys"/"values", packed kinds
//               their codes and scales (biases) / turboquant norms and indices — bit-exact,
//               except "keys" with RoPE on (budget below).
// Parameters a kind does not use (max/keep: rotating kinds; chunk: chunked; qmode/group:
// quantized kinds and kv with a `q` command; bits: those and turboquant; lpad/rpad: batch kinds) must keep
// their defaults, so one problem has one line. Packed kinds need rope=0 (see setup_of).
//
// prepare() runs the script once over a private ReferenceBackend (the "trace"): it sizes
// the content outputs, rejects scripts the cache refuses (INVALID, with the cache's
// message), and records what the budget needs; budget() reuses it (memoized by line).
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

#include "cache/cache_script.h"
#include "harness/ops/ops.h"
#include "reference/quantized_sdpa.h"
#include "reference/reference_backend.h"
#include "reference/turboquant.h"

namespace kvlab::harness::ops {

namespace {

namespace cs = kvlab::cache_script;

constexpr double kU = 0x1p-24;  // f32 unit roundoff

double denorm_of(DType t) { return t == DType::f32 ? 0x1p-149 : (t == DType::f16 ? 0x1p-24 : 0x1p-133); }

std::vector<ParamSpec> cache_params() {
  return {word_param("kind", cs::kind_names()),
          int_param("B", 1, true),
          int_param("Hq", 4),
          int_param("Hkv", 2),
          int_param("D", 64),
          dtype_param(),
          int_param("rope", 1, true, 0),
          int_param("window", 0, true, 0),
          int_param("max", 16, true),
          int_param("keep", 0, true, 0),
          int_param("chunk", 16, true),
          word_param("qmode", quant_mode_names()),
          int_param("bits", 4),
          int_param("group", 32),
          int_param("lpad", 0, true, 0),
          int_param("rpad", 0, true, 0),
          // Free-form (no choice list): the grammar of cache_script.h validates it.
          ParamSpec{"script", ParamKind::word, "p8.d", {}, false, 1}};
}

void require_default(const Problem& p, std::string_view key, std::string_view kind) {
  for (const ParamSpec& s : cache().params()) {
    if (s.key == key) {
      KVLAB_REQUIRE(p.word(key) == canonical_value(s, s.default_value), invalid_argument, "kind=", kind,
                    " does not use ", key, "=", p.word(key), " (leave it at its default ", s.default_value, ")");
    }
  }
}

CacheSetup setup_of(const Problem& p) {
  CacheSetup s;
  const std::string& kind = p.word("kind");
  const auto& names = cs::kind_names();
  s.kind = static_cast<cs::Kind>(std::find(names.begin(), names.end(), kind) - names.begin());
  s.batch = p.integer("B"), s.hq = p.integer("Hq"), s.hkv = p.integer("Hkv"), s.dim = p.integer("D");
  s.dtype = dtype_from_name(p.word("dtype"));
  s.rope = p.flag("rope");
  s.window = p.int32("window");
  s.max_size = p.integer("max"), s.keep = p.integer("keep"), s.chunk = p.integer("chunk");
  s.lpad = p.integer("lpad"), s.rpad = p.integer("rpad");
  s.seed = p.seed();
  KVLAB_REQUIRE(s.batch >= 1 && s.hq >= 1 && s.hkv >= 1 && s.dim >= 1, invalid_argument, "B=", s.batch, " Hq=", s.hq,
                " Hkv=", s.hkv, " D=", s.dim, " must all be >= 1");
  KVLAB_REQUIRE(s.hq % s.hkv == 0, invalid_argument, "Hq=", s.hq, " is not a multiple of Hkv=", s.hkv);
  KVLAB_REQUIRE(s.window >= 0 && s.lpad >= 0 && s.rpad >= 0, invalid_argument, "window=", s.window, " lpad=", s.lpad,
                " rpad=", s.rpad, " must be >= 0");
  KVLAB_REQUIRE(!s.rope || s.dim % 2 == 0, invalid_argument, "rope=1 rotates pairs: D=", s.dim, " must be even");
  // A RoPE difference within its budget may move a value across a rounding boundary of
  // the quantizer, and one flipped code (or a flipped edge rescale, which moves a whole
  // group) changes the stored key by a quantization step: no useful per-element bound
  // follows. With rope=0 the stored inputs are bit-exact, and so are the stored codes
  // (affine/fp quantization is a bit-exact kernel), which are compared bit for bit.
  const cs::Script script = cs::parse_script(p.word("script"));
  s.quantizes = cs::script_quantizes(s, script);
  KVLAB_REQUIRE(!s.rope || !(cs::is_packed(s.kind) || s.quantizes), invalid_argument, "kind=", kind,
                s.quantizes ? " quantized by 'q' or 'm'" : "", " stores codes, compared bit-exactly, which needs bit-exact "
                "inputs: use rope=0");
  const bool rotating = s.kind == cs::Kind::rotating || s.kind == cs::Kind::batch_rotating;
  const bool quantized = s.kind == cs::Kind::quantized || s.kind == cs::Kind::batch_quantized || s.quantizes;
  if (!rotating) require_default(p, "max", kind);
  if (s.kind != cs::Kind::rotating) require_default(p, "keep", kind);  // BatchRotatingKVCache has no keep
  if (s.kind != cs::Kind::chunked) require_default(p, "chunk", kind);
  if (!quantized) {
    require_default(p, "qmode", kind);
    require_default(p, "group", kind);
    if (s.kind != cs::Kind::turboquant) require_default(p, "bits", kind);
  }
  if (!cs::is_batch(s.kind)) {
    require_default(p, "lpad", kind);
    require_default(p, "rpad", kind);
  }
  if (quantized) {
    s.spec = QuantSpec{quant_mode_from_name(p.word("qmode")), p.int32("bits"), p.int32("group")};
    s.spec.validate();
    s.spec.validate_dim(s.dim);
  }
  s.tq_bits = p.int32("bits");
  return s;
}

// ---- the budget ----------------------------------------------------------------------------

// Per-element error bounds of what one attention reads, |Δx| ≤ abs + rel·|x| (backend vs
// reference): queries after RoPE, keys and values as attention reads them.
struct ReadError {
  xt::xarray<double> q_abs;   // per query element (q's shape); not rank 4: 0
  std::vector<double> k_abs;  // per feature d of every key; empty: 0
  double q_rel = 0, k_rel = 0, v_abs = 0, v_rel = 0;
};

// Tolerance of the cache op's attention outputs, one value per query row.
// Attention over the backend's cache and over the reference's differ by the attention
// kernel's own error (the sdpa budget, harness/ops/sdpa_info.cc) and by the difference of
// its inputs. That enters only through RoPE'd queries and stored keys: the cache's data
// movement and affine/fp quantization are bit-exact kernels, so values, and with rope=0
// keys and codes, are stored bit for bit; the bookkeeping (positions, masks, which rows)
// is host code shared by both runs.
//  * RoPE (rope=1): the backend's rotated q and k differ from the oracle's within the rope
//    budget (harness/ops/rope_info.cc): per element mag·(θ·5u + 4u) + denorm_T + eps_T·|x|
//    with mag = |x1| + |x2| of its input pair and θ = |position|·inv_pair. Queries get it
//    element by element; a stored key was rotated at its own earlier step, so keys get,
//    per feature d, the running maximum of the absolute part over every chunk stored.
//  * TurboQuant (rope=0): codes are bit-exact; the decode x̂ = norm·R⁻¹c may run in f32:
//    per element ≤ (D+2)·u·√D·max|c|·max‖x‖·(1 + 2^-10) (a D-term dot product of a unit
//    row of R with c, ‖c‖₂ ≤ √D·max|c|, times the f16 norm) + eps_T·|x̂| (its rounding to
//    T), keys and values alike.
//  * Logit of query row i and key j: with e_x = abs_x + rel_x·|x| per element,
//      |Δs_ij| ≤ scale·(pert_ij + (eps_T + (D+2)·u)·(P_ij + pert_ij)),
//      pert_ij = Σ_d (e_q,d·|k_d| + |q_d|·e_k,d + e_q,d·e_k,d),  P_ij = Σ_d |q_d k_d|,
//    the second term being the kernel's own rounding of the backend's logit (sdpa budget).
//    δ_i = max_j over finite keys (hidden padding keys hold NaN poison; the maximum over
//    every key, masked or not, is a superset and so still sound).
//  * Softmax: every weight of row i moves by a factor within e^{±2δ_i}, so
//    Σ_j|Δp_j| ≤ min(2, e^{2δ_i} − 1), and
//    |Δo| ≤ Σ|Δp|·max|v_b| + max|Δv| + max|v|·(2·eps_T + 2·(L + 4)·u) + denorm_T,
//    the last terms as in the sdpa budget (exp, normalizer and the L-term sum; P and out
//    rounded to T), max|v| over the finite values of the row's kv head.
// Without RoPE and for the affine/fp kinds every e is 0 and this is the sdpa budget. For
// f16/bf16 with RoPE it is loose by construction: the rope budget allows one ulp of T on
// every rotated element, and aligned over D that moves a logit by ~2·eps_T·P; there the
// bit-exact values/offsets and the keys content check carry the weight.
std::vector<double> attention_row_budgets(const xt::xarray<float>& q, const xt::xarray<float>& k,
                                          const xt::xarray<float>& v, const ReadError& e, double scale, DType t) {
  const double eps = dtype_epsilon(t);
  const std::size_t B = q.shape(0), Hq = q.shape(1), S = q.shape(2), D = q.shape(3);
  const std::size_t Hkv = k.shape(1), L = k.shape(2), Dv = v.shape(3);
  const double kernel = eps + (static_cast<double>(D) + 2) * kU;
  const double gamma = (static_cast<double>(L) + 4) * kU;
  std::vector<double> out;
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < Hq; ++h) {
      const std::size_t hk = h / (Hq / Hkv);
      double vmax = 0;
      for (std::size_t j = 0; j < L; ++j) {
        for (std::size_t d = 0; d < Dv; ++d) {
          const double x = std::abs(static_cast<double>(v(b, hk, j, d)));
          if (std::isfinite(x)) vmax = std::max(vmax, x);
        }
      }
      for (std::size_t i = 0; i < S; ++i) {
        double delta = 0;
        for (std::size_t j = 0; j < L; ++j) {
          double P = 0, pert = 0;
          for (std::size_t d = 0; d < D; ++d) {
            const double qd = std::abs(static_cast<double>(q(b, h, i, d)));
            const double kd = std::abs(static_cast<double>(k(b, hk, j, d)));
            const double eq = (e.q_abs.dimension() == 4 ? e.q_abs(b, h, i, d) : 0.0) + e.q_rel * qd;
            const double ek = (e.k_abs.empty() ? 0.0 : e.k_abs[d]) + e.k_rel * kd;
            P += qd * kd;
            pert += eq * kd + qd * ek + eq * ek;
          }
          if (std::isfinite(P)) delta = std::max(delta, scale * (pert + kernel * (P + pert)));
        }
        const double dp = std::min(2.0, std::expm1(2 * delta));
        const double dv = e.v_abs + e.v_rel * vmax;
        out.push_back((vmax + dv) * dp + dv + vmax * (2 * eps + 2 * gamma) + denorm_of(t));
      }
    }
  }
  return out;
}

// The absolute part of the rope budget for every element of x (B, H, S, D) rotated at
// positions[b] + s (per row b): mag·(θ·5u + 4u) + denorm_T, θ = |position|·inv_pair.
xt::xarray<double> rope_abs_slack(const xt::xarray<float>& x, const std::vector<std::int32_t>& positions,
                                  const RopeParams& rope, DType t) {
  const std::size_t B = x.shape(0), H = x.shape(1), S = x.shape(2), D = x.shape(3), half = D / 2;
  xt::xarray<double> out = xt::xarray<double>::from_shape({B, H, S, D});
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t s = 0; s < S; ++s) {
      const double pos = std::abs(static_cast<double>(positions.at(b)) + static_cast<double>(s));
      for (std::size_t d = 0; d < D; ++d) {
        const std::size_t pair = d % half, partner = d < half ? d + half : d - half;
        const double inv =
            std::pow(static_cast<double>(rope.base), -2.0 * static_cast<double>(pair) / static_cast<double>(D));
        for (std::size_t h = 0; h < H; ++h) {
          const double mag =
              std::abs(static_cast<double>(x(b, h, s, d))) + std::abs(static_cast<double>(x(b, h, s, partner)));
          out(b, h, s, d) = mag * (pos * inv * 5 * kU + 4 * kU) + denorm_of(t);
        }
      }
    }
  }
  return out;
}

// ---- the trace: the script over the reference, with what the budget needs ----------------

struct StepBudget {
  std::int64_t first_row = 0;  // rows of D in the attn output
  std::vector<double> rows;    // budget per row
};

struct Trace {
  std::vector<cs::Component> content;
  std::vector<StepBudget> steps;
  std::vector<double> key_rope_abs;  // per feature: the rope slack over every key stored (rope=1)
};

xt::xarray<float> dequantized(Backend& be, const QuantizedDTensor& t) {
  const Tensor wq = be.download(t.wq), scales = be.download(t.scales);
  const Tensor biases = t.spec.has_biases() ? be.download(t.biases) : Tensor();
  const ConstTensorView bias_view = t.spec.has_biases() ? biases.view() : ConstTensorView{};
  return ref::dequantize_to_f32({wq.view(), scales.view(), bias_view, t.spec}).to_f32();
}

class Tracer final : public cs::Observer {
 public:
  Tracer(Backend& be, const CacheSetup& s, const Tensor& k, const Tensor& v, Trace& trace)
      : be_(be), s_(s), k_(k.to_f32()), v_(v.to_f32()), trace_(trace),
        key_rope_abs_(static_cast<std::size_t>(s.dim), 0.0) {
    // A script of updates alone (uN) has no attention to publish this: its keys were
    // stored unrotated, so no slack, but the keys budget still reads one per feature.
    trace_.key_rope_abs = key_rope_abs_;
  }

  void attention(const cs::Step& step, const DTensor& q, const AttendResult& source, const DTensor&) override {
    if (step.kind != cs::StepKind::shared) note_stored_rows(step, source.positions);
    const xt::xarray<float> q_pre = be_.download(q).to_f32();
    ReadError e;
    if (s_.rope) {
      e.q_abs = rope_abs_slack(q_pre, source.positions, cs::attend_options(s_).rope, s_.dtype);
      e.k_abs = key_rope_abs_;
      e.q_rel = e.k_rel = dtype_epsilon(s_.dtype);
    }
    if (s_.kind == cs::Kind::turboquant) {
      const double d = static_cast<double>(s_.dim);
      e.v_abs = (d + 2) * kU * std::sqrt(d) * max_level() * max_norm_ * (1 + 0x1p-10);
      e.k_abs.assign(static_cast<std::size_t>(s_.dim), e.v_abs);
      e.k_rel = e.v_rel = dtype_epsilon(s_.dtype);
    }
    xt::xarray<float> keys, values;
    if (source.kv) {
      keys = be_.download(source.kv->keys).to_f32();
      values = be_.download(source.kv->values).to_f32();
    } else {
      keys = dequantized(be_, source.quantized_kv->keys);
      values = dequantized(be_, source.quantized_kv->values);
    }
    const xt::xarray<float> q_rot = s_.rope ? rotated(q, source.positions) : q_pre;
    trace_.steps.push_back(
        {step.q_row, attention_row_budgets(q_rot, keys, values, e, cs::attend_options(s_).attention.scale, s_.dtype)});
    trace_.key_rope_abs = key_rope_abs_;
  }
  void after_command(const Cache&) override {}
  // Update-only rows (uN) are read by later attentions: their norms bound TurboQuant's
  // decode error too. They are stored unrotated, so they add no RoPE slack.
  void stored(const cs::Step& step) override { note_stored_rows(step, {}); }

 private:
  // max |c| of the TurboQuant codebook (the same levels for keys and values: one width).
  double max_level() {
    if (max_level_ == 0) {
      for (const double c : ref::turboquant_codebook(static_cast<int>(s_.dim), static_cast<int>(s_.tq_bits))) {
        max_level_ = std::max(max_level_, std::abs(c) * (1 + 0x1p-23));  // stored as f32
      }
    }
    return max_level_;
  }
  // The keys and values this step stores join the running maxima (rope slack, norms).
  void note_stored_rows(const cs::Step& step, const std::vector<std::int32_t>& positions) {
    const auto D = static_cast<std::size_t>(s_.dim);
    const auto first = static_cast<std::size_t>(step.kv_row);
    const auto B = static_cast<std::size_t>(step.batch), H = static_cast<std::size_t>(s_.hkv);
    const auto S = static_cast<std::size_t>(step.tokens);
    xt::xarray<float> chunk = xt::xarray<float>::from_shape({B, H, S, D});
    for (std::size_t r = 0; r < B * H * S; ++r) {
      double kk = 0, vv = 0;
      for (std::size_t d = 0; d < D; ++d) {
        const double kx = k_.flat((first + r) * D + d), vx = v_.flat((first + r) * D + d);
        chunk.flat(r * D + d) = static_cast<float>(kx);
        kk += kx * kx, vv += vx * vx;
      }
      max_norm_ = std::max({max_norm_, std::sqrt(kk), std::sqrt(vv)});
    }
    if (!s_.rope || step.kind == cs::StepKind::update) return;
    const xt::xarray<double> slack = rope_abs_slack(chunk, positions, cs::attend_options(s_).rope, s_.dtype);
    for (std::size_t i = 0; i < slack.size(); ++i) key_rope_abs_[i % D] = std::max(key_rope_abs_[i % D], slack.flat(i));
  }
  // q rotated at `positions` by the reference backend: what attend() handed to attention.
  xt::xarray<float> rotated(const DTensor& q, const std::vector<std::int32_t>& positions) {
    DTensor offsets = be_.allocate(DType::i32, {static_cast<std::int64_t>(positions.size())});
    be_.upload(offsets, positions.data());
    DTensor out = be_.allocate(q.dtype, q.shape);
    be_.rope({q, cs::attend_options(s_).rope, Offsets{0, offsets}, out});
    return be_.download(out).to_f32();
  }

  Backend& be_;
  const CacheSetup& s_;
  xt::xarray<float> k_, v_;
  Trace& trace_;
  std::vector<double> key_rope_abs_;
  double max_norm_ = 0, max_level_ = 0;
};

std::shared_ptr<const Trace> run_trace(const Problem& p, const Prepared& prep) {
  const CacheSetup s = setup_of(p);
  ReferenceBackend be;
  auto trace = std::make_shared<Trace>();
  Tracer tracer(be, s, prep.input("k"), prep.input("v"), *trace);
  const std::unique_ptr<Cache> cache =
      cs::run_script(be, s, cs::parse_script(p.word("script")), be.upload(prep.input("q")), be.upload(prep.input("k")),
                     be.upload(prep.input("v")), tracer);
  trace->content = cs::cache_content(*cache, s);
  return trace;
}

// prepare() and budget() of one problem share its trace; the last few lines are kept.
std::shared_ptr<const Trace> trace_of(const Problem& p, const Prepared& prep) {
  static std::mutex mutex;
  static std::vector<std::pair<std::string, std::shared_ptr<const Trace>>> recent;
  const std::string line = p.line();
  {
    const std::lock_guard lock(mutex);
    for (const auto& [l, t] : recent) {
      if (l == line) return t;
    }
  }
  std::shared_ptr<const Trace> t = run_trace(p, prep);
  const std::lock_guard lock(mutex);
  recent.emplace_back(line, t);
  if (recent.size() > 4) recent.erase(recent.begin());
  return t;
}

// ---- invoke: the script over the backend under test, written into the output slots --------

class Writer final : public cs::Observer {
 public:
  Writer(Backend& be, const Bound& out, std::int64_t dim) : be_(be), out_(out), dim_(dim) {}

  void attention(const cs::Step& step, const DTensor&, const AttendResult&, const DTensor& out) override {
    const Tensor o = be_.download(out);
    write(out_.tensors.at(0), static_cast<std::size_t>(step.q_row * dim_) * dtype_size(o.dtype()), o);
  }
  void after_command(const Cache& cache) override {
    for (const std::int32_t o : cache.offsets()) offsets_.push_back(o);
    lengths_.push_back(cache.kv_length());
  }
  void finish(const std::vector<cs::Component>& content) {
    write(out_.tensors.at(1), 0, Tensor::from_ints(DType::i32, {static_cast<std::int64_t>(offsets_.size())}, offsets_));
    write(out_.tensors.at(2), 0, Tensor::from_ints(DType::i32, {static_cast<std::int64_t>(lengths_.size())}, lengths_));
    KVLAB_REQUIRE(out_.tensors.size() == 3 + content.size(), internal, "cache op: ", content.size(),
                  " content components for ", out_.tensors.size() - 3, " slots");
    for (std::size_t i = 0; i < content.size(); ++i) {
      const DTensor& slot = out_.tensors[3 + i];
      KVLAB_REQUIRE(slot.nbytes() == content[i].rows.nbytes(), internal, "cache op: content '", content[i].name, "' ",
                    shape_str(content[i].rows.shape()), " does not fit its slot ", shape_str(slot.shape),
                    " sized by the reference trace");
      write(slot, 0, content[i].rows);
    }
  }

 private:
  void write(const DTensor& slot, std::size_t at, const Tensor& t) {
    KVLAB_REQUIRE(at + t.nbytes() <= slot.nbytes(), internal, "cache op: ", t.nbytes(), " bytes at ", at,
                  " overrun an output slot of ", slot.nbytes());
    if (t.nbytes() == 0) return;
    be_.upload(DTensor{slot.buffer, slot.offset + at, DType::u8, {static_cast<std::int64_t>(t.nbytes())}}, t.data());
  }

  Backend& be_;
  const Bound& out_;
  std::int64_t dim_;
  std::vector<std::int64_t> offsets_, lengths_;
};

class CacheOp final : public OpInfo {
 public:
  std::string_view name() const override { return "cache"; }
  std::string_view summary() const override {
    return "a cache kind driven by a command script through attend(): outputs, offsets, content";
  }
  std::vector<ParamSpec> declared_params() const override { return cache_params(); }

  // q, K, V and the attention output; offsets and lengths per command; the content
  // outputs (at most every K/V row, as f32); and the trace's reference cache, whose
  // buffers hold every row of the batch at its longest, grown in steps of 256 tokens.
  std::uint64_t footprint(const Problem& p) const override {
    const CacheSetup s = setup_of(p);
    const cs::PlanTotals t = cs::plan_totals(s, cs::parse_script(p.word("script")));
    Footprint f;
    f.add(s.dtype, {t.q_rows, s.dim}).add(s.dtype, {t.q_rows, s.dim}).add(s.dtype, {t.kv_rows, s.dim, 2});
    f.add(DType::i32, {t.offset_entries}).add(DType::i32, {t.commands});
    f.add(DType::f32, {t.kv_rows, s.dim, 2}).add(DType::f32, {t.kv_rows, s.dim, 2});
    f.add(DType::f32, {t.max_batch, s.hkv, 256, s.dim, 2});
    return f.bytes();
  }
  std::uint64_t work(const Problem& p) const override {
    const cs::PlanTotals t = cs::plan_totals(setup_of(p), cs::parse_script(p.word("script")));
    return Footprint{}.add_bytes(footprint(p)).add_bytes(static_cast<std::uint64_t>(t.attention_work)).bytes();
  }

  Prepared prepare(const Problem& p) const override {
    const CacheSetup s = setup_of(p);
    const cs::Plan plan = cs::plan_script(s, cs::parse_script(p.word("script")));
    Prepared prep;
    prep.add_input("q", random_normal(p, "q", s.dtype, {plan.q_rows, s.dim}));
    prep.add_input("k", random_normal(p, "k", s.dtype, {plan.kv_rows, s.dim}));
    prep.add_input("v", random_normal(p, "v", s.dtype, {plan.kv_rows, s.dim}));
    const std::shared_ptr<const Trace> trace = trace_of(p, prep);
    prep.outputs.push_back({"attn", s.dtype, {plan.q_rows, s.dim}, false, {}});
    prep.outputs.push_back({"offsets", DType::i32, {plan.offset_entries}, true, {}});
    prep.outputs.push_back({"kv_length", DType::i32, {plan.commands}, true, {}});
    for (const cs::Component& c : trace->content) {
      prep.outputs.push_back({c.name, c.rows.dtype(), c.rows.shape(), !(s.rope && c.name == "keys"), {}});
    }
    return prep;
  }

  void invoke(Backend& be, const Problem& p, const Bound& in, const Bound& out) const override {
    const CacheSetup s = setup_of(p);
    Writer writer(be, out, s.dim);
    const std::unique_ptr<Cache> cache =
        cs::run_script(be, s, cs::parse_script(p.word("script")), in["q"], in["k"], in["v"], writer);
    writer.finish(cs::cache_content(*cache, s));
  }

  // attn: per query row, attention_row_budgets; NMSE ≤ Σbudget²/(4·Σref²), the sdpa norm
  // check. keys (rope=1, the only other value-compared output): the rope budget per
  // element, key_rope_abs of its feature (covers every stored key) + eps_T·|ref| +
  // denorm_T; after RoPE the cache moves keys bit for bit.
  Budget budget(const Problem& p, const Prepared& prep, std::size_t output, const Tensor& ref) const override {
    const std::shared_ptr<const Trace> trace = trace_of(p, prep);
    const DType t = ref.dtype();
    const ConstTensorView r = ref.view();
    const std::int64_t D = p.integer("D");
    Budget b;
    b.per_element.assign(static_cast<std::size_t>(ref.numel()), 0.0);
    if (prep.outputs.at(output).name == "attn") {
      double sum_b = 0, sum_r = 0;
      for (const StepBudget& step : trace->steps) {
        for (std::size_t row = 0; row < step.rows.size(); ++row) {
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t i = (step.first_row + static_cast<std::int64_t>(row)) * D + d;
            b.per_element[static_cast<std::size_t>(i)] = step.rows[row];
            sum_b += step.rows[row] * step.rows[row];
            sum_r += static_cast<double>(r.load(i)) * static_cast<double>(r.load(i));
          }
        }
      }
      b.nmse_max = sum_r > 0 ? sum_b / (4 * sum_r) : -1;
      return b;
    }
    for (std::int64_t i = 0, elements = ref.numel(); i < elements; ++i) {
      b.per_element[static_cast<std::size_t>(i)] = trace->key_rope_abs.at(static_cast<std::size_t>(i % D)) +
                                                   dtype_epsilon(t) * std::abs(static_cast<double>(r.load(i))) +
                                                   denorm_of(t);
    }
    return b;
  }

  // The script first (commands dropped, counts cut), then heads (together, Hq % Hkv must
  // hold), D halved (it stays even), then the generic integers (B, rope, window, max,
  // keep, chunk, lpad, rpad). Candidates the kind rejects are INVALID and skipped.
  std::vector<Problem> shrink_candidates(const Problem& p) const override {
    std::vector<Problem> out;
    for (const std::string& s : cs::simpler_scripts(p.word("script"))) out.push_back(p.with("script", s));
    const std::int64_t hq = p.integer("Hq"), hkv = p.integer("Hkv"), d = p.integer("D");
    if (hq > 1) out.push_back(p.with("Hq", "1").with("Hkv", "1"));
    if (hkv > 1) out.push_back(p.with("Hq", std::to_string(hq / hkv)).with("Hkv", "1"));
    if (d >= 4 && d % 4 == 0) out.push_back(p.with("D", std::to_string(d / 2)));
    for (Problem& g : OpInfo::shrink_candidates(p)) out.push_back(std::move(g));
    return out;
  }
};

}  // namespace

const OpInfo& cache() {
  static const CacheOp op;
  return op;
}

}  // namespace kvlab::harness::ops
