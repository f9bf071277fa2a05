#include "kernels/cpu/optim.hpp"

#include <cmath>

#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/cpu/lane_sum.hpp"

namespace atl::cpu {

namespace {

struct AdamWScalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps, step_size;
};

struct AdamWLoop {
  [[gnu::always_inline]] void operator()(float* param, const float* grad, float* m, float* v, std::int64_t n,
                                         const AdamWScalars* s) const {
    const AdamWScalars c = *s;
    for (std::int64_t i = 0; i < n; ++i) {
      param[i] *= c.decay;
      m[i] = c.beta1 * m[i] + c.one_minus_beta1 * grad[i];
      v[i] = c.beta2 * v[i] + c.one_minus_beta2 * grad[i] * grad[i];
      const float denom = std::sqrt(v[i]) / c.bias2_sqrt + c.eps;
      param[i] -= c.step_size * m[i] / denom;
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
                float eps, float weight_decay, std::int64_t step) {
  const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  const AdamWScalars s{1.0f - lr * weight_decay, beta1, 1.0f - beta1, beta2, 1.0f - beta2,
                       std::sqrt(bias2),         eps,   lr / bias1};
  run_for_isa<AdamWLoop>(param, grad, m, v, n, &s);
}

}  // namespace atl::cpu
