// Beam attention output gate (MODELS.md §3.3, §10.4.3) on raw pointers, T = float or double:
// y[r, h*D + d] = o[r, h*D + d] * sigmoid(gate[r, h*D + d] + bias[h]).
#pragma once
#include <cmath>
#include <cstdint>

namespace atl::cpu {

template <class T>
inline T gate_sigmoid(T x) {
  // Both branches keep exp's argument <= 0, so neither overflows.
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

template <class T>
void output_gate_forward(const T* o, const T* gate, const T* bias, T* y, std::int64_t rows, std::int64_t heads,
                         std::int64_t head_dim) {
  const std::int64_t width = heads * head_dim;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t d = 0; d < head_dim; ++d) {
        const std::int64_t i = r * width + h * head_dim + d;
        y[i] = o[i] * gate_sigmoid(gate[i] + bias[h]);
      }
    }
  }
}

// d_o and d_gate are written; d_bias[h] += sum over rows and the head's channels of d_gate.
template <class T>
void output_gate_backward(const T* dy, const T* o, const T* gate, const T* bias, T* d_o, T* d_gate, T* d_bias,
                          std::int64_t rows, std::int64_t heads, std::int64_t head_dim) {
  const std::int64_t width = heads * head_dim;
  for (std::int64_t h = 0; h < heads; ++h) {
    T bias_grad = 0;  // per head in a local, then added once: fixed order, one rounding into d_bias
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t d = 0; d < head_dim; ++d) {
        const std::int64_t i = r * width + h * head_dim + d;
        const T s = gate_sigmoid(gate[i] + bias[h]);
        d_o[i] = dy[i] * s;
        const T g = dy[i] * o[i] * s * (T(1) - s);
        d_gate[i] = g;
        bias_grad += g;
      }
    }
    if (d_bias != nullptr) d_bias[h] += bias_grad;
  }
}

}  // namespace atl::cpu
