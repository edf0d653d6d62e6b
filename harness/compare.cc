#include "harness/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

// Element i's bits, `size` bytes wide: the loops below read every element, so they take
// the element size (and the count) once rather than per element.
std::uint32_t element_bits(const std::byte* data, std::size_t size, std::int64_t i) {
  const std::byte* at = data + static_cast<std::size_t>(i) * size;
  switch (size) {  // constant sizes: a load each, not a memcpy call per element
    case 4: { std::uint32_t v; std::memcpy(&v, at, 4); return v; }
    case 2: { std::uint16_t v; std::memcpy(&v, at, 2); return v; }
    case 1: return std::to_integer<std::uint32_t>(*at);
    default: { std::uint32_t v = 0; std::memcpy(&v, at, std::min<std::size_t>(size, 4)); return v; }
  }
}
std::uint32_t element_bits(const Tensor& t, std::int64_t i) { return element_bits(t.data(), dtype_size(t.dtype()), i); }

std::string show(const Tensor& t, std::int64_t i) {
  const std::uint32_t bits = element_bits(t, i);
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%0*X", static_cast<int>(2 * dtype_size(t.dtype())), bits);
  if (!is_float(t.dtype())) return cat(t.view().load_int(i), " (", hex, ")");
  char val[40];
  std::snprintf(val, sizeof val, "%.9g", static_cast<double>(t.view().load(i)));
  return cat(val, " (", hex, ")");
}

// A float's bits as a position on the number line: consecutive representable values
// are consecutive integers, and +0 and -0 are the same point.
std::int64_t ordinal(std::uint32_t bits, DType dtype) {
  const std::uint32_t sign = 1u << (8 * dtype_size(dtype) - 1);
  const auto magnitude = static_cast<std::int64_t>(bits & (sign - 1));
  return (bits & sign) != 0 ? -magnitude : magnitude;
}

bool finite_bits(std::uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::f32: return (bits & 0x7F800000u) != 0x7F800000u;
    case DType::f16: return (bits & 0x7C00u) != 0x7C00u;
    case DType::bf16: return (bits & 0x7F80u) != 0x7F80u;
    default: return false;
  }
}

std::uint64_t max_ulp_distance(const Tensor& b, const Tensor& r) {
  if (!is_float(b.dtype())) return 0;
  std::uint64_t worst = 0;
  const DType dtype = b.dtype();
  const std::size_t size = dtype_size(dtype);
  const std::byte *bd = b.data(), *rd = r.data();
  for (std::int64_t i = 0, n = b.numel(); i < n; ++i) {
    const std::uint32_t x = element_bits(bd, size, i), y = element_bits(rd, size, i);
    if (!finite_bits(x, dtype) || !finite_bits(y, dtype)) continue;
    const std::int64_t d = ordinal(x, dtype) - ordinal(y, dtype);
    worst = std::max(worst, static_cast<std::uint64_t>(d < 0 ? -d : d));
  }
  return worst;
}

void zero_fractions(const Tensor& b, const Tensor& r, Comparison& c) {
  std::int64_t zb = 0, zr = 0;
  const std::size_t size = dtype_size(b.dtype());
  // -0.0 counts as zero too: the sign bit alone carries no information here.
  const std::uint32_t mask = is_float(b.dtype()) ? ~(1u << (8 * size - 1)) : ~0u;
  const std::byte *bd = b.data(), *rd = r.data();
  for (std::int64_t i = 0, n = b.numel(); i < n; ++i) {
    zb += (element_bits(bd, size, i) & mask) == 0;
    zr += (element_bits(rd, size, i) & mask) == 0;
  }
  const double n = static_cast<double>(std::max<std::int64_t>(b.numel(), 1));
  c.zero_fraction_backend = static_cast<double>(zb) / n;
  c.zero_fraction_reference = static_cast<double>(zr) / n;
}

void require_same_layout(const Tensor& b, const Tensor& r) {
  KVLAB_REQUIRE(b.dtype() == r.dtype() && b.shape() == r.shape(), internal, "compare: backend ",
                dtype_name(b.dtype()), shape_str(b.shape()), " vs reference ", dtype_name(r.dtype()),
                shape_str(r.shape()));
}

}  // namespace

std::string coords(const Shape& shape, std::int64_t flat) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    const std::int64_t d = std::max<std::int64_t>(shape[a], 1);
    idx[a] = flat % d;
    flat /= d;
  }
  if (shape.size() == 4) return cat("(b=", idx[0], ", h=", idx[1], ", t=", idx[2], ", d=", idx[3], ")");
  std::string out = "[";
  for (std::size_t a = 0; a < idx.size(); ++a) out += cat(a ? ", " : "", idx[a]);
  return out + "]";
}

Comparison compare_bits(const Tensor& backend, const Tensor& reference) {
  require_same_layout(backend, reference);
  Comparison c;
  zero_fractions(backend, reference, c);
  c.max_ulps = max_ulp_distance(backend, reference);
  const std::size_t size = dtype_size(backend.dtype());
  const std::byte *bd = backend.data(), *rd = reference.data();
  for (std::int64_t i = 0, n = backend.numel(); i < n; ++i) {
    if (element_bits(bd, size, i) == element_bits(rd, size, i)) continue;
    if (c.mismatches++ == 0) c.worst_index = i;  // bit-exact: the first difference
  }
  if (c.mismatches > 0) {
    c.ok = false;
    c.reason = cat(c.mismatches, " of ", backend.numel(), " elements differ bitwise");
    c.backend_value = show(backend, c.worst_index);
    c.reference_value = show(reference, c.worst_index);
  }
  return c;
}

Comparison compare_values(const Tensor& backend, const Tensor& reference, const Budget& budget) {
  require_same_layout(backend, reference);
  KVLAB_REQUIRE(budget.per_element.size() == 1 || static_cast<std::int64_t>(budget.per_element.size()) ==
                                                      backend.numel(),
                internal, "budget has ", budget.per_element.size(), " entries for ", backend.numel(), " elements");
  Comparison c;
  c.nmse_max = budget.nmse_max;
  c.precision_nmse_max = budget.precision_nmse_max;
  zero_fractions(backend, reference, c);
  c.max_ulps = max_ulp_distance(backend, reference);
  const ConstTensorView vb = backend.view(), vr = reference.view();
  double ref_inf_norm = 0, sum_sq_err = 0, sum_sq_ref = 0;
  double worst_ratio = -1;
  std::int64_t nans = 0, inf_mismatch = 0, copy_mismatch = 0;
  for (std::int64_t i = 0, n = backend.numel(); i < n; ++i) {
    const double b = vb.load(i), r = vr.load(i);
    const double allowed = budget.per_element.size() == 1 ? budget.per_element[0]
                                                          : budget.per_element[static_cast<std::size_t>(i)];
    double ratio = 0;
    bool bad = false;
    if (budget.bits_where_zero && allowed == 0) {
      const std::size_t size = dtype_size(backend.dtype()), at = static_cast<std::size_t>(i) * size;
      bad = std::memcmp(backend.data() + at, reference.data() + at, size) != 0;
      copy_mismatch += bad;
      ratio = bad ? std::numeric_limits<double>::infinity() : 0;
    } else if (budget.nan_where_reference_nan && std::isnan(r) && std::isnan(b)) {
      ratio = 0;
    } else if (std::isnan(b) || std::isnan(r)) {
      ++nans;
      bad = true;
      ratio = std::numeric_limits<double>::infinity();
    } else if (std::isinf(b) || std::isinf(r)) {
      bad = b != r;  // same infinity (sign included), or a failure
      inf_mismatch += bad;
      ratio = bad ? std::numeric_limits<double>::infinity() : 0;
    } else {
      const double err = std::abs(b - r);
      ref_inf_norm = std::max(ref_inf_norm, std::abs(r));
      c.max_abs_err = std::max(c.max_abs_err, err);
      sum_sq_err += err * err;
      sum_sq_ref += r * r;
      bad = err > allowed;
      ratio = err == 0 ? 0 : (allowed > 0 ? err / allowed : std::numeric_limits<double>::infinity());
    }
    c.mismatches += bad;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      c.worst_index = i;
      c.budget = allowed;
    }
  }
  c.rel_err = ref_inf_norm > 0 ? c.max_abs_err / ref_inf_norm : c.max_abs_err;
  c.nmse = sum_sq_ref > 0 ? sum_sq_err / sum_sq_ref : sum_sq_err;
  if (c.worst_index >= 0) {
    c.backend_value = show(backend, c.worst_index);
    c.reference_value = show(reference, c.worst_index);
  }
  if (copy_mismatch > 0) {
    c.reason = cat(copy_mismatch, " copied element(s) differ from the reference's bytes");
  } else if (nans > 0) {
    c.reason = budget.nan_where_reference_nan ? cat(nans, " element(s) NaN in one output only")
                                              : cat(nans, " NaN element(s)");
  } else if (inf_mismatch > 0) {
    c.reason = cat(inf_mismatch, " infinities differ from the reference");
  } else if (c.mismatches > 0) {
    c.reason = cat(c.mismatches, " of ", backend.numel(), " elements over budget");
  } else if (budget.nmse_max >= 0 && c.nmse > budget.nmse_max) {
    c.reason = cat("budget: NMSE ", c.nmse, " > ", budget.nmse_max, " (the output dtype's norm bound)");
  } else if (budget.precision_nmse_max >= 0 && c.nmse > budget.precision_nmse_max) {
    c.reason = cat("precision ceiling: NMSE ", c.nmse, " > ", budget.precision_nmse_max,
                   " (f32 accumulation and the final rounding; the budget's norm bound is ", budget.nmse_max, ")");
  }
  c.ok = c.reason.empty();
  return c;
}

}  // namespace kvlab::harness
