// What a Beam block's forward keeps for its backward (model.hpp declares it only, so the headers
// most code includes stay small). Public for the tests that inspect a block's activations
// (MODELS.md §10.1.12's bf16 points); the model's pieces are its only writers.
#pragma once
#include "graph/models/dense_mlp.hpp"
#include "graph/models/gqa_attention.hpp"
#include "graph/models/moe_mlp.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct BeamBlockCache {
  Tensor h_in;
  RmsNormForward ln_in;    // input_layernorm
  GqaAttentionCache attn;  // q/k/v, norms, RoPE / SSMax, attention; attn.out [T, Hq*D]
  Tensor gate_lin;         // output_gate_proj(x) [T, Hq*D]
  Tensor gated;            // after the output gate
  Tensor a_lin;            // o_proj output
  RmsNormForward ln_post_attn;
  Tensor h_mid;
  RmsNormForward ln_pre_ff;
  Tensor mlp_in;  // the MLP's input: ln_pre_ff.y
  DenseMlpCache dense;
  // sparse MLP: router, routed experts, shared experts
  MoeMlpCache moe;
  Tensor m_lin;
  RmsNormForward ln_post_ff;
};

}  // namespace atl
