// Exact IEEE binary32 arithmetic on bit patterns (uint), for kernels that must match the
// oracle bit for bit.
//
// Why not the hardware: Vulkan allows 2.5 ulp for x/y, lets an implementation flush
// denormals (lavapipe reports shaderDenormPreserveFloat32 = false, and even a comparison
// of a denormal can then see 0), and need not preserve signed zeros, Inf or NaN without
// SignedZeroInfNanPreserve. Everything here is integer arithmetic, which every device
// executes exactly: correctly rounded results (round to nearest, ties to even) with
// denormals, and the special values the oracle gets on the CI host (x86-64 SSE):
//   * a NaN operand is returned quieted, the first operand's if both are NaN;
//   * an invalid operation (Inf − Inf, 0·Inf, 0/0, Inf/Inf) returns the x86 default NaN
//     0xFFC00000 (sign set), which is what the oracle's float math yields there.
// tests/vulkan/test_vulkan_softfloat.cc checks every function against the host's IEEE
// arithmetic over edge values and millions of random bit patterns.
#ifndef KVLAB_SOFTFLOAT_GLSL
#define KVLAB_SOFTFLOAT_GLSL

const uint SF_SIGN = 0x80000000u;
const uint SF_MAG = 0x7FFFFFFFu;
const uint SF_INF = 0x7F800000u;
const uint SF_FRAC = 0x007FFFFFu;
const uint SF_QUIET = 0x00400000u;
const uint SF_DEFAULT_NAN = 0xFFC00000u;

bool sf_is_nan(uint a) { return (a & SF_MAG) > SF_INF; }
bool sf_is_inf(uint a) { return (a & SF_MAG) == SF_INF; }
bool sf_is_zero(uint a) { return (a & SF_MAG) == 0u; }

// IEEE a < b: false when either is NaN; −0 == +0.
bool sf_lt(uint a, uint b) {
  if (sf_is_nan(a) || sf_is_nan(b)) return false;
  if (sf_is_zero(a) && sf_is_zero(b)) return false;
  const bool na = (a & SF_SIGN) != 0u, nb = (b & SF_SIGN) != 0u;
  if (na != nb) return na;
  return na ? a > b : a < b;  // sign-magnitude: a larger magnitude is smaller when negative
}

// A nonzero finite value as m·2^(e−23) with m in [2^23, 2^24) (denormals normalized).
void sf_unpack(uint a, out int e, out uint m) {
  const uint field = (a >> 23) & 0xFFu;
  m = a & SF_FRAC;
  if (field == 0u) {
    const int shift = 23 - findMSB(m);
    m <<= uint(shift);
    e = -126 - shift;
  } else {
    m |= 0x800000u;
    e = int(field) - 127;
  }
}

// Rounds sig·2^(e−25) to binary32 (ties to even), sig in [2^25, 2^26); `sticky` says
// whether nonzero bits lie below sig. Handles overflow to Inf and denormal results.
uint sf_round_pack(uint sign, int e, uint sig, bool sticky) {
  int biased = e + 127;
  if (biased >= 255) return sign | SF_INF;
  uint shift = 2u;
  if (biased < 1) {
    shift = uint(min(2 + (1 - biased), 31));  // denormal: value/2^-149 = sig/2^(3 − biased)
    biased = 0;
  }
  uint kept = sig >> shift;
  const uint dropped = sig & ((1u << shift) - 1u);
  const uint half_way = 1u << (shift - 1u);
  if (dropped > half_way || (dropped == half_way && (sticky || (kept & 1u) != 0u))) kept += 1u;
  if (biased == 0) return sign | kept;  // a carry into 2^23 lands on the smallest normal
  if (kept == 0x1000000u) {
    kept >>= 1;
    biased += 1;
    if (biased >= 255) return sign | SF_INF;
  }
  return sign | (uint(biased) << 23) | (kept & SF_FRAC);
}

uint sf_quiet(uint a) { return a | SF_QUIET; }

uint sf_add(uint a, uint b) {
  if (sf_is_nan(a)) return sf_quiet(a);
  if (sf_is_nan(b)) return sf_quiet(b);
  if (sf_is_inf(a)) return (sf_is_inf(b) && ((a ^ b) & SF_SIGN) != 0u) ? SF_DEFAULT_NAN : a;
  if (sf_is_inf(b)) return b;
  if (sf_is_zero(a) && sf_is_zero(b)) return a & b;  // −0 only when both are −0
  if (sf_is_zero(a)) return b;
  if (sf_is_zero(b)) return a;
  int ea, eb;
  uint ma, mb;
  sf_unpack(a, ea, ma);
  sf_unpack(b, eb, mb);
  uint sign = a & SF_SIGN;
  const bool subtract = ((a ^ b) & SF_SIGN) != 0u;
  if (eb > ea || (eb == ea && mb > ma)) {  // make |a| >= |b|
    const int te = ea; ea = eb; eb = te;
    const uint tm = ma; ma = mb; mb = tm;
    sign = b & SF_SIGN;
  }
  // Six guard bits, then a sticky bit in the LSB that stands for everything shifted out
  // of b: with guard bits above it, rounding the sum or difference of the truncated
  // operands is then the same as rounding the exact result.
  const uint big = ma << 7;
  const int d = ea - eb;
  uint small = mb << 6;
  bool lost = false;
  if (d >= 31) {
    lost = true;
    small = 0u;
  } else if (d > 0) {
    lost = (small & ((1u << uint(d)) - 1u)) != 0u;
    small >>= uint(d);
  }
  small = (small << 1) | (lost ? 1u : 0u);
  const uint m = subtract ? big - small : big + small;
  if (m == 0u) return 0u;  // exact cancellation is +0 when rounding to nearest
  const int p = findMSB(m);
  // value = m·2^(ea − 30) = sig·2^(e − 25) with sig's leading bit at 25
  const int e = ea - 30 + p;
  if (p > 25) {
    const uint sh = uint(p - 25);
    return sf_round_pack(sign, e, m >> sh, (m & ((1u << sh) - 1u)) != 0u);
  }
  return sf_round_pack(sign, e, m << uint(25 - p), false);
}

uint sf_sub(uint a, uint b) {
  if (sf_is_nan(a)) return sf_quiet(a);
  if (sf_is_nan(b)) return sf_quiet(b);
  return sf_add(a, b ^ SF_SIGN);
}

uint sf_mul(uint a, uint b) {
  if (sf_is_nan(a)) return sf_quiet(a);
  if (sf_is_nan(b)) return sf_quiet(b);
  const uint sign = (a ^ b) & SF_SIGN;
  if (sf_is_inf(a)) return sf_is_zero(b) ? SF_DEFAULT_NAN : (sign | SF_INF);
  if (sf_is_inf(b)) return sf_is_zero(a) ? SF_DEFAULT_NAN : (sign | SF_INF);
  if (sf_is_zero(a) || sf_is_zero(b)) return sign;
  int ea, eb;
  uint ma, mb;
  sf_unpack(a, ea, ma);
  sf_unpack(b, eb, mb);
  uint hi, lo;
  umulExtended(ma, mb, hi, lo);  // exact 48-bit product in [2^46, 2^48)
  const int p = hi >= 0x8000u ? 47 : 46;
  const uint sh = uint(p - 25);  // 21 or 22
  const uint sig = (hi << (32u - sh)) | (lo >> sh);
  return sf_round_pack(sign, ea + eb + p - 46, sig, (lo & ((1u << sh) - 1u)) != 0u);
}

uint sf_div(uint a, uint b) {
  if (sf_is_nan(a)) return sf_quiet(a);
  if (sf_is_nan(b)) return sf_quiet(b);
  const uint sign = (a ^ b) & SF_SIGN;
  if (sf_is_inf(a)) return sf_is_inf(b) ? SF_DEFAULT_NAN : (sign | SF_INF);
  if (sf_is_inf(b)) return sign;
  if (sf_is_zero(b)) return sf_is_zero(a) ? SF_DEFAULT_NAN : (sign | SF_INF);
  if (sf_is_zero(a)) return sign;
  int ea, eb;
  uint ma, mb;
  sf_unpack(a, ea, ma);
  sf_unpack(b, eb, mb);
  int e = ea - eb;
  if (ma < mb) {  // make the mantissa quotient lie in [1, 2)
    ma <<= 1;
    e -= 1;
  }
  // Restoring long division: 26 quotient bits (leading bit at 25), remainder exact.
  uint q = 0u, r = ma;
  for (int i = 0; i < 26; ++i) {
    q <<= 1;
    if (r >= mb) {
      r -= mb;
      q |= 1u;
    }
    r <<= 1;
  }
  return sf_round_pack(sign, e, q, r != 0u);
}

// Binary32 bits of a small non-negative integer n < 2^24 (exact).
uint sf_from_uint(uint n) {
  if (n == 0u) return 0u;
  const int p = findMSB(n);
  return (uint(p + 127) << 23) | ((n << uint(23 - p)) & SF_FRAC);
}

// Rounds to an integral value: ties to even (std::rint, mlx_cpu) or away from zero
// (std::round, mlx_gpu). Keeps the sign of zero. NaN: rint returns a signaling NaN
// unchanged (as GCC's inline std::rint; glibc's rintf, which clang calls, quiets it),
// round quiets it (the kernels only round quotients, which are quiet).
uint sf_round_integral(uint a, bool ties_to_even) {
  if (sf_is_nan(a)) return ties_to_even ? a : sf_quiet(a);
  const uint field = (a >> 23) & 0xFFu;
  if (field >= 150u) return a;  // |a| >= 2^23 (or Inf): already integral
  const uint sign = a & SF_SIGN;
  if (field < 126u) return sign;  // |a| < 0.5 (zeros and denormals included)
  const uint m = (a & SF_FRAC) | 0x800000u;
  const uint shift = 150u - field;  // 1..24
  uint n = m >> shift;
  const uint frac = m & ((1u << shift) - 1u);
  const uint half_way = 1u << (shift - 1u);
  if (frac > half_way || (frac == half_way && (!ties_to_even || (n & 1u) != 0u))) n += 1u;
  return sign | sf_from_uint(n);
}

// Truncates an integral binary32 with |a| <= 2^31 to int (two's complement).
int sf_integral_to_int(uint a) {
  const uint field = (a >> 23) & 0xFFu;
  if (field < 127u) return 0;
  const uint m = (a & SF_FRAC) | 0x800000u;
  const int p = int(field) - 127;  // 0..31
  const uint mag = p >= 23 ? m << uint(p - 23) : m >> uint(23 - p);
  return (a & SF_SIGN) != 0u ? -int(mag) : int(mag);
}

// ---- storage conversions (kvlab/dtype.h: RNE, denormals, overflow to Inf, NaN kept) --

// Rounds m (an integer) right by `shift` bits, ties to even; shift in 1..31.
uint sf_shift_rne(uint m, uint shift) {
  uint kept = m >> shift;
  const uint dropped = m & ((1u << shift) - 1u);
  const uint half_way = 1u << (shift - 1u);
  if (dropped > half_way || (dropped == half_way && (kept & 1u) != 0u)) kept += 1u;
  return kept;
}

uint f32_to_f16_bits(uint u) {
  const uint sign = (u >> 16) & 0x8000u;
  const uint a = u & SF_MAG;
  if (a > SF_INF) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);  // NaN: quiet, high payload bits kept
  if (a >= 0x477FF000u) return sign | 0x7C00u;                    // >= 65520 rounds to Inf
  if (a >= 0x38800000u) {                                          // normal f16 (>= 2^-14)
    const uint rounded = a + 0xFFFu + ((a >> 13) & 1u);
    return sign | ((rounded - 0x38000000u) >> 13);
  }
  // Denormal f16 or zero: units of 2^-24. With m the f32 significand (implicit bit
  // included), the value is m·2^(field − 150), i.e. m·2^(field − 126) units.
  const uint field = a >> 23;
  if (field < 102u) return sign;  // below 2^-25: rounds to zero (the half-way point)
  const uint m = (a & SF_FRAC) | 0x800000u;
  return sign | sf_shift_rne(m, 126u - field);
}

uint f32_to_bf16_bits(uint u) {
  if ((u & SF_MAG) > SF_INF) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // a carry into the exponent reaches Inf
}

uint f16_bits_to_f32(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1Fu;
  const uint m = h & 0x3FFu;
  if (e == 0x1Fu) return sign | SF_INF | (m << 13);
  if (e == 0u) {
    if (m == 0u) return sign;
    const int p = findMSB(m);  // value m·2^-24 = 1.f·2^(p − 24)
    return sign | (uint(p - 24 + 127) << 23) | ((m << uint(23 - p)) & SF_FRAC);
  }
  return sign | ((e + 112u) << 23) | (m << 13);
}

uint bf16_bits_to_f32(uint b) { return b << 16; }

#endif  // KVLAB_SOFTFLOAT_GLSL
