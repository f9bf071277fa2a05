// The attention core Beam and Flint share (MODELS.md §2.2, §3.3, §10.1.11): q/k/v projections
// (`<prefix>self_attn.{q,k,v}_proj.weight`), per-head q_norm/k_norm, then RoPE on sliding layers;
// on full layers NoPE, optionally with SSMax on q (Beam); GQA attention with the document mask,
// the sliding window and optional learned per-head sinks (Flint). The output is rounded at the
// emulation point "attention output before the output projection".
#pragma once
#include <string>

#include "graph/models/token_context.hpp"
#include "graph/param.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/norm.hpp"

namespace atl {

struct GqaAttentionSpec {
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float norm_eps = 1e-6f;
  bool sliding = false;       // RoPE and the window; else a full (NoPE) layer
  std::int64_t window = 0;    // visible keys including the current one (sliding layers)
  float rope_theta = 10000.0f;
  bool ssmax = false;         // full layers: q *= (1 + (pos+1)/base)^exponent
  float ssmax_base = 2048.0f, ssmax_exponent = 0.1f;
  std::string sinks;          // name of the [Hq] sink parameter, or empty
};

struct GqaAttentionCache {
  Tensor q_lin, k_lin, v;          // projections [T, heads*D]
  RmsNormForward q_norm, k_norm;   // per-head norms
  Tensor q_att, k_att;             // after RoPE / SSMax
  AttentionForward attention;
  Tensor out;                      // [T, Hq*D], rounded
};

// `prefix` is the layer's, e.g. "model.layers.3."; x is the attention input [T, H].
Tensor gqa_attention_forward(const std::string& prefix, const TensorMap& w, const Tensor& x, const TokenContext& ctx,
                             const GqaAttentionSpec& spec, GqaAttentionCache& cache);
// Gradient wrt x of the path through q, k, v; parameter gradients accumulate into grads.
Tensor gqa_attention_backward(const std::string& prefix, const TensorMap& w, const Tensor& x, const TokenContext& ctx,
                              const GqaAttentionSpec& spec, const GqaAttentionCache& cache, const Tensor& d_out,
                              const TensorMap& grads);

}  // namespace atl
