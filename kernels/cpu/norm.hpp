// RMSNorm over the last dim (MODELS.md §0.2, §10.1.2): variance in the kernel's float type;
// in bf16 emulation the normalised value is rounded, multiplied by gamma, rounded again.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/bf16_emulation.hpp"

namespace atl::cpu {

template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, std::int64_t rows, std::int64_t dim, T eps,
                     bool round_bf16) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T sum_sq = 0;
    for (std::int64_t i = 0; i < dim; ++i) sum_sq += xr[i] * xr[i];
    const T inv = T(1) / std::sqrt(sum_sq / T(dim) + eps);
    rstd[r] = inv;
    for (std::int64_t i = 0; i < dim; ++i) {
      T n = maybe_round_bf16<T>(xr[i] * inv, round_bf16);
      yr[i] = weight ? maybe_round_bf16<T>(weight[i] * n, round_bf16) : n;
    }
  }
}

// dx = rstd * (dn - n * mean(dn * n)) with n = x * rstd and dn = dy * weight; dweight += dy * n.
template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight, std::int64_t rows,
                      std::int64_t dim) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    T* dxr = dx + r * dim;
    const T inv = rstd[r];
    T dot = 0;
    for (std::int64_t i = 0; i < dim; ++i) {
      const T dn = weight ? dyr[i] * weight[i] : dyr[i];
      dot += dn * xr[i] * inv;
    }
    const T mean_dot = dot / T(dim);
    for (std::int64_t i = 0; i < dim; ++i) {
      const T n = xr[i] * inv;
      const T dn = weight ? dyr[i] * weight[i] : dyr[i];
      dxr[i] = inv * (dn - n * mean_dot);
      if (dweight) dweight[i] += dyr[i] * n;
    }
  }
}

}  // namespace atl::cpu
