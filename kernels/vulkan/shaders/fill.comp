#version 450
// Backend::fill: every element of a byte range gets the same bit pattern. The host
// passes the pattern replicated to a 32-bit word; the range starts on an element
// boundary and elements are 1, 2 or 4 bytes, so byte k of any word holds pattern byte k.
// Edge words that the range covers only in part keep their other bytes.
#include "common.glsl"

KVLAB_TENSOR8(dst, 0)

layout(push_constant) uniform Push {
  uint byte_offset;  // of the range within the binding
  uint nbytes;
  uint pattern;      // the element bits replicated over 32 bits
} pc;

void main() {
  const uint first = pc.byte_offset >> 2;
  const uint end = pc.byte_offset + pc.nbytes;
  const uint words = ((end + 3u) >> 2) - first;
  for (uint i = gl_GlobalInvocationID.x; i < words; i += kvlab_stride()) {
    const uint w = first + i;
    const uint lo = max(pc.byte_offset, 4u * w), hi = min(end, 4u * w + 4u);
    if (lo == 4u * w && hi == 4u * w + 4u) {
      dst_w[w] = pc.pattern;
    } else {
      uint mask = 0u;
      for (uint x = lo; x < hi; ++x) mask |= 0xFFu << (8u * (x - 4u * w));
      dst_store_partial(w, mask, pc.pattern & mask);
    }
  }
}
