// AttnRes depth mixing (MODELS.md §1.3, §10.2.6), raw pointers, T = float or double. Per token
// (row), over N sources x_s [rows, dim] and one query w [dim]:
//   k_s = x_s · rsqrt(mean(x_s²) + eps)     (RMS-normalised values, no gamma)
//   l_s = <w, k_s>,  a = softmax_s(l),  out = Σ_s a_s x_s
// all in T (fp32 for float); in bf16 emulation only `out` is rounded, once.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_emulation.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace atl::cpu {

// weights [rows, N] (the softmax a) and rstd [rows, N] are saved for the backward.
template <class T>
void residual_mix_forward(const T* const* sources, std::int64_t n_sources, const T* query, T* out, T* weights, T* rstd,
                          std::int64_t rows, std::int64_t dim, T eps, bool round_bf16) {
  std::vector<T> logits(static_cast<std::size_t>(n_sources));
  for (std::int64_t r = 0; r < rows; ++r) {
    T* a = weights + r * n_sources;
    T* rs = rstd + r * n_sources;
    T m = -INFINITY;
    for (std::int64_t s = 0; s < n_sources; ++s) {
      const T* x = sources[s] + r * dim;
      T sum_sq = 0;
      for (std::int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
      rs[s] = T(1) / std::sqrt(sum_sq / T(dim) + eps);
      T l = 0;
      for (std::int64_t i = 0; i < dim; ++i) l += query[i] * (x[i] * rs[s]);
      logits[static_cast<std::size_t>(s)] = l;
      m = std::max(m, l);
    }
    T sum = 0;
    for (std::int64_t s = 0; s < n_sources; ++s) {
      a[s] = exp_value(logits[static_cast<std::size_t>(s)] - m);
      sum += a[s];
    }
    for (std::int64_t s = 0; s < n_sources; ++s) a[s] /= sum;
    T* o = out + r * dim;
    for (std::int64_t i = 0; i < dim; ++i) {
      T acc = 0;
      for (std::int64_t s = 0; s < n_sources; ++s) acc += a[s] * sources[s][r * dim + i];
      o[i] = maybe_round_bf16<T>(acc, round_bf16);
    }
  }
}

// dsources[s] are written; dquery is accumulated (+=) when not null. With da_s = <dout, x_s>,
// dl_s = a_s (da_s - Σ a da), dk_s = dl_s w:  dx_s = a_s dout + rstd_s (dk_s - k_s mean(dk_s ⊙ k_s)),
// dw += Σ_rows Σ_s dl_s k_s.
template <class T>
void residual_mix_backward(const T* dout, const T* const* sources, std::int64_t n_sources, const T* query,
                           const T* weights, const T* rstd, T* const* dsources, T* dquery, std::int64_t rows,
                           std::int64_t dim) {
  std::vector<T> dl(static_cast<std::size_t>(n_sources));
  std::vector<T> dq(dquery ? static_cast<std::size_t>(dim) : 0, T(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* a = weights + r * n_sources;
    const T* rs = rstd + r * n_sources;
    const T* g = dout + r * dim;
    T mean_da = 0;
    for (std::int64_t s = 0; s < n_sources; ++s) {
      const T* x = sources[s] + r * dim;
      T da = 0;
      for (std::int64_t i = 0; i < dim; ++i) da += g[i] * x[i];
      dl[static_cast<std::size_t>(s)] = da;
      mean_da += a[s] * da;
    }
    for (std::int64_t s = 0; s < n_sources; ++s) {
      const T* x = sources[s] + r * dim;
      T* dx = dsources[s] + r * dim;
      const T dls = a[s] * (dl[static_cast<std::size_t>(s)] - mean_da);
      T dk_dot_k = 0;
      for (std::int64_t i = 0; i < dim; ++i) dk_dot_k += dls * query[i] * (x[i] * rs[s]);
      const T mean_dk_k = dk_dot_k / T(dim);
      for (std::int64_t i = 0; i < dim; ++i) {
        const T k = x[i] * rs[s];
        dx[i] = a[s] * g[i] + rs[s] * (dls * query[i] - k * mean_dk_k);
        if (dquery) dq[static_cast<std::size_t>(i)] += dls * k;
      }
    }
  }
  if (dquery) {
    for (std::int64_t i = 0; i < dim; ++i) dquery[i] += dq[static_cast<std::size_t>(i)];
  }
}

}  // namespace atl::cpu
