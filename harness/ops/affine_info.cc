// affine_quantize / affine_dequantize (reference/affine_quantize.h).
//
// Inputs are x (B, H, T, D) in `dtype`, from a value family (harness/value_families.h):
// normal(0,1) by default; dist=grid gives k/4 (k in [-16, 16]) so that group extremes
// and codes land on exact rounding ties — where mlx_cpu (rint) and mlx_gpu (round)
// differ and a backend's division is most likely to disagree with the oracle; the other
// families are the conformance grid against real MLX (rounding=mlx).
#include <cmath>

#include "harness/ops/ops.h"
#include "harness/value_families.h"
#include "reference/affine_quantize.h"

namespace kvlab::harness::ops {

namespace {

std::vector<ParamSpec> quant_params() {
  return {int_param("B", 1, true), int_param("H", 1, true), int_param("T", 4, true),
          int_param("D", 64, true, 32), dtype_param(), int_param("bits", 4), int_param("group", 64),
          word_param("rounding", {"mlx_cpu", "mlx_gpu", "mlx"}), word_param("dist", value_family_names(), true)};
}

QuantSpec affine_spec(const Problem& p) {
  QuantSpec s{QuantMode::affine, p.int32("bits"), p.int32("group")};
  s.validate();
  return s;
}

Tensor quant_input(const Problem& p) {
  return value_family_fill(p, "x", dtype_from_name(p.word("dtype")), bhtd_shape(p), p.word("dist"));
}

// affine_quantize's traffic: reads x (n·es); writes the codes, scales and biases. 2 flops
// per element: (x − bias) / scale (the group min/max scan and the rounding are compares).
Traffic affine_quantize_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  return {n * es, packed_bytes({QuantMode::affine, p.int32("bits"), p.int32("group")}, n, es), 2 * n};
}

// affine_dequantize's: the mirror image; 2 flops per element: code·scale + bias.
Traffic affine_dequantize_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  return {packed_bytes({QuantMode::affine, p.int32("bits"), p.int32("group")}, n, es), n * es, 2 * n};
}

// x, its codes (at most a byte per element plus a padding word per row), two
// parameters per group, and row scratch sized by D alone (so also when B·H·T = 0).
Footprint quant_footprint(const Problem& p) {
  const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
  const DType dtype = dtype_from_name(p.word("dtype"));
  const std::int64_t groups = D / std::max<std::int64_t>(p.integer("group"), 1) + 1;
  Footprint f;
  f.add(dtype, {B, H, T, D}).add(DType::u8, {B, H, T, D}).add(DType::u32, {B, H, T});
  f.add(dtype, {B, H, T, groups}).add(dtype, {B, H, T, groups});
  return f.add(DType::f32, {D, 2});  // the oracle's row scratch, whatever the row count
}

class AffineQuantize final : public OpInfo {
 public:
  std::string_view name() const override { return "affine_quantize"; }
  std::string_view summary() const override { return "x -> packed u32 codes, scales, biases (bit-exact)"; }
  std::vector<ParamSpec> declared_params() const override { return quant_params(); }

  std::uint64_t footprint(const Problem& p) const override { return quant_footprint(p).bytes(); }
  TrafficModel traffic_model() const override { return affine_quantize_traffic; }

  Prepared prepare(const Problem& p) const override {
    const QuantSpec spec = affine_spec(p);
    Prepared prep;
    prep.add_input("x", quant_input(p));
    const Shape xs = bhtd_shape(p);
    const DType dtype = dtype_from_name(p.word("dtype"));
    // Codes, scales and biases are all bit-exact: the algorithm is a fixed sequence of
    // f32 operations (reference/affine_quantize.h), so any difference is a bug, not noise.
    prep.outputs.push_back({"wq", DType::u32, shape_with_last(xs, spec.packed_words(xs.back())), true, {}});
    prep.outputs.push_back({"scales", dtype, shape_with_last(xs, spec.groups(xs.back())), true, {}});
    prep.outputs.push_back({"biases", dtype, shape_with_last(xs, spec.groups(xs.back())), true, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    b.quantize({in["x"], rounding_from_name(p.word("rounding")), {out.tensors[0], out.tensors[1], out.tensors[2], affine_spec(p)}});
  }
};

// Tolerance of affine_dequantize.
// The oracle computes fl32(fl32(c·s) + b) and rounds once to T. A backend may fuse the
// multiply-add (fma: one rounding instead of two), which moves the f32 result by at
// most the product's rounding, u32·|c·s| ≤ u32·n·|s| (u32 = 2^-24, n = 2^bits − 1);
// rounding that to T may then land one ulp of T away: ≤ eps_T·|ref|. Subnormal T
// results add T's smallest spacing. So per element:
//   budget = eps_T·|ref| + 2^-24·n·|s_g| + denorm_min_T
// For f32 data without fma the result is bit-exact (the budget is an upper bound).
class AffineDequantize final : public OpInfo {
 public:
  std::string_view name() const override { return "affine_dequantize"; }
  std::string_view summary() const override { return "packed codes -> values (1 ulp of T + fma slack)"; }
  std::vector<ParamSpec> declared_params() const override { return quant_params(); }

  TrafficModel traffic_model() const override { return affine_dequantize_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
    return quant_footprint(p).add(dtype_from_name(p.word("dtype")), {B, H, T, D}).bytes();  // + out
  }

  Prepared prepare(const Problem& p) const override {
    const QuantSpec spec = affine_spec(p);
    ref::QuantizedTensor q = ref::affine_quantize(quant_input(p), spec, rounding_from_name(p.word("rounding")));
    Prepared prep;
    prep.add_input("wq", std::move(q.wq));
    prep.add_input("scales", std::move(q.scales));
    prep.add_input("biases", std::move(q.biases));
    // rounding=mlx is the pinned MLX's arithmetic, which defines every bit: compared
    // bit for bit; the other flavours are a contract with an fma-tolerant budget.
    const bool exact = rounding_from_name(p.word("rounding")) == Rounding::mlx;
    prep.outputs.push_back({"out", dtype_from_name(p.word("dtype")), bhtd_shape(p), exact, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    b.dequantize({{in["wq"], in["scales"], in["biases"], affine_spec(p)}, out.tensors[0], rounding_from_name(p.word("rounding"))});
  }

  Budget budget(const Problem& p, const Prepared& prep, std::size_t, const Tensor& ref) const override {
    const DType t = ref.dtype();
    const double eps = dtype_epsilon(t);
    const double denorm = t == DType::f32 ? 0x1p-149 : (t == DType::f16 ? 0x1p-24 : 0x1p-133);
    const double n = std::ldexp(1.0, p.int32("bits")) - 1;
    const std::int64_t group = p.integer("group");
    const ConstTensorView scales = prep.input("scales").view();
    const ConstTensorView r = ref.view();
    Budget b;
    b.per_element.resize(static_cast<std::size_t>(ref.numel()));
    for (std::int64_t i = 0, elements = ref.numel(); i < elements; ++i) {
      const double s = std::abs(static_cast<double>(scales.load(i / group)));
      b.per_element[static_cast<std::size_t>(i)] =
          eps * std::abs(static_cast<double>(r.load(i))) + 0x1p-24 * n * s + denorm;
    }
    return b;
  }
};

}  // namespace

const OpInfo& affine_quantize() {
  static const AffineQuantize op;
  return op;
}
const OpInfo& affine_dequantize() {
  static const AffineDequantize op;
  return op;
}

}  // namespace kvlab::harness::ops
