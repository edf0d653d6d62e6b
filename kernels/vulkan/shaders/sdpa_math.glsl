// exp and tanh for the attention shaders, in f32 with their own range reduction.
//
// Why not GLSL's exp/tanh: Vulkan only bounds exp to 3 + 2|x| ulp (and tanh not at all
// beyond "derived from exp"), and lavapipe's exp2 is a short polynomial. The softmax
// weights would still be within attention_budget for typical logits, but the bound
// would depend on the driver; these take only +, −, · (correctly rounded in Vulkan)
// and ldexp, so their error is a property of this file: a few ulp of f32.
#ifndef KVLAB_SDPA_MATH_GLSL
#define KVLAB_SDPA_MATH_GLSL

// e^x. x = n·ln2 + r with ln2 split Cody–Waite style into LN2_HI (16 significant bits,
// so n·LN2_HI and x − n·LN2_HI are exact for |n| <= 255) and LN2_LO; |r| <= ln2/2, where
// the degree-7 Taylor polynomial's truncation (r^8/8! < 2^-28) is below half an ulp.
// Results below 2^-126 may be flushed by the device (absolute error < 2^-126).
float kvlab_exp(float x) {
  if (x < -104.0) return 0.0;                       // e^x < 2^-150: rounds to zero
  if (x > 88.0) return uintBitsToFloat(0x7F800000u);  // overflows f32 (not reached: x <= 0 here)
  const float LN2_HI = 0.693145751953125;            // 0x3F317200
  const float LN2_LO = 1.428606765330187e-06;        // ln2 − LN2_HI
  const float n = roundEven(x * 1.4426950408889634);
  precise float r = (x - n * LN2_HI) - n * LN2_LO;
  precise float p = 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return ldexp(p, int(n));
}

// tanh x. |x| < 0.25: the odd Taylor series to x^11 (truncation < |x|·2^-30); else
// (1 − e)/(1 + e) with e = e^{−2|x|} <= 0.61, where 1 − e loses at most 2 bits.
float kvlab_tanh(float x) {
  const float a = abs(x);
  if (a < 0.25) {
    const float z = x * x;
    precise float p = -1382.0 / 155925.0;
    p = p * z + 62.0 / 2835.0;
    p = p * z - 17.0 / 315.0;
    p = p * z + 2.0 / 15.0;
    p = p * z - 1.0 / 3.0;
    p = p * z;
    return x + x * p;
  }
  if (a > 10.0) return sign(x);  // 1 − tanh(10) < 2^-28
  const float e = kvlab_exp(-2.0 * a);
  precise float t = (1.0 - e) / (1.0 + e);
  return x < 0.0 ? -t : t;
}

#endif  // KVLAB_SDPA_MATH_GLSL
