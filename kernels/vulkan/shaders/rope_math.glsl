// Double-precision helpers of the RoPE shader (needs shaderFloat64): sin/cos with an
// exact argument reduction, and exact conversions between binary32/16 bit patterns and
// double. tests/vulkan/test_vulkan_softfloat.cc checks them against the host.
#ifndef KVLAB_ROPE_MATH_GLSL
#define KVLAB_ROPE_MATH_GLSL

#include "softfloat.glsl"

const double TWO_OVER_PI = 0.63661977236758138LF;
const double PIO2_1 = 1.5707962512969971LF;      // π/2 in 24-bit pieces and a remainder
const double PIO2_2 = 7.5497894158615964e-08LF;
const double PIO2_3 = 5.3903025299577648e-15LF;
const double PIO2_4 = 3.2820035428735005e-22LF;
const double PIO2 = 1.5707963267948966LF;
const double ROUNDING_SHIFT = 6755399441055744.0LF;  // 1.5·2^52

// sin and cos of |r| <= π/4 (a little more when k is off by one): Taylor in z = r².
void sincos_reduced(double r, out double s, out double c) {
  precise double z = r * r;
  precise double ps = 2.8114572543455206e-15LF;
  ps = ps * z - 7.6471637318198164e-13LF;
  ps = ps * z + 1.6059043836821613e-10LF;
  ps = ps * z - 2.505210838544172e-08LF;
  ps = ps * z + 2.7557319223985893e-06LF;
  ps = ps * z - 0.00019841269841269841LF;
  ps = ps * z + 0.0083333333333333332LF;
  ps = ps * z - 0.16666666666666666LF;
  precise double sv = r + (r * z) * ps;
  s = sv;
  precise double pc_ = -1.5619206968586225e-16LF;
  pc_ = pc_ * z + 4.7794773323873853e-14LF;
  pc_ = pc_ * z - 1.1470745597729725e-11LF;
  pc_ = pc_ * z + 2.08767569878681e-09LF;
  pc_ = pc_ * z - 2.7557319223985888e-07LF;
  pc_ = pc_ * z + 2.4801587301587302e-05LF;
  pc_ = pc_ * z - 0.0013888888888888889LF;
  pc_ = pc_ * z + 0.041666666666666664LF;
  pc_ = pc_ * z - 0.5LF;
  precise double cv = 1.0LF + z * pc_;
  c = cv;
}

void sincos_double(double theta, out double s, out double c) {
  if ((unpackDouble2x32(theta).y & 0x7FF00000u) == 0x7FF00000u) {  // ±Inf or NaN (bit test: the
    s = c = packDouble2x32(uvec2(0u, 0x7FF80000u));                   // compiler may assume no NaN)
    return;                                                           // the oracle gets NaN too
  }
  precise double t = theta * TWO_OVER_PI;
  precise double k, r;
  int q;
  if (abs(theta) < 8.0e8LF) {
    // Rounding by adding and taking away 1.5·2^52 (RNE, exact for |t| < 2^51), not by
    // roundEven, trunc or int(): lavapipe on an AVX2-only host (Zen 3, Mesa 22.3.6) gave
    // roundEven(t) = t and double(int(t)) = t for t ~ 5e8 (measured), so k kept its
    // fraction and sin/cos were wrong; the AVX-512 hosts rounded correctly. Plain double
    // adds are IEEE on both.
    k = (t + ROUNDING_SHIFT) - ROUNDING_SHIFT;
    r = ((theta - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    r = r - k * PIO2_4;
    precise double m = (k * 0.25LF + ROUNDING_SHIFT) - ROUNDING_SHIFT;  // k/4 to nearest even
    q = int(k - 4.0LF * m) & 3;  // k − 4m in [−2, 2], exact: k mod 4
  } else {  // unreduced: only boundedness is promised (rope's tolerance covers it)
    k = roundEven(t);
    r = clamp(theta - k * PIO2, -0.7853981633974483LF, 0.7853981633974483LF);
    q = int(k - 4.0LF * floor(k * 0.25LF)) & 3;
  }
  double sr, cr;
  sincos_reduced(r, sr, cr);
  s = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
  c = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
  s = clamp(s, -1.0LF, 1.0LF);
  c = clamp(c, -1.0LF, 1.0LF);
}

// Exact binary32 bits → double.
double double_from_f32(uint u) {
  const uint sign = u & SF_SIGN, field = (u >> 23) & 0xFFu;
  uint m = u & SF_FRAC, e = field + 896u;  // rebias 127 → 1023
  if (field == 0xFFu) {
    e = 0x7FFu;
  } else if (field == 0u) {
    if (m == 0u) return packDouble2x32(uvec2(0u, sign));
    const int p = findMSB(m);  // m·2^-149 = 1.f·2^(p − 149)
    e = uint(p - 149 + 1023);
    m = (m << uint(23 - p)) & SF_FRAC;
  }
  return packDouble2x32(uvec2(m << 29, sign | (e << 20) | (m >> 3)));
}

// (sig_hi·2^32 + sig_lo) >> shift rounded to nearest even, shift in [29, 53]; the
// result fits 32 bits. sig_hi < 2^21.
uint shift_rne_64(uint sig_hi, uint sig_lo, uint shift) {
  uint kept;
  bool above, tie;
  if (shift < 32u) {
    kept = (sig_hi << (32u - shift)) | (sig_lo >> shift);
    const uint dropped = sig_lo & ((1u << shift) - 1u), half_way = 1u << (shift - 1u);
    above = dropped > half_way;
    tie = dropped == half_way;
  } else if (shift == 32u) {
    kept = sig_hi;
    above = sig_lo > 0x80000000u;
    tie = sig_lo == 0x80000000u;
  } else {
    const uint t = shift - 32u;
    kept = sig_hi >> t;
    const uint dh = sig_hi & ((1u << t) - 1u), hh = 1u << (t - 1u);
    above = dh > hh || (dh == hh && sig_lo != 0u);
    tie = dh == hh && sig_lo == 0u;
  }
  if (above || (tie && (kept & 1u) != 0u)) kept += 1u;
  return kept;
}

// A double rounded once (RNE) to the stored bits of `dtype` (f32, f16 or bf16), with
// denormals and overflow to Inf; NaN as the oracle's double → float → dtype path.
uint narrow_double(double v, uint dtype) {
  const uvec2 w = unpackDouble2x32(v);
  const uint sign32 = w.y & SF_SIGN;
  const uint field = (w.y >> 20) & 0x7FFu;
  const uint frac_hi = w.y & 0xFFFFFu, frac_lo = w.x;
  if (field == 0x7FFu && (frac_hi | frac_lo) != 0u) {
    const uint f32_nan = sign32 | 0x7FC00000u | (frac_hi << 3) | (frac_lo >> 29);
    return dtype == DT_F32 ? f32_nan : dtype == DT_F16 ? f32_to_f16_bits(f32_nan) : f32_to_bf16_bits(f32_nan);
  }
  const uint p = dtype == DT_F32 ? 23u : dtype == DT_F16 ? 10u : 7u;  // fraction bits
  const int emax = dtype == DT_F16 ? 15 : 127, emin = 1 - emax;
  const uint sign = dtype == DT_F32 ? sign32 : sign32 >> 16;
  const uint inf = dtype == DT_F32 ? SF_INF : dtype == DT_F16 ? 0x7C00u : 0x7F80u;
  if (field == 0x7FFu) return sign | inf;
  if (field == 0u) return sign;  // double denormals are far below any dtype's half_way-denormal
  const int e = int(field) - 1023;
  if (e > emax) return sign | inf;
  uint shift = 52u - p;
  const bool denormal = e < emin;
  if (denormal) {
    shift += uint(emin - e);
    if (shift > 53u) return sign;  // below half_way the smallest denormal
  }
  uint kept = shift_rne_64(frac_hi | 0x100000u, frac_lo, shift);
  if (denormal) return sign | kept;  // a carry into 2^p is the smallest normal's encoding
  int biased = e + emax;
  if (kept == (2u << p)) {
    kept >>= 1;
    biased += 1;
    if (biased >= 2 * emax + 1) return sign | inf;
  }
  return sign | (uint(biased) << p) | (kept & ((1u << p) - 1u));
}

#endif  // KVLAB_ROPE_MATH_GLSL
