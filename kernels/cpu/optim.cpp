#include "kernels/cpu/optim.hpp"

#include <cmath>

#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/cpu/lane_sum.hpp"
#include "kernels/dtype.hpp"

namespace atl::cpu {

namespace {

struct AdamWScalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps, step_size;
};

// One element's update; returns the new parameter.
[[gnu::always_inline]] inline float adamw_element(const AdamWScalars& c, float& param, float grad, float& m, float& v) {
  param *= c.decay;
  m = c.beta1 * m + c.one_minus_beta1 * grad;
  v = c.beta2 * v + c.one_minus_beta2 * grad * grad;
  const float denom = std::sqrt(v) / c.bias2_sqrt + c.eps;
  param -= c.step_size * m / denom;
  return param;
}

// With Round, each new parameter is also written rounded to bf16 into `rounded` (else unused).
template <bool Round>
struct AdamWLoop {
  [[gnu::always_inline]] void operator()(float* param, const float* grad, float* m, float* v, std::int64_t n,
                                         const AdamWScalars* s, float* __restrict rounded) const {
    const AdamWScalars c = *s;
    for (std::int64_t i = 0; i < n; ++i) {
      const float p = adamw_element(c, param[i], grad[i], m[i], v[i]);
      if constexpr (Round) rounded[i] = round_to_bf16(p);
    }
  }
};

struct SumSquaresLoop {
  [[gnu::always_inline]] void operator()(const float* x, std::int64_t n, double* out) const {
    *out = lane_sum<double>(n, [x](std::int64_t i) { return static_cast<double>(x[i]) * static_cast<double>(x[i]); });
  }
};

}  // namespace

double sum_of_squares(const float* x, std::int64_t n) {
  double out = 0;
  run_for_isa<SumSquaresLoop>(x, n, &out);
  return out;
}

void adamw_step(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, std::int64_t step, float* bf16_copy) {
  const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  const AdamWScalars s{1.0f - lr * weight_decay, beta1, 1.0f - beta1, beta2, 1.0f - beta2,
                       std::sqrt(bias2),         eps,   lr / bias1};
  if (bf16_copy) {
    run_for_isa<AdamWLoop<true>>(param, grad, m, v, n, &s, bf16_copy);
  } else {
    run_for_isa<AdamWLoop<false>>(param, grad, m, v, n, &s, bf16_copy);
  }
}

}  // namespace atl::cpu
