// Cache data movement with MLX's indexing ops, after the oracle's checks (so a rejected
// call leaves dst unchanged): scatter = put_along_axis, gather = take, copy_blocks =
// slice_update per block, roll = mlx-lm's dynamic_roll (take_along_axis with
// (arange(L) − shift) mod L), append = slice_update per row plus an MLX add for the
// offsets, snapshot = copy. Destinations are read first, since rows not written must
// survive: MLX returns new arrays, which are copied back whole.
#include <vector>

#include "kernels/mlx/mlx_array.h"
#include "kernels/mlx/mlx_ops.h"
#include "kvlab/host_buffer.h"
#include "reference/kv_append.h"
#include "reference/kv_move.h"

namespace kvlab::mlxk {

namespace {

int i32(std::int64_t v) { return static_cast<int>(v); }

}  // namespace

void kv_scatter(const KvScatterArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  const ref::KvMovePlan plan = ref::validate_kv_scatter(src, a.slots, dst);
  if (src.numel() == 0) return;
  guarded("kv_scatter", [&] {
    const ref::KvBlock& s = plan.src;
    // slots (B, S) -> indices (B, 1, S, 1), broadcast over heads and features.
    const mx::array idx = mx::broadcast_to(mx::reshape(to_array(a.slots), {i32(s.B), 1, i32(s.L), 1}, cpu()),
                                           to_mx_shape(src.shape), cpu());
    copy_out(mx::put_along_axis(to_array(dst), idx, to_array(src), 2, cpu()), dst, "kv_scatter");
  });
}

void kv_gather(const KvGatherArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  ref::validate_kv_gather(src, a.batch_index, dst);
  if (dst.numel() == 0) return;
  guarded("kv_gather", [&] { copy_out(mx::take(to_array(src), to_array(a.batch_index), 0, cpu()), dst, "kv_gather"); });
}

void kv_copy_blocks(const KvCopyBlocksArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  const ref::KvMovePlan plan = ref::validate_kv_copy_blocks(src, a.blocks, dst);
  if (dst.numel() == 0) return;
  guarded("kv_copy_blocks", [&] {
    const mx::array s = to_array(src);
    mx::array d = to_array(dst);
    const int H = i32(plan.src.H), W = i32(plan.src.W);
    for (const SeqBlock& b : a.blocks) {
      if (b.length == 0) continue;
      const mx::array rows = mx::slice(s, {i32(b.src_batch), 0, i32(b.src_seq), 0},
                                       {i32(b.src_batch) + 1, H, i32(b.src_seq + b.length), W}, cpu());
      d = mx::slice_update(d, rows, mx::Shape{i32(b.dst_batch), 0, i32(b.dst_seq), 0},
                           mx::Shape{i32(b.dst_batch) + 1, H, i32(b.dst_seq + b.length), W}, cpu());
    }
    copy_out(d, dst, "kv_copy_blocks");
  });
}

void kv_roll(const KvRollArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  const ref::KvMovePlan plan = ref::validate_kv_roll(src, a.shifts, dst);
  if (dst.numel() == 0) return;
  guarded("kv_roll", [&] {
    const int B = i32(plan.src.B), L = i32(plan.src.L);
    // mlx-lm's dynamic_roll: idx = (arange(L) − shifts[:, None]) % L, MLX's remainder
    // taking the divisor's sign as Python's does.
    const mx::array shifts = mx::reshape(to_array(a.shifts), {B, 1}, cpu());
    const mx::array idx = mx::remainder(mx::subtract(mx::expand_dims(mx::arange(L, cpu()), 0, cpu()), shifts, cpu()),
                                        mx::array(L, mx::int32), cpu());
    const mx::array full = mx::broadcast_to(mx::reshape(idx, {B, 1, L, 1}, cpu()), to_mx_shape(src.shape), cpu());
    copy_out(mx::take_along_axis(to_array(src), full, 2, cpu()), dst, "kv_roll");
  });
}

void kv_append_advance(const KvAppendAdvanceArgs& a) {
  const ConstTensorView k = host_cview(a.k), v = host_cview(a.v);
  const TensorView offsets = host_view(a.offsets), kc = host_view(a.k_cache), vc = host_view(a.v_cache);
  const ref::KvAppendPlan plan = ref::validate_kv_append_advance(k, v, a.left_padding, offsets, kc, vc);
  if (plan.S == 0 || plan.B == 0) return;
  guarded("kv_append_advance", [&] {
    const auto append = [&](const ConstTensorView& rows, const TensorView& cache, std::int64_t d, const char* what) {
      const mx::array r = to_array(rows);
      mx::array c = to_array(cache);
      for (std::int64_t b = 0; b < plan.B; ++b) {
        const int col = i32(plan.first_column[static_cast<std::size_t>(b)]);
        const mx::array row = mx::slice(r, {i32(b), 0, 0, 0}, {i32(b) + 1, i32(plan.H), i32(plan.S), i32(d)}, cpu());
        c = mx::slice_update(c, row, mx::Shape{i32(b), 0, col, 0},
                             mx::Shape{i32(b) + 1, i32(plan.H), col + i32(plan.S), i32(d)}, cpu());
      }
      copy_out(c, cache, what);
    };
    append(k, kc, plan.Dk, "kv_append_advance k_cache");
    append(v, vc, plan.Dv, "kv_append_advance v_cache");
    // Validated above: offsets[b] + S fits int32.
    copy_out(mx::add(to_array(offsets), mx::array(i32(plan.S), mx::int32), cpu()), offsets, "kv_append_advance offsets");
  });
}

void kv_snapshot(const KvSnapshotArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  ref::validate_kv_snapshot(src, dst);
  if (dst.numel() == 0) return;
  guarded("kv_snapshot", [&] { copy_out(mx::copy(to_array(src), cpu()), dst, "kv_snapshot"); });
}

}  // namespace kvlab::mlxk
