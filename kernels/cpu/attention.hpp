// GQA attention over packed rows (raw pointers, T = float or double; MODELS.md §0.3, §1.4.7, §10.1).
// Layouts: q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D], out like q, lse [B,Hq,Sq], positions [B,Sq] (of the
// queries), valid [B,Sk] (of the keys). Query t sits at key index g(t) (shape.query_index; by
// default g(t) = t and Sk = Sq): under context parallelism a rank's queries are a chunk of the
// row and the keys are the whole row in global order. Query (b,t) sees key j iff valid[j] &&
// lo(t) <= j <= g(t) with lo(t) = max(0, g(t)-pos[t], g(t)-window+1) (the window term only when
// window > 0). Query head h reads KV head h / (Hq/Hkv).
// Scores s_j = scale*<q,k_j> + bias(t,j); p_j = exp(s_j) / (exp(sink) + sum_j' exp(s_j')); the sink
// has zero value. lse = log(exp(sink) + sum exp(s_j)) is saved for the backward. A query with no
// visible key outputs 0 (lse = sink, or -inf without one) and gets zero gradients.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_rows.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/libm_float.hpp"
#include "kernels/cpu/lane_sum.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace atl::cpu {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t kv_seq = 0;                     // keys per row; 0: as many as queries (seq)
  const std::int64_t* query_index = nullptr;  // [B, seq]: key index of each query; null: query t is key t

  std::int64_t keys() const { return kv_seq > 0 ? kv_seq : seq; }
  std::int64_t key_of(std::int64_t b, std::int64_t t) const { return query_index ? query_index[b * seq + t] : t; }
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

// First key a query at key index g may see (the last one is g itself).
inline std::int64_t attention_first_key(std::int64_t g, std::int64_t position, std::int64_t window) {
  std::int64_t lo = std::max<std::int64_t>(0, g - position);
  if (window > 0) lo = std::max(lo, g - window + 1);
  return lo;
}

// Queries are processed in tiles of kAttentionQueryTile rows per (batch row, head): scores of a tile
// against the keys its queries may see are one GEMM, probabilities times values another (GEMMs are
// batch-invariant, gemm.hpp). Inside a tile, a key a query may not see gets probability exactly 0,
// and a zero term leaves an FMA chain unchanged, so every output is the chain over the query's own
// visible keys in ascending order: independent of the tile, of other documents and of padding.
// Softmax and delta sums run over the query's key span in lane_sum order counted from its first
// visible key (the sink term added last): the same order wherever its document sits. (A key
// outside the span enters P·V with probability 0, so a non-finite value there would reach the
// output as 0·inf; activations are finite, and a non-finite step is never applied.)
inline constexpr std::int64_t kAttentionQueryTile = 64;

namespace attention_detail {

// float scores without a bias run attention_rows.hpp's vectorized loops; every other instance
// (double references, biased scores) the generic loops below: the same operations, so with a
// zero bias the same bits (a kernel test compares the two).
template <class T, class Bias>
inline constexpr bool kVectorRowLoops = std::is_same_v<T, float> && std::is_same_v<Bias, NoScoreBias<float>>;

// One tile of queries [t0, t1) of batch row b and the key range [j0, j1) they can see.
struct QueryTile {
  std::int64_t b, t0, t1, j0, j1;
  std::int64_t queries() const { return t1 - t0; }
  std::int64_t keys() const { return j1 - j0; }
};

inline QueryTile query_tile(std::int64_t b, std::int64_t t0, const AttentionShape& shape, const std::int64_t* pos,
                            std::int64_t window) {
  const std::int64_t t1 = std::min(shape.seq, t0 + kAttentionQueryTile);
  std::int64_t j0 = shape.key_of(b, t0), j1 = j0 + 1;
  for (std::int64_t t = t0; t < t1; ++t) {
    const std::int64_t g = shape.key_of(b, t);
    j0 = std::min(j0, attention_first_key(g, pos[t], window));
    j1 = std::max(j1, g + 1);
  }
  return {b, t0, t1, j0, j1};
}

// scores[i][j - j0] = scale * <q_t, k_j> + bias(t, j) for the tile's queries t = t0 + i, visible
// keys j; every other entry of the row is set to `fill`. Returns per query whether any key is visible.
template <class T, class Bias>
void tile_scores(const QueryTile& tile, const AttentionShape& shape, std::int64_t h, const T* q_head,
                 std::int64_t q_row, const T* k_head, std::int64_t kv_row, const std::int64_t* pos, const bool* ok,
                 std::int64_t window, T scale, const Bias& bias, T fill, T* scores, bool* any_visible) {
  const std::int64_t nk = tile.keys();
  gemm<T>(false, true, tile.queries(), nk, shape.head_dim, q_head + tile.t0 * q_row, q_row,
          k_head + tile.j0 * kv_row, kv_row, false, scores, nk);
  for (std::int64_t t = tile.t0; t < tile.t1; ++t) {
    T* row = scores + (t - tile.t0) * nk;
    const std::int64_t g = shape.key_of(tile.b, t);
    const std::int64_t lo = attention_first_key(g, pos[t], window);
    if constexpr (kVectorRowLoops<T, Bias>) {
      any_visible[t - tile.t0] = mask_score_row(row, ok + tile.j0, lo - tile.j0, g + 1 - tile.j0, nk, scale, fill);
    } else {
      bool any = false;
      for (std::int64_t j = tile.j0; j < tile.j1; ++j) {
        T& s = row[j - tile.j0];
        if (j < lo || j > g || !ok[j]) {
          s = fill;
          continue;
        }
        s = scale * s + bias.value(tile.b, h, t, j);
        any = true;
      }
      any_visible[t - tile.t0] = any;
    }
  }
}

// The keys query t may see, as a range of its tile row: [begin, begin + count).
struct KeySpan {
  std::int64_t begin, count;
  template <class T>
  void zero_outside(T* row, std::int64_t nk) const {
    std::fill(row, row + begin, T(0));
    std::fill(row + begin + count, row + nk, T(0));
  }
};

inline KeySpan key_span(const QueryTile& tile, std::int64_t g, std::int64_t position, std::int64_t window) {
  const std::int64_t lo = attention_first_key(g, position, window);
  return {lo - tile.j0, g - lo + 1};
}

// A sum over a query's keys in lane_sum's order, counted from the query's first key: the same
// order wherever the query's document sits in the row or the tile.
template <class T, class Term>
T key_sum(const KeySpan& keys, Term term) {
  return lane_sum<T>(keys.count, term);
}

}  // namespace attention_detail

template <class T, class Bias = NoScoreBias<T>>
void attention_forward(const T* q, const T* k, const T* v, const std::int64_t* positions, const bool* valid,
                       const SinkLogits<T>& sinks, T* out, T* lse, const AttentionShape& shape, std::int64_t window,
                       T scale, const Bias& bias = Bias{}) {
  using namespace attention_detail;
  const std::int64_t S = shape.seq, Sk = shape.keys(), Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const std::int64_t group = Hq / Hkv;
  const std::int64_t q_row = Hq * D, kv_row = Hkv * D;  // token strides
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> probs(static_cast<std::size_t>(kAttentionQueryTile * Sk));
  bool any_visible[kAttentionQueryTile];
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const std::int64_t* pos = positions + b * S;
    const bool* ok = valid + b * Sk;
    for (std::int64_t h = 0; h < Hq; ++h) {
      const T* q_head = q + b * S * q_row + h * D;
      const T* k_head = k + b * Sk * kv_row + (h / group) * D;
      const T* v_head = v + b * Sk * kv_row + (h / group) * D;
      T* out_head = out + b * S * q_row + h * D;
      for (std::int64_t t0 = 0; t0 < S; t0 += kAttentionQueryTile) {
        const QueryTile tile = query_tile(b, t0, shape, pos, window);
        const std::int64_t nk = tile.keys();
        tile_scores(tile, shape, h, q_head, q_row, k_head, kv_row, pos, ok, window, scale, bias, neg_inf,
                    probs.data(), any_visible);
        for (std::int64_t t = tile.t0; t < tile.t1; ++t) {
          T* row = probs.data() + (t - tile.t0) * nk;
          const T sink = sinks.enabled() ? sinks.values[sinks.index(b, h, t)] : neg_inf;
          T* lse_t = lse + (b * Hq + h) * S + t;
          if (!any_visible[t - tile.t0]) {
            std::fill(row, row + nk, T(0));
            *lse_t = sink;
            continue;
          }
          const KeySpan keys = key_span(tile, shape.key_of(b, t), pos[t], window);
          T* p = row + keys.begin;
          if constexpr (kVectorRowLoops<T, Bias>) {
            const KeySoftmax soft = softmax_key_row(p, keys.count, sink, sinks.enabled());
            *lse_t = soft.max + log_rounded(soft.sum);
          } else {
            const T m = lane_max<T>(keys.count, sink, [&](std::int64_t j) { return p[j]; });
            for (std::int64_t j = 0; j < keys.count; ++j) p[j] -= m;  // masked: -inf - m = -inf, exp 0
            exp_values(p, keys.count);                                // unnormalised probabilities
            const T sink_term = sinks.enabled() ? exp_value(sink - m) : T(0);
            const T sum = sink_term + key_sum<T>(keys, [&](std::int64_t j) { return p[j]; });
            *lse_t = m + log_rounded(sum);
            const T inv_sum = T(1) / sum;
            for (std::int64_t j = 0; j < keys.count; ++j) p[j] *= inv_sum;
          }
          keys.zero_outside(row, nk);
        }
        gemm<T>(false, false, tile.queries(), D, nk, probs.data(), nk, v_head + tile.j0 * kv_row, kv_row, false,
                out_head + tile.t0 * q_row, q_row);
      }
    }
  }
}

// dq, dk, dv are written (fully overwritten); sink and bias gradients are accumulated.
// Probabilities are recomputed from the saved lse: p_j = exp(s_j - lse). With dp_j = <dout, v_j>
// and delta = sum_j p_j dp_j (= <dout, out>): ds_j = p_j (dp_j - delta), d sink = -p_sink delta.
// dk and dv sum over queries in ascending order within each head, heads of a KV group in order.
template <class T, class Bias = NoScoreBias<T>>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* lse,
                        const std::int64_t* positions, const bool* valid, const SinkLogits<T>& sinks, T* dq, T* dk,
                        T* dv, const AttentionShape& shape, std::int64_t window, T scale,
                        const Bias& bias = Bias{}) {
  using namespace attention_detail;
  const std::int64_t S = shape.seq, Sk = shape.keys(), Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const std::int64_t group = Hq / Hkv;
  const std::int64_t q_row = Hq * D, kv_row = Hkv * D;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::fill(dk, dk + shape.batch * Sk * kv_row, T(0));
  std::fill(dv, dv + shape.batch * Sk * kv_row, T(0));
  const std::size_t tile_size = static_cast<std::size_t>(kAttentionQueryTile * Sk);
  std::vector<T> probs(tile_size), dprobs(tile_size);
  bool any_visible[kAttentionQueryTile];
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const std::int64_t* pos = positions + b * S;
    const bool* ok = valid + b * Sk;
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t q_offset = b * S * q_row + h * D, kv_offset = b * Sk * kv_row + (h / group) * D;
      for (std::int64_t t0 = 0; t0 < S; t0 += kAttentionQueryTile) {
        const QueryTile tile = query_tile(b, t0, shape, pos, window);
        const std::int64_t nq = tile.queries(), nk = tile.keys();
        const std::int64_t q_tile = q_offset + tile.t0 * q_row, kv_tile = kv_offset + tile.j0 * kv_row;
        tile_scores(tile, shape, h, q + q_offset, q_row, k + kv_offset, kv_row, pos, ok, window, scale, bias, neg_inf,
                    probs.data(), any_visible);
        // dp = dout · v^T over the tile's keys
        gemm<T>(false, true, nq, nk, D, dout + q_tile, q_row, v + kv_tile, kv_row, false, dprobs.data(), nk);
        for (std::int64_t t = tile.t0; t < tile.t1; ++t) {
          T* p = probs.data() + (t - tile.t0) * nk;
          T* ds = dprobs.data() + (t - tile.t0) * nk;  // dp in, d score out
          const T lse_t = lse[(b * Hq + h) * S + t];
          if (!any_visible[t - tile.t0]) {  // output was the constant 0: no gradient anywhere
            std::fill(p, p + nk, T(0));
            std::fill(ds, ds + nk, T(0));
            continue;
          }
          const KeySpan keys = key_span(tile, shape.key_of(b, t), pos[t], window);
          T* pk = p + keys.begin;
          T* dsk = ds + keys.begin;
          T delta;
          if constexpr (kVectorRowLoops<T, Bias>) {
            delta = softmax_grad_key_row(pk, dsk, keys.count, lse_t, scale);
          } else {
            for (std::int64_t j = 0; j < keys.count; ++j) pk[j] -= lse_t;
            exp_values(pk, keys.count);
            delta = key_sum<T>(keys, [&](std::int64_t j) { return pk[j] * dsk[j]; });
            for (std::int64_t j = 0; j < keys.count; ++j) {
              dsk[j] = pk[j] * (dsk[j] - delta);
              if (pk[j] != T(0)) bias.add_grad(b, h, t, tile.j0 + keys.begin + j, dsk[j]);
              dsk[j] *= scale;
            }
          }
          keys.zero_outside(p, nk);
          keys.zero_outside(ds, nk);
          if (sinks.enabled() && sinks.grads != nullptr) {
            const std::int64_t i = sinks.index(b, h, t);
            sinks.grads[i] -= exp_value(sinks.values[i] - lse_t) * delta;
          }
        }
        gemm<T>(false, false, nq, D, nk, dprobs.data(), nk, k + kv_tile, kv_row, false, dq + q_tile, q_row);
        gemm<T>(true, false, nk, D, nq, dprobs.data(), nk, q + q_tile, q_row, true, dk + kv_tile, kv_row);
        gemm<T>(true, false, nk, D, nq, probs.data(), nk, dout + q_tile, q_row, true, dv + kv_tile, kv_row);
      }
    }
  }
}

}  // namespace atl::cpu
