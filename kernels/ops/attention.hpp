// GQA attention over packed rows (f32 CPU tensors). Masks, sinks and the zero output of a query
// with no visible key follow MODELS.md §0.3, §1.4.7, §2.2 and §10.1; the math is in
// kernels/cpu/attention.hpp.
#pragma once
#include <cstdint>

#include "kernels/tensor.hpp"

namespace atl {

struct AttentionOptions {
  std::int64_t window = 0;  // 0 = unlimited; else key j is visible only when t - j < window
  float scale = 1.0f;       // score scale; the models pass D^-0.5
  // i64 [B, Sq]: the key index (global token index in the row) of each query, for queries that are
  // a part of the key row (context parallelism: local queries, all-gathered keys in global order).
  // Undefined: Sq = Sk and query t is key t.
  Tensor query_index;
};

struct AttentionForward {
  Tensor out;  // f32 [B, S, Hq, D]
  Tensor lse;  // f32 [B, Hq, S]: log(exp(sink) + sum_j exp(s_j)); sink or -inf for a query with no visible key
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// Throws std::invalid_argument unless every position is >= 0 and, inside each row, every t > 0 has
// pos[t] == pos[t-1] + 1 or pos[t] == 0. positions: i64 [B, S] (or [S], one row).
void validate_positions(const Tensor& positions);

// q [B,Sq,Hq,D], k and v [B,Sk,Hkv,D] (Hq a multiple of Hkv; Sk = Sq unless options.query_index),
// positions i64 [B,Sq] of the queries (global positions; negative throws), valid bool [B,Sk] of
// the keys, sinks f32 [Hq] or undefined for no sink.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                   const Tensor& valid, const Tensor& sinks, const AttentionOptions& options);

// Returns dq, dk, dv; adds d loss / d sinks into *dsinks (f32 [Hq]) when sinks are used and dsinks is
// not null. Probabilities are recomputed from saved.lse (saved.out is not read).
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionForward& saved, const Tensor& positions, const Tensor& valid,
                                  const Tensor& sinks, Tensor* dsinks, const AttentionOptions& options);

}  // namespace atl
