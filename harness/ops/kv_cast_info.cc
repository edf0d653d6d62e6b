// kv_cast (reference/kv_cast.h): K/V of one float dtype written into a cache of another.
//
// Tolerance: none, the output is compared bit for bit. Each element's result is defined
// exactly: the source value is an f32 exactly, and rounding it to the destination dtype
// (nearest, ties to even, overflow to ±inf) has one correct answer, so a correct backend
// cannot differ by even an ulp; NaN results have the bits the contract fixes, and a
// same-dtype cast is a byte copy. The value families aim at where conversions go wrong:
// `wide` spreads magnitudes over 2^±30 (f16 subnormals, underflow to zero, overflow to
// inf), `bits` takes raw patterns of the source dtype (every exponent, subnormals,
// infinities, quiet and signalling NaNs with payloads, −0).
#include <cmath>
#include <string>

#include "harness/ops/ops.h"

namespace kvlab::harness::ops {

namespace {

ParamSpec cast_dtype(std::string key, std::string def) {
  return {std::move(key), ParamKind::word, std::move(def), {"f32", "f16", "bf16"}, false, 1};
}

Shape cast_shape(const Problem& p) { return {p.integer("B"), p.integer("H"), p.integer("L"), p.integer("W")}; }

Tensor cast_input(const Problem& p) {
  const DType dtype = dtype_from_name(p.word("src"));
  const std::string& values = p.word("values");
  if (values == "bits") return random_bits(p, "src", dtype, cast_shape(p));
  Tensor t = random_normal(p, "src", dtype, cast_shape(p));
  if (values == "wide") {
    const TensorView v = t.view();
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) {
      v.store(i, std::ldexp(v.load(i), static_cast<int>(i * 7 % 61) - 30));
    }
  }
  return t;
}

// Traffic: every element of src read once (n·size(src)) and written once into dst
// (n·size(dst)); the conversion is rounding, which the model does not count as a flop.
Traffic kv_cast_traffic(const Problem& p) {
  const std::int64_t n = p.integer("B") * p.integer("H") * p.integer("L") * p.integer("W");
  return {n * dtype_bytes(p, "src"), n * dtype_bytes(p, "dst"), 0};
}

class KvCast final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_cast"; }
  std::string_view summary() const override { return "convert K/V between f32, f16 and bf16 (bit-exact, RNE)"; }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("B", 1, true),     int_param("H", 2, true),     int_param("L", 4, true),
            int_param("W", 64, true),    cast_dtype("src", "f32"),    cast_dtype("dst", "f16"),
            word_param("values", {"normal", "wide", "bits"}, true)};
  }
  std::uint64_t footprint(const Problem& p) const override {
    const std::int64_t B = p.integer("B"), H = p.integer("H"), L = p.integer("L"), W = p.integer("W");
    return Footprint{}
        .add(dtype_from_name(p.word("src")), {B, H, L, W})
        .add(dtype_from_name(p.word("dst")), {B, H, L, W})
        .bytes();
  }
  TrafficModel traffic_model() const override { return kv_cast_traffic; }
  Prepared prepare(const Problem& p) const override {
    Prepared prep;
    prep.add_input("src", cast_input(p));
    prep.outputs.push_back({"dst", dtype_from_name(p.word("dst")), cast_shape(p), true, {}});
    return prep;
  }
  void invoke(Backend& b, const Problem&, const Bound& in, const Bound& out) const override {
    b.kv_cast({in["src"], out.tensors[0]});
  }
};

}  // namespace

const OpInfo& kv_cast() {
  static const KvCast op;
  return op;
}

}  // namespace kvlab::harness::ops
