// fp_quantize / fp_dequantize: mxfp4, mxfp8, nvfp4 (reference/fp_quantize.h).
//
// Codes and scale codes are compared bit-exactly. (The contract notes that Metal's
// log2 may round differently within a few ulps of 2^(k+1/2), where a ±1 scale code
// should be tolerated; random normal data essentially never lands there, so the
// harness stays strict until a backend shows such a case — then add a tie-aware
// comparison here that counts those elements, as docs/design.md §Tolerance objects says.)
#include <cmath>

#include "harness/ops/ops.h"
#include "harness/value_families.h"
#include "reference/fp_quantize.h"

namespace kvlab::harness::ops {

namespace {

// The formats of the fp encoder, from the format table.
std::vector<std::string> fp_modes() {
  std::vector<std::string> out;
  for (const QuantFormat& f : quant_formats()) {
    if (f.encoder == QuantEncoder::fp) out.emplace_back(f.name);
  }
  return out;
}

// The spread of the normal fill: 10^-3 and 10^3 put the group scales far from 1 (E8M0
// and E4M3 scale codes at both ends). A quiet key: lines without it keep their fills.
ParamSpec stddev_param() { return quiet(real_param("stddev", "1")); }

// The value family of x (harness/value_families.h); quiet, so older lines keep their fills.
ParamSpec dist_param() { return quiet(word_param("dist", value_family_names(), true)); }

std::vector<ParamSpec> fp_params() {
  return {int_param("B", 1, true), int_param("H", 1, true), int_param("T", 4, true), int_param("D", 64, true, 16),
          dtype_param(), word_param("mode", fp_modes()),
          word_param("rounding", {"mlx_cpu", "mlx_gpu", "mlx"}),
          // amax: nvfp4's two-level scaling with MLX's global scale = tensor amax.
          word_param("global_scale", {"none", "amax"}, true), stddev_param(), dist_param()};
}

QuantSpec fp_spec(const Problem& p) { return QuantSpec::make(quant_mode_from_name(p.word("mode"))); }

// fp_quantize's traffic: reads x; writes fp4/fp8 codes and u8 scale codes. 1 flop per
// element (x / scale; the code is a table search), +1 with nvfp4's global scale.
Traffic fp_quantize_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  const std::int64_t per = p.word("global_scale") == "none" ? 1 : 2;
  return {n * es, packed_bytes(fp_spec(p), n, es), per * n};
}

// fp_dequantize's: codes + scale codes in, values out; lut(code)·scale (·global).
Traffic fp_dequantize_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  const std::int64_t per = p.word("global_scale") == "none" ? 1 : 2;
  return {packed_bytes(fp_spec(p), n, es), n * es, per * n};
}

Tensor fp_input(const Problem& p) {
  return value_family_fill(p, "x", dtype_from_name(p.word("dtype")), bhtd_shape(p), p.word("dist"), p.real("stddev"));
}

std::optional<float> global_scale(const Problem& p, const Tensor& x) {
  if (p.word("global_scale") == "none") return std::nullopt;
  float amax = 0;
  const ConstTensorView v = x.view();
  for (std::int64_t i = 0, elements = x.numel(); i < elements; ++i) amax = std::max(amax, std::abs(v.load(i)));
  return amax;
}

// The global scale prepare() derived from x (absent: none), an f32 held exactly as a double.
void keep_global_scale(Prepared& prep, std::optional<float> scale) {
  if (scale) prep.scalars["global_scale"] = *scale;
}
std::optional<float> kept_global_scale(const Problem& p, const Bound& in) {
  if (p.word("global_scale") == "none") return std::nullopt;
  const std::optional<double> s = in.scalar("global_scale");
  KVLAB_REQUIRE(s.has_value(), internal, "fp op: the bound inputs carry no prepared global scale");
  return static_cast<float>(*s);
}

// x, its codes (at most a byte per element plus a padding word per row), one scale
// byte per group (groups of 16 or 32), and the output of dequantize.
Footprint fp_footprint(const Problem& p, bool with_output) {
  const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
  const DType dtype = dtype_from_name(p.word("dtype"));
  Footprint f;
  f.add(dtype, {B, H, T, D}).add(DType::u8, {B, H, T, D}).add(DType::u32, {B, H, T});
  f.add(DType::u8, {B, H, T, D / 16 + 1});
  if (with_output) f.add(dtype, {B, H, T, D});
  return f.add(DType::f32, {D, 2});  // the oracle's row scratch, whatever the row count
}

class FpQuantize final : public OpInfo {
 public:
  std::string_view name() const override { return "fp_quantize"; }
  std::string_view summary() const override { return "x -> fp4/fp8 codes + u8 scale codes (bit-exact)"; }
  std::vector<ParamSpec> declared_params() const override { return fp_params(); }

  std::uint64_t footprint(const Problem& p) const override { return fp_footprint(p, false).bytes(); }
  TrafficModel traffic_model() const override { return fp_quantize_traffic; }

  Prepared prepare(const Problem& p) const override {
    const QuantSpec spec = fp_spec(p);
    Prepared prep;
    Tensor x = fp_input(p);
    keep_global_scale(prep, global_scale(p, x));
    prep.add_input("x", std::move(x));
    const Shape xs = bhtd_shape(p);
    prep.outputs.push_back({"wq", DType::u32, shape_with_last(xs, spec.packed_words(xs.back())), true, {}});
    prep.outputs.push_back({"scales", DType::u8, shape_with_last(xs, spec.groups(xs.back())), true, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    // The global scale is derived on the host from the same input bits on both sides.
    b.quantize({in["x"], rounding_from_name(p.word("rounding")), {out.tensors[0], out.tensors[1], {}, fp_spec(p), kept_global_scale(p, in)}});
  }
};

// Tolerance of fp_dequantize.
// Without a global scale, lut(code)·decode(scale) is exact in f32: E2M1 values have 2
// significant bits and E4M3 4, E8M0 is a power of two, so the product has ≤ 6 bits
// and no rounding happens before the single rounding to T. Any correct backend is
// therefore bit-exact: budget 0.
// With nvfp4's global scale the oracle multiplies by g/2688 in f32 afterwards; a
// backend may fold g/2688 into the scale first, which is a different f32 rounding
// (≤ 2 u32 relative), and then T's rounding can move one ulp: eps_T·|ref| + 2^-22·|ref|.
class FpDequantize final : public OpInfo {
 public:
  std::string_view name() const override { return "fp_dequantize"; }
  std::string_view summary() const override { return "fp codes -> values (exact; 1 ulp with a global scale)"; }
  std::vector<ParamSpec> declared_params() const override { return fp_params(); }

  std::uint64_t footprint(const Problem& p) const override { return fp_footprint(p, true).bytes(); }
  TrafficModel traffic_model() const override { return fp_dequantize_traffic; }

  Prepared prepare(const Problem& p) const override {
    const Tensor x = fp_input(p);
    const std::optional<float> scale = global_scale(p, x);
    ref::QuantizedTensor q = ref::fp_quantize(x, fp_spec(p), rounding_from_name(p.word("rounding")), scale);
    Prepared prep;
    keep_global_scale(prep, scale);
    prep.add_input("wq", std::move(q.wq));
    prep.add_input("scales", std::move(q.scales));
    prep.outputs.push_back({"out", dtype_from_name(p.word("dtype")), bhtd_shape(p), false, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    b.dequantize({{in["wq"], in["scales"], {}, fp_spec(p), kept_global_scale(p, in)}, out.tensors[0]});
  }

  Budget budget(const Problem& p, const Prepared&, std::size_t, const Tensor& ref) const override {
    if (p.word("global_scale") == "none") return {{0.0}, -1};
    const double eps = dtype_epsilon(ref.dtype());
    Budget b;
    b.per_element.resize(static_cast<std::size_t>(ref.numel()));
    const ConstTensorView r = ref.view();
    for (std::int64_t i = 0, elements = ref.numel(); i < elements; ++i) {
      b.per_element[static_cast<std::size_t>(i)] = (eps + 0x1p-22) * std::abs(static_cast<double>(r.load(i)));
    }
    return b;
  }
};

}  // namespace

const OpInfo& fp_quantize() {
  static const FpQuantize op;
  return op;
}
const OpInfo& fp_dequantize() {
  static const FpDequantize op;
  return op;
}

}  // namespace kvlab::harness::ops
