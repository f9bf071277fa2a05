#include "graph/models/beam/model.hpp"
#include "graph/models/beam/block_cache.hpp"

#include <cmath>

#include "graph/models/gqa_attention.hpp"
#include "graph/models/sublayer_run.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/model_parts.hpp"
#include "graph/models/dense_mlp.hpp"
#include "graph/models/moe_mlp.hpp"
#include "kernels/ops/activation.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/experts.hpp"
#include "kernels/ops/gate.hpp"
#include "kernels/ops/matmul.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/ops/router.hpp"

namespace atl {

namespace {

// Depth-scaled residual coefficients for sublayer index idx (MODELS.md §3.2).
std::pair<float, float> residual_coefficients(bool enabled, std::int64_t idx) {
  if (!enabled) return {1.0f, 1.0f};
  const double d = static_cast<double>(idx);
  return {static_cast<float>(1.0 / std::sqrt(d)), static_cast<float>(std::sqrt((d - 1.0) / d))};
}

RouterConfig router_config(const BeamConfig& c) {
  RouterConfig r;
  r.num_experts = c.n_routed_experts;
  r.top_k = c.num_experts_per_tok;
  r.score = ScoreFunction::sigmoid_with_bias;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.norm_topk_prob = c.norm_topk_prob;
  r.norm_topk_prob_top1 = c.norm_topk_prob_top1;
  r.route_scale = c.routed_scaling_factor;
  r.router_weights_fp32 = c.router_weights_fp32;
  return r;
}

MoeMlpSpec beam_moe_spec(const BeamConfig& c) {
  MoeMlpSpec m;
  m.router = router_config(c);
  m.experts.activation = GluActivation::swiglu;
  m.experts.layout = GluLayout::concatenated;
  m.experts.weight_after_down = false;
  m.correction_bias = true;
  m.shared_width = c.n_shared_experts * c.moe_intermediate_size;
  return m;
}

}  // namespace

BeamModel::BeamModel(BeamConfig config) : HiddenStateModel(std::move(config)) {
  const auto& c = config_;
  const std::int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  specs_.push_back(make_param("model.embed_tokens.weight", {c.vocab_size, H}));
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    specs_.push_back(make_param(p + "input_layernorm.weight", {H}, Init::ones));
    specs_.push_back(make_param(p + "self_attn.q_proj.weight", {Hq * D, H}));
    specs_.push_back(make_param(p + "self_attn.k_proj.weight", {Hkv * D, H}));
    specs_.push_back(make_param(p + "self_attn.v_proj.weight", {Hkv * D, H}));
    specs_.push_back(make_param(p + "self_attn.output_gate_proj.weight", {Hq * D, H}));
    specs_.push_back(make_param(p + "self_attn.output_gate_bias", {Hq}, Init::zeros));
    specs_.push_back(make_param(p + "self_attn.o_proj.weight", {H, Hq * D}));
    specs_.push_back(make_param(p + "self_attn.q_norm.weight", {D}, Init::ones));
    specs_.push_back(make_param(p + "self_attn.k_norm.weight", {D}, Init::ones));
    specs_.push_back(make_param(p + "post_attention_layernorm.weight", {H}, Init::ones));
    specs_.push_back(make_param(p + "pre_feedforward_layernorm.weight", {H}, Init::ones));
    if (c.is_sparse(l)) {
      append_moe_mlp_specs(specs_, p, beam_moe_spec(c), H, c.moe_intermediate_size, /*router_island=*/true);
    } else {
      append_dense_mlp_specs(specs_, p, H, c.intermediate_size);
    }
    specs_.push_back(make_param(p + "post_feedforward_layernorm.weight", {H}, Init::ones));
  }
  specs_.push_back(make_param("model.norm.weight", {H}, Init::ones));
  specs_.push_back(make_param("lm_head.weight", {c.vocab_size, H}));
  // The runtime runs each layer as sublayer ops: attention, then the dense MLP or the MoE steps.
  split_into_ops(SublayerSplit{{"pre_feedforward_layernorm.weight"},
                                {"post_feedforward_layernorm.weight"},
                                [this](std::int64_t l) { return config_.is_sparse(l); },
                                [this](std::int64_t) { return config_.n_shared_experts > 0; },
                                {}},  // no mix ops: the input norms run inside attention and router
                 "hidden");
}

Tensor BeamModel::attention_sublayer_forward(std::int64_t layer, const TensorMap& w, const Tensor& hidden,
                                             const TokenContext& ctx, BeamBlockCache& k) const {
  const auto& c = config_;
  const std::string p = layer_prefix(layer);
  const Precision prec = ctx.precision;
  const float eps = c.rms_norm_eps;
  k.h_in = hidden;
  k.ln_in = rmsnorm_forward(hidden, w.at(p + "input_layernorm.weight"), eps, prec);
  const Tensor& x = k.ln_in.y;
  k.gate_lin = project(x, w.at(p + "self_attn.output_gate_proj.weight"), prec);
  gqa_attention_forward(p, w, x, ctx, attention_spec(layer), k.attn);
  k.gated = rounded(output_gate_forward(k.attn.out, k.gate_lin, w.at(p + "self_attn.output_gate_bias")), prec);
  k.a_lin = project(k.gated, w.at(p + "self_attn.o_proj.weight"), prec);
  k.ln_post_attn = rmsnorm_forward(k.a_lin, w.at(p + "post_attention_layernorm.weight"), eps, prec);
  auto [cs1, cr1] = residual_coefficients(c.depth_scaled_residual, 2 * layer + 2);
  k.h_mid = scaled_add(k.ln_post_attn.y, cs1, hidden, cr1, prec);
  return k.h_mid;
}

Tensor BeamModel::mlp_input_forward(std::int64_t layer, const TensorMap& w, const Tensor& h_mid,
                                    const TokenContext& ctx, BeamBlockCache& k) const {
  k.h_mid = h_mid;
  k.ln_pre_ff = rmsnorm_forward(h_mid, w.at(layer_prefix(layer) + "pre_feedforward_layernorm.weight"),
                                config_.rms_norm_eps, ctx.precision);
  k.mlp_in = k.ln_pre_ff.y;
  return k.mlp_in;
}

Tensor BeamModel::mlp_output_forward(std::int64_t layer, const TensorMap& w, const Tensor& m, const TokenContext& ctx,
                                     BeamBlockCache& k) const {
  const Precision prec = ctx.precision;
  k.m_lin = m;
  k.ln_post_ff =
      rmsnorm_forward(m, w.at(layer_prefix(layer) + "post_feedforward_layernorm.weight"), config_.rms_norm_eps, prec);
  auto [cs2, cr2] = residual_coefficients(config_.depth_scaled_residual, 2 * layer + 3);
  return scaled_add(k.ln_post_ff.y, cs2, k.h_mid, cr2, prec);
}

MlpOutputGrads<Tensor> BeamModel::mlp_output_backward(std::int64_t layer, const TensorMap& w, const BeamBlockCache& k,
                                                      const Tensor& d_out, const TokenContext& /*ctx*/,
                                                      const TensorMap& grads) const {
  // out = cs2 * norm(m) + cr2 * h_mid.
  const std::string p = layer_prefix(layer);
  auto [cs2, cr2] = residual_coefficients(config_.depth_scaled_residual, 2 * layer + 3);
  MlpOutputGrads<Tensor> out;
  out.d_residual = scaled(d_out, cr2);
  Tensor gn = grads.at(p + "post_feedforward_layernorm.weight");
  out.d_m = rmsnorm_backward(scaled(d_out, cs2), k.m_lin, w.at(p + "post_feedforward_layernorm.weight"),
                             k.ln_post_ff.rstd, &gn);
  return out;
}

Tensor BeamModel::mlp_input_backward(std::int64_t layer, const TensorMap& w, const BeamBlockCache& k,
                                     const Tensor& d_x2, const Tensor& d_residual, const TensorMap& grads) const {
  const std::string p = layer_prefix(layer);
  Tensor d_h_mid = d_residual;
  Tensor gpre = grads.at(p + "pre_feedforward_layernorm.weight");
  add_inplace(d_h_mid,
              rmsnorm_backward(d_x2, k.h_mid, w.at(p + "pre_feedforward_layernorm.weight"), k.ln_pre_ff.rstd, &gpre));
  return d_h_mid;
}

Tensor BeamModel::attention_sublayer_backward(std::int64_t layer, const TensorMap& w, const BeamBlockCache& k,
                                              const Tensor& d_h_mid, const TokenContext& ctx,
                                              const TensorMap& grads) const {
  const auto& c = config_;
  const std::string p = layer_prefix(layer);
  auto g = [&](const char* name) { return grads.at(p + name); };
  // Attention sublayer: h_mid = cs1 * norm(a) + cr1 * h_in.
  auto [cs1, cr1] = residual_coefficients(c.depth_scaled_residual, 2 * layer + 2);
  Tensor d_h_in = scaled(d_h_mid, cr1);
  Tensor gpost = g("post_attention_layernorm.weight");
  Tensor d_a = rmsnorm_backward(scaled(d_h_mid, cs1), k.a_lin, w.at(p + "post_attention_layernorm.weight"),
                                k.ln_post_attn.rstd, &gpost);
  Tensor go = g("self_attn.o_proj.weight");
  Tensor d_gated = project_backward(k.gated, w.at(p + "self_attn.o_proj.weight"), d_a, &go, ctx.precision);
  Tensor gbias = g("self_attn.output_gate_bias");
  OutputGateGrads og =
      output_gate_backward(d_gated, k.attn.out, k.gate_lin, w.at(p + "self_attn.output_gate_bias"), &gbias);
  const Tensor& x = k.ln_in.y;
  Tensor d_x = gqa_attention_backward(p, w, x, ctx, attention_spec(layer), k.attn, og.d_o, grads);
  Tensor gg = g("self_attn.output_gate_proj.weight");
  add_inplace(d_x, project_backward(x, w.at(p + "self_attn.output_gate_proj.weight"), og.d_gate, &gg, ctx.precision));
  Tensor gin = g("input_layernorm.weight");
  add_inplace(d_h_in, rmsnorm_backward(d_x, k.h_in, w.at(p + "input_layernorm.weight"), k.ln_in.rstd, &gin));
  return d_h_in;
}

MoeMlpSpec BeamModel::moe_spec() const { return beam_moe_spec(config_); }

Tensor BeamModel::routing_indices(const BeamBlockCache& cache) { return cache.moe.routing.indices; }

GqaAttentionSpec BeamModel::attention_spec(std::int64_t layer) const {
  const auto& c = config_;
  GqaAttentionSpec s;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.norm_eps = c.rms_norm_eps;
  s.sliding = c.is_sliding(layer);
  s.window = c.sliding_window;
  s.rope_theta = c.rope_theta;
  s.ssmax = true;  // full layers: NoPE + SSMax (MODELS.md §10.4.2)
  s.ssmax_base = c.ssmax_base;
  s.ssmax_exponent = c.ssmax_exponent;
  return s;
}

LmHeadSpec BeamModel::head_spec() const {
  const auto& c = config_;
  return {"model.norm.weight",   "lm_head.weight",          c.rms_norm_eps,       c.vocab_size,
          c.unpadded_vocab_size, c.final_logit_softcapping, /*round_logits=*/true};  // Beam's head is bulk (MODELS.md
                                                                                     // §10.4.5)
}

std::unique_ptr<MicroBatchRun> BeamModel::start(const Batch& micro_batch, Precision precision, float grad_scale) const {
  return std::make_unique<SublayerRun<BeamModel>>(*this, micro_batch, precision, grad_scale);
}

LossSum BeamModel::forward(const TensorMap& w, const Batch& batch, Precision precision, Tensor* logits_out) const {
  return sublayer_forward(*this, w, batch, precision, logits_out);
}

}  // namespace atl
