// Logit softcap, unused-vocabulary mask and cross entropy (MODELS.md §0.4, §10.1.5, §10.1.6), raw
// pointers, T = float or double. capped = cap·tanh(z/cap) on every column (cap <= 0: no cap), then
// columns >= usable_vocab are -inf; CE = logsumexp(capped) - capped[target] per row whose target
// is not -100 (the caller has already shifted the targets).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/vector_math.hpp"

namespace atl::cpu {

inline constexpr std::int64_t kIgnoreIndex = -100;

// Throws unless every target is -100 or in [0, usable_vocab).
inline void check_loss_targets(const std::int64_t* targets, std::int64_t rows, std::int64_t usable_vocab) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = targets[r];
    if (t != kIgnoreIndex && (t < 0 || t >= usable_vocab)) {
      throw std::invalid_argument("logit_loss: target " + std::to_string(t) + " at row " + std::to_string(r) +
                                  " is neither -100 nor in [0, " + std::to_string(usable_vocab) + ")");
    }
  }
}

// capped [rows, vocab] and probs [rows, vocab] (softmax of capped; 0 in masked columns) are
// overwritten. Returns the sum of CE over non-ignored rows in double; *count gets their number.
template <class T>
double logit_loss_forward(const T* logits, const std::int64_t* targets, std::int64_t rows, std::int64_t vocab,
                          std::int64_t usable_vocab, T cap, T* capped, T* probs, std::int64_t* count) {
  check_loss_targets(targets, rows, usable_vocab);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  double loss_sum = 0;
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * vocab;
    T* c = capped + r * vocab;
    T* p = probs + r * vocab;
    if (cap > T(0)) {  // cap * tanh(z / cap), tanh a row at a time
      for (std::int64_t v = 0; v < vocab; ++v) c[v] = z[v] / cap;
      tanh_values(c, vocab);
      for (std::int64_t v = 0; v < vocab; ++v) c[v] = v < usable_vocab ? cap * c[v] : neg_inf;
    } else {
      for (std::int64_t v = 0; v < vocab; ++v) c[v] = v < usable_vocab ? z[v] : neg_inf;
    }
    const auto [mx, sum] = softmax_values(c, usable_vocab, p);
    std::fill(p + usable_vocab, p + vocab, T(0));
    if (targets[r] == kIgnoreIndex) continue;
    const double lse = static_cast<double>(mx) + std::log(static_cast<double>(sum));
    loss_sum += lse - static_cast<double>(c[targets[r]]);
    ++n;
  }
  *count = n;
  return loss_sum;
}

// d_logits [rows, vocab] (overwritten) = scale · d(sum CE)/d logits, chained through the softcap.
// Exactly 0 in masked columns and in ignored rows.
template <class T>
void logit_loss_backward(const T* probs, const T* capped, const std::int64_t* targets, std::int64_t rows,
                         std::int64_t vocab, std::int64_t usable_vocab, T cap, T scale, T* d_logits) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* d = d_logits + r * vocab;
    std::fill(d, d + vocab, T(0));
    const std::int64_t target = targets[r];
    if (target == kIgnoreIndex) continue;
    const T* p = probs + r * vocab;
    const T* c = capped + r * vocab;
    for (std::int64_t v = 0; v < usable_vocab; ++v) {
      T g = scale * (p[v] - (v == target ? T(1) : T(0)));
      if (cap > T(0)) {
        const T th = c[v] / cap;  // tanh(z/cap)
        g *= T(1) - th * th;
      }
      d[v] = g;
    }
  }
}

}  // namespace atl::cpu
