// rope (reference/rope.h). x (B, H, T, D); positions scale·(t + offset_b), with
// per_row=1 giving every batch row its own offset (offset + 7·b − 3·(b odd)), the
// batched-decode layout where rows sit at different positions.
#include <cmath>

#include "harness/ops/ops.h"
#include "reference/rope.h"

namespace kvlab::harness::ops {

namespace {

Shape x_shape(const Problem& p) { return {p.integer("B"), p.integer("H"), p.integer("T"), p.integer("D")}; }

std::int32_t row_offset(const Problem& p, std::int64_t b) {
  const std::int64_t base = p.integer("offset");
  return static_cast<std::int32_t>(p.flag("per_row") ? base + 7 * b - 3 * (b % 2) : base);
}

RopeParams rope_params(const Problem& p) {
  RopeParams r;
  r.dims = p.int32("dims");
  r.traditional = p.flag("traditional");
  r.base = static_cast<float>(p.real("base"));
  r.scale = static_cast<float>(p.real("scale"));
  return r;
}

// Tolerance of rope.
// The oracle evaluates in double and rounds once (≤ ½ ulp of T). A backend in f32:
//   inv_i = base^(−2i/dims) via powf/exp2: relative error ≤ 4·u (u = 2^-24);
//   θ = p·inv_i: absolute error ≤ |θ|·5u (inv_i's error plus the product's rounding);
//   cos/sin of θ in f32: absolute error ≤ 2u + |Δθ| (range reduction of a large θ is
//   exactly where fast-math sin/cos lose digits, so |θ| multiplies the bound);
//   x1·c − x2·s: ≤ (|x1| + |x2|)·(|Δc| + 2u).
// So per rotated element: (|x1| + |x2|)·(|θ|·5u + 4u), plus eps_T·|ref| for the two
// independent roundings to T, plus T's subnormal spacing. Passthrough features
// [dims, D) are copies: budget 0.
class Rope final : public OpInfo {
 public:
  std::string_view name() const override { return "rope"; }
  std::string_view summary() const override { return "rotary embedding, scalar or per-row offsets"; }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("B", 1, true),  int_param("H", 4, true),         int_param("T", 8, true),
            int_param("D", 64, true, 2), dtype_param(),                 int_param("dims", 64, true, 2),
            int_param("traditional", 0), real_param("base", "10000"),  real_param("scale", "1"),
            int_param("offset", 0, true, 0), int_param("per_row", 0, true, 0)};
  }

  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
    // x, out, per-row offsets, and the oracle's frequency table (sized by D alone).
    return Footprint{}.add(dtype, {B, H, T, D}).add(dtype, {B, H, T, D}).add(DType::i32, {B}).add(DType::f32, {D, 2}).bytes();
  }

  Prepared prepare(const Problem& p) const override {
    Prepared prep;
    prep.add_input("x", random_normal(p, "x", dtype_from_name(p.word("dtype")), x_shape(p)));
    if (p.flag("per_row")) {
      Tensor off(DType::i32, {p.integer("B")});
      for (std::int64_t b = 0; b < p.integer("B"); ++b) off.view().store_int(b, row_offset(p, b));
      prep.add_input("offsets", std::move(off));
    }
    prep.outputs.push_back({"out", dtype_from_name(p.word("dtype")), x_shape(p), false, {}});
    return prep;
  }

  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    Offsets o;
    if (const DTensor* per_row = in.find("offsets")) {
      o.per_row = *per_row;
    } else {
      o.scalar = row_offset(p, 0);
    }
    b.rope({in["x"], rope_params(p), o, out.tensors[0]});
  }

  Budget budget(const Problem& p, const Prepared& prep, std::size_t, const Tensor& ref) const override {
    std::vector<std::int32_t> offsets;
    for (std::int64_t b = 0; b < p.integer("B"); ++b) offsets.push_back(row_offset(p, b));
    Budget b;
    b.per_element = rope_budget(prep.input("x"), rope_params(p), offsets, ref);
    return b;
  }
};

}  // namespace

std::vector<double> rope_budget(const Tensor& x_in, const RopeParams& rp, const std::vector<std::int32_t>& row_offsets,
                                const Tensor& ref) {
  constexpr double u = 0x1p-24;
  const Shape& s = ref.shape();
  KVLAB_REQUIRE(s.size() == 4 && x_in.shape() == s && static_cast<std::int64_t>(row_offsets.size()) == s[0],
                shape_mismatch, "rope_budget: x ", shape_str(x_in.shape()), ", result ", shape_str(s), ", ",
                row_offsets.size(), " row offsets");
  const std::int64_t T = s[2], D = s[3], half = rp.dims / 2;
  const double eps = dtype_epsilon(ref.dtype());
  const double denorm = ref.dtype() == DType::f32 ? 0x1p-149 : (ref.dtype() == DType::f16 ? 0x1p-24 : 0x1p-133);
  const ConstTensorView x = x_in.view(), r = ref.view();
  std::vector<double> out(static_cast<std::size_t>(ref.numel()), 0.0);
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const std::int64_t d = i % D, t = (i / D) % T, batch = i / (D * T * s[1]);
    if (d >= rp.dims) continue;  // passthrough: bit copy
    const std::int64_t pair = rp.traditional ? d / 2 : d % half;
    const std::int64_t partner = rp.traditional ? (d ^ 1) : (d < half ? d + half : d - half);
    const double inv = std::pow(static_cast<double>(rp.base), -2.0 * static_cast<double>(pair) / rp.dims);
    const double theta =
        std::abs(static_cast<double>(rp.scale) * static_cast<double>(t + row_offsets[static_cast<std::size_t>(batch)]) * inv);
    const double mag = std::abs(static_cast<double>(x.load(i))) + std::abs(static_cast<double>(x.load(i - d + partner)));
    out[static_cast<std::size_t>(i)] = mag * (theta * 5 * u + 4 * u) + eps * std::abs(static_cast<double>(r.load(i))) + denorm;
  }
  return out;
}

const OpInfo& rope() {
  static const Rope op;
  return op;
}

}  // namespace kvlab::harness::ops
