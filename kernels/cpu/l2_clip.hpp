// L2 clip of each row (a head vector) to a radius (MODELS.md §1.4.3, §10.2.5), raw pointers,
// T = float or double:  u = scale ⊙ x (no scale: u = x);  y = u · min(1, ρ / max(‖u‖₂, tiny)).
// The norm and the factor are computed in T (fp32 for float); in bf16 emulation only y is rounded.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/bf16_emulation.hpp"

namespace atl::cpu {

inline constexpr double kL2ClipTiny = 1e-12;  // guards ρ / ‖u‖ for an all-zero row

// norms[r] = ‖u_r‖₂ is saved for the backward.
template <class T>
void l2_clip_forward(const T* x, const T* scale, T radius, T* y, T* norms, std::int64_t rows, std::int64_t dim,
                     bool round_bf16) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T sum_sq = 0;
    for (std::int64_t i = 0; i < dim; ++i) {
      const T u = scale ? scale[i] * xr[i] : xr[i];
      sum_sq += u * u;
    }
    const T norm = std::sqrt(sum_sq);
    norms[r] = norm;
    const T factor = std::min(T(1), radius / std::max(norm, T(kL2ClipTiny)));
    for (std::int64_t i = 0; i < dim; ++i) {
      const T u = scale ? scale[i] * xr[i] : xr[i];
      yr[i] = maybe_round_bf16<T>(u * factor, round_bf16);
    }
  }
}

// Unclipped rows pass du = dy; clipped rows (y = ρ u / n) get du = (ρ/n) (dy - u (u·dy) / n²).
// dx = scale ⊙ du (written); dscale += Σ_rows x ⊙ du when both scale and dscale are given.
template <class T>
void l2_clip_backward(const T* dy, const T* x, const T* scale, T radius, const T* norms, T* dx, T* dscale,
                      std::int64_t rows, std::int64_t dim) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    T* dxr = dx + r * dim;
    const T norm = norms[r];
    const T factor = std::min(T(1), radius / std::max(norm, T(kL2ClipTiny)));
    const bool clipped = factor < T(1);
    T u_dot_dy = 0;
    if (clipped) {
      for (std::int64_t i = 0; i < dim; ++i) u_dot_dy += (scale ? scale[i] * xr[i] : xr[i]) * dyr[i];
    }
    const T coef = clipped ? u_dot_dy / (norm * norm) : T(0);
    for (std::int64_t i = 0; i < dim; ++i) {
      const T u = scale ? scale[i] * xr[i] : xr[i];
      const T du = clipped ? factor * (dyr[i] - u * coef) : dyr[i];
      dxr[i] = scale ? scale[i] * du : du;
      if (scale && dscale) dscale[i] += xr[i] * du;
    }
  }
}

}  // namespace atl::cpu
