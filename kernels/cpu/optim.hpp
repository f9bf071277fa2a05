#pragma once
#include <cmath>
#include <cstdint>

namespace atl::cpu {

// One AdamW step (decoupled weight decay, PyTorch semantics) on n elements; step counts from 1.
// Elementwise IEEE operations only, so the vectorized loop (one per instruction set) gives the
// same bits as a scalar one.
void adamw_step(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, std::int64_t step);

// Sum of squares accumulated in double, in index order (one fixed order for the global norm).
template <class T>
double sum_of_squares(const T* x, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace atl::cpu
