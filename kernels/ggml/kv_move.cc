// The cache moves ggml has, as llama.cpp's KV cache uses them: kv_scatter through
// ggml_set_rows (llama.cpp writes each ubatch's K/V rows at their cells this way),
// kv_gather through ggml_get_rows, kv_cast through ggml_cpy (an f32 K/V into an f16 or bf16
// cache). kv_copy_blocks, kv_roll and the device-offset appends have no ggml op: not
// overridden (UNIMPLEMENTED).
//
// kvlab's block (B, H, L, W) is ggml's [W, L, H, B]. The moves are byte copies, so the
// data is handed to ggml as a type whose path copies bits: ggml_set_rows from F16 into F16
// is a memcpy of each row, so every 2-byte dtype goes as F16, and its F32 path runs the
// F32 from_float, a copy, for every 4-byte dtype; ggml_get_rows keeps I32 as I32 (other
// types come back as F32), so rows go as I32 words (a 2-byte dtype two elements a word, so
// W must be even). Other element sizes are UNIMPLEMENTED.
//
// kv_cast is ggml's own conversion (ggml-cpu's dup: FP32→FP16 by F16C, FP32→BF16 by
// GGML_FP32_TO_BF16, widening exact), judged bit for bit against the oracle's.
#include <limits>
#include <vector>

#include "kernels/ggml/ggml_ops.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"
#include "reference/kv_cast.h"
#include "reference/kv_move.h"

namespace kvlab::ggmlk {
namespace {

// ggml counts rows and elements per dimension with int64 but a row's index with int32
// here (I32 indices): kvlab's L and B must fit.
void require_int32(std::int64_t v, const char* what) {
  KVLAB_REQUIRE(v <= std::numeric_limits<std::int32_t>::max(), unsupported, "ggml ", what, " ", v,
                " beyond ggml's int32 row indices");
}

}  // namespace

void kv_scatter(Engine& e, const KvScatterArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  const ref::KvMovePlan plan = ref::validate_kv_scatter(src, a.slots, dst);
  const std::size_t es = dtype_size(src.dtype);
  KVLAB_REQUIRE(es == 2 || es == 4, unsupported, "ggml kv_scatter: ", dtype_name(src.dtype),
                " (ggml_set_rows copies bits for 2- and 4-byte elements only)");
  const std::int64_t B = plan.src.B, H = plan.src.H, S = plan.src.L, W = plan.src.W;
  if (B == 0 || H == 0 || S == 0 || W == 0) return;
  require_int32(plan.dst.L, "kv_scatter length");
  const ggml_type type = es == 2 ? GGML_TYPE_F16 : GGML_TYPE_F32;
  // One graph per batch row: its slots are the rows of every head.
  std::vector<std::int32_t> slots(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s)
      slots[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(plan.indices[static_cast<std::size_t>(b * S + s)]);
    Context ctx(4);
    ggml_tensor* td = ctx.tensor(type, W, plan.dst.L, H, 1, dst.data + plan.dst.row_offset(b, 0, 0));
    ggml_tensor* ts = ctx.tensor(type, W, S, H, 1, src.data + plan.src.row_offset(b, 0, 0));
    ggml_tensor* ti = ctx.tensor(GGML_TYPE_I32, S, 1, 1, 1, slots.data());
    e.compute(ctx.get(), ggml_set_rows(ctx.get(), td, ts, ti), "kv_scatter");
  }
}

void kv_gather(Engine& e, const KvGatherArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  const ref::KvMovePlan plan = ref::validate_kv_gather(src, a.batch_index, dst);
  const std::size_t es = dtype_size(src.dtype);
  KVLAB_REQUIRE(es == 4 || (es == 2 && plan.src.W % 2 == 0), unsupported, "ggml kv_gather: ", dtype_name(src.dtype),
                " rows of ", plan.src.W, " (ggml_get_rows keeps 4-byte words: 4-byte elements, or 2-byte ones in pairs)");
  if (plan.dst.B == 0 || plan.src.row_bytes == 0 || plan.src.H == 0 || plan.src.L == 0) return;
  require_int32(plan.src.B, "kv_gather batch");
  // A batch row is one ggml row of H·L·W elements: get_rows picks whole batch rows.
  const auto words = static_cast<std::int64_t>(static_cast<std::size_t>(plan.src.H * plan.src.L) * plan.src.row_bytes / 4);
  std::vector<std::int32_t> index(plan.indices.begin(), plan.indices.end());
  Context ctx(4);
  ggml_tensor* ts = ctx.tensor(GGML_TYPE_I32, words, plan.src.B, 1, 1, src.data);
  ggml_tensor* ti = ctx.tensor(GGML_TYPE_I32, plan.dst.B, 1, 1, 1, index.data());
  ggml_tensor* r = ggml_get_rows(ctx.get(), ts, ti);
  r->data = dst.data;
  e.compute(ctx.get(), r, "kv_gather");
}

void kv_cast(Engine& e, const KvCastArgs& a) {
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  ref::validate_kv_cast(src, dst);
  const std::int64_t n = src.numel();
  if (n == 0) return;
  Context ctx(3);
  ggml_tensor* ts = ctx.tensor(float_type(src.dtype), n, 1, 1, 1, src.data);
  ggml_tensor* td = ctx.tensor(float_type(dst.dtype), n, 1, 1, 1, dst.data);
  e.compute(ctx.get(), ggml_cpy(ctx.get(), ts, td), "kv_cast");
}

}  // namespace kvlab::ggmlk
