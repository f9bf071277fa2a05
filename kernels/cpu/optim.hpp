#pragma once
#include <cmath>
#include <cstdint>

namespace atl::cpu {

// One AdamW step (decoupled weight decay, PyTorch semantics) on n elements; step counts from 1.
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, std::int64_t n, T lr, T beta1, T beta2, T eps, T weight_decay,
                std::int64_t step) {
  const T bias1 = T(1) - static_cast<T>(std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  const T bias2 = T(1) - static_cast<T>(std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  const T bias2_sqrt = std::sqrt(bias2);
  const T step_size = lr / bias1;
  for (std::int64_t i = 0; i < n; ++i) {
    param[i] *= T(1) - lr * weight_decay;
    m[i] = beta1 * m[i] + (T(1) - beta1) * grad[i];
    v[i] = beta2 * v[i] + (T(1) - beta2) * grad[i] * grad[i];
    const T denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    param[i] -= step_size * m[i] / denom;
  }
}

// Sum of squares accumulated in double, in index order (one fixed order for the global norm).
template <class T>
double sum_of_squares(const T* x, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace atl::cpu
