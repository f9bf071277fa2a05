// MoE router on given logits [T,E] (MODELS.md §0.5, §10.1.7, §10.1.9), raw pointers, T = float or
// double. Three steps so tests can hold the selection fixed: router_scores (per-expert unbiased score),
// router_select (top-k on the biased, optionally grouped, selection score) and router_weights
// (gather, normalise, scale, round).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/vector_math.hpp"
#include "kernels/precision.hpp"

namespace atl {

enum class ScoreFunction {
  softmax,              // top-k on raw logits, weights = softmax over the k selected logits
  softmax_before_topk,  // softmax over all E, top-k on it, gather
  sigmoid_with_bias,    // sigmoid; selection on sigmoid + correction bias, weights = unbiased sigmoid
};

struct RouterConfig {
  std::int64_t num_experts = 0;
  std::int64_t top_k = 1;
  ScoreFunction score = ScoreFunction::sigmoid_with_bias;
  std::int64_t n_group = 1;     // experts split into n_group contiguous groups of E/n_group
  std::int64_t topk_group = 1;  // groups kept when n_group > 1
  bool norm_topk_prob = true;   // w /= (sum(w) + 1e-20) when k > 1 ...
  bool norm_topk_prob_top1 = false;  // ... and also when k == 1 (Beam)
  float route_scale = 1.0f;
  bool router_weights_fp32 = false;  // else weights are rounded to bf16 in precision bf16
};

namespace cpu {

inline void validate_router_config(const RouterConfig& c) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("router: " + why); };
  if (c.num_experts < 1) fail("num_experts must be >= 1");
  if (c.top_k < 1 || c.top_k > c.num_experts) fail("top_k must be in [1, num_experts]");
  if (c.n_group < 1 || c.num_experts % c.n_group != 0) fail("n_group must divide num_experts");
  if (c.n_group > 1) {
    if (c.topk_group < 1 || c.topk_group > c.n_group) fail("topk_group must be in [1, n_group]");
    if (c.top_k > c.topk_group * (c.num_experts / c.n_group)) fail("top_k exceeds the experts of the kept groups");
  }
}

inline bool router_normalises(const RouterConfig& c) {
  return c.norm_topk_prob && (c.top_k > 1 || c.norm_topk_prob_top1);
}

// The score the weights derive from, per expert: sigmoid(logits), softmax(logits) over E, or the
// raw logits for `softmax` (whose weights are a softmax over the k selected logits).
template <class T>
void router_scores(const T* logits, std::int64_t rows, const RouterConfig& c, T* scores) {
  const std::int64_t e_count = c.num_experts;
  for (std::int64_t t = 0; t < rows; ++t) {
    const T* l = logits + t * e_count;
    T* s = scores + t * e_count;
    if (c.score == ScoreFunction::sigmoid_with_bias) {
      std::copy(l, l + e_count, s);
      sigmoid_values(s, e_count);
    } else if (c.score == ScoreFunction::softmax_before_topk) {
      softmax_values(l, e_count, s);
    } else {
      for (std::int64_t e = 0; e < e_count; ++e) s[e] = l[e];
    }
  }
}

// a ranks before b: higher score, ties to the lower id.
template <class T>
inline bool ranks_before(T score_a, std::int64_t a, T score_b, std::int64_t b) {
  return score_a > score_b || (score_a == score_b && a < b);
}

// indices[rows, K] (sorted by selection score descending, ties to the lower expert id) from
// scores (router_scores) plus the optional correction bias [E]. With n_group > 1 the groups
// outside the top topk_group (group score = sum of the top-2 biased scores, top-1 for one-expert
// groups; ties to the lower group id) are set to -inf before the top-k.
template <class T>
void router_select(const T* scores, const T* correction_bias, std::int64_t rows, const RouterConfig& c,
                   std::int32_t* indices) {
  const std::int64_t e_count = c.num_experts, k = c.top_k;
  const std::int64_t group_size = e_count / c.n_group;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> biased(static_cast<std::size_t>(e_count));
  std::vector<T> group_score(static_cast<std::size_t>(c.n_group));
  std::vector<std::int64_t> order(static_cast<std::size_t>(std::max(e_count, c.n_group)));
  for (std::int64_t t = 0; t < rows; ++t) {
    const T* s = scores + t * e_count;
    for (std::int64_t e = 0; e < e_count; ++e) biased[e] = s[e] + (correction_bias ? correction_bias[e] : T(0));
    if (c.n_group > 1) {
      for (std::int64_t g = 0; g < c.n_group; ++g) {
        const T* b = biased.data() + g * group_size;
        T top1 = neg_inf, top2 = neg_inf;
        std::int64_t top1_at = -1;
        for (std::int64_t i = 0; i < group_size; ++i) {
          if (top1_at < 0 || b[i] > top1) {
            top1 = b[i];
            top1_at = i;
          }
        }
        for (std::int64_t i = 0; i < group_size; ++i) {
          if (i != top1_at && (top2 == neg_inf || b[i] > top2)) top2 = b[i];
        }
        group_score[g] = group_size == 1 ? top1 : top1 + top2;
      }
      for (std::int64_t g = 0; g < c.n_group; ++g) order[g] = g;
      std::sort(order.begin(), order.begin() + c.n_group, [&](std::int64_t a, std::int64_t b) {  // a total order
        return ranks_before(group_score[a], a, group_score[b], b);
      });
      for (std::int64_t r = c.topk_group; r < c.n_group; ++r) {
        const std::int64_t g = order[r];
        for (std::int64_t i = 0; i < group_size; ++i) biased[g * group_size + i] = neg_inf;
      }
    }
    for (std::int64_t e = 0; e < e_count; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + e_count,
                      [&](std::int64_t a, std::int64_t b) { return ranks_before(biased[a], a, biased[b], b); });
    for (std::int64_t j = 0; j < k; ++j) indices[t * k + j] = static_cast<std::int32_t>(order[j]);
  }
}

// Pre-normalisation weights p[K] of one token.
template <class T>
void router_raw_weights(const T* s, const std::int32_t* idx, const RouterConfig& c, T* p) {
  const std::int64_t k = c.top_k;
  if (c.score == ScoreFunction::softmax) {
    T mx = s[idx[0]];
    for (std::int64_t j = 1; j < k; ++j) mx = std::max(mx, s[idx[j]]);
    T sum = 0;
    for (std::int64_t j = 0; j < k; ++j) sum += (p[j] = exp_value(s[idx[j]] - mx));
    for (std::int64_t j = 0; j < k; ++j) p[j] /= sum;
  } else {
    for (std::int64_t j = 0; j < k; ++j) p[j] = s[idx[j]];
  }
}

// weights[rows, K] for given indices: gather/softmax, normalise, * route_scale, round to bf16 in
// precision bf16 unless router_weights_fp32.
template <class T>
void router_weights(const T* scores, const std::int32_t* indices, std::int64_t rows, const RouterConfig& c,
                    Precision precision, T* weights) {
  const std::int64_t e_count = c.num_experts, k = c.top_k;
  const Precision weight_precision = c.router_weights_fp32 ? Precision::fp32 : precision;
  const T scale = static_cast<T>(c.route_scale);
  for (std::int64_t t = 0; t < rows; ++t) {
    T* w = weights + t * k;
    router_raw_weights(scores + t * e_count, indices + t * k, c, w);
    if (router_normalises(c)) {
      T sum = 0;
      for (std::int64_t j = 0; j < k; ++j) sum += w[j];
      const T denom = sum + static_cast<T>(1e-20);
      for (std::int64_t j = 0; j < k; ++j) w[j] /= denom;
    }
    for (std::int64_t j = 0; j < k; ++j) w[j] = round_emulated(weight_precision, w[j] * scale);
  }
}

// d_logits[rows, E] (overwritten) from d_weights[rows, K]. The bf16 rounding of the weights is
// straight-through; the correction bias only selects, so it has no gradient.
template <class T>
void router_backward(const T* d_weights, const std::int32_t* indices, const T* scores, std::int64_t rows,
                     const RouterConfig& c, T* d_logits) {
  const std::int64_t e_count = c.num_experts, k = c.top_k;
  const T scale = static_cast<T>(c.route_scale);
  std::vector<T> p(static_cast<std::size_t>(k)), dp(static_cast<std::size_t>(k));
  for (std::int64_t t = 0; t < rows; ++t) {
    const T* s = scores + t * e_count;
    const std::int32_t* idx = indices + t * k;
    T* dl = d_logits + t * e_count;
    std::fill(dl, dl + e_count, T(0));
    router_raw_weights(s, idx, c, p.data());
    for (std::int64_t j = 0; j < k; ++j) dp[j] = d_weights[t * k + j] * scale;
    if (router_normalises(c)) {
      // q_j = p_j / D, D = sum(p) + eps: dp_j = dq_j / D - sum_i dq_i p_i / D^2.
      T sum = 0, dot = 0;
      for (std::int64_t j = 0; j < k; ++j) sum += p[j];
      const T denom = sum + static_cast<T>(1e-20);
      for (std::int64_t j = 0; j < k; ++j) dot += dp[j] * p[j];
      for (std::int64_t j = 0; j < k; ++j) dp[j] = dp[j] / denom - dot / (denom * denom);
    }
    if (c.score == ScoreFunction::sigmoid_with_bias) {
      for (std::int64_t j = 0; j < k; ++j) {
        const T sj = s[idx[j]];
        dl[idx[j]] += dp[j] * sj * (T(1) - sj);
      }
    } else if (c.score == ScoreFunction::softmax) {
      T dot = 0;
      for (std::int64_t j = 0; j < k; ++j) dot += p[j] * dp[j];
      for (std::int64_t j = 0; j < k; ++j) dl[idx[j]] += p[j] * (dp[j] - dot);
    } else {
      // P = softmax over E; only the gathered entries carry a gradient dP.
      T dot = 0;
      for (std::int64_t j = 0; j < k; ++j) dot += s[idx[j]] * dp[j];
      for (std::int64_t e = 0; e < e_count; ++e) dl[e] = -s[e] * dot;
      for (std::int64_t j = 0; j < k; ++j) dl[idx[j]] += s[idx[j]] * dp[j];
    }
  }
}

// scores + selection + weights in one call.
template <class T>
void router_forward(const T* logits, const T* correction_bias, std::int64_t rows, const RouterConfig& c,
                    Precision precision, std::int32_t* indices, T* weights, T* scores) {
  validate_router_config(c);
  router_scores(logits, rows, c, scores);
  router_select(scores, correction_bias, rows, c, indices);
  router_weights(scores, indices, rows, c, precision, weights);
}

}  // namespace cpu
}  // namespace atl
