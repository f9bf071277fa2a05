// GQA attention over packed rows (raw pointers, T = float or double; MODELS.md §0.3, §1.4.7, §10.1).
// Layouts: q [B,S,Hq,D], k/v [B,S,Hkv,D], out like q, lse [B,Hq,S], positions [B,S], valid [B,S].
// Query (b,t) sees key j iff valid[j] && lo(t) <= j <= t with lo(t) = max(0, t-pos[t], t-window+1)
// (the window term only when window > 0). Query head h reads KV head h / (Hq/Hkv).
// Scores s_j = scale*<q,k_j> + bias(t,j); p_j = exp(s_j) / (exp(sink) + sum_j' exp(s_j')); the sink
// has zero value. lse = log(exp(sink) + sum exp(s_j)) is saved for the backward. A query with no
// visible key outputs 0 (lse = sink, or -inf without one) and gets zero gradients.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace atl::cpu {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
};

// Sink logit of query (b,h,t) = values[b*batch_stride + h*head_stride + t*query_stride].
// A learned per-head sink [Hq] uses strides (0, 1, 0); a query-conditioned sink [B,Hq,S] would use
// (Hq*S, S, 1). grads (same indexing, accumulated) may be null; values null = no sink.
template <class T>
struct SinkLogits {
  const T* values = nullptr;
  T* grads = nullptr;
  std::int64_t batch_stride = 0, head_stride = 1, query_stride = 0;

  bool enabled() const { return values != nullptr; }
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return b * batch_stride + h * head_stride + t * query_stride;
  }
};

// Additive per-(query, key) score bias hook (e.g. relative logits), added after the scaling. The
// backward hands it d loss / d score via add_grad. This default adds nothing.
template <class T>
struct NoScoreBias {
  T value(std::int64_t /*b*/, std::int64_t /*h*/, std::int64_t /*t*/, std::int64_t /*j*/) const { return T(0); }
  void add_grad(std::int64_t /*b*/, std::int64_t /*h*/, std::int64_t /*t*/, std::int64_t /*j*/, T /*g*/) const {}
};

// First key query t may see (the last one is t itself).
inline std::int64_t attention_first_key(std::int64_t t, std::int64_t position, std::int64_t window) {
  std::int64_t lo = std::max<std::int64_t>(0, t - position);
  if (window > 0) lo = std::max(lo, t - window + 1);
  return lo;
}

// Eight independent partial sums (a fixed summation order, so still deterministic) let the
// compiler vectorise the dot product without reassociating floating-point adds.
template <class T>
inline T attention_dot(const T* a, const T* b, std::int64_t n) {
  constexpr std::int64_t kLanes = 8;
  T lanes[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) lanes[0] += a[i] * b[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

template <class T, class Bias = NoScoreBias<T>>
void attention_forward(const T* q, const T* k, const T* v, const std::int64_t* positions, const bool* valid,
                       const SinkLogits<T>& sinks, T* out, T* lse, const AttentionShape& shape, std::int64_t window,
                       T scale, const Bias& bias = Bias{}) {
  const std::int64_t S = shape.seq, Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const std::int64_t group = Hq / Hkv;
  const std::int64_t q_row = Hq * D, kv_row = Hkv * D;  // token strides
  std::vector<T> scores(static_cast<std::size_t>(S));
  std::vector<T> acc(static_cast<std::size_t>(D));
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const std::int64_t* pos = positions + b * S;
    const bool* ok = valid + b * S;
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / group;
      const T* kb = k + b * S * kv_row + hk * D;
      const T* vb = v + b * S * kv_row + hk * D;
      for (std::int64_t t = 0; t < S; ++t) {
        const T* qt = q + (b * S + t) * q_row + h * D;
        T* ot = out + (b * S + t) * q_row + h * D;
        const std::int64_t lo = attention_first_key(t, pos[t], window);
        T m = -std::numeric_limits<T>::infinity();
        std::int64_t visible = 0;
        for (std::int64_t j = lo; j <= t; ++j) {
          if (!ok[j]) continue;
          const T s = scale * attention_dot(qt, kb + j * kv_row, D) + bias.value(b, h, t, j);
          scores[static_cast<std::size_t>(j)] = s;
          m = std::max(m, s);
          ++visible;
        }
        const T sink = sinks.enabled() ? sinks.values[sinks.index(b, h, t)] : -std::numeric_limits<T>::infinity();
        T* lse_t = lse + (b * Hq + h) * S + t;
        if (visible == 0) {
          std::fill(ot, ot + D, T(0));
          *lse_t = sink;
          continue;
        }
        m = std::max(m, sink);
        T sum = sinks.enabled() ? std::exp(sink - m) : T(0);
        for (std::int64_t j = lo; j <= t; ++j) {
          if (!ok[j]) continue;
          T& s = scores[static_cast<std::size_t>(j)];
          s = std::exp(s - m);  // the row buffer now holds unnormalised probabilities
          sum += s;
        }
        *lse_t = m + std::log(sum);
        const T inv_sum = T(1) / sum;
        std::fill(acc.begin(), acc.end(), T(0));
        for (std::int64_t j = lo; j <= t; ++j) {
          if (!ok[j]) continue;
          const T p = scores[static_cast<std::size_t>(j)] * inv_sum;
          const T* vj = vb + j * kv_row;
          for (std::int64_t d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += p * vj[d];
        }
        std::copy(acc.begin(), acc.end(), ot);
      }
    }
  }
}

// dq, dk, dv are written (fully overwritten); sink and bias gradients are accumulated.
// Probabilities are recomputed from the saved lse: p_j = exp(s_j - lse). With dp_j = <dout, v_j>
// and delta = sum_j p_j dp_j (= <dout, out>): ds_j = p_j (dp_j - delta), d sink = -p_sink delta.
template <class T, class Bias = NoScoreBias<T>>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* lse,
                        const std::int64_t* positions, const bool* valid, const SinkLogits<T>& sinks, T* dq, T* dk,
                        T* dv, const AttentionShape& shape, std::int64_t window, T scale,
                        const Bias& bias = Bias{}) {
  const std::int64_t S = shape.seq, Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const std::int64_t group = Hq / Hkv;
  const std::int64_t q_row = Hq * D, kv_row = Hkv * D;
  std::fill(dq, dq + shape.batch * S * q_row, T(0));
  std::fill(dk, dk + shape.batch * S * kv_row, T(0));
  std::fill(dv, dv + shape.batch * S * kv_row, T(0));
  std::vector<T> probs(static_cast<std::size_t>(S)), dprobs(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const std::int64_t* pos = positions + b * S;
    const bool* ok = valid + b * S;
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / group;
      const std::int64_t kv_offset = b * S * kv_row + hk * D;
      for (std::int64_t t = 0; t < S; ++t) {
        const std::int64_t q_offset = (b * S + t) * q_row + h * D;
        const T* qt = q + q_offset;
        const T* dot = dout + q_offset;
        const T lse_t = lse[(b * Hq + h) * S + t];
        const std::int64_t lo = attention_first_key(t, pos[t], window);
        std::int64_t visible = 0;
        T delta = 0;
        for (std::int64_t j = lo; j <= t; ++j) {
          if (!ok[j]) continue;
          const T s = scale * attention_dot(qt, k + kv_offset + j * kv_row, D) + bias.value(b, h, t, j);
          const T p = std::exp(s - lse_t);
          const T dp = attention_dot(dot, v + kv_offset + j * kv_row, D);
          probs[static_cast<std::size_t>(j)] = p;
          dprobs[static_cast<std::size_t>(j)] = dp;
          delta += p * dp;
          ++visible;
        }
        if (visible == 0) continue;  // output was the constant 0: no gradient anywhere
        T* dqt = dq + q_offset;
        for (std::int64_t j = lo; j <= t; ++j) {
          if (!ok[j]) continue;
          const T p = probs[static_cast<std::size_t>(j)];
          const T ds = p * (dprobs[static_cast<std::size_t>(j)] - delta);
          const T* kj = k + kv_offset + j * kv_row;
          T* dkj = dk + kv_offset + j * kv_row;
          T* dvj = dv + kv_offset + j * kv_row;
          const T ds_scaled = scale * ds;
          for (std::int64_t d = 0; d < D; ++d) {
            dqt[d] += ds_scaled * kj[d];
            dkj[d] += ds_scaled * qt[d];
            dvj[d] += p * dot[d];
          }
          bias.add_grad(b, h, t, j, ds);
        }
        if (sinks.enabled() && sinks.grads != nullptr) {
          const std::int64_t i = sinks.index(b, h, t);
          sinks.grads[i] -= std::exp(sinks.values[i] - lse_t) * delta;
        }
      }
    }
  }
}

}  // namespace atl::cpu
