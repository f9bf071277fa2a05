// RMSNorm over the last dim (MODELS.md §0.2, §10.1.2): variance in the kernel's float type;
// in bf16 emulation the normalised value is rounded, multiplied by gamma, rounded again.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/bf16_emulation.hpp"
#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/cpu/lane_sum.hpp"

namespace atl::cpu {

template <class T>
struct RmsNormForwardRows {
  [[gnu::always_inline]] void operator()(const T* x, const T* weight, T* y, T* rstd, std::int64_t rows,
                                         std::int64_t dim, T eps, bool round_bf16) const {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      T* yr = y + r * dim;
      const T sum_sq = lane_sum<T>(dim, [&](std::int64_t i) { return xr[i] * xr[i]; });
      const T inv = T(1) / std::sqrt(sum_sq / T(dim) + eps);
      rstd[r] = inv;
      for (std::int64_t i = 0; i < dim; ++i) {
        T n = maybe_round_bf16<T>(xr[i] * inv, round_bf16);
        yr[i] = weight ? maybe_round_bf16<T>(weight[i] * n, round_bf16) : n;
      }
    }
  }
};

// dx = rstd * (dn - n * mean(dn * n)) with n = x * rstd and dn = dy * weight; dweight += dy * n.
template <class T>
struct RmsNormBackwardRows {
  [[gnu::always_inline]] void operator()(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                                         std::int64_t rows, std::int64_t dim) const {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      const T* dyr = dy + r * dim;
      T* dxr = dx + r * dim;
      const T inv = rstd[r];
      const T dot = lane_sum<T>(dim, [&](std::int64_t i) {
        const T dn = weight ? dyr[i] * weight[i] : dyr[i];
        return dn * xr[i] * inv;
      });
      const T mean_dot = dot / T(dim);
      for (std::int64_t i = 0; i < dim; ++i) {
        const T n = xr[i] * inv;
        const T dn = weight ? dyr[i] * weight[i] : dyr[i];
        dxr[i] = inv * (dn - n * mean_dot);
        if (dweight) dweight[i] += dyr[i] * n;
      }
    }
  }
};

// Sums over dim in the fixed lane order of lane_sum.hpp; loops compiled per instruction set.
template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, std::int64_t rows, std::int64_t dim, T eps,
                     bool round_bf16) {
  run_for_isa<RmsNormForwardRows<T>>(x, weight, y, rstd, rows, dim, eps, round_bf16);
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight, std::int64_t rows,
                      std::int64_t dim) {
  run_for_isa<RmsNormBackwardRows<T>>(dy, x, weight, rstd, dx, dweight, rows, dim);
}

}  // namespace atl::cpu
