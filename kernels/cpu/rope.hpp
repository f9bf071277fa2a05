// Positional ops on per-head vectors x[tokens, heads, D] (raw pointers, T = float or double):
// NeoX rotate-half RoPE and SSMax query scaling (MODELS.md §3.3, §10.1.11, §10.4.2).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/libm_float.hpp"

namespace atl::cpu {

// cos/sin of the angles of each distinct position among `positions`, first half only (the NeoX
// table is duplicated-half: entries i and i + D/2 are equal). Computed in fp32 whatever T is (as
// the reference does), so the double template sees exactly the tables the float path uses.
// Packed rows repeat positions (each document starts at 0): one table per distinct position.
struct RopeHalfTables {
  std::vector<std::int64_t> positions;  // distinct, ascending
  std::vector<float> cos_half, sin_half;  // [positions.size(), D/2]
  std::int64_t half = 0;

  RopeHalfTables(const std::int64_t* token_positions, std::int64_t tokens, std::int64_t head_dim, float theta)
      : positions(token_positions, token_positions + tokens), half(head_dim / 2) {
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    std::vector<float> inv_freq(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i) {
      inv_freq[static_cast<std::size_t>(i)] =
          1.0f / pow_rounded(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    }
    cos_half.resize(positions.size() * static_cast<std::size_t>(half));
    sin_half.resize(cos_half.size());
    for (std::size_t k = 0; k < positions.size(); ++k) {
      for (std::int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[k]) * inv_freq[static_cast<std::size_t>(i)];
        cos_half[k * static_cast<std::size_t>(half) + static_cast<std::size_t>(i)] = cos_rounded(angle);
        sin_half[k * static_cast<std::size_t>(half) + static_cast<std::size_t>(i)] = sin_rounded(angle);
      }
    }
  }
  // The row of `position` (one of the positions given).
  std::size_t row(std::int64_t position) const {
    const auto it = std::lower_bound(positions.begin(), positions.end(), position);
    return static_cast<std::size_t>(it - positions.begin()) * static_cast<std::size_t>(half);
  }
};

// y[i] = x[i] cos - x[i+h] sin, y[i+h] = x[i+h] cos + x[i] sin (h = D/2). With inverse = true the
// rotation is transposed (angle negated): that is the backward, since the map is orthogonal.
template <class T>
void rope_apply(const T* x, const std::int64_t* positions, T* y, std::int64_t tokens, std::int64_t heads,
                std::int64_t head_dim, float theta, bool inverse) {
  const std::int64_t half = head_dim / 2;
  const RopeHalfTables tables(positions, tokens, head_dim, theta);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* cos_half = tables.cos_half.data() + tables.row(positions[t]);
    const float* sin_half = tables.sin_half.data() + tables.row(positions[t]);
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t base = (t * heads + h) * head_dim;
      const T* xr = x + base;
      T* yr = y + base;
      for (std::int64_t i = 0; i < half; ++i) {
        const T c = static_cast<T>(cos_half[i]);
        const T s = inverse ? -static_cast<T>(sin_half[i]) : static_cast<T>(sin_half[i]);
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

// SSMax factor (1 + (pos+1)/base)^exponent, an fp32 value like the reference's (pow in double,
// rounded once: kernels/cpu/libm_float.hpp).
inline float ssmax_factor(std::int64_t position, float base, float exponent) {
  return pow_rounded(1.0f + (static_cast<float>(position) + 1.0f) / base, exponent);
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
