// Short causal convolution with a residual, inside documents (MODELS.md §1.4.2, §10.2.3), raw
// pointers, T = float or double. Channels form `groups` groups of `group_size` consecutive
// channels (a head, or D channels of the hidden state); every channel of group g uses the taps
// tap(b, t, g, j), j = 0..W-1 (j is the lag, j = 0 the current token):
//   xm[t] = valid[t] ? x[t] : 0                       (inputs zeroed at invalid tokens)
//   y[t, c] = xm[t, c] + Σ_j tap(t, g(c), j) · lag_j(xm)[t, c]
//   lag_j(xm)[t] = xm[t-j] if j <= pos[t] and j <= t (t counted inside the row), else 0
// so a lag never crosses a document start, and lags before the row (pos[0] > 0) read zeros.
// Outputs at invalid tokens are not forced to zero.
// Taps live at taps[(b*seq + t) * taps_token_stride + g*W + j]: token stride 0 = static taps
// [G, W] shared by every token, token stride G*W = dynamic taps [B, S, G, W].
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_emulation.hpp"

namespace atl::cpu {

struct ShortConvDims {
  std::int64_t batch = 0, seq = 0, groups = 0, group_size = 0, width = 0;
  std::int64_t channels() const { return groups * group_size; }
};

// Lag j of row-local token t exists iff it stays inside the document and inside the row.
inline bool conv_lag_visible(std::int64_t t, std::int64_t position, std::int64_t j) { return j <= position && j <= t; }

template <class T>
void short_conv_forward(const T* x, const T* taps, std::int64_t taps_token_stride, const std::int64_t* positions,
                        const bool* valid, T* y, const ShortConvDims& d, bool round_bf16) {
  const std::int64_t S = d.seq, C = d.channels(), W = d.width;
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t t = 0; t < S; ++t) {
      const std::int64_t row = b * S + t;
      const T* tap_row = taps + row * taps_token_stride;
      T* yt = y + row * C;
      for (std::int64_t c = 0; c < C; ++c) yt[c] = valid[row] ? x[row * C + c] : T(0);
      for (std::int64_t j = 0; j < W; ++j) {
        if (!conv_lag_visible(t, positions[row], j) || !valid[row - j]) continue;  // an invalid source reads 0
        const T* xs = x + (row - j) * C;
        for (std::int64_t g = 0; g < d.groups; ++g) {
          const T w = tap_row[g * W + j];
          for (std::int64_t i = 0; i < d.group_size; ++i) {
            const std::int64_t c = g * d.group_size + i;
            yt[c] += w * xs[c];
          }
        }
      }
      for (std::int64_t c = 0; c < C; ++c) yt[c] = maybe_round_bf16<T>(yt[c], round_bf16);
    }
  }
}

// dx is written (overwritten); dtaps is accumulated (+=) at the same indices as taps (so static
// taps sum over tokens). Either output may be null. Gradients at invalid tokens' inputs are 0.
template <class T>
void short_conv_backward(const T* dy, const T* x, const T* taps, std::int64_t taps_token_stride,
                         const std::int64_t* positions, const bool* valid, T* dx, T* dtaps, const ShortConvDims& d) {
  const std::int64_t S = d.seq, C = d.channels(), W = d.width, G = d.groups;
  if (dx) {
    for (std::int64_t i = 0; i < d.batch * S * C; ++i) dx[i] = dy[i];
  }
  // Static taps: sum over tokens in a local buffer first (fixed order), then add once.
  std::vector<T> tap_sum(taps_token_stride == 0 ? static_cast<std::size_t>(G * W) : 0, T(0));
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t t = 0; t < S; ++t) {
      const std::int64_t row = b * S + t;
      const T* tap_row = taps + row * taps_token_stride;
      T* dtap_row = taps_token_stride == 0 ? tap_sum.data() : (dtaps ? dtaps + row * taps_token_stride : nullptr);
      const T* dyt = dy + row * C;
      for (std::int64_t j = 0; j < W; ++j) {
        if (!conv_lag_visible(t, positions[row], j) || !valid[row - j]) continue;
        const T* xs = x + (row - j) * C;
        T* dxs = dx ? dx + (row - j) * C : nullptr;
        for (std::int64_t g = 0; g < G; ++g) {
          const T w = tap_row[g * W + j];
          T dot = 0;
          for (std::int64_t i = 0; i < d.group_size; ++i) {
            const std::int64_t c = g * d.group_size + i;
            dot += dyt[c] * xs[c];
            if (dxs) dxs[c] += w * dyt[c];
          }
          if (dtap_row) dtap_row[g * W + j] += dot;
        }
      }
    }
  }
  if (dx) {
    for (std::int64_t row = 0; row < d.batch * S; ++row) {
      if (valid[row]) continue;
      for (std::int64_t c = 0; c < C; ++c) dx[row * C + c] = T(0);  // the input was replaced by 0
    }
  }
  if (dtaps && taps_token_stride == 0) {
    for (std::int64_t i = 0; i < G * W; ++i) dtaps[i] += tap_sum[static_cast<std::size_t>(i)];
  }
}

}  // namespace atl::cpu
