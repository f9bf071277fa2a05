#include "graph/models/flint/model.hpp"
#include "graph/models/flint/block_cache.hpp"

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
#include "kernels/ops/matmul.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/ops/router.hpp"

namespace atl {

namespace {

constexpr const char* kSinks = "self_attn._fp32_params.sinks";

RouterConfig router_config(const FlintConfig& c) {
  RouterConfig r;
  r.num_experts = c.num_experts;
  r.top_k = c.num_experts_per_tok;
  r.score = ScoreFunction::softmax_before_topk;
  r.norm_topk_prob = c.norm_topk_prob;
  r.router_weights_fp32 = c.router_weights_fp32;
  return r;
}

MoeMlpSpec flint_moe_spec(const FlintConfig& c) {
  MoeMlpSpec m;
  m.router = router_config(c);
  m.experts.activation = GluActivation::swiglu;
  m.experts.layout = GluLayout::concatenated;
  m.experts.weight_after_down = true;  // MODELS.md §2.2, §10.3.4
  m.correction_bias = false;
  m.shared_width = c.shared_expert_intermediate_size;  // ungated, added with weight 1
  return m;
}

}  // namespace

FlintModel::FlintModel(FlintConfig config) : HiddenStateModel(std::move(config)) {
  const auto& c = config_;
  const std::int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  specs_.push_back(make_param("model.embed_tokens.weight", {c.vocab_size, H}));
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    specs_.push_back(make_param(p + "input_layernorm.weight", {H}, Init::ones));
    specs_.push_back(make_param(p + "self_attn.q_proj.weight", {Hq * D, H}));
    specs_.push_back(make_param(p + "self_attn.k_proj.weight", {Hkv * D, H}));
    specs_.push_back(make_param(p + "self_attn.v_proj.weight", {Hkv * D, H}));
    specs_.push_back(make_param(p + "self_attn.o_proj.weight", {H, Hq * D}));
    specs_.push_back(make_param(p + "self_attn.q_norm.weight", {D}, Init::ones));
    specs_.push_back(make_param(p + "self_attn.k_norm.weight", {D}, Init::ones));
    specs_.push_back(make_param(p + kSinks, {Hq}, Init::zeros, /*island=*/true));
    specs_.push_back(make_param(p + "post_attention_layernorm.weight", {H}, Init::ones));
    if (c.is_sparse(l)) {
      // The router is bulk: bf16 in bf16 runs (§10.3.4).
      append_moe_mlp_specs(specs_, p, flint_moe_spec(c), H, c.moe_intermediate_size, /*router_island=*/false);
    } else {
      append_dense_mlp_specs(specs_, p, H, c.intermediate_size);
    }
  }
  specs_.push_back(make_param("model.norm.weight", {H}, Init::ones));
  specs_.push_back(make_param("lm_head.weight", {c.vocab_size, H}, Init::normal, /*island=*/true));
  // The runtime runs each layer as sublayer ops: attention, then the dense MLP or the MoE steps.
  split_into_ops(SublayerSplit{{"post_attention_layernorm.weight"},
                                {},
                                [this](std::int64_t l) { return config_.is_sparse(l); },
                                [this](std::int64_t) { return config_.shared_expert_intermediate_size > 0; },
                                {}},  // no mix ops: the input norms run inside attention and router
                 "hidden");
}

Tensor FlintModel::attention_sublayer_forward(std::int64_t layer, const TensorMap& w, const Tensor& hidden,
                                              const TokenContext& ctx, FlintBlockCache& k) const {
  const auto& c = config_;
  const std::string p = layer_prefix(layer);
  const Precision prec = ctx.precision;
  const float eps = c.rms_norm_eps;
  // Attention: h_mid = h + o_proj(attn(input_layernorm(h))).
  k.h_in = hidden;
  k.ln_in = rmsnorm_forward(hidden, w.at(p + "input_layernorm.weight"), eps, prec);
  const Tensor& x = k.ln_in.y;
  gqa_attention_forward(p, w, x, ctx, attention_spec(layer), k.attn);
  k.a_lin = project(k.attn.out, w.at(p + "self_attn.o_proj.weight"), prec);
  k.h_mid = scaled_add(k.a_lin, 1.0f, hidden, 1.0f, prec);
  return k.h_mid;
}

Tensor FlintModel::mlp_input_forward(std::int64_t layer, const TensorMap& w, const Tensor& h_mid,
                                     const TokenContext& ctx, FlintBlockCache& k) const {
  // out = h_mid + mlp(post_attention_layernorm(h_mid)).
  k.h_mid = h_mid;
  k.ln_post = rmsnorm_forward(h_mid, w.at(layer_prefix(layer) + "post_attention_layernorm.weight"),
                              config_.rms_norm_eps, ctx.precision);
  k.mlp_in = k.ln_post.y;
  return k.mlp_in;
}

Tensor FlintModel::mlp_output_forward(std::int64_t /*layer*/, const TensorMap& /*w*/, const Tensor& m,
                                      const TokenContext& ctx, FlintBlockCache& k) const {
  return scaled_add(m, 1.0f, k.h_mid, 1.0f, ctx.precision);
}

MlpOutputGrads<Tensor> FlintModel::mlp_output_backward(std::int64_t /*layer*/, const TensorMap& /*w*/,
                                                       const FlintBlockCache& /*k*/, const Tensor& d_out,
                                                       const TokenContext& /*ctx*/, const TensorMap& /*grads*/) const {
  return {d_out, d_out};  // out = h_mid + m
}

Tensor FlintModel::mlp_input_backward(std::int64_t layer, const TensorMap& w, const FlintBlockCache& k,
                                      const Tensor& d_x2, const Tensor& d_residual, const TensorMap& grads) const {
  const std::string p = layer_prefix(layer);
  Tensor gpost = grads.at(p + "post_attention_layernorm.weight");
  Tensor d_h_mid = rmsnorm_backward(d_x2, k.h_mid, w.at(p + "post_attention_layernorm.weight"), k.ln_post.rstd, &gpost);
  add_inplace(d_h_mid, d_residual);
  return d_h_mid;
}

Tensor FlintModel::attention_sublayer_backward(std::int64_t layer, const TensorMap& w, const FlintBlockCache& k,
                                               const Tensor& d_h_mid, const TokenContext& ctx,
                                               const TensorMap& grads) const {
  const std::string p = layer_prefix(layer);
  auto g = [&](const std::string& name) { return grads.at(p + name); };
  // Attention sublayer: h_mid = h_in + a, so d_a = d_h_mid and d_h_in starts as d_h_mid.
  Tensor go = g("self_attn.o_proj.weight");
  Tensor d_attn = project_backward(k.attn.out, w.at(p + "self_attn.o_proj.weight"), d_h_mid, &go, ctx.precision);
  Tensor d_x = gqa_attention_backward(p, w, k.ln_in.y, ctx, attention_spec(layer), k.attn, d_attn, grads);
  Tensor gin = g("input_layernorm.weight");
  Tensor d_h_in = rmsnorm_backward(d_x, k.h_in, w.at(p + "input_layernorm.weight"), k.ln_in.rstd, &gin);
  add_inplace(d_h_in, d_h_mid);
  return d_h_in;
}

MoeMlpSpec FlintModel::moe_spec() const { return flint_moe_spec(config_); }

Tensor FlintModel::routing_indices(const FlintBlockCache& cache) { return cache.moe.routing.indices; }

GqaAttentionSpec FlintModel::attention_spec(std::int64_t layer) const {
  const auto& c = config_;
  GqaAttentionSpec s;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.norm_eps = c.rms_norm_eps;
  s.sliding = c.is_sliding(layer);
  s.window = c.sliding_window;  // visible 0 <= q-k <= w-1 (MODELS.md §10.3.5)
  s.rope_theta = c.rope_theta;
  s.ssmax = false;   // full layers are plain NoPE
  s.sinks = kSinks;  // on every layer (§10.3.1)
  return s;
}

LmHeadSpec FlintModel::head_spec() const {
  const auto& c = config_;
  // fp32 island: bf16-valued hidden times the fp32 weight, fp32 logits never rounded, no softcap.
  return {"model.norm.weight",   "lm_head.weight", c.rms_norm_eps, c.vocab_size, c.unpadded_vocab_size, 0.0f,
          /*round_logits=*/false};
}

std::unique_ptr<MicroBatchRun> FlintModel::start(const Batch& micro_batch, Precision precision,
                                                 float grad_scale) const {
  return std::make_unique<SublayerRun<FlintModel>>(*this, micro_batch, precision, grad_scale);
}

LossSum FlintModel::forward(const TensorMap& w, const Batch& batch, Precision precision, Tensor* logits_out) const {
  return sublayer_forward(*this, w, batch, precision, logits_out);
}

}  // namespace atl
