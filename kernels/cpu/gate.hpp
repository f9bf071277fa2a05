// Beam attention output gate (MODELS.md §3.3, §10.4.3) on raw pointers, T = float or double:
// y[r, h*D + d] = o[r, h*D + d] * sigmoid(gate[r, h*D + d] + bias[h]).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/lane_sum.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace atl::cpu {

// s[h*D + d] = sigmoid(gate[h*D + d] + bias[h]) over one row of `heads` heads.
template <class T>
void gate_row_sigmoids(const T* gate, const T* bias, std::int64_t heads, std::int64_t head_dim, T* s) {
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t d = 0; d < head_dim; ++d) s[h * head_dim + d] = gate[h * head_dim + d] + bias[h];
  sigmoid_values(s, heads * head_dim);
}

template <class T>
void output_gate_forward(const T* o, const T* gate, const T* bias, T* y, std::int64_t rows, std::int64_t heads,
                         std::int64_t head_dim) {
  const std::int64_t width = heads * head_dim;
  std::vector<T> s(static_cast<std::size_t>(width));
  for (std::int64_t r = 0; r < rows; ++r) {
    gate_row_sigmoids(gate + r * width, bias, heads, head_dim, s.data());
    for (std::int64_t i = 0; i < width; ++i) y[r * width + i] = o[r * width + i] * s[static_cast<std::size_t>(i)];
  }
}

// d_o and d_gate are written; d_bias[h] += sum over rows and the head's channels of d_gate.
template <class T>
void output_gate_backward(const T* dy, const T* o, const T* gate, const T* bias, T* d_o, T* d_gate, T* d_bias,
                          std::int64_t rows, std::int64_t heads, std::int64_t head_dim) {
  const std::int64_t width = heads * head_dim;
  std::vector<T> s(static_cast<std::size_t>(width));
  // d_bias: each channel summed over the rows in order as the rows are written, then a head's
  // channels in lane_sum order, added once into d_bias. (One chain over rows x channels per head,
  // each add waiting on the one before, was ~1% of a beam-small step.)
  std::vector<T> channel(d_bias ? static_cast<std::size_t>(width) : 0, T(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    gate_row_sigmoids(gate + r * width, bias, heads, head_dim, s.data());
    for (std::int64_t c = 0; c < width; ++c) {
      const std::int64_t i = r * width + c;
      const T si = s[static_cast<std::size_t>(c)];
      d_o[i] = dy[i] * si;
      d_gate[i] = dy[i] * o[i] * si * (T(1) - si);
    }
    if (d_bias) {
      for (std::int64_t c = 0; c < width; ++c) channel[static_cast<std::size_t>(c)] += d_gate[r * width + c];
    }
  }
  if (d_bias == nullptr) return;
  for (std::int64_t h = 0; h < heads; ++h) {
    const T* c = channel.data() + h * head_dim;
    d_bias[h] += lane_sum<T>(head_dim, [c](std::int64_t d) { return c[d]; });
  }
}

}  // namespace atl::cpu
