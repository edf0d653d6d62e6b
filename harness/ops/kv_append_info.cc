// Device-resident offsets (reference/kv_append.h): kv_append_advance and kv_snapshot.
// Both bit-exact. The caches start with random content carrying NaN payloads, so a
// backend that writes outside the appended columns, or moves values through float
// registers, is caught; the offsets are an output too (their advance is the op).
#include <algorithm>

#include "harness/ops/ops.h"
#include "harness/rng.h"

namespace kvlab::harness::ops {

namespace {

ParamSpec append_dtype() { return {"dtype", ParamKind::word, "f32", {"f32", "f16", "bf16", "u32"}, false, 1}; }

// Random bits with a NaN payload every 29th element of a float dtype.
Tensor payload_data(const Problem& p, std::string_view name, DType dtype, Shape shape) {
  Tensor t = random_bits(p, name, dtype, std::move(shape));
  if (!is_float(dtype)) return t;
  for (std::int64_t i = 0, elements = t.numel(); i < elements; i += 29) store_bits(t, i, payload_nan_bits(dtype) ^ 0x1u);
  return t;
}

// Row b's first column (start + 5b) mod (C − S + 1) is split into left padding
// (first mod 4, plus 3 on odd rows) and an offset (the rest: negative when the padding
// exceeds it, as for a padded row that has not reached its first real token).
struct RowPlacement {
  std::vector<std::int64_t> pads, offsets;
};
RowPlacement placement(const Problem& p) {
  const std::int64_t B = p.integer("B"), S = p.integer("S"), C = p.integer("C");
  KVLAB_REQUIRE(S <= C, invalid_argument, "kv_append_advance S=", S, " does not fit C=", C, " columns");
  RowPlacement r;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t first = (p.integer("start") + 5 * b) % (C - S + 1);
    const std::int64_t pad = first % 4 + 3 * (b % 2);
    r.pads.push_back(pad);
    r.offsets.push_back(first - pad);
  }
  return r;
}

// kv_append_advance's traffic (the device-offset cache append): the B·H·S new K and V
// rows are read and written into the caches; B offsets are read and written, B left
// paddings read.
Traffic kv_append_advance_traffic(const Problem& p) {
  const std::int64_t rows = p.integer("B") * p.integer("H") * p.integer("S");
  const std::int64_t moved = rows * (p.integer("Dk") + p.integer("Dv")) * dtype_bytes(p);
  return {moved + p.integer("B") * 8, moved + p.integer("B") * 4, 0};
}

// kv_snapshot's: N elements read and written.
Traffic kv_snapshot_traffic(const Problem& p) {
  const std::int64_t moved = p.integer("N") * dtype_bytes(p);
  return {moved, moved, 0};
}

class KvAppendAdvance final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_append_advance"; }
  std::string_view summary() const override { return "append S rows at device offsets + left padding, advance"; }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("B", 2, true), int_param("H", 2, true), int_param("S", 3, true), int_param("C", 16, true),
            int_param("Dk", 64, true), int_param("Dv", 64, true), append_dtype(), int_param("start", 0, true, 0)};
  }
  TrafficModel traffic_model() const override { return kv_append_advance_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), H = p.integer("H"), S = p.integer("S"), C = p.integer("C");
    const std::int64_t D = p.integer("Dk") + p.integer("Dv");
    // k and v, both caches with their initial content, the index vectors.
    return Footprint{}.add(dtype, {B, H, S, D}).add(dtype, {B, H, C, D, 2}).add(DType::u32, {B, 8}).bytes();
  }
  Prepared prepare(const Problem& p) const override {
    const std::int64_t B = p.integer("B"), H = p.integer("H"), S = p.integer("S"), C = p.integer("C");
    const std::int64_t Dk = p.integer("Dk"), Dv = p.integer("Dv");
    const DType dtype = dtype_from_name(p.word("dtype"));
    const RowPlacement rows = placement(p);
    Prepared prep;
    prep.add_input("k", payload_data(p, "k", dtype, {B, H, S, Dk}));
    prep.add_input("v", payload_data(p, "v", dtype, {B, H, S, Dv}));
    prep.add_input("left_padding", Tensor::from_ints(DType::i32, {B}, rows.pads));
    prep.outputs.push_back({"k_cache", dtype, {B, H, C, Dk}, true, payload_data(p, "k_cache", dtype, {B, H, C, Dk})});
    prep.outputs.push_back({"v_cache", dtype, {B, H, C, Dv}, true, payload_data(p, "v_cache", dtype, {B, H, C, Dv})});
    prep.outputs.push_back({"offsets", DType::i32, {B}, true, Tensor::from_ints(DType::i32, {B}, rows.offsets)});
    return prep;
  }
  void invoke(Backend& b, const Problem&, const Bound& in, const Bound& out) const override {
    // The padding is host bookkeeping (kvlab/op_list.h): read back from where the
    // problem bound it.
    const Tensor pads = b.download(in["left_padding"]);
    b.kv_append_advance({in["k"], in["v"], pads.view(), out.tensors[2], out.tensors[0], out.tensors[1]});
  }
};

class KvSnapshot final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_snapshot"; }
  std::string_view summary() const override { return "copy a backend tensor (the offsets) into a snapshot"; }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("N", 4, true), {"dtype", ParamKind::word, "i32", {"i32", "f32", "f16", "u8"}, false, 1}};
  }
  TrafficModel traffic_model() const override { return kv_snapshot_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    return Footprint{}.add(dtype_from_name(p.word("dtype")), {p.integer("N"), 2}).bytes();
  }
  Prepared prepare(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t N = p.integer("N");
    Prepared prep;
    prep.add_input("src", payload_data(p, "src", dtype, {N}));
    prep.outputs.push_back({"dst", dtype, {N}, true, {}});
    return prep;
  }
  void invoke(Backend& b, const Problem&, const Bound& in, const Bound& out) const override {
    b.kv_snapshot({in["src"], out.tensors[0]});
  }
};

}  // namespace

const OpInfo& kv_append_advance() {
  static const KvAppendAdvance op;
  return op;
}
const OpInfo& kv_snapshot() {
  static const KvSnapshot op;
  return op;
}

}  // namespace kvlab::harness::ops
