// Vulkan cache data movement (contract: reference/kv_move.h): shaders/kv_move.comp, one
// shader for the four kernels. The oracle's validators run first on the host index
// vectors; the shader then reads the same indices from a table copied into the scratch
// buffer (kv_copy_blocks' block table travels the same way).
#include <cstdint>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kvlab/error.h"
#include "reference/kv_move.h"

namespace kvlab {

namespace {

enum Mode : std::uint32_t { kScatter = 0, kGather = 1, kRoll = 2, kCopyBlocks = 3 };

// The push-constant block of kv_move.comp.
struct KvMovePush {
  std::uint32_t mode = 0, src_offset = 0, dst_offset = 0, index_offset = 0, row_bytes = 0, row_words = 0, rows = 0,
                heads = 0, src_len = 0, dst_len = 0, blocks = 0;
};

void run(VulkanBackend::Context& c, KvMovePush push, const ref::KvMovePlan& plan, const DTensor& src,
         const DTensor& dst, const BoundTensor& index, std::int64_t rows) {
  const BoundTensor bs = c.bind(src, 1), bd = c.bind(dst, 1);
  push.src_offset = bs.offset;
  push.dst_offset = bd.offset;
  push.index_offset = index.offset;
  push.row_bytes = static_cast<std::uint32_t>(plan.src.row_bytes);
  push.row_words = push.row_bytes / 4 + 2;  // words one row can touch at any alignment
  push.rows = u32(rows);
  push.heads = u32(plan.src.H);
  c.dispatch(vulkan::ShaderId::kv_move, {bs, bd, index}, &push, sizeof push,
             static_cast<std::uint64_t>(rows) * push.row_words);
}

}  // namespace

void VulkanBackend::kv_scatter(const KvScatterArgs& a) {
  const auto& [src, slots, dst] = a;
  Context& c = *context_;
  const ref::KvMovePlan plan = ref::validate_kv_scatter(c.view(src), slots, c.view(dst));
  if (plan.src.bytes == 0) return;
  KvMovePush push;
  push.mode = kScatter;
  push.src_len = u32(plan.src.L);
  push.dst_len = u32(plan.dst.L);
  run(c, push, plan, src, dst, c.bind_table(slots.data, slots.nbytes()), plan.src.B * plan.src.H * plan.src.L);
}

void VulkanBackend::kv_gather(const KvGatherArgs& a) {
  const auto& [src, batch_index, dst] = a;
  Context& c = *context_;
  const ref::KvMovePlan plan = ref::validate_kv_gather(c.view(src), batch_index, c.view(dst));
  if (plan.src.bytes == 0 || plan.dst.bytes == 0) return;
  KvMovePush push;
  push.mode = kGather;
  push.src_len = push.dst_len = u32(plan.src.L);
  run(c, push, plan, src, dst, c.bind_table(batch_index.data, batch_index.nbytes()),
      plan.dst.B * plan.src.H * plan.src.L);
}

void VulkanBackend::kv_roll(const KvRollArgs& a) {
  const auto& [src, shifts, dst] = a;
  Context& c = *context_;
  const ref::KvMovePlan plan = ref::validate_kv_roll(c.view(src), shifts, c.view(dst));
  if (plan.src.bytes == 0) return;  // also L == 0, where "mod L" is undefined
  KvMovePush push;
  push.mode = kRoll;
  push.src_len = push.dst_len = u32(plan.src.L);
  run(c, push, plan, src, dst, c.bind_table(shifts.data, shifts.nbytes()), plan.src.B * plan.src.H * plan.src.L);
}

void VulkanBackend::kv_copy_blocks(const KvCopyBlocksArgs& a) {
  const auto& [src, blocks, dst] = a;
  Context& c = *context_;
  const ref::KvMovePlan plan = ref::validate_kv_copy_blocks(c.view(src), blocks, c.view(dst));
  if (plan.src.bytes == 0) return;
  // The shader's block table: per non-empty block, its first row (cumulative over
  // H·length rows) and its coordinates; the shader finds a row's block by binary search.
  std::vector<std::uint32_t> table;
  std::int64_t rows = 0;
  for (const SeqBlock& k : blocks) {
    if (k.length == 0) continue;
    for (const std::int64_t v : {rows, k.src_batch, k.src_seq, k.dst_batch, k.dst_seq, k.length}) table.push_back(u32(v));
    rows += plan.src.H * k.length;
  }
  if (rows == 0) return;
  KvMovePush push;
  push.mode = kCopyBlocks;
  push.src_len = u32(plan.src.L);
  push.dst_len = u32(plan.dst.L);
  push.blocks = u32(static_cast<std::int64_t>(table.size() / 6));
  run(c, push, plan, src, dst, c.bind_table(table.data(), table.size() * sizeof(std::uint32_t)), rows);
}

}  // namespace kvlab
