// ggml_quantize / ggml_dequantize: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl
// (reference/ggml_quantize.h).
//
// Inputs are x (B, H, T, D) in `dtype` from a value family (harness/value_families.h),
// normal(0, stddev) by default; dist=grid puts elements on k/4, where q4_0's +8.5
// truncation, q8_0's half-away rounding and iq4_nl's upper-tie rule meet exact ties.
#include <cmath>

#include "harness/ops/ops.h"
#include "harness/value_families.h"
#include "reference/ggml_quantize.h"

namespace kvlab::harness::ops {

namespace {

// The formats of the ggml encoder, from the format table.
std::vector<std::string> ggml_modes() {
  std::vector<std::string> out;
  for (const QuantFormat& f : quant_formats()) {
    if (f.encoder == QuantEncoder::ggml) out.emplace_back(f.name);
  }
  return out;
}

// rounding: ggml's C reference (ggml_ref, the default) or its CPU backend's quantizer
// (ggml_cpu: q8_0 differs on x86, kvlab/quant_spec.h); dequantize has one arithmetic.
std::vector<ParamSpec> ggml_params(bool quantize) {
  std::vector<ParamSpec> p = {int_param("B", 1, true), int_param("H", 1, true), int_param("T", 4, true),
                              int_param("D", 64, true, 32), dtype_param(), word_param("mode", ggml_modes()),
                              quiet(real_param("stddev", "1")), quiet(word_param("dist", value_family_names(), true))};
  if (quantize) p.push_back(quiet(word_param("rounding", {"ggml_ref", "ggml_cpu"})));
  return p;
}

QuantSpec ggml_spec(const Problem& p) { return QuantSpec::make(quant_mode_from_name(p.word("mode"))); }

Tensor ggml_input(const Problem& p) {
  return value_family_fill(p, "x", dtype_from_name(p.word("dtype")), bhtd_shape(p), p.word("dist"), p.real("stddev"));
}

// ggml_quantize's traffic: reads x; writes the codes, f16 scales (and f16 mins). 2 flops
// per element: x·id and the + offset (iq4_nl's table search and sums are compares and
// 4 more; counted as 2, the common case).
Traffic ggml_quantize_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  return {n * es, packed_bytes(ggml_spec(p), n, es), 2 * n};
}

// ggml_dequantize's: the mirror image; 1 flop per element (value·d), 2 with a min.
Traffic ggml_dequantize_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  const QuantSpec spec = ggml_spec(p);
  return {packed_bytes(spec, n, es), n * es, (spec.has_biases() ? 2 : 1) * n};
}

// x, its codes (at most a byte per element plus a padding word per row), two f16 values
// per block, the output of dequantize, and the oracle's row scratch.
Footprint ggml_footprint(const Problem& p, bool with_output) {
  const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
  const DType dtype = dtype_from_name(p.word("dtype"));
  Footprint f;
  f.add(dtype, {B, H, T, D}).add(DType::u8, {B, H, T, D}).add(DType::u32, {B, H, T});
  f.add(DType::f16, {B, H, T, D / 32 + 1}).add(DType::f16, {B, H, T, D / 32 + 1});
  if (with_output) f.add(dtype, {B, H, T, D});
  return f.add(DType::f32, {D, 2});
}

class GgmlQuantize final : public OpInfo {
 public:
  std::string_view name() const override { return "ggml_quantize"; }
  std::string_view summary() const override { return "x -> ggml block codes + f16 scales/mins (bit-exact)"; }
  std::vector<ParamSpec> declared_params() const override { return ggml_params(true); }

  std::uint64_t footprint(const Problem& p) const override { return ggml_footprint(p, false).bytes(); }
  TrafficModel traffic_model() const override { return ggml_quantize_traffic; }

  Prepared prepare(const Problem& p) const override {
    const QuantSpec spec = ggml_spec(p);
    Prepared prep;
    prep.add_input("x", ggml_input(p));
    const Shape xs = bhtd_shape(p);
    // Codes, scales and mins are bit-exact: ggml's C reference is a fixed sequence of
    // f32 operations (reference/ggml_quantize.h).
    prep.outputs.push_back({"wq", DType::u32, shape_with_last(xs, spec.packed_words(xs.back())), true, {}});
    prep.outputs.push_back({"scales", DType::f16, shape_with_last(xs, spec.groups(xs.back())), true, {}});
    if (spec.has_biases()) {
      prep.outputs.push_back({"biases", DType::f16, shape_with_last(xs, spec.groups(xs.back())), true, {}});
    }
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    const QuantSpec spec = ggml_spec(p);
    b.quantize({in["x"], rounding_from_name(p.word("rounding")),
                {out.tensors[0], out.tensors[1], spec.has_biases() ? out.tensors[2] : DTensor{}, spec}});
  }
};

// Tolerance of ggml_dequantize: bit-exact. code·d is exact in f32 (a code of at most 8
// significant bits times an f16 of 11: at most 19 bits, and no f16 product leaves f32's
// range), so q8_0/q4_0/q5_0/iq4_nl have only the final rounding to T, and q4_1/q5_1 one
// f32 sum with the f16 min before it, which an fma computes identically (its product
// needs no rounding). Any correct backend therefore matches bit for bit.
class GgmlDequantize final : public OpInfo {
 public:
  std::string_view name() const override { return "ggml_dequantize"; }
  std::string_view summary() const override { return "ggml block codes -> values (bit-exact)"; }
  std::vector<ParamSpec> declared_params() const override { return ggml_params(false); }

  std::uint64_t footprint(const Problem& p) const override { return ggml_footprint(p, true).bytes(); }
  TrafficModel traffic_model() const override { return ggml_dequantize_traffic; }

  Prepared prepare(const Problem& p) const override {
    const QuantSpec spec = ggml_spec(p);
    ref::QuantizedTensor q = ref::ggml_quantize(ggml_input(p), spec);
    Prepared prep;
    prep.add_input("wq", std::move(q.wq));
    prep.add_input("scales", std::move(q.scales));
    if (spec.has_biases()) prep.add_input("biases", std::move(q.biases));
    prep.outputs.push_back({"out", dtype_from_name(p.word("dtype")), bhtd_shape(p), true, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    const QuantSpec spec = ggml_spec(p);
    const DTensor* biases = in.find("biases");
    b.dequantize({{in["wq"], in["scales"], biases ? *biases : DTensor{}, spec}, out.tensors[0], Rounding::ggml_ref});
  }
};

}  // namespace

const OpInfo& ggml_quantize() {
  static const GgmlQuantize op;
  return op;
}
const OpInfo& ggml_dequantize() {
  static const GgmlDequantize op;
  return op;
}

}  // namespace kvlab::harness::ops
