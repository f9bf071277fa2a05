// Inkling2 attention on f32 CPU tensors (MODELS.md §1.4.5-7, §10.2.1, §10.2.4): the GQA attention
// of kernels/ops/attention.hpp plus a relative-logit bias from per-query profiles and a
// query-conditioned sink logit. Scores s_j = scale·<q, k_j> + bias(t, j), bias(t, j) = P[b,h,t,t-j]
// when 0 <= t-j < R (else 0); p_j = exp(s_j) / (exp(σ[b,h,t]) + Σ exp(s_j')); the sink has zero
// value. Masks and the zero output of a query with no visible key as in attention.hpp.
#pragma once
#include "kernels/ops/attention.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// q [B,S,Hq,D], k and v [B,S,Hkv,D], positions i64 [B,S], valid bool [B,S]; profiles f32
// [B,Hq,S,R] (R >= 1) or undefined (no bias); sink_logits f32 [B,Hq,S] or undefined (no sink).
AttentionForward relative_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                            const Tensor& valid, const Tensor& profiles, const Tensor& sink_logits,
                                            const AttentionOptions& options);

struct RelativeAttentionGrads {
  Tensor dq, dk, dv;
  Tensor d_profiles;     // like profiles (undefined without them)
  Tensor d_sink_logits;  // like sink_logits (undefined without them)
};

// Probabilities are recomputed from saved.lse (saved.out is not read).
RelativeAttentionGrads relative_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                   const Tensor& v, const AttentionForward& saved,
                                                   const Tensor& positions, const Tensor& valid, const Tensor& profiles,
                                                   const Tensor& sink_logits, const AttentionOptions& options);

}  // namespace atl
