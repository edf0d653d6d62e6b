#version 450
// Cache data movement (reference/kv_move.h): kv_scatter, kv_gather, kv_roll and
// kv_copy_blocks as byte copies of whole rows. Every kernel is a map from a destination
// row to a source row of one (b, h, t) row of W elements; the host validated every
// index before this runs, so the shader trusts them.
//
// One invocation writes one 32-bit word of one destination row (row_words units per
// row): a word the row covers entirely is assembled from (at most two) source words and
// stored whole; a word the row covers in part (rows of odd byte sizes or offsets) gets
// only its bytes, through 8-bit stores or masked atomics, since a neighbouring row or a
// byte outside dst may share the word.
#include "common.glsl"

KVLAB_TENSOR8(src, 0)
KVLAB_TENSOR8(dst, 1)
layout(std430, set = 0, binding = 2) buffer index_block { uint index_w[]; };

const uint MODE_SCATTER = 0u, MODE_GATHER = 1u, MODE_ROLL = 2u, MODE_COPY_BLOCKS = 3u;

layout(push_constant) uniform Push {
  uint mode;
  uint src_offset;    // bytes, within binding 0
  uint dst_offset;    // bytes, within binding 1
  uint index_offset;  // 32-bit elements, within binding 2
  uint row_bytes;
  uint row_words;     // work units per row: row_bytes/4 + 2 covers any alignment
  uint rows;          // destination rows written
  uint heads;         // H
  uint src_len;       // source sequence length (S for scatter, L otherwise)
  uint dst_len;       // destination sequence length
  uint blocks;        // copy_blocks: entries in the block table
} pc;

// Roll amount (shift mod n) in [0, n) for an int32 shift, without signed overflow.
uint roll_amount(int shift, uint n) {
  if (shift >= 0) return uint(shift) % n;
  const uint m = uint(-(shift + 1)) % n;  // −(shift+1) fits in int32 even for INT32_MIN
  return n - 1u - m;
}

// copy_blocks table: per non-empty block, 6 words
// {first row (cumulative over H·length), src_batch, src_seq, dst_batch, dst_seq, length}.
uint table(uint block, uint field) { return index_w[pc.index_offset + 6u * block + field]; }

void rows_of(uint r, out uint src_row, out uint dst_row) {
  if (pc.mode == MODE_SCATTER) {  // r over (B, H, S): dst[b, h, slots[b, s]] = src[b, h, s]
    const uint s = r % pc.src_len, bh = r / pc.src_len, b = bh / pc.heads;
    src_row = r;
    dst_row = bh * pc.dst_len + index_w[pc.index_offset + b * pc.src_len + s];
  } else if (pc.mode == MODE_GATHER) {  // r over (Bd, H, L): dst[d] = src[batch_index[d]]
    const uint slab = pc.heads * pc.src_len, d = r / slab;
    src_row = index_w[pc.index_offset + d] * slab + r % slab;
    dst_row = r;
  } else if (pc.mode == MODE_ROLL) {  // r over (B, H, L): dst[t] = src[(t − shift) mod L]
    const uint t = r % pc.src_len, bh = r / pc.src_len, b = bh / pc.heads;
    const uint k = roll_amount(int(index_w[pc.index_offset + b]), pc.src_len);
    src_row = bh * pc.src_len + (t + pc.src_len - k) % pc.src_len;
    dst_row = r;
  } else {  // MODE_COPY_BLOCKS: binary search for the block holding row r
    uint lo = 0u, hi = pc.blocks;  // table(lo, 0) <= r < table(hi, 0)
    while (hi - lo > 1u) {
      const uint mid = (lo + hi) / 2u;
      if (table(mid, 0u) <= r) lo = mid; else hi = mid;
    }
    const uint local = r - table(lo, 0u), length = table(lo, 5u);
    const uint h = local / length, t = local % length;
    src_row = (table(lo, 1u) * pc.heads + h) * pc.src_len + table(lo, 2u) + t;
    dst_row = (table(lo, 3u) * pc.heads + h) * pc.dst_len + table(lo, 4u) + t;
  }
}

void main() {
  const uint units = pc.rows * pc.row_words;
  for (uint u = gl_GlobalInvocationID.x; u < units; u += kvlab_stride()) {
    const uint r = u / pc.row_words, k = u % pc.row_words;
    uint src_row, dst_row;
    rows_of(r, src_row, dst_row);
    const uint ds = pc.dst_offset + dst_row * pc.row_bytes, de = ds + pc.row_bytes;
    const uint w = (ds >> 2) + k;
    if (4u * w >= de) continue;
    const uint ss = pc.src_offset + src_row * pc.row_bytes;  // source byte of dst byte ds
    const uint lo = max(ds, 4u * w), hi = min(de, 4u * w + 4u);
    if (lo == 4u * w && hi == 4u * w + 4u) {
      const uint s0 = ss + (4u * w - ds), shift = 8u * (s0 & 3u);
      uint v = src_w[s0 >> 2];
      if (shift != 0u) v = (v >> shift) | (src_w[(s0 >> 2) + 1u] << (32u - shift));
      dst_w[w] = v;
    } else {
      uint v = 0u, mask = 0u;
      for (uint x = lo; x < hi; ++x) {
        const uint at = 8u * (x - 4u * w);
        v |= src_load_byte(ss + (x - ds)) << at;
        mask |= 0xFFu << at;
      }
      dst_store_partial(w, mask, v);
    }
  }
}
