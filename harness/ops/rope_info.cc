// rope (reference/rope.h). x (B, H, T, D); positions scale·(t + offset_b), with
// per_row=1 giving every batch row its own offset (offset + row_step·b − 3·(b odd),
// row_step 7 unless given), the batched-decode layout where rows sit at different
// positions. rank=3 drops the head axis (B, T, D; H must be 1), rank=5 splits it
// (B, H, 1, T, D). freqs=ramp gives explicit wavelengths 1 + 37·i, freqs=tiny cycles
// 1, 0.5, 0.1, 0.001 (angles far past a table or an exact reduction with large offsets).
// special=nonfinite puts NaN and ±inf among the rotated features of every 7th row and
// a signalling-NaN pattern in the middle of the passthrough features of every row.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>
#include <cmath>

#include "harness/ops/ops.h"
#include "reference/rope.h"

namespace kvlab::harness::ops {

std::vector<double> rope_budget_mlx(const Tensor& x_in, const RopeParams& rp, const Tensor& ref);

namespace {

Shape x_shape(const Problem& p) {
  const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
  switch (p.integer("rank")) {
    case 3:
      KVLAB_REQUIRE(H == 1, invalid_argument, "rope rank=3 has no head axis: H must be 1, not ", H);
      return {B, T, D};
    case 4: return {B, H, T, D};
    case 5: return {B, H, 1, T, D};
    default: fail(ErrorKind::invalid_argument, cat("rope rank=", p.integer("rank"), " is not 3, 4 or 5"));
  }
}

// The offset of batch row b, as a 64-bit value (prepare() checks it fits 32 bits).
std::int64_t wide_offset(const Problem& p, std::int64_t b) {
  const std::int64_t base = p.integer("offset");
  return p.flag("per_row") ? base + p.integer("row_step") * b - 3 * (b % 2) : base;
}

std::int32_t row_offset(const Problem& p, std::int64_t b) { return static_cast<std::int32_t>(wide_offset(p, b)); }

RopeParams rope_params(const Problem& p) {
  RopeParams r;
  r.dims = p.int32("dims");
  r.traditional = p.flag("traditional");
  r.base = static_cast<float>(p.real("base"));
  r.scale = static_cast<float>(p.real("scale"));
  r.mlx_arithmetic = p.word("flavour") == "mlx";
  const std::string& freqs = p.word("freqs");
  for (int i = 0; freqs != "none" && i < r.dims / 2; ++i) {
    constexpr std::array<float, 4> tiny = {1.0f, 0.5f, 0.1f, 1e-3f};
    r.freqs.push_back(freqs == "ramp" ? static_cast<float>(1 + 37 * i) : tiny[static_cast<std::size_t>(i % 4)]);
  }
  return r;
}

// Tolerance of rope.
// rope's traffic: reads x, writes out (same size; per-row offsets, B·4 bytes, when
// given). The first `dims` features of a row are rotated in pairs, 3 flops per rotated
// element (x1·c − x2·s: two products and a sum); cos/sin are per (position, pair),
// shared by the heads, and not counted.
Traffic rope_traffic(const Problem& p) {
  const std::int64_t n = bhtd_numel(p), es = dtype_bytes(p);
  const std::int64_t offsets = p.flag("per_row") ? p.integer("B") * 4 : 0;
  return {n * es + offsets, n * es, 3 * (n / p.integer("D")) * p.integer("dims")};
}

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
            int_param("offset", 0, true, 0), int_param("per_row", 0, true, 0),
            quiet(int_param("row_step", 7)),  quiet(int_param("rank", 4)),
            quiet(word_param("freqs", {"none", "ramp", "tiny"}, true)),
            quiet(word_param("special", {"none", "nonfinite"}, true)),
            // mlx: MLX 0.32.4's CPU arithmetic (reference/rope.h), judged in ulps of T.
            quiet(word_param("flavour", {"contract", "mlx"}, true))};
  }

  TrafficModel traffic_model() const override { return rope_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), H = p.integer("H"), T = p.integer("T"), D = p.integer("D");
    // x, out, per-row offsets, and the oracle's frequency table (sized by D alone).
    return Footprint{}.add(dtype, {B, H, T, D}).add(dtype, {B, H, T, D}).add(DType::i32, {B}).add(DType::f32, {D, 2}).bytes();
  }

  Prepared prepare(const Problem& p) const override {
    Prepared prep;
    const DType dtype = dtype_from_name(p.word("dtype"));
    Tensor x = random_normal(p, "x", dtype, x_shape(p));
    const std::int64_t D = p.integer("D"), dims = p.integer("dims");
    // dims <= D: a shrink candidate may cut D below dims before the oracle rejects the
    // case, and the special elements below sit at offsets up to 11 % dims of a row.
    if (p.word("special") == "nonfinite" && D > 0 && dims > 0 && dims <= D) {
      const std::uint32_t nan = dtype == DType::f32 ? 0x7FC00000u : (dtype == DType::f16 ? 0x7E00u : 0x7FC0u);
      const std::uint32_t inf = dtype == DType::f32 ? 0x7F800000u : (dtype == DType::f16 ? 0x7C00u : 0x7F80u);
      const std::uint32_t sign = dtype == DType::f32 ? 0x80000000u : 0x8000u;
      const std::uint32_t snan = dtype == DType::f32 ? 0x7F800001u : (dtype == DType::f16 ? 0x7C01u : 0x7F81u);
      for (std::int64_t r = 0, rows = x.numel() / D; r < rows; ++r) {
        if (r % 7 == 0) {
          store_bits(x, r * D + 3 % dims, nan);
          store_bits(x, r * D + 11 % dims, inf | (r % 2 ? 0 : sign));
        }
        if (D > dims) store_bits(x, r * D + dims + (D - dims) / 2, snan);
      }
    }
    prep.add_input("x", std::move(x));
    if (p.flag("per_row")) {
      for (std::int64_t b = 0; b < p.integer("B"); ++b) {
        const std::int64_t o = wide_offset(p, b);
        KVLAB_REQUIRE(o >= INT32_MIN && o <= INT32_MAX, invalid_argument, "rope offset of batch row ", b, " (", o,
                      ") does not fit 32 bits");
      }
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
    b.per_element = rope_params(p).mlx_arithmetic ? rope_budget_mlx(prep.input("x"), rope_params(p), ref)
                                                  : rope_budget(prep.input("x"), rope_params(p), offsets, ref);
    b.nan_where_reference_nan = true;  // NaN only from special=nonfinite or a NaN/inf scale
    b.bits_where_zero = true;          // passthrough features are copies
    return b;
  }
};

}  // namespace

std::vector<double> rope_budget(const Tensor& x_in, const RopeParams& rp, const std::vector<std::int32_t>& row_offsets,
                                const Tensor& ref) {
  constexpr double u = 0x1p-24;
  if (ref.numel() == 0) return {};
  const Shape& s = ref.shape();
  // Any rank >= 2 with batch rows on axis 0 and positions on axis -2 (rope accepts 3-D and
  // 5-D x as well as (B, H, T, D)).
  KVLAB_REQUIRE(s.size() >= 2 && x_in.shape() == s && !row_offsets.empty() &&
                    static_cast<std::int64_t>(row_offsets.size()) == s[0],
                shape_mismatch, "rope_budget: x ", shape_str(x_in.shape()), ", result ", shape_str(s), ", ",
                row_offsets.size(), " row offsets");
  const std::int64_t T = s[s.size() - 2], D = s.back(), half = rp.dims / 2;
  const std::int64_t per_batch = ref.numel() / static_cast<std::int64_t>(row_offsets.size());
  const double eps = dtype_epsilon(ref.dtype());
  const double denorm = ref.dtype() == DType::f32 ? 0x1p-149 : (ref.dtype() == DType::f16 ? 0x1p-24 : 0x1p-133);
  const ConstTensorView x = x_in.view(), r = ref.view();
  // inv_i depends on the pair alone: one pow per pair, not per element.
  std::vector<double> inv_of(static_cast<std::size_t>(std::max<std::int64_t>(half, 0)));
  for (std::int64_t i = 0; i < half; ++i) {
    inv_of[static_cast<std::size_t>(i)] =
        rp.freqs.empty() ? std::pow(static_cast<double>(rp.base), -2.0 * static_cast<double>(i) / rp.dims)
                         : 1.0 / static_cast<double>(rp.freqs[static_cast<std::size_t>(i)]);
  }
  std::vector<double> out(static_cast<std::size_t>(ref.numel()), 0.0);
  for (std::int64_t i = 0, elements = ref.numel(); i < elements; ++i) {
    const std::int64_t d = i % D, t = (i / D) % T, batch = i / per_batch;
    if (d >= rp.dims) continue;  // passthrough: bit copy
    const std::int64_t pair = rp.traditional ? d / 2 : d % half;
    const std::int64_t partner = rp.traditional ? (d ^ 1) : (d < half ? d + half : d - half);
    const double inv = inv_of[static_cast<std::size_t>(pair)];
    const double theta =
        std::abs(static_cast<double>(rp.scale) * static_cast<double>(t + row_offsets[static_cast<std::size_t>(batch)]) * inv);
    const double mag = std::abs(static_cast<double>(x.load(i))) + std::abs(static_cast<double>(x.load(i - d + partner)));
    out[static_cast<std::size_t>(i)] = mag * (theta * 5 * u + 4 * u) + eps * std::abs(static_cast<double>(r.load(i))) + denorm;
  }
  return out;
}

// Tolerance of rope with flavour=mlx: the oracle repeats MLX's f32/T operation sequence,
// with libm's cos/sin/exp where MLX has its own approximations (a few f32 ulps apart).
// That can flip the T rounding of either product, one ulp of T each (eps_T·|x1|,
// eps_T·|x2| bound them as |cos|, |sin| ≤ 1), and then of the sum: per element
// eps_T·(|x1| + |x2| + |ref|) plus T's subnormal spacing — a few ulps, where the
// contract's budget grows with the position.
std::vector<double> rope_budget_mlx(const Tensor& x_in, const RopeParams& rp, const Tensor& ref) {
  const Shape& s = ref.shape();
  const std::int64_t D = s.back(), half = rp.dims / 2;
  const double eps = dtype_epsilon(ref.dtype());
  const double denorm = ref.dtype() == DType::f32 ? 0x1p-149 : (ref.dtype() == DType::f16 ? 0x1p-24 : 0x1p-133);
  const ConstTensorView x = x_in.view(), r = ref.view();
  std::vector<double> out(static_cast<std::size_t>(ref.numel()), 0.0);
  for (std::int64_t i = 0, elements = ref.numel(); i < elements; ++i) {
    const std::int64_t d = i % D;
    if (d >= rp.dims) continue;  // passthrough: bit copy
    const std::int64_t partner = rp.traditional ? (d ^ 1) : (d < half ? d + half : d - half);
    const double mag = std::abs(static_cast<double>(x.load(i))) + std::abs(static_cast<double>(x.load(i - d + partner)));
    out[static_cast<std::size_t>(i)] = eps * (mag + std::abs(static_cast<double>(r.load(i)))) + denorm;
  }
  return out;
}

const OpInfo& rope() {
  static const Rope op;
  return op;
}

}  // namespace kvlab::harness::ops
