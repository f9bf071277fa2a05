// What Inkling2's pieces keep for their backward (model.hpp declares them only, so the headers
// most code includes stay small). Public for the tests that inspect a layer's activations
// (MODELS.md §10.1.12's bf16 points); the model's pieces are their only writers.
#pragma once
#include <vector>

#include "graph/models/dense_mlp.hpp"
#include "graph/models/inkling2/model.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/moe_mlp.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/l2_clip.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/ops/residual_mix.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct Inkling2EmbedCache {
  Tensor input_ids;  // i64 [T]
  Tensor embedded;   // [T, H] lookup
  RmsNormForward norm;
};

struct Inkling2AttnCache {
  Tensor xq, xk, xv;                  // attention inputs [T, H] (the same tensor on local layers)
  Tensor q_lin, k_lin, v_lin, r_lin;  // qkvr blocks [T, heads*width]
  Tensor k_taps, v_taps;              // full layers: dynamic conv taps [T, Hkv*W]
  Tensor k_conv, v_conv;              // after the short convs [T, Hkv*D]
  L2ClipForward q_clip, k_clip, r_clip;
  RmsNormForward v_norm;   // optional value norm (no gamma)
  Tensor v_att;            // the values attention reads [T, Hkv*D]
  Tensor rel;              // clipped r @ relative_table [T*Hq, R+1] (profiles | sink)
  Tensor lambda;           // full-layer log scaling [T] (undefined when off)
  Tensor q_att;            // q attention reads [T, Hq*D]
  Tensor profiles, sinks;  // [B, Hq, S, R], [B, Hq, S]
  AttentionForward attn;
  Tensor o;                           // attention output [T, Hq*D]
  Tensor gate_lin, gate_full, gated;  // optional output gate
  Tensor a_lin;                       // wo_ud output [T, H]
};

struct Inkling2LayerCache {
  Inkling2ResidualState in;
  Inkling2ResidualState mid;  // after the attention sublayer: the MLP's input state and residual
  std::vector<ResidualMixForward> attn_mix;  // 1 (local) or 3 (full: q, k, v inputs)
  std::vector<RmsNormForward> attn_norm;
  Inkling2AttnCache attn;
  std::vector<Tensor> mlp_sources;
  ResidualMixForward mlp_mix;
  RmsNormForward mlp_norm;
  Tensor mlp_in;  // the MoE input (mlp_norm's output)
  MoeMlpCache moe;
  DenseMlpCache dense;  // unused: every Inkling2 layer is sparse (the shared run has a dense path)
  Tensor experts_out;   // the MoE output, input of mlp_sconv
};

struct Inkling2HeadCache {
  std::vector<Tensor> sources;
  ResidualMixForward mix;  // output_query's depth mix
  LmHeadCache head;        // norm, lm_head, softcap, mask, loss
};

}  // namespace atl
