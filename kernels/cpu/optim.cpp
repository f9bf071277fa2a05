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

struct AdamWLoop {
  [[gnu::always_inline]] void operator()(float* param, const float* grad, float* m, float* v, std::int64_t n,
                                         const AdamWScalars* s) const {
    const AdamWScalars c = *s;
    for (std::int64_t i = 0; i < n; ++i) adamw_element(c, param[i], grad[i], m[i], v[i]);
  }
};

// The same, writing each new parameter rounded to bf16 into `rounded` as well.
struct AdamWRoundedLoop {
  [[gnu::always_inline]] void operator()(float* param, const float* grad, float* m, float* v, std::int64_t n,
                                         const AdamWScalars* s, float* __restrict rounded) const {
    const AdamWScalars c = *s;
    for (std::int64_t i = 0; i < n; ++i) rounded[i] = round_to_bf16(adamw_element(c, param[i], grad[i], m[i], v[i]));
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
    run_for_isa<AdamWRoundedLoop>(param, grad, m, v, n, &s, bf16_copy);
  } else {
    run_for_isa<AdamWLoop>(param, grad, m, v, n, &s);
  }
}

}  // namespace atl::cpu
