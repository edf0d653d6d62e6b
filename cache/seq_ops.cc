#include "cache/seq_ops.h"

#include "cache/cache.h"

namespace kvlab::seq {

namespace {

// A host index vector as the kernels take it (it stays on the host, kvlab/op_list.h).
ConstTensorView index_view(const std::vector<std::int32_t>& values) {
  return {reinterpret_cast<const std::byte*>(values.data()), DType::i32, {static_cast<std::int64_t>(values.size())}};
}

std::vector<SeqBlock> whole_rows(std::int64_t batch_size, std::int64_t src_seq, std::int64_t dst_seq,
                                 std::int64_t len) {
  std::vector<SeqBlock> blocks;
  for (std::int64_t b = 0; b < batch_size; ++b) blocks.push_back({b, src_seq, b, dst_seq, len});
  return blocks;
}

}  // namespace

std::int64_t grown_capacity(std::int64_t prev, std::int64_t capacity, std::int64_t s, std::int64_t step) {
  const std::int64_t kept = (capacity > 0 && prev % step != 0) ? prev : capacity;
  return kept + (s + step - 1) / step * step;
}

void require_block(const DTensor& t, const char* what) {
  KVLAB_REQUIRE(t.shape.size() == 4, shape_mismatch, what, " has shape ", shape_str(t.shape),
                ", expected a cache block (B, H, L, D)");
}

DTensor alloc_poisoned(Backend& be, DType dtype, const Shape& shape) {
  DTensor t = be.allocate(dtype, shape);
  be.fill(t, is_float(dtype) ? nan_poison_bits(dtype) : 0xFFFFFFFFu);
  return t;
}

DTensor slice(Backend& be, const DTensor& src, std::int64_t begin, std::int64_t end) {
  require_block(src, "slice source");
  KVLAB_REQUIRE(0 <= begin && begin <= end && end <= length(src), invalid_argument, "sequence slice [", begin, ", ",
                end, ") of a block with ", length(src), " rows");
  DTensor out = be.allocate(src.dtype, {batch(src), heads(src), end - begin, width(src)});
  const auto blocks = whole_rows(batch(src), begin, 0, end - begin);
  if (end > begin) be.kv_copy_blocks({src, blocks, out});
  return out;
}

DTensor regrow(Backend& be, const DTensor& src, std::int64_t keep, std::int64_t capacity) {
  require_block(src, "regrow source");
  KVLAB_REQUIRE(0 <= keep && keep <= length(src) && keep <= capacity, invalid_argument, "regrow keeping ", keep,
                " of ", length(src), " rows into capacity ", capacity);
  DTensor out = alloc_poisoned(be, src.dtype, {batch(src), heads(src), capacity, width(src)});
  if (keep > 0) be.kv_copy_blocks({src, whole_rows(batch(src), 0, 0, keep), out});
  return out;
}

DTensor concat(Backend& be, const DTensor& a, const DTensor& b) {
  require_block(a, "concat first");
  require_block(b, "concat second");
  KVLAB_REQUIRE(batch(a) == batch(b) && heads(a) == heads(b) && width(a) == width(b) && a.dtype == b.dtype,
                shape_mismatch, "cannot concatenate ", dtype_name(a.dtype), shape_str(a.shape), " and ",
                dtype_name(b.dtype), shape_str(b.shape), " along the sequence");
  DTensor out = be.allocate(a.dtype, {batch(a), heads(a), length(a) + length(b), width(a)});
  if (length(a) > 0) be.kv_copy_blocks({a, whole_rows(batch(a), 0, 0, length(a)), out});
  if (length(b) > 0) be.kv_copy_blocks({b, whole_rows(batch(b), 0, length(a), length(b)), out});
  return out;
}

void write_rows(Backend& be, const DTensor& src, const DTensor& dst, std::int64_t at) {
  require_block(src, "rows to write");
  require_block(dst, "destination block");
  if (length(src) > 0) be.kv_copy_blocks({src, whole_rows(batch(src), 0, at, length(src)), dst});
}

DTensor roll(Backend& be, const DTensor& src, const std::vector<std::int32_t>& shifts) {
  require_block(src, "roll source");
  DTensor out = be.allocate(src.dtype, src.shape);
  be.kv_roll({src, index_view(shifts), out});
  return out;
}

DTensor gather(Backend& be, const DTensor& src, const std::vector<std::int32_t>& index) {
  require_block(src, "gather source");
  const auto n = static_cast<std::int64_t>(index.size());
  DTensor out = be.allocate(src.dtype, {n, heads(src), length(src), width(src)});
  be.kv_gather({src, index_view(index), out});
  return out;
}

}  // namespace kvlab::seq

namespace kvlab::seq {

void poison_rows(Backend& be, const DTensor& dst, std::int64_t begin, std::int64_t end) {
  require_block(dst, "poison target");
  KVLAB_REQUIRE(0 <= begin && begin <= end && end <= length(dst), invalid_argument, "poison range [", begin, ", ",
                end, ") of a block with ", length(dst), " rows");
  if (end == begin) return;
  const DTensor poison = alloc_poisoned(be, dst.dtype, {batch(dst), heads(dst), end - begin, width(dst)});
  write_rows(be, poison, dst, begin);
}

}  // namespace kvlab::seq
