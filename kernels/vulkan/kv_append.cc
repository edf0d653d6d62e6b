// Vulkan device-offset ops (contract: reference/kv_append.h).
//
// kv_append_advance: shaders/kv_append_advance.comp reads each row's offset and writes the
// advanced one. Done in place, the invocations of row b that read offsets[b] would race
// the one that advances it, so one submission first copies the offsets into a scratch
// tensor (the shader's read side) and then runs the shader with the caller's offsets as
// its write side. The oracle's validator reads the offsets where they live (a readable
// view of the device buffer), so an append outside the capacity is refused before any
// command is recorded, with the oracle's message.
// kv_snapshot: vkCmdCopyBuffer after the oracle's checks.
#include <cstdint>

#include "kernels/vulkan/context.h"
#include "kvlab/error.h"
#include "reference/kv_append.h"

namespace kvlab {

namespace {

// The push-constant block of shaders/kv_append_advance.comp.
struct AppendPush {
  std::uint32_t k_src_offset, v_src_offset, k_cache_offset, v_cache_offset, snapshot_offset, live_offset,
      pad_offset, wide, batch, heads, seq, k_dim, v_dim, capacity;
};

}  // namespace

void VulkanBackend::kv_append_advance(const KvAppendAdvanceArgs& a) {
  Context& c = *context_;
  (void)c.view(a.offsets);  // the buffer is this backend's before it is read
  const ref::KvAppendPlan p = ref::validate_kv_append_advance(c.view(a.k), c.view(a.v), a.left_padding,
                                                              c.readable_view(a.offsets), c.view(a.k_cache),
                                                              c.view(a.v_cache));
  if (p.S == 0 || p.B == 0 || p.H == 0) return;
  const std::size_t es = dtype_size(a.k.dtype);
  const DTensor read_side = allocate(DType::i32, {p.B});
  const BoundTensor bk = c.bind(a.k, es), bv = c.bind(a.v, es), bkc = c.bind(a.k_cache, es),
                    bvc = c.bind(a.v_cache, es), bread = c.bind(read_side, 4), blive = c.bind(a.offsets, 4);
  Context::Batch recording(c);
  const BoundTensor bpad = c.bind_table(a.left_padding.data, a.left_padding.nbytes());
  const AppendPush push{bk.offset,    bv.offset,    bkc.offset, bvc.offset, bread.offset,
                        blive.offset, bpad.offset,  es == 4 ? 1u : 0u,
                        u32(p.B),     u32(p.H),     u32(p.S),   u32(p.Dk),  u32(p.Dv), u32(p.C)};
  c.copy(a.offsets, read_side);
  c.dispatch(vulkan::ShaderId::kv_append_advance, {bk, bv, bkc, bvc, bread, blive, bpad}, &push, sizeof push,
             static_cast<std::uint64_t>(p.B * p.H * p.S * (p.Dk + p.Dv)));
  recording.submit();
}

void VulkanBackend::kv_snapshot(const KvSnapshotArgs& a) {
  Context& c = *context_;
  ref::validate_kv_snapshot(c.view(a.src), c.view(a.dst));
  if (a.src.nbytes() == 0) return;
  c.copy(a.src, a.dst);
}

}  // namespace kvlab
