#version 450
// kv_append_advance (kernels/vulkan/kv_append.cc, contract reference/kv_append.h): writes
// a chunk of S K rows and V rows of every (b, h) into the caches (B, H, capacity, D) at the
// columns given by the row's offset, and advances the row's offset.
//
// Offsets: `snapshot` holds the offsets copied from `live` before this dispatch (an
// earlier command of the same submission). Token s of row b goes to column
// snapshot[b] + pad[b] + s (pad: the row's left padding, so the offset of the first real
// token is 0); then live[b] = snapshot[b] + S. Columns are read from the snapshot only:
// the live buffer is written by this very dispatch, and reading it would race.
//
// One invocation copies one element (16- or 32-bit); the u32-word build stores 16-bit
// elements through the masked atomics of common.glsl, so neighbouring elements written by
// other invocations are never clobbered.
#include "common.glsl"

KVLAB_TENSOR16(k_src, 0)
KVLAB_TENSOR16(v_src, 1)
KVLAB_TENSOR16(k_cache, 2)
KVLAB_TENSOR16(v_cache, 3)
layout(std430, set = 0, binding = 4) readonly buffer snapshot_block { int snapshot_w[]; };
layout(std430, set = 0, binding = 5) writeonly buffer live_block { int live_w[]; };
layout(std430, set = 0, binding = 6) readonly buffer pad_block { int pad_w[]; };

layout(push_constant) uniform Push {
  uint k_src_offset;     // elements, within binding 0
  uint v_src_offset;     // elements, within binding 1
  uint k_cache_offset;   // elements, within binding 2
  uint v_cache_offset;   // elements, within binding 3
  uint snapshot_offset;  // i32 elements, within binding 4
  uint live_offset;      // i32 elements, within binding 5
  uint pad_offset;       // i32 elements, within binding 6
  uint wide;             // 1: 32-bit elements (f32); 0: 16-bit (f16, bf16)
  uint batch;            // B
  uint heads;            // H
  uint seq;              // S, the chunk length
  uint k_dim;            // Dk
  uint v_dim;            // Dv
  uint capacity;         // columns of the caches
} pc;

void main() {
  const uint width = pc.k_dim + pc.v_dim;  // the K then the V features of one token
  const uint items = pc.batch * pc.heads * pc.seq * width;
  for (uint item = gl_GlobalInvocationID.x; item < items; item += kvlab_stride()) {
    const uint f = item % width, row = item / width;  // row over (B, H, S)
    const uint s = row % pc.seq, bh = row / pc.seq, b = bh / pc.heads;
    // The host validated snapshot + pad + S <= capacity before recording.
    const uint column = uint(snapshot_w[pc.snapshot_offset + b] + pad_w[pc.pad_offset + b]) + s;
    const uint slot = bh * pc.capacity + column;
    if (f < pc.k_dim) {
      const uint from = pc.k_src_offset + row * pc.k_dim + f, to = pc.k_cache_offset + slot * pc.k_dim + f;
      if (pc.wide != 0u) k_cache_store32(to, k_src_load32(from)); else k_cache_store16(to, k_src_load16(from));
    } else {
      const uint g = f - pc.k_dim;
      const uint from = pc.v_src_offset + row * pc.v_dim + g, to = pc.v_cache_offset + slot * pc.v_dim + g;
      if (pc.wide != 0u) v_cache_store32(to, v_src_load32(from)); else v_cache_store16(to, v_src_load16(from));
    }
  }
  // The advance: one invocation per row (items >= B, so the dispatch has them).
  const uint b = gl_GlobalInvocationID.x;
  if (b < pc.batch) live_w[pc.live_offset + b] = snapshot_w[pc.snapshot_offset + b] + int(pc.seq);
}
