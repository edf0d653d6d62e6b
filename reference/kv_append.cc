#include "reference/kv_append.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "kvlab/error.h"

namespace kvlab::ref {

namespace {

constexpr const char* kAppend = "kv_append_advance";

std::size_t bytes_of(const ConstTensorView& v) {
  return static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype);
}

// Compared as integers: relational comparison of pointers into different objects is
// unspecified. An overlap would make the result depend on the order of the writes.
void require_disjoint(const ConstTensorView& a, const char* a_name, const ConstTensorView& b, const char* b_name,
                      const char* kernel) {
  const std::size_t ab = bytes_of(a), bb = bytes_of(b);
  if (ab == 0 || bb == 0) return;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data), b0 = reinterpret_cast<std::uintptr_t>(b.data);
  KVLAB_REQUIRE(a0 + ab <= b0 || b0 + bb <= a0, invalid_argument, kernel, ": ", a_name, " (", ab, " bytes) overlaps ",
                b_name, " (", bb, " bytes)");
}

void copy_rows(const ConstTensorView& src, const TensorView& dst, const KvAppendPlan& p, std::int64_t width) {
  const std::size_t row = static_cast<std::size_t>(width) * dtype_size(src.dtype);
  const std::byte* from = src.data;
  std::byte* to = dst.data;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t t = 0; t < p.S; ++t) {
        const std::int64_t s_row = (b * p.H + h) * p.S + t, d_row = (b * p.H + h) * p.C + p.first_column[static_cast<std::size_t>(b)] + t;
        std::memcpy(to + static_cast<std::size_t>(d_row) * row, from + static_cast<std::size_t>(s_row) * row, row);
      }
}

}  // namespace

KvAppendPlan validate_kv_append_advance(const ConstTensorView& k, const ConstTensorView& v,
                                        const ConstTensorView& left_padding, const ConstTensorView& offsets,
                                        const ConstTensorView& k_cache, const ConstTensorView& v_cache) {
  for (const auto& [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}}) {
    require_rank(*t, 4, name);
    KVLAB_REQUIRE(t->dtype == k.dtype, dtype_mismatch, kAppend, ": ", name, " is ", dtype_name(t->dtype), ", k is ",
                  dtype_name(k.dtype));
  }
  KVLAB_REQUIRE(dtype_size(k.dtype) == 2 || dtype_size(k.dtype) == 4, dtype_mismatch, kAppend, ": dtype ",
                dtype_name(k.dtype), " is not a 16- or 32-bit element");
  KvAppendPlan p{k.dim(0), k.dim(1), k.dim(2), k_cache.dim(2), k.dim(3), v.dim(3), {}};
  const Shape want_v{p.B, p.H, p.S, p.Dv}, want_kc{p.B, p.H, p.C, p.Dk}, want_vc{p.B, p.H, p.C, p.Dv};
  KVLAB_REQUIRE(v.shape == want_v, shape_mismatch, kAppend, ": v ", shape_str(v.shape), ", expected ",
                shape_str(want_v), " (the B, H and S of k ", shape_str(k.shape), ")");
  KVLAB_REQUIRE(k_cache.shape == want_kc, shape_mismatch, kAppend, ": k_cache ", shape_str(k_cache.shape),
                ", expected ", shape_str(want_kc), " (B, H, capacity, Dk)");
  KVLAB_REQUIRE(v_cache.shape == want_vc, shape_mismatch, kAppend, ": v_cache ", shape_str(v_cache.shape),
                ", expected ", shape_str(want_vc), " (the capacity of k_cache)");
  require_dtype(left_padding, DType::i32, "left_padding");
  require_shape(left_padding, {p.B}, "left_padding");
  require_dtype(offsets, DType::i32, "offsets");
  require_shape(offsets, {p.B}, "offsets");
  for (const auto& [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&v_cache, "v_cache"}, {&offsets, "offsets"}})
    require_disjoint(*t, name, k_cache, "k_cache", kAppend);
  for (const auto& [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&offsets, "offsets"}})
    require_disjoint(*t, name, v_cache, "v_cache", kAppend);
  for (std::int64_t b = 0; b < p.B; ++b) {
    const std::int64_t pad = left_padding.load_int(b), off = offsets.load_int(b), first = off + pad;
    KVLAB_REQUIRE(pad >= 0, invalid_argument, kAppend, ": left_padding[", b, "] = ", pad, " is negative");
    KVLAB_REQUIRE(off + p.S <= std::numeric_limits<std::int32_t>::max(), invalid_argument, kAppend, ": offsets[", b,
                  "] = ", off, " advanced by S = ", p.S, " overflows int32");
    KVLAB_REQUIRE(first >= 0 && first + p.S <= p.C, invalid_argument, kAppend, ": row ", b, " appends S = ", p.S,
                  " tokens at column ", first, " (offsets[", b, "] = ", off, " + left_padding ", pad,
                  "), outside the capacity of ", p.C, " columns");
    p.first_column.push_back(first);
  }
  return p;
}

void validate_kv_snapshot(const ConstTensorView& src, const ConstTensorView& dst) {
  KVLAB_REQUIRE(src.dtype == dst.dtype, dtype_mismatch, "kv_snapshot: src is ", dtype_name(src.dtype), ", dst is ",
                dtype_name(dst.dtype));
  KVLAB_REQUIRE(src.shape == dst.shape, shape_mismatch, "kv_snapshot: src ", shape_str(src.shape), " and dst ",
                shape_str(dst.shape), " differ");
  require_disjoint(src, "src", dst, "dst", "kv_snapshot");
}

void kv_append_advance(const ConstTensorView& k, const ConstTensorView& v, const ConstTensorView& left_padding,
                       const TensorView& offsets, const TensorView& k_cache, const TensorView& v_cache) {
  const KvAppendPlan p = validate_kv_append_advance(k, v, left_padding, offsets, k_cache, v_cache);
  if (p.S == 0) return;
  copy_rows(k, k_cache, p, p.Dk);
  copy_rows(v, v_cache, p, p.Dv);
  for (std::int64_t b = 0; b < p.B; ++b) offsets.store_int(b, offsets.load_int(b) + p.S);
}

void kv_snapshot(const ConstTensorView& src, const TensorView& dst) {
  validate_kv_snapshot(src, dst);
  if (const std::size_t n = bytes_of(src)) std::memcpy(dst.data, src.data, n);
}

}  // namespace kvlab::ref
