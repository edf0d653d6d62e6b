// One op of the harness: its parameters, how a Problem becomes host inputs and output
// slots (create + fill), how it calls a Backend, and its numerics policy.
//
// The spine (harness/spine.h) is the same for every op; an op only describes itself.
// Extension point for cache-level cases: a cache op is an OpInfo whose invoke() drives
// a cache type over the Backend (a command sequence read from the problem) and whose
// outputs are the observables of docs/design.md §Observables (logical content, attention output,
// offsets); register it in op.cc beside the kernel ops.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/problem.h"
#include "kvlab/backend.h"
#include "kvlab/tensor.h"

namespace kvlab::harness {

// How an output is compared with the reference.
struct Budget {
  // Allowed |backend − reference| per element; a single entry applies to all.
  std::vector<double> per_element;
  // Upper bound on NMSE = Σ(b−r)²/Σr² (a norm check that catches many small errors
  // which each stay under the point-wise bound); negative disables it.
  double nmse_max = -1;
  // A second, tighter NMSE bound that follows the accumulation precision the backend
  // declares (Backend::accumulation) instead of the output dtype: what f32 accumulation
  // plus the final rounding to the output dtype allows (e.g. attention, where a
  // half-precision running accumulator stays inside nmse_max on long sequences). The
  // spine drops it for a backend that declares a narrower accumulation; negative: none.
  double precision_nmse_max = -1;
  // The terms of precision_nmse_max that hold only for a backend that rounds the named
  // intermediate value to T (Backend::AttentionRounding); precision_nmse_max is the sum
  // over all of them, and the spine subtracts those the backend does not declare.
  struct RoundingTerms {
    double scaled_q = 0, dequantized_kv = 0, logits = 0, probabilities = 0;
  } rounding_terms;
  // f16/bf16 outputs of a backend that declares f32 arithmetic and no intermediate
  // rounding: how many elements' rounding to T an f32 kernel may have differ from the
  // oracle's correctly rounded one, measured on the same inputs (the op's derivation).
  // The spine fails when more than 4·E + 8 differ; negative: no such check.
  double expected_rounding_mismatches = -1;
  // Inputs with inf/NaN on purpose (e.g. sdpa special=q_nan): the reference's NaN
  // elements are expected, and the backend must have NaN at exactly those elements.
  bool nan_where_reference_nan = false;
  // Elements whose budget is exactly zero are copies (e.g. rope's passthrough features):
  // their bytes must equal the reference's, NaN payloads included.
  bool bits_where_zero = false;
};

struct OutputSlot {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  bool bit_exact = true;          // integer codes, data movement: compare bytes
  std::optional<Tensor> initial;  // content before the kernel (rows it must not touch);
                                  // absent: NaN poison (all bytes 0xFF)
};

struct Prepared {
  std::vector<std::string> input_names;
  std::vector<Tensor> inputs;
  std::vector<OutputSlot> outputs;
  // Host values derived once from the inputs (fp's global scale is the amax of x), so
  // that invoke() need not recompute them inside a timed call.
  std::map<std::string, double, std::less<>> scalars;
  void add_input(std::string name, Tensor t) {
    input_names.push_back(std::move(name));
    inputs.push_back(std::move(t));
  }
  const Tensor& input(std::string_view name) const;
};

// Tensors as a backend sees them, looked up by the names of Prepared.
struct Bound {
  const std::vector<std::string>* names = nullptr;
  std::vector<DTensor> tensors;
  const std::map<std::string, double, std::less<>>* scalars = nullptr;  // Prepared::scalars
  const DTensor& operator[](std::string_view name) const;
  const DTensor* find(std::string_view name) const;
  std::optional<double> scalar(std::string_view name) const;  // absent: nullopt
};

// A saturating sum of tensor sizes for OpInfo::footprint. A negative dimension counts as
// zero (prepare() rejects the problem), and sums or products past 2^63 saturate, so a
// footprint never overflows whatever the parameters.
class Footprint {
 public:
  Footprint& add(DType dtype, std::initializer_list<std::int64_t> dims);
  Footprint& add_bytes(std::uint64_t bytes);
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::uint64_t bytes_ = 0;
};

// The traffic and work a kernel call is credited with, written out by hand from the
// op's parameters (never measured, never taken from the buffers a backend happens to
// allocate): the numerator of every GB/s and flop/s figure the benchmarks report
// (bench/bytes_model.h). Bytes are the logical bytes the kernel must read plus those it
// must write, each counted once (a cache-line write-allocate or an extra pass a kernel
// chooses to make is not credited); the memory baselines count the same way (memcpy:
// read + written), so "% of memcpy" compares like with like.
struct Traffic {
  std::int64_t read_bytes = 0;
  std::int64_t write_bytes = 0;
  std::int64_t flops = 0;  // arithmetic the op needs (comparisons, rounding, exp not counted)
  std::int64_t bytes() const { return read_bytes + write_bytes; }
};
using TrafficModel = Traffic (*)(const Problem& p);

class OpInfo {
 public:
  virtual ~OpInfo() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;
  // Declared parameters followed by `seed` (added by the registry).
  const std::vector<ParamSpec>& params() const;

  // Bytes of every input and output tensor of `p` (and of any host-side copy as large,
  // e.g. the f32 copies a tolerance object makes), from the parameters alone: the spine
  // checks it against the run's memory cap before prepare() allocates anything. An
  // upper bound of what prepare() makes, at most twice what a whole run holds at its
  // peak, and an eighth of that peak at least (tests/harness/test_bounds.cc).
  virtual std::uint64_t footprint(const Problem& p) const = 0;
  // The work of a run of `p` in elementary operations, to an order of magnitude, from the
  // parameters alone: the spine skips a problem over the run's work cap before prepare()
  // (a small problem can still take minutes: attention is quadratic, a cache script's
  // trace grows with the square of its length). Default: the footprint, one pass over
  // every tensor byte; ops with more than linear work override it (saturating).
  virtual std::uint64_t work(const Problem& p) const { return footprint(p); }
  // The op's traffic model, beside its footprint and work: a function of the parameters
  // alone, with its derivation in a comment where it is defined. nullptr (the default):
  // none, for an op that is no single kernel call (the cache op drives many), which the
  // benchmarks then skip.
  virtual TrafficModel traffic_model() const { return nullptr; }
  // create + fill. May throw kvlab::Error for a problem the op cannot express (INVALID).
  virtual Prepared prepare(const Problem& p) const = 0;
  // Calls the backend kernel; `out` are the output slots in Prepared order.
  virtual void invoke(Backend& backend, const Problem& p, const Bound& in, const Bound& out) const = 0;
  // Tolerance of a non-bit-exact output, derived from the problem and the reference
  // result (each op documents its derivation beside its implementation).
  virtual Budget budget(const Problem& p, const Prepared& prep, std::size_t output, const Tensor& ref) const;
  // Smaller variants to try when a problem fails (default: every shrinkable parameter
  // to its minimum, half, and one less; words to their simplest choice).
  virtual std::vector<Problem> shrink_candidates(const Problem& p) const;

 protected:
  virtual std::vector<ParamSpec> declared_params() const = 0;

 private:
  mutable std::vector<ParamSpec> params_;
};

const OpInfo& find_op(std::string_view name);  // throws invalid_argument listing the ops
std::vector<const OpInfo*> all_ops();

// ---- helpers for op implementations -------------------------------------------
ParamSpec int_param(std::string key, std::int64_t def, bool shrink = false, std::int64_t shrink_min = 1);
ParamSpec real_param(std::string key, std::string def);
ParamSpec word_param(std::string key, std::vector<std::string> choices, bool shrink = false);
ParamSpec dtype_param(std::string key = "dtype", std::string def = "f32");
// `s` as a quiet key (ParamSpec::quiet_default): added after lines were written, named in a
// canonical line only when off its default.
ParamSpec quiet(ParamSpec s);

// Normal(0, stddev²) values rounded to `dtype`, keyed by the problem line and `name`.
Tensor random_normal(const Problem& p, std::string_view name, DType dtype, Shape shape, double stddev = 1.0);
// Raw random bits for any dtype (integer payloads, data-movement tests).
Tensor random_bits(const Problem& p, std::string_view name, DType dtype, Shape shape);
// f32 quiet NaN with a payload, f16/bf16 likewise; the poison of hidden cache slots.
std::uint32_t payload_nan_bits(DType dtype);
void store_bits(Tensor& t, std::int64_t index, std::uint32_t bits);

}  // namespace kvlab::harness
