// What a Flint block's forward keeps for its backward (model.hpp declares it only, so the headers
// most code includes stay small). Public for the tests that inspect a block's activations
// (MODELS.md §10.1.12's bf16 points); the model's pieces are its only writers.
#pragma once
#include "graph/models/dense_mlp.hpp"
#include "graph/models/gqa_attention.hpp"
#include "graph/models/moe_mlp.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct FlintBlockCache {
  Tensor h_in;
  RmsNormForward ln_in;    // input_layernorm
  GqaAttentionCache attn;  // q/k/v, norms, RoPE, attention with sinks; attn.out [T, Hq*D]
  Tensor a_lin;            // o_proj output
  Tensor h_mid;
  RmsNormForward ln_post;  // post_attention_layernorm
  Tensor mlp_in;  // the MLP's input: ln_post.y
  DenseMlpCache dense;
  // sparse MLP: router, routed experts, shared expert
  MoeMlpCache moe;
};

}  // namespace atl
