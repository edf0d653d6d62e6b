// Output comparison: bit-exact (codes, data movement) or value-wise against a Budget.
//
// Checks, in the order a failure is reported: NaN in the backend output (a failure even
// where the reference is NaN: valid problems have finite results, so a NaN means a read of
// poison or an uninitialised slot; only a problem whose inputs hold inf/NaN on purpose
// sets Budget::nan_where_reference_nan, and then NaN must appear exactly where the
// reference has it); ±inf must match the reference in sign; |b − r| <= budget
// point-wise; NMSE <= nmse_max (over the finite pairs); NMSE <= precision_nmse_max.
#pragma once

#include <cstdint>
#include <string>

#include "harness/op.h"
#include "kvlab/tensor.h"

namespace kvlab::harness {

struct Comparison {
  bool ok = true;
  std::string reason;             // empty when ok
  std::int64_t mismatches = 0;    // elements over budget (bit-exact: differing elements)
  std::int64_t worst_index = -1;  // flat index of the worst element (-1: none)
  double max_abs_err = 0;         // max |b − r| over finite pairs
  double rel_err = 0;             // max |b − r| / ‖r‖∞
  double nmse = 0;                // Σ(b − r)² / Σ r²
  // Largest distance in units in the last place of the output dtype (f32/f16/bf16) over
  // the pairs where both values are finite: how many representable values lie between
  // them, the measure an engine developer tunes against. 0 for integer dtypes.
  std::uint64_t max_ulps = 0;
  double nmse_max = -1;            // the bounds it was held to (Budget), -1: none
  double precision_nmse_max = -1;
  double budget = 0;              // the budget at the worst element
  std::string backend_value, reference_value;  // at the worst element, printable
  double zero_fraction_backend = 0, zero_fraction_reference = 0;
};

Comparison compare_bits(const Tensor& backend, const Tensor& reference);
Comparison compare_values(const Tensor& backend, const Tensor& reference, const Budget& budget);

// "(b=0, h=3, t=7, d=12)" for rank-4 shapes (batch, head, token, dim); "[i, j, ...]"
// otherwise.
std::string coords(const Shape& shape, std::int64_t flat_index);

}  // namespace kvlab::harness
