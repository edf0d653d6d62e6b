#include "reference/mlx_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvlab::ref {

namespace {

// 2^n for an integer n in the normal range, from the exponent bits (as MLX builds it).
float pow2i(std::int32_t n) {
  const auto bits = static_cast<std::uint32_t>(n + 127) << 23;
  float out = 0;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Cephes' sin/cos on [0, π/4] after a three-part Cody–Waite reduction by π/4, selecting
// polynomial and sign from the octant like MLX's sincos.
float sincos(float in, bool sine) {
  bool sign_sin = in < 0;
  const float x0 = std::fabs(in);
  float y = x0 * 1.27323954473516f;  // 4/π
  auto octant = static_cast<std::uint32_t>(y);
  octant = (octant + 1) & ~1u;
  y = static_cast<float>(octant);
  const bool second_poly = (octant & 2u) != 0;
  float x = std::fma(y, -0.78515625f, x0);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  sign_sin = sign_sin != ((octant & 4u) != 0);
  const bool sign_cos = ((octant - 2u) & 4u) != 0;
  const float z = x * x;
  float c = std::fma(z, 2.443315711809948e-5f, -1.388731625493765e-3f);
  float s = std::fma(z, -1.9515295891e-4f, 8.3321608736e-3f);
  c = std::fma(c, z, 4.166664568298827e-2f);
  s = std::fma(s, z, -1.6666654611e-1f);
  c = c * z;
  s = s * z;
  c = c * z;
  s = std::fma(x, s, x);
  c = std::fma(z, -0.5f, c);
  c = c + 1.0f;
  if (sine) {
    const float r = second_poly ? c : s;
    return sign_sin ? -r : r;
  }
  const float r = second_poly ? s : c;
  return sign_cos ? r : -r;
}

}  // namespace

float mlx_exp(float in) {
  if (std::isnan(in)) return in;
  if (in > 88.0f) return INFINITY;
  if (in < -88.0f) return 0.0f;
  const float x = in * 1.442695f;  // log2(e)
  const float ipart = std::floor(x + 0.5f);
  const float fpart = x - ipart;
  float p = 1.535336188319500e-4f;
  p = std::fma(p, fpart, 1.339887440266574e-3f);
  p = std::fma(p, fpart, 9.618437357674640e-3f);
  p = std::fma(p, fpart, 5.550332471162809e-2f);
  p = std::fma(p, fpart, 2.402264791363012e-1f);
  p = std::fma(p, fpart, 6.931472028550421e-1f);
  p = std::fma(p, fpart, 1.000000000000000f);
  return pow2i(static_cast<std::int32_t>(ipart)) * p;
}

float mlx_sin(float x) { return std::fabs(x) > 8388608.0f ? std::sin(x) : sincos(x, true); }
float mlx_cos(float x) { return std::fabs(x) > 8388608.0f ? std::cos(x) : sincos(x, false); }

}  // namespace kvlab::ref
