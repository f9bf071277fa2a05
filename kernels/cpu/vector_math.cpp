#include "kernels/cpu/vector_math.hpp"

#include <cmath>

#include "kernels/cpu/exp_lane.hpp"
#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/dtype.hpp"

namespace atl::cpu {

namespace {

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
