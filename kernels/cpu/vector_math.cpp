#include "kernels/cpu/vector_math.hpp"

#include <bit>
#include <limits>

#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/dtype.hpp"

namespace atl::cpu {

namespace {

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

// x[i] = Lane(x[i]) over n values.
template <float (*Lane)(float)>
struct MapLoop {
  [[gnu::always_inline]] void operator()(float* x, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) x[i] = Lane(x[i]);
  }
};

struct RoundBf16Loop {
  [[gnu::always_inline]] void operator()(float* x, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
  }
};

// A separate loop from the in-place one, with __restrict pointers: the copy must not overlap.
struct RoundBf16CopyLoop {
  [[gnu::always_inline]] void operator()(const float* __restrict src, float* __restrict dst, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = round_to_bf16(src[i]);
  }
};

}  // namespace

void round_to_bf16_values(float* x, std::int64_t n) { run_for_isa<RoundBf16Loop>(x, n); }

void round_to_bf16_copy(const float* src, float* dst, std::int64_t n) { run_for_isa<RoundBf16CopyLoop>(src, dst, n); }

void exp_inplace(float* x, std::int64_t n) { run_for_isa<MapLoop<exp_lane>>(x, n); }
void sigmoid_inplace(float* x, std::int64_t n) { run_for_isa<MapLoop<sigmoid_lane>>(x, n); }
void tanh_inplace(float* x, std::int64_t n) { run_for_isa<MapLoop<tanh_lane>>(x, n); }

float exp_f32(float x) { return exp_lane(x); }
float tanh_f32(float x) { return tanh_lane(x); }

}  // namespace atl::cpu
