// Positional ops on per-head vectors x[tokens, heads, D] (raw pointers, T = float or double):
// NeoX rotate-half RoPE and SSMax query scaling (MODELS.md §3.3, §10.1.11, §10.4.2).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace atl::cpu {

// cos/sin of one token's angles, first half only: the NeoX table is duplicated-half, so entry
// i and i + D/2 are equal. Computed in fp32 whatever T is (as the reference does), so the
// double template sees exactly the tables the float path uses.
inline void rope_half_table(std::int64_t position, std::int64_t head_dim, float theta, float* cos_half,
                            float* sin_half) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    const float angle = static_cast<float>(position) * inv_freq;
    cos_half[i] = std::cos(angle);
    sin_half[i] = std::sin(angle);
  }
}

// y[i] = x[i] cos - x[i+h] sin, y[i+h] = x[i+h] cos + x[i] sin (h = D/2). With inverse = true the
// rotation is transposed (angle negated): that is the backward, since the map is orthogonal.
template <class T>
void rope_apply(const T* x, const std::int64_t* positions, T* y, std::int64_t tokens, std::int64_t heads,
                std::int64_t head_dim, float theta, bool inverse) {
  const std::int64_t half = head_dim / 2;
  std::vector<float> cos_half(static_cast<std::size_t>(half)), sin_half(static_cast<std::size_t>(half));
  for (std::int64_t t = 0; t < tokens; ++t) {
    rope_half_table(positions[t], head_dim, theta, cos_half.data(), sin_half.data());
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t base = (t * heads + h) * head_dim;
      const T* xr = x + base;
      T* yr = y + base;
      for (std::int64_t i = 0; i < half; ++i) {
        const T c = static_cast<T>(cos_half[static_cast<std::size_t>(i)]);
        const T s = inverse ? -static_cast<T>(sin_half[static_cast<std::size_t>(i)])
                            : static_cast<T>(sin_half[static_cast<std::size_t>(i)]);
        const T lo = xr[i], hi = xr[i + half];  // read both before writing (y may alias x)
        yr[i] = lo * c - hi * s;
        yr[i + half] = hi * c + lo * s;
      }
    }
  }
}

template <class T>
void rope_forward(const T* x, const std::int64_t* positions, T* y, std::int64_t tokens, std::int64_t heads,
                  std::int64_t head_dim, float theta) {
  rope_apply(x, positions, y, tokens, heads, head_dim, theta, /*inverse=*/false);
}

template <class T>
void rope_backward(const T* dy, const std::int64_t* positions, T* dx, std::int64_t tokens, std::int64_t heads,
                   std::int64_t head_dim, float theta) {
  rope_apply(dy, positions, dx, tokens, heads, head_dim, theta, /*inverse=*/true);
}

// SSMax factor (1 + (pos+1)/base)^exponent, in fp32 like the reference.
inline float ssmax_factor(std::int64_t position, float base, float exponent) {
  return std::pow(1.0f + (static_cast<float>(position) + 1.0f) / base, exponent);
}

// y = x * factor(pos) per token; the op is linear in x, so the backward is the same scaling.
template <class T>
void ssmax_scale(const T* x, const std::int64_t* positions, T* y, std::int64_t tokens, std::int64_t row,
                 float base, float exponent) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const T f = static_cast<T>(ssmax_factor(positions[t], base, exponent));
    for (std::int64_t i = 0; i < row; ++i) y[t * row + i] = x[t * row + i] * f;
  }
}

template <class T>
void ssmax_forward(const T* q, const std::int64_t* positions, T* y, std::int64_t tokens, std::int64_t row,
                   float base, float exponent) {
  ssmax_scale(q, positions, y, tokens, row, base, exponent);
}

template <class T>
void ssmax_backward(const T* dy, const std::int64_t* positions, T* dq, std::int64_t tokens, std::int64_t row,
                    float base, float exponent) {
  ssmax_scale(dy, positions, dq, tokens, row, base, exponent);
}

}  // namespace atl::cpu
