// The fp element formats from their bit fields, and brute-force nearest-value searches
// over them: the independent expectations that test_fp_formats.cc and test_fp_quantize.cc
// share (docs/quantization.md §Microscaling formats).
#pragma once

#include <cmath>

namespace kvlab::test_fp_formulas {

// E2M1 from its fields: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal.
inline double e2m1_formula(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double magnitude = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);
  return (code & 8) != 0 ? -magnitude : magnitude;
}

// E4M3 from its fields: sign, 4 exponent bits (bias 7), 3 mantissa bits; no NaN case, so
// 0x7F is 2^8·1.875 = 480 as MLX decodes it.
inline double e4m3_formula(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

// Brute force: the magnitude code 0..max_code whose value is nearest to |x| (so values
// beyond the largest saturate); ties go to the even code (= even mantissa, RNE) or, with
// ties_even false, to the smaller magnitude.
inline int nearest_magnitude(double x, int max_code, double (*value)(int), bool ties_even) {
  int best = 0;
  for (int c = 1; c <= max_code; ++c) {
    const double dc = std::fabs(std::fabs(x) - value(c)), db = std::fabs(std::fabs(x) - value(best));
    if (dc < db || (dc == db && ties_even && c % 2 == 0)) best = c;
  }
  return best;
}

// E4M3: RNE, saturating at 0x7E (448), sign from signbit.
inline int e4m3_nearest(double x) {
  return (std::signbit(x) ? 0x80 : 0) | nearest_magnitude(x, 0x7E, e4m3_formula, true);
}

}  // namespace kvlab::test_fp_formulas
