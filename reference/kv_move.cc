#include "reference/kv_move.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kvlab/error.h"

namespace kvlab::ref {

namespace {

// Every byte offset of an in-range row of a validated block is below `bytes`, and
// `bytes` fits in ptrdiff_t (checked), so row addressing cannot overflow even for
// shapes near the int64 limit.
using Block = KvBlock;

// Byte size of a view, rejecting shapes whose byte count does not fit in memory:
// numel() alone fits int64, but numel · dtype_size may not, and a wrapped size would
// make every later bound check meaningless.
std::size_t checked_bytes(const ConstTensorView& v, const char* what) {
  const std::int64_t n = v.numel();  // throws on negative dims and int64 overflow
  const auto es = static_cast<std::int64_t>(dtype_size(v.dtype));
  KVLAB_REQUIRE(n <= std::numeric_limits<std::ptrdiff_t>::max() / es, invalid_argument, what, " of shape ",
                shape_str(v.shape), " ", dtype_name(v.dtype), " has more bytes than memory can hold");
  KVLAB_REQUIRE(n == 0 || v.data != nullptr, misuse, what, " of shape ", shape_str(v.shape), " has no data pointer");
  return static_cast<std::size_t>(n * es);
}

Block block_of(const ConstTensorView& v, const char* what) {
  require_rank(v, 4, what);
  Block b{v.dim(0), v.dim(1), v.dim(2), v.dim(3), 0, 0};
  b.bytes = checked_bytes(v, what);
  // An empty block may still have one huge extent (e.g. (1, 0, 1, 2^62)), whose row
  // size would overflow; it has nothing to move, so its row size is left 0. Kernels
  // return before copying when the source is empty, which keeps every product of
  // extents used for addressing below the (non-zero) element count.
  if (b.bytes != 0) b.row_bytes = static_cast<std::size_t>(b.W) * dtype_size(v.dtype);
  return b;
}

// Source and destination of one move must agree on what a row is: same dtype (no
// casts — these are byte copies), same heads, same row width.
void require_same_rows(const ConstTensorView& src, const ConstTensorView& dst, const char* kernel) {
  KVLAB_REQUIRE(src.dtype == dst.dtype, dtype_mismatch, kernel, ": src dtype ", dtype_name(src.dtype),
                " differs from dst dtype ", dtype_name(dst.dtype));
  KVLAB_REQUIRE(src.dim(1) == dst.dim(1) && src.dim(3) == dst.dim(3), shape_mismatch, kernel, ": src ",
                shape_str(src.shape), " and dst ", shape_str(dst.shape),
                " differ in heads (axis 1) or row width (axis 3)");
}

// The kernels read `a` while writing `b`; if the byte ranges overlap, a row can be
// overwritten before it is read, and the result would depend on loop order (which an
// optimized backend is free to change). Compared as integers: relational comparison
// of pointers into different objects is unspecified.
void require_disjoint(const ConstTensorView& a, std::size_t a_bytes, const char* a_name, const ConstTensorView& b,
                      std::size_t b_bytes, const char* kernel) {
  if (a_bytes == 0 || b_bytes == 0) return;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  KVLAB_REQUIRE(a0 + a_bytes <= b0 || b0 + b_bytes <= a0, invalid_argument, kernel, ": ", a_name, " (", a_bytes,
                " bytes at ", static_cast<const void*>(a.data), ") overlaps dst (", b_bytes, " bytes at ",
                static_cast<const void*>(b.data), "); use a separate destination buffer");
}

// An int32 index tensor of the expected shape, loaded up front: every index is
// validated before the first byte of dst is written, so a rejected call leaves dst as
// it was.
std::vector<std::int64_t> load_indices(const ConstTensorView& v, const Shape& expected, const char* what) {
  require_dtype(v, DType::i32, what);
  require_shape(v, expected, what);
  checked_bytes(v, what);
  // Read as i32 in one loop the compiler vectorizes, not a load_int call per element: an
  // append's slots arrive cold, and a call per element kept about one miss in flight
  // (docs/benchmarks.md §Measurements behind kernel choices).
  std::vector<std::int64_t> out(static_cast<std::size_t>(v.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::int32_t x;
    std::memcpy(&x, v.data + 4 * i, 4);
    out[i] = x;
  }
  return out;
}

// Whether a row of in-range slots repeats one. A decode append is one or two runs of
// consecutive slots (two when a ring wraps), so the slots are split into maximal runs
// and the runs, sorted by first slot, must not overlap: O(S + R log R) for R runs
// instead of sorting all S slots on every append.
bool has_repeated_slot(std::span<const std::int64_t> row) {
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // [first, end) slots
  for (std::size_t p = 0; p < row.size();) {
    std::size_t len = 1;
    while (p + len < row.size() && row[p + len] == row[p] + static_cast<std::int64_t>(len)) ++len;
    runs.emplace_back(row[p], row[p] + static_cast<std::int64_t>(len));
    p += len;
  }
  std::sort(runs.begin(), runs.end());
  for (std::size_t i = 1; i < runs.size(); ++i) {
    if (runs[i].first < runs[i - 1].second) return true;
  }
  return false;
}

// Names the smallest repeated slot and its first two positions (only on the error path).
[[noreturn]] void reject_repeated_slot(std::span<const std::int64_t> row, std::int64_t b) {
  std::vector<std::pair<std::int64_t, std::size_t>> sorted;  // (slot, position)
  for (std::size_t p = 0; p < row.size(); ++p) sorted.emplace_back(row[p], p);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t p = 1; p < sorted.size(); ++p) {
    KVLAB_REQUIRE(sorted[p].first != sorted[p - 1].first, invalid_argument, "kv_scatter: slot ", sorted[p].first,
                  " repeated in batch row ", b, " (positions ", sorted[p - 1].second, " and ", sorted[p].second, ")");
  }
  fail(ErrorKind::internal, cat("kv_scatter: batch row ", b, " was found to repeat a slot, but no repeat is left"));
}

}  // namespace

// Math modulo: the result is in [0, n) for any a, unlike C++'s %, which keeps the sign
// of a. n > 0.
std::int64_t kv_roll_amount(std::int64_t shift, std::int64_t n) {
  const std::int64_t r = shift % n;
  return r < 0 ? r + n : r;
}

KvMovePlan validate_kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const ConstTensorView& dst) {
  const Block s = block_of(src, "kv_scatter src");
  const Block d = block_of(dst, "kv_scatter dst");
  require_same_rows(src, dst, "kv_scatter");
  KVLAB_REQUIRE(s.B == d.B, shape_mismatch, "kv_scatter: src ", shape_str(src.shape), " and dst ", shape_str(dst.shape),
                " differ in batch (axis 0)");
  const std::vector<std::int64_t> slot = load_indices(slots, {s.B, s.L}, "kv_scatter slots");
  require_disjoint(src, s.bytes, "src", dst, d.bytes, "kv_scatter");
  require_disjoint(slots, static_cast<std::size_t>(slots.numel()) * 4, "slots", dst, d.bytes, "kv_scatter");

  const auto S = static_cast<std::size_t>(s.L);
  for (std::int64_t b = 0; b < s.B; ++b) {
    for (std::size_t p = 0; p < S; ++p) {
      const std::int64_t t = slot[static_cast<std::size_t>(b) * S + p];
      KVLAB_REQUIRE(0 <= t && t < d.L, invalid_argument, "kv_scatter: slot ", t, " (batch row ", b, ", position ", p,
                    ") is outside [0, ", d.L, ")");
    }
    // A repeated slot would make the surviving row depend on write order.
    const std::span<const std::int64_t> row(slot.data() + static_cast<std::size_t>(b) * S, S);
    if (has_repeated_slot(row)) reject_repeated_slot(row, b);
  }
  return {s, d, slot};
}

void kv_scatter(const ConstTensorView& src, const ConstTensorView& slots, const TensorView& dst) {
  const KvMovePlan plan = validate_kv_scatter(src, slots, dst);
  const KvBlock &s = plan.src, &d = plan.dst;
  if (s.bytes == 0) return;
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.H; ++h)
      for (std::int64_t p = 0; p < s.L; ++p) {
        const std::int64_t t = plan.indices[static_cast<std::size_t>(b * s.L + p)];
        std::memcpy(dst.data + d.row_offset(b, h, t), src.data + s.row_offset(b, h, p), s.row_bytes);
      }
}

KvMovePlan validate_kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index,
                              const ConstTensorView& dst) {
  const Block s = block_of(src, "kv_gather src");
  const Block d = block_of(dst, "kv_gather dst");
  require_same_rows(src, dst, "kv_gather");
  KVLAB_REQUIRE(s.L == d.L, shape_mismatch, "kv_gather: src ", shape_str(src.shape), " and dst ", shape_str(dst.shape),
                " differ in sequence length (axis 2)");
  const std::vector<std::int64_t> index = load_indices(batch_index, {d.B}, "kv_gather batch_index");
  require_disjoint(src, s.bytes, "src", dst, d.bytes, "kv_gather");
  require_disjoint(batch_index, static_cast<std::size_t>(d.B) * 4, "batch_index", dst, d.bytes, "kv_gather");
  for (std::size_t i = 0; i < index.size(); ++i) {
    KVLAB_REQUIRE(0 <= index[i] && index[i] < s.B, invalid_argument, "kv_gather: batch_index[", i, "] = ", index[i],
                  " is outside [0, ", s.B, ") (the source batch)");
  }
  return {s, d, index};
}

void kv_gather(const ConstTensorView& src, const ConstTensorView& batch_index, const TensorView& dst) {
  const KvMovePlan plan = validate_kv_gather(src, batch_index, dst);
  if (plan.src.bytes == 0) return;
  // One batch row of a dense (B, H, L, W) block is a contiguous H·L·W slab.
  const std::size_t slab = plan.src.bytes / static_cast<std::size_t>(plan.src.B);
  for (std::size_t i = 0; i < plan.indices.size(); ++i) {
    std::memcpy(dst.data + i * slab, src.data + static_cast<std::size_t>(plan.indices[i]) * slab, slab);
  }
}

KvMovePlan validate_kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks,
                                   const ConstTensorView& dst) {
  const Block s = block_of(src, "kv_copy_blocks src");
  const Block d = block_of(dst, "kv_copy_blocks dst");
  require_same_rows(src, dst, "kv_copy_blocks");
  require_disjoint(src, s.bytes, "src", dst, d.bytes, "kv_copy_blocks");

  // Range checks are written as `seq <= L - length` after `length <= L`, so that no
  // sum of caller values is formed (src_seq + length may overflow int64).
  auto in_range = [](std::int64_t seq, std::int64_t length, std::int64_t L) {
    return length <= L && 0 <= seq && seq <= L - length;
  };
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const SeqBlock& k = blocks[i];
    KVLAB_REQUIRE(k.length >= 0, invalid_argument, "kv_copy_blocks: block ", i, " has negative length ", k.length);
    KVLAB_REQUIRE(0 <= k.src_batch && k.src_batch < s.B, invalid_argument, "kv_copy_blocks: block ", i, " src_batch ",
                  k.src_batch, " is outside [0, ", s.B, ")");
    KVLAB_REQUIRE(0 <= k.dst_batch && k.dst_batch < d.B, invalid_argument, "kv_copy_blocks: block ", i, " dst_batch ",
                  k.dst_batch, " is outside [0, ", d.B, ")");
    KVLAB_REQUIRE(in_range(k.src_seq, k.length, s.L), invalid_argument, "kv_copy_blocks: block ", i,
                  " source rows start at ", k.src_seq, " with length ", k.length, ", outside src sequence length ",
                  s.L);
    KVLAB_REQUIRE(in_range(k.dst_seq, k.length, d.L), invalid_argument, "kv_copy_blocks: block ", i,
                  " destination rows start at ", k.dst_seq, " with length ", k.length, ", outside dst sequence length ",
                  d.L);
  }

  // Overlapping destinations would make the result depend on block order. Sort the
  // non-empty blocks by (dst_batch, dst_seq); within a batch row, a block overlaps an
  // earlier one iff it starts before the furthest end seen so far.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].length > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(blocks[a].dst_batch, blocks[a].dst_seq) < std::pair(blocks[b].dst_batch, blocks[b].dst_seq);
  });
  for (std::size_t k = 1, reach = order.empty() ? 0 : order[0]; k < order.size(); ++k) {
    const SeqBlock& prev = blocks[reach];
    const SeqBlock& cur = blocks[order[k]];
    if (cur.dst_batch == prev.dst_batch) {
      KVLAB_REQUIRE(cur.dst_seq >= prev.dst_seq + prev.length, invalid_argument,
                    "kv_copy_blocks: destinations of blocks ", std::min(reach, order[k]), " and ",
                    std::max(reach, order[k]), " overlap (dst_batch ", cur.dst_batch, ", rows [", prev.dst_seq, ", ",
                    prev.dst_seq + prev.length, ") and [", cur.dst_seq, ", ", cur.dst_seq + cur.length, "))");
    }
    // No overlap so far means cur ends last within its batch row.
    reach = order[k];
  }
  return {s, d, {}};
}

void kv_copy_blocks(const ConstTensorView& src, std::span<const SeqBlock> blocks, const TensorView& dst) {
  const KvMovePlan plan = validate_kv_copy_blocks(src, blocks, dst);
  const KvBlock &s = plan.src, &d = plan.dst;
  if (s.bytes == 0) return;
  for (const SeqBlock& k : blocks) {
    const std::size_t n = static_cast<std::size_t>(k.length) * s.row_bytes;  // rows t are adjacent in one (b, h)
    if (n == 0) continue;  // an empty block may sit in an empty dst with no data pointer
    for (std::int64_t h = 0; h < s.H; ++h) {
      std::memcpy(dst.data + d.row_offset(k.dst_batch, h, k.dst_seq), src.data + s.row_offset(k.src_batch, h, k.src_seq),
                  n);
    }
  }
}

KvMovePlan validate_kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const ConstTensorView& dst) {
  const Block s = block_of(src, "kv_roll src");
  const Block d = block_of(dst, "kv_roll dst");
  require_shape(dst, src.shape, "kv_roll dst");
  require_dtype(dst, src.dtype, "kv_roll dst");
  const std::vector<std::int64_t> shift = load_indices(shifts, {s.B}, "kv_roll shifts");
  require_disjoint(src, s.bytes, "src", dst, d.bytes, "kv_roll");
  require_disjoint(shifts, static_cast<std::size_t>(s.B) * 4, "shifts", dst, d.bytes, "kv_roll");
  return {s, d, shift};
}

void kv_roll(const ConstTensorView& src, const ConstTensorView& shifts, const TensorView& dst) {
  const KvMovePlan plan = validate_kv_roll(src, shifts, dst);
  const KvBlock& s = plan.src;
  if (s.bytes == 0) return;  // also covers L == 0, where "mod L" is undefined

  // dst[i] = src[(i − r) mod L] with r = shift mod L: the last r source rows wrap to the
  // front, the first L − r move up by r. Shifts are int32 widened to int64, so the
  // modulo never overflows (INT32_MIN included).
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t r = kv_roll_amount(plan.indices[static_cast<std::size_t>(b)], s.L);
    const std::size_t head = static_cast<std::size_t>(r) * s.row_bytes;
    const std::size_t tail = static_cast<std::size_t>(s.L - r) * s.row_bytes;
    for (std::int64_t h = 0; h < s.H; ++h) {
      const std::size_t base = s.row_offset(b, h, 0);
      if (head != 0) std::memcpy(dst.data + base, src.data + base + tail, head);
      if (tail != 0) std::memcpy(dst.data + base + head, src.data + base, tail);
    }
  }
}

}  // namespace kvlab::ref
