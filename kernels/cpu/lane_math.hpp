// exp, sigmoid and tanh of one float lane: the functions behind vector_math.cpp's loops, also
// inlined into attention's softmax rows (attention_rows.cpp) and the GLU rows (glu_rows.cpp). For
// translation units that build loops per instruction set (isa_dispatch.hpp): always inlined
// there, so each build vectorizes them; every step is an IEEE operation, so every build gives the
// same bits.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace atl::cpu {

// exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x - n·ln 2 in two steps (ln 2 = C1 + C2, C1
// exact in 9 bits so n·C1 is exact). n comes out of the bits of x·log2(e) + 1.5·2^23 (the add
// rounds to an integer), which never converts a float to int and so stays defined for NaN.
[[gnu::always_inline]] inline float exp_lane(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23
  constexpr float kLow = -87.33654f, kHigh = 88.72283f;
  const float shifted = std::fma(x, kLog2e, kShifter);
  const float n = shifted - kShifter;
  float r = std::fma(n, -kC1, x);
  r = std::fma(n, -kC2, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float e = std::fma(p, r * r, r) + 1.0f;  // 1 + r + r^2 p(r)
  // 2^n as a float for n <= 127; n = 128 (x just below ln(FLT_MAX)) as 2^127 * 2, exact unless the
  // result itself overflows. Multiplying by 1 or 2 is exact, so n <= 127 is unaffected.
  const std::uint32_t n_bits = std::bit_cast<std::uint32_t>(shifted) - std::bit_cast<std::uint32_t>(kShifter);
  const std::uint32_t top = n_bits == 128u ? 127u : n_bits;
  const float scale = std::bit_cast<float>((top + 127u) << 23);
  const float y = e * scale * (n_bits == 128u ? 2.0f : 1.0f);
  return x < kLow ? 0.0f : (x > kHigh ? std::numeric_limits<float>::infinity() : y);
}

// exp's argument is -|x| <= 0 on both sides, so it never overflows.
[[gnu::always_inline]] inline float sigmoid_lane(float x) {
  const float e = exp_lane(-std::fabs(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// tanh(x) as in Cephes' tanhf: below |x| = 0.625 the odd polynomial x + x^3 P(x^2); above,
// 1 - 2 / (exp(2|x|) + 1) on exp_lane (no cancellation there: the result is above 0.55). Computed
// on |x| and given x's sign at the end, so tanh(-0) = -0; NaN stays NaN, +-inf gives +-1.
[[gnu::always_inline]] inline float tanh_lane(float x) {
  const float a = std::fabs(x);
  const float z = a * a;
  float p = -5.70498872745e-3f;
  p = std::fma(p, z, 2.06390887954e-2f);
  p = std::fma(p, z, -5.37397155531e-2f);
  p = std::fma(p, z, 1.33314422036e-1f);
  p = std::fma(p, z, -3.33332819422e-1f);
  const float small = std::fma(p * z, a, a);
  const float large = 1.0f - 2.0f / (exp_lane(a + a) + 1.0f);
  return std::copysign(a < 0.625f ? small : large, x);
}

}  // namespace atl::cpu
