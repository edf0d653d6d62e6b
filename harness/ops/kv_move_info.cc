// Cache data movement (reference/kv_move.h): kv_scatter, kv_gather, kv_copy_blocks,
// kv_roll. All bit-exact. Float data carries NaN payloads (every 37th element) so a
// backend that moves values through float registers (which may quieten or canonicalize
// NaNs) instead of bytes is caught; destinations the kernel must not touch start with
// random content and are compared too.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "harness/ops/ops.h"
#include "harness/rng.h"
#include "kvlab/host_buffer.h"

namespace kvlab::harness::ops {

namespace {

// An index input as the kernel takes it: on the host (kvlab/op_list.h). Problems bind
// every input to the backend: a host backend's copy is viewed where it lies, a device
// backend's is read back into `storage`. Reading a host copy back too would time an
// allocation and a copy no caller of the op makes (docs/benchmarks.md §How a row is measured).
ConstTensorView host_index(Backend& b, const DTensor& t, Tensor& storage) {
  if (t.buffer != nullptr && t.buffer->host_data() != nullptr) return host_cview(t);
  storage = b.download(t);
  return storage.view();
}

ParamSpec move_dtype() {
  return {"dtype", ParamKind::word, "f32", {"f32", "f16", "bf16", "u32", "u8"}, false, 1};
}

Tensor block_data(const Problem& p, std::string_view name, Shape shape) {
  const DType dtype = dtype_from_name(p.word("dtype"));
  if (!is_float(dtype)) return random_bits(p, name, dtype, std::move(shape));
  Tensor t = random_normal(p, name, dtype, std::move(shape));
  const CounterRng rng(p.line(), std::string(name) + ".nan");
  for (std::int64_t i = 0, elements = t.numel(); i < elements; i += 37) {
    // A signalling-looking payload: the low bits are random and must survive the move.
    const auto payload = static_cast<std::uint32_t>(rng.bits(static_cast<std::uint64_t>(i)));
    store_bits(t, i, dtype == DType::f32 ? 0x7F800001u | (payload & 0x3FFFFFu)
                                         : (dtype == DType::f16 ? 0x7C01u | (payload & 0x1FFu)
                                                                : 0x7F81u | (payload & 0x3Fu)));
  }
  return t;
}

Tensor int_tensor(Shape shape, const std::vector<std::int64_t>& values) {
  return Tensor::from_ints(DType::i32, std::move(shape), values);
}

// Traffic of the moves: only the moved rows are credited, each read once and written
// once. kv_scatter (the cache append): the B·H·S rows of W elements read from src and
// written into dst (the rest of dst is not touched, so it is not credited), plus the
// (B, S) i32 slot indices read.
Traffic kv_scatter_traffic(const Problem& p) {
  const std::int64_t moved = p.integer("B") * p.integer("H") * p.integer("S") * p.integer("W") * dtype_bytes(p);
  return {moved + p.integer("B") * p.integer("S") * 4, moved, 0};
}

// kv_gather: every dst row (Bd, H, L, W) is read from src and written; Bd i32 indices.
Traffic kv_gather_traffic(const Problem& p) {
  const std::int64_t moved = p.integer("Bd") * p.integer("H") * p.integer("L") * p.integer("W") * dtype_bytes(p);
  return {moved + p.integer("Bd") * 4, moved, 0};
}

// kv_copy_blocks: `blocks` blocks of len rows per head are read and written.
Traffic kv_copy_blocks_traffic(const Problem& p) {
  const std::int64_t moved =
      p.integer("blocks") * p.integer("H") * p.integer("len") * p.integer("W") * dtype_bytes(p);
  return {moved, moved, 0};
}

// kv_roll: the whole (B, H, L, W) tensor is read and written; B i32 shifts.
Traffic kv_roll_traffic(const Problem& p) {
  const std::int64_t moved = p.integer("B") * p.integer("H") * p.integer("L") * p.integer("W") * dtype_bytes(p);
  return {moved + p.integer("B") * 4, moved, 0};
}

// Keys added after the case files were written: left out of a line at their default.
class KvScatter final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_scatter"; }
  std::string_view summary() const override {
    return "write S rows at slots (start + 3b + s) mod L, or (order=perm) at a random permutation's first S";
  }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("B", 1, true), int_param("H", 2, true), int_param("S", 4, true), int_param("L", 16, true),
            int_param("W", 64, true), move_dtype(), int_param("start", 0, true, 0),
            quiet(word_param("order", {"ring", "perm"}, true))};
  }
  TrafficModel traffic_model() const override { return kv_scatter_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), H = p.integer("H"), S = p.integer("S"), L = p.integer("L"), W = p.integer("W");
    // src, the slots (and the host vector they are built from), dst and its initial content.
    return Footprint{}.add(dtype, {B, H, S, W}).add(DType::u32, {B, S, 4}).add(dtype, {B, H, L, W, 2}).bytes();
  }
  Prepared prepare(const Problem& p) const override {
    const std::int64_t B = p.integer("B"), H = p.integer("H"), S = p.integer("S"), L = p.integer("L"), W = p.integer("W");
    Prepared prep;
    prep.add_input("src", block_data(p, "src", {B, H, S, W}));
    std::vector<std::int64_t> slots;
    const bool perm = p.word("order") == "perm";
    const CounterRng rng(p.line(), "slots");
    for (std::int64_t b = 0; b < B; ++b) {
      if (perm && L > 0) {
        // Fisher-Yates over the L slots of this row; its first S are distinct.
        std::vector<std::int64_t> row(static_cast<std::size_t>(L));
        for (std::int64_t i = 0; i < L; ++i) row[static_cast<std::size_t>(i)] = i;
        for (std::int64_t i = L - 1; i > 0; --i) {
          const auto j = static_cast<std::int64_t>(rng.bits(static_cast<std::uint64_t>(b * L + i)) %
                                                   static_cast<std::uint64_t>(i + 1));
          std::swap(row[static_cast<std::size_t>(i)], row[static_cast<std::size_t>(j)]);
        }
        slots.insert(slots.end(), row.begin(), row.begin() + std::min(S, L));
        for (std::int64_t s = L; s < S; ++s) slots.push_back(0);  // S > L: the kernel must reject it
        continue;
      }
      for (std::int64_t s = 0; s < S; ++s) slots.push_back(L > 0 ? (p.integer("start") + 3 * b + s) % L : 0);
    }
    prep.add_input("slots", int_tensor({B, S}, slots));
    prep.outputs.push_back({"dst", dtype_from_name(p.word("dtype")), {B, H, L, W}, true, block_data(p, "dst", {B, H, L, W})});
    return prep;
  }
  void invoke(Backend& b, const Problem&, const Bound& in, const Bound& out) const override {
    Tensor storage;
    b.kv_scatter({in["src"], host_index(b, in["slots"], storage), out.tensors[0]});
  }
};

class KvGather final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_gather"; }
  std::string_view summary() const override { return "dst[d] = src[random batch index]"; }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("Bs", 2, true), int_param("Bd", 2, true), int_param("H", 2, true), int_param("L", 8, true),
            int_param("W", 64, true), move_dtype()};
  }
  TrafficModel traffic_model() const override { return kv_gather_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t Bs = p.integer("Bs"), Bd = p.integer("Bd"), H = p.integer("H"), L = p.integer("L"), W = p.integer("W");
    return Footprint{}.add(dtype, {Bs, H, L, W}).add(DType::u32, {Bd, 4}).add(dtype, {Bd, H, L, W}).bytes();
  }
  Prepared prepare(const Problem& p) const override {
    const std::int64_t Bs = p.integer("Bs"), Bd = p.integer("Bd"), H = p.integer("H"), L = p.integer("L"), W = p.integer("W");
    Prepared prep;
    prep.add_input("src", block_data(p, "src", {Bs, H, L, W}));
    const CounterRng rng(p.line(), "batch_index");
    std::vector<std::int64_t> index;
    for (std::int64_t d = 0; d < Bd; ++d) index.push_back(static_cast<std::int64_t>(rng.bits(static_cast<std::uint64_t>(d)) % static_cast<std::uint64_t>(std::max<std::int64_t>(Bs, 1))));
    prep.add_input("batch_index", int_tensor({Bd}, index));
    prep.outputs.push_back({"dst", dtype_from_name(p.word("dtype")), {Bd, H, L, W}, true, {}});
    return prep;
  }
  void invoke(Backend& b, const Problem&, const Bound& in, const Bound& out) const override {
    Tensor storage;
    b.kv_gather({in["src"], host_index(b, in["batch_index"], storage), out.tensors[0]});
  }
};

// Block k: src (k mod Bs, 7k mod (Ls − len + 1)) → dst (k mod Bd, ⌊k/Bd⌋·len), so
// destinations never overlap and sources may.
std::vector<SeqBlock> blocks_of(const Problem& p) {
  const std::int64_t Bs = p.integer("Bs"), Bd = p.integer("Bd"), Ls = p.integer("Ls"), len = p.integer("len");
  std::vector<SeqBlock> out;
  for (std::int64_t k = 0; k < p.integer("blocks"); ++k) {
    const std::int64_t span = std::max<std::int64_t>(Ls - len + 1, 1);
    out.push_back({k % std::max<std::int64_t>(Bs, 1), (7 * k) % span, k % std::max<std::int64_t>(Bd, 1), (k / std::max<std::int64_t>(Bd, 1)) * len, len});
  }
  return out;
}

class KvCopyBlocks final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_copy_blocks"; }
  std::string_view summary() const override { return "move sequence blocks between batch rows"; }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("Bs", 2, true), int_param("Bd", 2, true), int_param("H", 2, true), int_param("Ls", 16, true),
            int_param("Ld", 16, true), int_param("W", 64, true), move_dtype(), int_param("blocks", 3, true),
            int_param("len", 4, true, 0)};
  }
  TrafficModel traffic_model() const override { return kv_copy_blocks_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t Bs = p.integer("Bs"), Bd = p.integer("Bd"), H = p.integer("H"), W = p.integer("W");
    // src, dst and its initial content, and the block list invoke() builds (five
    // integers per block).
    return Footprint{}
        .add(dtype, {Bs, H, p.integer("Ls"), W})
        .add(dtype, {Bd, H, p.integer("Ld"), W, 2})
        .add(DType::u32, {p.integer("blocks"), 10})
        .bytes();
  }
  Prepared prepare(const Problem& p) const override {
    const std::int64_t Bs = p.integer("Bs"), Bd = p.integer("Bd"), H = p.integer("H"), W = p.integer("W");
    Prepared prep;
    prep.add_input("src", block_data(p, "src", {Bs, H, p.integer("Ls"), W}));
    const Shape ds{Bd, H, p.integer("Ld"), W};
    prep.outputs.push_back({"dst", dtype_from_name(p.word("dtype")), ds, true, block_data(p, "dst", ds)});
    return prep;
  }
  void invoke(Backend& b, const Problem& p, const Bound& in, const Bound& out) const override {
    const std::vector<SeqBlock> blocks = blocks_of(p);
    b.kv_copy_blocks({in["src"], blocks, out.tensors[0]});
  }
};

class KvRoll final : public OpInfo {
 public:
  std::string_view name() const override { return "kv_roll"; }
  std::string_view summary() const override {
    return "per-row roll by shift·(1+b) − 3b (any sign, beyond L); shifts=extreme cycles 3, −2, 2^31−1, 0, −2^31, 9";
  }
  std::vector<ParamSpec> declared_params() const override {
    return {int_param("B", 2, true), int_param("H", 2, true), int_param("L", 16, true), int_param("W", 64, true),
            move_dtype(), int_param("shift", 3, true, 0), quiet(word_param("shifts", {"linear", "extreme"}, true))};
  }
  TrafficModel traffic_model() const override { return kv_roll_traffic; }
  std::uint64_t footprint(const Problem& p) const override {
    const DType dtype = dtype_from_name(p.word("dtype"));
    const std::int64_t B = p.integer("B"), H = p.integer("H"), L = p.integer("L"), W = p.integer("W");
    return Footprint{}.add(dtype, {B, H, L, W, 2}).add(DType::u32, {B, 4}).bytes();
  }
  Prepared prepare(const Problem& p) const override {
    const std::int64_t B = p.integer("B"), H = p.integer("H"), L = p.integer("L"), W = p.integer("W");
    Prepared prep;
    prep.add_input("src", block_data(p, "src", {B, H, L, W}));
    // shift·(1+b) − 3b must stay a 32-bit shift (fuzzed: shift=-5888888888888888888
    // overflowed the product).
    const std::int64_t shift = p.integer("shift");
    if (p.word("shifts") == "extreme") {
      constexpr std::int64_t cycle[] = {3, -2, INT32_MAX, 0, INT32_MIN, 9};
      std::vector<std::int64_t> shifts;
      for (std::int64_t b = 0; b < B; ++b) shifts.push_back(cycle[b % 6]);
      prep.add_input("shifts", int_tensor({B}, shifts));
      prep.outputs.push_back({"dst", dtype_from_name(p.word("dtype")), {B, H, L, W}, true, {}});
      return prep;
    }
    KVLAB_REQUIRE(std::abs(shift) <= (std::int64_t{1} << 31) / std::max<std::int64_t>(B, 1) - 3, invalid_argument,
                  "kv_roll shift=", shift, " times B=", B, " rows does not fit a 32-bit shift");
    std::vector<std::int64_t> shifts;
    for (std::int64_t b = 0; b < B; ++b) shifts.push_back(shift * (1 + b) - 3 * b);
    prep.add_input("shifts", int_tensor({B}, shifts));
    prep.outputs.push_back({"dst", dtype_from_name(p.word("dtype")), {B, H, L, W}, true, {}});
    return prep;
  }
  void invoke(Backend& b, const Problem&, const Bound& in, const Bound& out) const override {
    Tensor storage;
    b.kv_roll({in["src"], host_index(b, in["shifts"], storage), out.tensors[0]});
  }
};

}  // namespace

const OpInfo& kv_scatter() {
  static const KvScatter op;
  return op;
}
const OpInfo& kv_gather() {
  static const KvGather op;
  return op;
}
const OpInfo& kv_copy_blocks() {
  static const KvCopyBlocks op;
  return op;
}
const OpInfo& kv_roll() {
  static const KvRoll op;
  return op;
}

}  // namespace kvlab::harness::ops
