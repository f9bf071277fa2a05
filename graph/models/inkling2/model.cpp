#include "graph/models/inkling2/model.hpp"
#include "graph/models/inkling2/caches.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/model_parts.hpp"
#include "graph/models/moe_mlp.hpp"
#include "graph/models/dense_mlp.hpp"

#include <cmath>
#include <stdexcept>

#include "kernels/ops/attention.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/experts.hpp"
#include "kernels/ops/gate.hpp"
#include "kernels/ops/l2_clip.hpp"
#include "kernels/ops/matmul.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/ops/relative_attention.hpp"
#include "kernels/ops/residual_mix.hpp"
#include "kernels/ops/router.hpp"
#include "kernels/ops/short_conv.hpp"

namespace atl {

std::vector<Tensor> Inkling2ResidualState::sources() const {
  std::vector<Tensor> out = completed;
  if (partial.defined()) out.push_back(partial);
  return out;
}

namespace {

// Depth queries are vectors (one per mix) even when stored as [Q, H]: no weight decay.
ParamSpec query_spec(std::string name, Shape shape) {
  ParamSpec s = make_param(std::move(name), std::move(shape), Init::zeros, /*island=*/true);
  s.weight_decay = false;
  return s;
}

// acc += g, making acc a private copy on first use (gradients are never aliased).
void accumulate(Tensor& acc, const Tensor& g) {
  if (!g.defined()) return;
  if (!acc.defined()) {
    acc = g.clone();
  } else {
    add_inplace(acc, g);
  }
}

RouterConfig router_config(const Inkling2Config& c) {
  RouterConfig r;
  r.num_experts = c.n_routed_experts;
  r.top_k = c.num_experts_per_tok;
  r.score = ScoreFunction::sigmoid_with_bias;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.norm_topk_prob = c.norm_topk_prob;
  r.norm_topk_prob_top1 = false;
  r.route_scale = c.route_scale;
  r.router_weights_fp32 = c.router_weights_fp32;
  return r;
}

MoeMlpSpec inkling2_moe_spec(const Inkling2Config& c) {
  MoeMlpSpec m;
  m.router = router_config(c);
  m.experts.activation = GluActivation::situ;
  m.experts.layout = GluLayout::interleaved;
  m.experts.weight_after_down = false;  // routing weight before the down GEMM
  m.experts.beta_gate = c.expert_gate_cap;
  m.experts.beta_up = c.expert_up_cap;
  m.correction_bias = true;
  m.shared_width = 0;  // no shared expert: MODELS.md §10.2.7
  return m;
}

// Row q of a [Q, H] depth-query tensor as a view.
Tensor query_row(const Tensor& queries, std::int64_t q) { return queries.slice_rows(q, q + 1); }

// Row blocks of self_attn.qkvr (MODELS.md §10.2.2).
struct QkvrBlocks {
  std::int64_t q, k, v, r, kt, vt, end;  // start rows; end = total
};
QkvrBlocks qkvr_blocks(const Inkling2Config& c, bool local) {
  const std::int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  QkvrBlocks b;
  b.q = 0;
  b.k = b.q + Hq * D;
  b.v = b.k + Hkv * D;
  b.r = b.v + Hkv * D;
  b.kt = b.r + Hq * c.d_rel;
  b.vt = b.kt + (local ? 0 : Hkv * c.conv_kernel_size);
  b.end = b.vt + (local ? 0 : Hkv * c.conv_kernel_size);
  return b;
}

// λ_t = 1 + α log(max(1, (pos_t + 1) / n_floor)) on document positions (MODELS.md §1.4.6).
Tensor log_scaling(const Inkling2Config& c, const Tensor& positions) {
  Tensor lambda = Tensor::empty({positions.numel()});
  const std::int64_t* pos = positions.data<std::int64_t>();
  for (std::int64_t t = 0; t < positions.numel(); ++t) {
    const double ratio = static_cast<double>(pos[t] + 1) / c.log_scaling_n_floor;
    lambda.data<float>()[t] = static_cast<float>(1.0 + c.log_scaling_alpha * std::log(std::max(1.0, ratio)));
  }
  return lambda;
}

// x [T, width*k] rows scaled by λ_t, rounded.
Tensor scale_rows(const Tensor& x, const Tensor& lambda, Precision p) {
  Tensor y = Tensor::empty(x.shape());
  const std::int64_t T = lambda.numel(), row = x.numel() / T;
  for (std::int64_t t = 0; t < T; ++t) {
    const float l = lambda.data<float>()[t];
    for (std::int64_t i = 0; i < row; ++i)
      y.data<float>()[t * row + i] = round_activation(p, l * x.data<float>()[t * row + i]);
  }
  return y;
}

}  // namespace

Inkling2Model::Inkling2Model(Inkling2Config config) : FamilyModel(std::move(config)) {
  const auto& c = config_;
  const std::int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, W = c.conv_kernel_size;
  specs_.push_back(make_param("embed_tokens.weight", {c.vocab_size, H}));
  specs_.push_back(make_param("embed_norm.weight", {H}, Init::ones));
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    const bool local = c.is_local(l);
    if (c.attn_query_count(l) > 0) specs_.push_back(query_spec(p + "attn_query.weight", {c.attn_query_count(l), H}));
    for (std::int64_t i = 0; i < c.attn_norm_count(l); ++i) {
      specs_.push_back(make_param(p + "attn_norms." + std::to_string(i) + ".weight", {H}, Init::ones));
    }
    specs_.push_back(make_param(p + "self_attn.qkvr.weight", {c.qkvr_rows(l), H}));
    specs_.push_back(make_param(p + "self_attn.q_l2_clip.scale", {D}, Init::ones, /*island=*/true));
    specs_.push_back(make_param(p + "self_attn.rel_l2_clip.scale", {c.d_rel}, Init::ones, /*island=*/true));
    specs_.push_back(make_param(p + "self_attn.relative_table", {c.d_rel, c.relative_extent(l) + 1}));
    if (local) {
      specs_.push_back(make_param(p + "self_attn.k_sconv.weight", {c.num_key_value_heads, W}));
      specs_.push_back(make_param(p + "self_attn.v_sconv.weight", {c.num_key_value_heads, W}));
    }
    if (c.use_attention_gate) specs_.push_back(make_param(p + "self_attn.gate.weight", {Hq, H}));
    specs_.push_back(make_param(p + "self_attn.wo_ud.weight", {H, Hq * D}));
    specs_.push_back(make_param(p + "attn_sconv.weight", {H / D, W}));
    specs_.push_back(query_spec(p + "mlp_query.weight", {1, H}));
    specs_.push_back(make_param(p + "mlp_norm.weight", {H}, Init::ones));
    append_moe_mlp_specs(specs_, p, inkling2_moe_spec(c), H, c.moe_intermediate_size, /*router_island=*/true);
    specs_.push_back(make_param(p + "mlp_sconv.weight", {H / D, W}));
  }
  ParamSpec out_query = query_spec("output_query.weight", {H});
  specs_.push_back(out_query);
  specs_.push_back(make_param("norm.weight", {H}, Init::ones));
  specs_.push_back(make_param("lm_head.weight", {c.vocab_size, H}));
  // attention_mix reads attn_query/attn_norms, attention the rest of the attention side; mlp_mix
  // reads mlp_query and mlp_norm (-> the router's input); combine mlp_sconv and the residual add.
  split_into_ops(SublayerSplit{{"mlp_query.weight", "mlp_norm.weight"},
                                {"mlp_sconv.weight"},
                                [](std::int64_t) { return true; },
                                [](std::int64_t) { return false; },  // no shared expert (MODELS.md §10.2.7)
                                {"attn_query.", "attn_norms."}},
                 "state");
}

std::map<std::string, std::vector<TensorMeta>> Inkling2Model::activation_metas(std::int64_t rows, std::int64_t seq) const {
  // The residual state: its completed blocks, then the partial (MODELS.md §1.3); a boundary
  // layer's attention sublayer commits the incoming partial as one more block.
  ActivationShapes a;
  a.hidden = config_.hidden_size;
  a.vocab = config_.vocab_size;
  a.top_k = [this](std::int64_t) { return config_.num_experts_per_tok; };
  a.attention_inputs = [this](std::int64_t layer) { return config_.attn_norm_count(layer); };
  a.state = [this](std::int64_t layer, bool mid, std::int64_t tokens) {
    const std::int64_t completed =
        config_.completed_blocks_before(layer) + (mid && config_.is_boundary(layer) ? 1 : 0);
    std::vector<TensorMeta> out;
    for (std::int64_t b = 0; b < completed; ++b) {
      out.push_back({"completed." + std::to_string(b), {tokens, config_.hidden_size}, DType::f32});
    }
    out.push_back({"partial", {tokens, config_.hidden_size}, DType::f32});
    return out;
  };
  return sublayer_metas(a, rows, seq);
}

// ------------------------------------------------------------------------------------------------
// Embedding

Inkling2ResidualState Inkling2Model::embed_forward(const TensorMap& w, const Tensor& input_ids, const TokenContext& ctx,
                                                   std::shared_ptr<Inkling2EmbedCache>* cache_out) const {
  auto cache = std::make_shared<Inkling2EmbedCache>();
  cache->input_ids = input_ids.reshape({input_ids.numel()});
  cache->embedded = embedding_forward(w.at("embed_tokens.weight"), cache->input_ids);  // a bf16 lookup is exact
  cache->norm = rmsnorm_forward(cache->embedded, w.at("embed_norm.weight"), config_.rms_norm_eps, ctx.precision);
  Inkling2ResidualState state;
  state.partial = cache->norm.y;
  if (cache_out) *cache_out = std::move(cache);
  return state;
}

void Inkling2Model::embed_backward(const TensorMap& w, const Inkling2EmbedCache& cache,
                                   const Inkling2StateGrad& d_state, const TensorMap& grads) const {
  if (!d_state.completed.empty()) throw std::logic_error("inkling2: the embedding state has no completed blocks");
  Tensor gn = grads.at("embed_norm.weight");
  Tensor d_e = rmsnorm_backward(d_state.partial, cache.embedded, w.at("embed_norm.weight"), cache.norm.rstd, &gn);
  embedding_backward(d_e, cache.input_ids, grads.at("embed_tokens.weight"));
}

// ------------------------------------------------------------------------------------------------
// Decoder layer

namespace {

struct AttnWeights {
  Tensor q, k, v, r, kt, vt;  // row-block views of qkvr
};
AttnWeights attn_weights(const Tensor& qkvr, const QkvrBlocks& b, bool local) {
  AttnWeights a;
  a.q = qkvr.slice_rows(b.q, b.k);
  a.k = qkvr.slice_rows(b.k, b.v);
  a.v = qkvr.slice_rows(b.v, b.r);
  a.r = qkvr.slice_rows(b.r, b.kt);
  if (!local) {
    a.kt = qkvr.slice_rows(b.kt, b.vt);
    a.vt = qkvr.slice_rows(b.vt, b.end);
  }
  return a;
}

}  // namespace

std::vector<Tensor> Inkling2Model::attention_mix_forward(std::int64_t layer, const TensorMap& w,
                                                         const Inkling2ResidualState& state, const TokenContext& ctx,
                                                         Inkling2LayerCache& k) const {
  const auto& c = config_;
  const std::string p = layer_prefix(layer);
  const Precision prec = ctx.precision;
  const float eps = c.rms_norm_eps;
  const bool local = c.is_local(layer);
  if (!state.partial.defined() ||
      static_cast<std::int64_t>(state.completed.size()) != c.completed_blocks_before(layer)) {
    throw std::logic_error("inkling2 layer " + std::to_string(layer) + ": expected " +
                           std::to_string(c.completed_blocks_before(layer)) + " completed blocks and a partial, got " +
                           std::to_string(state.completed.size()));
  }
  k.in = state;
  Inkling2AttnCache& a = k.attn;

  // 1. AttnRes mixes of the depth sources and the attention input norms.
  const std::vector<Tensor> src = state.sources();
  const std::int64_t mixes = c.attn_norm_count(layer);
  for (std::int64_t i = 0; i < mixes; ++i) {
    Tensor query = layer == 0 ? Tensor() : query_row(w.at(p + "attn_query.weight"), i);
    k.attn_mix.push_back(residual_mix_forward(src, query, eps, prec));  // N = 1 at layer 0: the identity
    k.attn_norm.push_back(
        rmsnorm_forward(k.attn_mix.back().out, w.at(p + "attn_norms." + std::to_string(i) + ".weight"), eps, prec));
  }
  a.xq = k.attn_norm[0].y;
  a.xk = local ? a.xq : k.attn_norm[1].y;
  a.xv = local ? a.xq : k.attn_norm[2].y;

  std::vector<Tensor> inputs;  // the normed mixes attention reads: xq (and xk, xv on full layers)
  for (const RmsNormForward& n : k.attn_norm) inputs.push_back(n.y);
  return inputs;
}

Inkling2ResidualState Inkling2Model::attention_core_forward(std::int64_t layer, const TensorMap& w,
                                                            const Inkling2ResidualState& state,
                                                            const TokenContext& ctx, Inkling2LayerCache& k) const {
  const auto& c = config_;
  const std::string p = layer_prefix(layer);
  const Precision prec = ctx.precision;
  const float eps = c.rms_norm_eps;
  const std::int64_t T = ctx.tokens(), B = ctx.rows, S = ctx.seq, D = c.head_dim, Hq = c.num_attention_heads,
                     Hkv = c.num_key_value_heads, dr = c.d_rel, W = c.conv_kernel_size;
  const bool local = c.is_local(layer);
  const std::int64_t R = c.relative_extent(layer);
  Inkling2AttnCache& a = k.attn;

  // 2. Boundary commit: the pre-attention partial becomes a completed block.
  Inkling2ResidualState out;
  out.completed = state.completed;
  Tensor partial = state.partial;
  if (c.is_boundary(layer)) {
    out.completed.push_back(state.partial);
    partial = Tensor();
  }

  // 3. Attention (MODELS.md §10.2.1).
  const QkvrBlocks blocks = qkvr_blocks(c, local);
  const AttnWeights aw = attn_weights(w.at(p + "self_attn.qkvr.weight"), blocks, local);
  a.q_lin = project(a.xq, aw.q, prec);
  a.r_lin = project(a.xq, aw.r, prec);
  a.k_lin = project(a.xk, aw.k, prec);
  a.v_lin = project(a.xv, aw.v, prec);
  if (local) {
    a.k_conv = short_conv_forward(a.k_lin, w.at(p + "self_attn.k_sconv.weight"), ctx.positions, ctx.valid, prec);
    a.v_conv = short_conv_forward(a.v_lin, w.at(p + "self_attn.v_sconv.weight"), ctx.positions, ctx.valid, prec);
  } else {
    a.k_taps = project(a.xk, aw.kt, prec);
    a.v_taps = project(a.xv, aw.vt, prec);
    a.k_conv = dynamic_short_conv_forward(a.k_lin.reshape({T, Hkv, D}), a.k_taps.reshape({T, Hkv, W}), ctx.positions,
                                          ctx.valid, prec)
                   .reshape({T, Hkv * D});
    a.v_conv = dynamic_short_conv_forward(a.v_lin.reshape({T, Hkv, D}), a.v_taps.reshape({T, Hkv, W}), ctx.positions,
                                          ctx.valid, prec)
                   .reshape({T, Hkv * D});
  }
  a.q_clip = l2_clip_forward(a.q_lin.reshape({T * Hq, D}), w.at(p + "self_attn.q_l2_clip.scale"), c.radius_q(), prec);
  a.k_clip = l2_clip_forward(a.k_conv.reshape({T * Hkv, D}), Tensor(), c.radius_k(), prec);
  a.r_clip =
      l2_clip_forward(a.r_lin.reshape({T * Hq, dr}), w.at(p + "self_attn.rel_l2_clip.scale"), c.radius_r(), prec);
  if (c.use_value_norm_no_gamma) {
    a.v_norm = rmsnorm_forward(a.v_conv.reshape({T * Hkv, D}), Tensor(), eps, prec);
    a.v_att = a.v_norm.y.reshape({T, Hkv * D});
  } else {
    a.v_att = a.v_conv;
  }
  // Relative profiles and the sink logit from the clipped r: [T*Hq, dr] @ relative_table [dr, R+1].
  a.rel = rounded(matmul(a.r_clip.y, w.at(p + "self_attn.relative_table")), prec);
  const bool log_scaled = !local && c.log_scaling_n_floor > 0;
  a.q_att = a.q_clip.y.reshape({T, Hq * D});
  if (log_scaled) {
    a.lambda = log_scaling(c, ctx.positions);
    a.q_att = scale_rows(a.q_att, a.lambda, prec);
  }
  a.profiles = Tensor::empty({B, Hq, S, R});
  a.sinks = Tensor::empty({B, Hq, S});
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      for (std::int64_t s = 0; s < S; ++s) {
        const float* rel_row = a.rel.data<float>() + ((b * S + s) * Hq + h) * (R + 1);
        float* prof = a.profiles.data<float>() + ((b * Hq + h) * S + s) * R;
        const float lambda = log_scaled ? a.lambda.data<float>()[b * S + s] : 1.0f;
        for (std::int64_t d = 0; d < R; ++d)
          prof[d] = log_scaled ? round_activation(prec, lambda * rel_row[d]) : rel_row[d];
        a.sinks.data<float>()[(b * Hq + h) * S + s] = rel_row[R];  // the sink is not log-scaled
      }
    }
  }
  AttentionOptions opts;
  opts.window = local ? c.sliding_window_size : 0;
  opts.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  a.attn =
      relative_attention_forward(a.q_att.reshape({B, S, Hq, D}), a.k_clip.y.reshape({B, S, Hkv, D}),
                                 a.v_att.reshape({B, S, Hkv, D}), ctx.positions, ctx.valid, a.profiles, a.sinks, opts);
  a.o = rounded_copy(a.attn.out.reshape({T, Hq * D}), prec);
  Tensor o_proj_in = a.o;
  if (c.use_attention_gate) {
    a.gate_lin = project(a.xq, w.at(p + "self_attn.gate.weight"), prec);  // [T, Hq]
    a.gate_full = Tensor::empty({T, Hq * D});
    for (std::int64_t i = 0; i < T * Hq; ++i) {
      std::fill_n(a.gate_full.data<float>() + i * D, D, a.gate_lin.data<float>()[i]);
    }
    a.gated = rounded(output_gate_forward(a.o, a.gate_full, Tensor::zeros({Hq})), prec);
    o_proj_in = a.gated;
  }
  a.a_lin = project(o_proj_in, w.at(p + "self_attn.wo_ud.weight"), prec);
  Tensor attn_out = short_conv_forward(a.a_lin, w.at(p + "attn_sconv.weight"), ctx.positions, ctx.valid, prec);
  partial = partial.defined() ? scaled_add(partial, 1.0f, attn_out, 1.0f, prec) : attn_out;

  out.partial = partial;
  k.mid = out;
  return out;
}

Inkling2ResidualState Inkling2Model::attention_sublayer_forward(std::int64_t layer, const TensorMap& w,
                                                                const Inkling2ResidualState& state,
                                                                const TokenContext& ctx, Inkling2LayerCache& k) const {
  attention_mix_forward(layer, w, state, ctx, k);
  return attention_core_forward(layer, w, state, ctx, k);
}

Tensor Inkling2Model::mlp_input_forward(std::int64_t layer, const TensorMap& w, const Inkling2ResidualState& mid,
                                        const TokenContext& ctx, Inkling2LayerCache& k) const {
  // The MoE reads the MLP mix of the mid state's sources, normed.
  const std::string p = layer_prefix(layer);
  k.mlp_sources = mid.sources();
  k.mlp_mix = residual_mix_forward(k.mlp_sources, query_row(w.at(p + "mlp_query.weight"), 0), config_.rms_norm_eps,
                                   ctx.precision);
  k.mlp_norm = rmsnorm_forward(k.mlp_mix.out, w.at(p + "mlp_norm.weight"), config_.rms_norm_eps, ctx.precision);
  k.mlp_in = k.mlp_norm.y;
  return k.mlp_in;
}

Inkling2ResidualState Inkling2Model::mlp_output_forward(std::int64_t layer, const TensorMap& w, const Tensor& m,
                                                        const TokenContext& ctx, Inkling2LayerCache& k) const {
  // partial_out = partial_mid + mlp_sconv(m); the completed blocks pass through.
  k.experts_out = m;
  const Tensor conv =
      short_conv_forward(m, w.at(layer_prefix(layer) + "mlp_sconv.weight"), ctx.positions, ctx.valid, ctx.precision);
  Inkling2ResidualState out;
  out.completed = k.mid.completed;
  out.partial = scaled_add(k.mid.partial, 1.0f, conv, 1.0f, ctx.precision);
  return out;
}

Inkling2ResidualState Inkling2Model::layer_forward(std::int64_t layer, const TensorMap& w,
                                                   const Inkling2ResidualState& state, const TokenContext& ctx,
                                                   std::shared_ptr<Inkling2LayerCache>* cache_out) const {
  auto cache = std::make_shared<Inkling2LayerCache>();
  Inkling2ResidualState out =
      mlp_sublayer_forward(*this, layer, w, attention_sublayer_forward(layer, w, state, ctx, *cache), ctx, *cache);
  if (cache_out) *cache_out = std::move(cache);
  return out;
}

MlpOutputGrads<Inkling2StateGrad> Inkling2Model::mlp_output_backward(std::int64_t layer, const TensorMap& w,
                                                                     const Inkling2LayerCache& k,
                                                                     const Inkling2StateGrad& d_out,
                                                                     const TokenContext& ctx,
                                                                     const TensorMap& grads) const {
  // partial_out = partial_mid + mlp_sconv(m): the residual's share is d_out itself (private copies,
  // which the MLP input's backward adds to).
  const std::string p = layer_prefix(layer);
  if (d_out.completed.size() != k.mid.completed.size()) {
    throw std::logic_error("inkling2 layer " + std::to_string(layer) + ": output gradient has " +
                           std::to_string(d_out.completed.size()) + " completed blocks, the layer " +
                           std::to_string(k.mid.completed.size()));
  }
  MlpOutputGrads<Inkling2StateGrad> g;
  g.d_residual.completed.resize(d_out.completed.size());
  for (std::size_t i = 0; i < d_out.completed.size(); ++i) accumulate(g.d_residual.completed[i], d_out.completed[i]);
  accumulate(g.d_residual.partial, d_out.partial);
  Tensor gms = grads.at(p + "mlp_sconv.weight");
  g.d_m = short_conv_backward(d_out.partial, k.experts_out, w.at(p + "mlp_sconv.weight"), ctx.positions, ctx.valid,
                              &gms);
  return g;
}

Inkling2StateGrad Inkling2Model::mlp_input_backward(std::int64_t layer, const TensorMap& w,
                                                    const Inkling2LayerCache& k, const Tensor& d_x,
                                                    const Inkling2StateGrad& d_residual, const TensorMap& grads) const {
  // x = mlp_norm(mix(sources of the mid state)).
  const std::string p = layer_prefix(layer);
  Inkling2StateGrad d_mid = d_residual;  // its tensors are private (mlp_output_backward): added to in place
  Tensor gmn = grads.at(p + "mlp_norm.weight");
  Tensor d_mix = rmsnorm_backward(d_x, k.mlp_mix.out, w.at(p + "mlp_norm.weight"), k.mlp_norm.rstd, &gmn);
  Tensor gmq = query_row(grads.at(p + "mlp_query.weight"), 0);
  std::vector<Tensor> d_msrc =
      residual_mix_backward(d_mix, k.mlp_sources, query_row(w.at(p + "mlp_query.weight"), 0), k.mlp_mix, &gmq);
  accumulate(d_mid.partial, d_msrc.back());
  for (std::size_t i = 0; i + 1 < d_msrc.size(); ++i) accumulate(d_mid.completed[i], d_msrc[i]);
  return d_mid;
}

Inkling2StateGrad Inkling2Model::attention_core_backward(std::int64_t layer, const TensorMap& w,
                                                         const Inkling2LayerCache& k, const Inkling2StateGrad& d_mid,
                                                         const TokenContext& ctx, const TensorMap& grads,
                                                         std::vector<Tensor>& d_inputs) const {
  const auto& c = config_;
  const std::string p = layer_prefix(layer);
  const Precision prec = ctx.precision;
  const std::int64_t T = ctx.tokens(), B = ctx.rows, S = ctx.seq, D = c.head_dim, Hq = c.num_attention_heads,
                     Hkv = c.num_key_value_heads, dr = c.d_rel, W = c.conv_kernel_size;
  const bool local = c.is_local(layer), boundary = c.is_boundary(layer);
  const std::int64_t R = c.relative_extent(layer);
  const std::size_t nb = k.in.completed.size();
  const Inkling2AttnCache& a = k.attn;
  auto g = [&](const std::string& name) { return grads.at(p + name); };

  const std::vector<Tensor>& d_completed = d_mid.completed;
  if (d_completed.size() != nb + (boundary ? 1 : 0)) {
    throw std::logic_error("inkling2 layer " + std::to_string(layer) + ": mid gradient has " +
                           std::to_string(d_completed.size()) + " completed blocks");
  }
  const Tensor& d_p1 = d_mid.partial;

  // p1 = (boundary ? 0 : partial_in) + attn_sconv(attention(...)).
  Inkling2StateGrad d_in;
  if (!boundary) accumulate(d_in.partial, d_p1);
  Tensor gas = g("attn_sconv.weight");
  Tensor d_a_lin = short_conv_backward(d_p1, a.a_lin, w.at(p + "attn_sconv.weight"), ctx.positions, ctx.valid, &gas);
  Tensor gwo = g("self_attn.wo_ud.weight");
  const Tensor& o_proj_in = c.use_attention_gate ? a.gated : a.o;
  Tensor d_o = project_backward(o_proj_in, w.at(p + "self_attn.wo_ud.weight"), d_a_lin, &gwo, prec);
  Tensor d_xq_gate;
  if (c.use_attention_gate) {
    OutputGateGrads og = output_gate_backward(d_o, a.o, a.gate_full, Tensor::zeros({Hq}), nullptr);
    d_o = og.d_o;
    Tensor d_gate_lin = Tensor::zeros({T, Hq});
    for (std::int64_t i = 0; i < T * Hq; ++i) {
      float s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += og.d_gate.data<float>()[i * D + d];
      d_gate_lin.data<float>()[i] = s;
    }
    Tensor gg = g("self_attn.gate.weight");
    d_xq_gate = project_backward(a.xq, w.at(p + "self_attn.gate.weight"), d_gate_lin, &gg, prec);
  }
  AttentionOptions opts;
  opts.window = local ? c.sliding_window_size : 0;
  opts.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  RelativeAttentionGrads ag = relative_attention_backward(
      d_o.reshape({B, S, Hq, D}), a.q_att.reshape({B, S, Hq, D}), a.k_clip.y.reshape({B, S, Hkv, D}),
      a.v_att.reshape({B, S, Hkv, D}), a.attn, ctx.positions, ctx.valid, a.profiles, a.sinks, opts);
  const bool log_scaled = a.lambda.defined();
  // Back to the [T*Hq, R+1] relative logits (profiles | sink), undoing the log scaling.
  Tensor d_rel = Tensor::empty({T * Hq, R + 1});
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      for (std::int64_t s = 0; s < S; ++s) {
        float* row = d_rel.data<float>() + ((b * S + s) * Hq + h) * (R + 1);
        const float* dprof = ag.d_profiles.data<float>() + ((b * Hq + h) * S + s) * R;
        const float lambda = log_scaled ? a.lambda.data<float>()[b * S + s] : 1.0f;
        for (std::int64_t d = 0; d < R; ++d) row[d] = lambda * dprof[d];
        row[R] = ag.d_sink_logits.data<float>()[(b * Hq + h) * S + s];
      }
    }
  }
  Tensor d_q_clip = ag.dq.reshape({T, Hq * D});
  if (log_scaled) {
    d_q_clip = d_q_clip.clone();
    for (std::int64_t t = 0; t < T; ++t) {
      const float l = a.lambda.data<float>()[t];
      for (std::int64_t i = 0; i < Hq * D; ++i) d_q_clip.data<float>()[t * Hq * D + i] *= l;
    }
  }
  // rel = r_clip @ table:  d r_clip = d_rel @ tableᵀ,  d table += r_clipᵀ @ d_rel.
  const Tensor& table = w.at(p + "self_attn.relative_table");
  Tensor gtable = g("self_attn.relative_table");
  Tensor d_r_clip =
      matmul_backward(a.r_clip.y.reshape({T * Hq, dr}), table, d_rel.reshape({T * Hq, R + 1}), &gtable);
  Tensor grs = g("self_attn.rel_l2_clip.scale"), gqs = g("self_attn.q_l2_clip.scale");
  Tensor d_r_lin = l2_clip_backward(d_r_clip, a.r_lin.reshape({T * Hq, dr}), w.at(p + "self_attn.rel_l2_clip.scale"),
                                    c.radius_r(), a.r_clip.norms, &grs);
  Tensor d_q_lin = l2_clip_backward(d_q_clip.reshape({T * Hq, D}), a.q_lin.reshape({T * Hq, D}),
                                    w.at(p + "self_attn.q_l2_clip.scale"), c.radius_q(), a.q_clip.norms, &gqs);
  Tensor d_k_conv = l2_clip_backward(ag.dk.reshape({T * Hkv, D}), a.k_conv.reshape({T * Hkv, D}), Tensor(),
                                     c.radius_k(), a.k_clip.norms, nullptr);
  Tensor d_v_conv = ag.dv.reshape({T * Hkv, D});
  if (c.use_value_norm_no_gamma) {
    d_v_conv = rmsnorm_backward(d_v_conv, a.v_conv.reshape({T * Hkv, D}), Tensor(), a.v_norm.rstd, nullptr);
  }
  Tensor d_k_lin, d_v_lin, d_k_taps, d_v_taps;
  if (local) {
    Tensor gk = g("self_attn.k_sconv.weight"), gv = g("self_attn.v_sconv.weight");
    d_k_lin = short_conv_backward(d_k_conv.reshape({T, Hkv * D}), a.k_lin, w.at(p + "self_attn.k_sconv.weight"),
                                  ctx.positions, ctx.valid, &gk);
    d_v_lin = short_conv_backward(d_v_conv.reshape({T, Hkv * D}), a.v_lin, w.at(p + "self_attn.v_sconv.weight"),
                                  ctx.positions, ctx.valid, &gv);
  } else {
    DynamicShortConvGrads dk = dynamic_short_conv_backward(d_k_conv.reshape({T, Hkv, D}), a.k_lin.reshape({T, Hkv, D}),
                                                           a.k_taps.reshape({T, Hkv, W}), ctx.positions, ctx.valid);
    DynamicShortConvGrads dv = dynamic_short_conv_backward(d_v_conv.reshape({T, Hkv, D}), a.v_lin.reshape({T, Hkv, D}),
                                                           a.v_taps.reshape({T, Hkv, W}), ctx.positions, ctx.valid);
    d_k_lin = dk.dx.reshape({T, Hkv * D});
    d_v_lin = dv.dx.reshape({T, Hkv * D});
    d_k_taps = dk.dtaps.reshape({T, Hkv * W});
    d_v_taps = dv.dtaps.reshape({T, Hkv * W});
  }
  // Projections: q and r read xq, k (+ k-taps) read xk, v (+ v-taps) read xv.
  const QkvrBlocks blocks = qkvr_blocks(c, local);
  const AttnWeights aw = attn_weights(w.at(p + "self_attn.qkvr.weight"), blocks, local);
  const AttnWeights gw = attn_weights(g("self_attn.qkvr.weight"), blocks, local);
  Tensor d_xq = project_backward(a.xq, aw.q, d_q_lin.reshape({T, Hq * D}), &gw.q, prec);
  add_inplace(d_xq, project_backward(a.xq, aw.r, d_r_lin.reshape({T, Hq * dr}), &gw.r, prec));
  accumulate(d_xq, d_xq_gate);
  Tensor d_xk = project_backward(a.xk, aw.k, d_k_lin, &gw.k, prec);
  Tensor d_xv = project_backward(a.xv, aw.v, d_v_lin, &gw.v, prec);
  if (!local) {
    add_inplace(d_xk, project_backward(a.xk, aw.kt, d_k_taps, &gw.kt, prec));
    add_inplace(d_xv, project_backward(a.xv, aw.vt, d_v_taps, &gw.vt, prec));
  }
  std::vector<Tensor> d_norm_out;
  if (local) {
    add_inplace(d_xq, d_xk);
    add_inplace(d_xq, d_xv);
    d_norm_out = {d_xq};
  } else {
    d_norm_out = {d_xq, d_xk, d_xv};
  }

  // The input state's gradient through the residual paths: the output's first nb completed blocks
  // are the input's; a boundary layer's committed block is the input partial. The mixes add theirs.
  d_in.completed.resize(nb);
  for (std::size_t s = 0; s < nb; ++s) accumulate(d_in.completed[s], d_completed[s]);
  if (boundary) accumulate(d_in.partial, d_completed[nb]);
  d_inputs = std::move(d_norm_out);
  return d_in;
}

Inkling2StateGrad Inkling2Model::attention_mix_backward(std::int64_t layer, const TensorMap& w,
                                                        const Inkling2LayerCache& k,
                                                        const std::vector<Tensor>& d_norm_out,
                                                        const Inkling2StateGrad& d_residual,
                                                        const TensorMap& grads) const {
  const std::string p = layer_prefix(layer);
  const std::size_t nb = k.in.completed.size();
  auto g = [&](const std::string& name) { return grads.at(p + name); };
  // Attention norms and mixes back to the input sources.
  Inkling2StateGrad d_src;  // gradient of sources(): completed then partial
  d_src.completed.resize(nb);
  const std::vector<Tensor> src = k.in.sources();
  for (std::size_t i = 0; i < d_norm_out.size(); ++i) {
    const std::string norm_name = "attn_norms." + std::to_string(i) + ".weight";
    Tensor gn = g(norm_name);
    Tensor d_mix_out =
        rmsnorm_backward(d_norm_out[i], k.attn_mix[i].out, w.at(p + norm_name), k.attn_norm[i].rstd, &gn);
    Tensor gq = layer == 0 ? Tensor() : query_row(g("attn_query.weight"), static_cast<std::int64_t>(i));
    Tensor query = layer == 0 ? Tensor() : query_row(w.at(p + "attn_query.weight"), static_cast<std::int64_t>(i));
    std::vector<Tensor> ds = residual_mix_backward(d_mix_out, src, query, k.attn_mix[i], layer == 0 ? nullptr : &gq);
    for (std::size_t s = 0; s < nb; ++s) accumulate(d_src.completed[s], ds[s]);
    accumulate(d_src.partial, ds.back());
  }

  // Added to the residual paths' share (attention_core_backward), whose tensors are private.
  Inkling2StateGrad d_in = d_residual;
  for (std::size_t s = 0; s < nb; ++s) accumulate(d_in.completed[s], d_src.completed[s]);
  accumulate(d_in.partial, d_src.partial);
  return d_in;
}

Inkling2StateGrad Inkling2Model::attention_sublayer_backward(std::int64_t layer, const TensorMap& w,
                                                             const Inkling2LayerCache& k, const Inkling2StateGrad& d_mid,
                                                             const TokenContext& ctx, const TensorMap& grads) const {
  std::vector<Tensor> d_inputs;
  const Inkling2StateGrad residual = attention_core_backward(layer, w, k, d_mid, ctx, grads, d_inputs);
  return attention_mix_backward(layer, w, k, d_inputs, residual, grads);
}

MoeMlpSpec Inkling2Model::moe_spec() const { return inkling2_moe_spec(config_); }

Tensor Inkling2Model::routing_indices(const Inkling2LayerCache& cache) { return cache.moe.routing.indices; }

std::vector<Tensor> Inkling2Model::attn_mix_weights(const Inkling2LayerCache& cache) {
  std::vector<Tensor> out;
  for (const auto& m : cache.attn_mix) out.push_back(m.weights);
  return out;
}

Tensor Inkling2Model::mlp_mix_weights(const Inkling2LayerCache& cache) { return cache.mlp_mix.weights; }

// ------------------------------------------------------------------------------------------------
// Final mix, norm, head, loss

Tensor Inkling2Model::head_forward(const TensorMap& w, const Inkling2ResidualState& state, const TokenContext& ctx,
                                   std::shared_ptr<Inkling2HeadCache>* cache_out) const {
  auto cache = std::make_shared<Inkling2HeadCache>();
  cache->sources = state.sources();
  cache->mix = residual_mix_forward(cache->sources, w.at("output_query.weight"), config_.rms_norm_eps, ctx.precision);
  // lm_head is bulk (bf16 weight values in bf16), accumulates in fp32; the logits are never rounded.
  Tensor logits = lm_head_forward(w, head_spec(), cache->mix.out, ctx, cache->head);
  if (cache_out) *cache_out = std::move(cache);
  return logits;
}

LmHeadSpec Inkling2Model::head_spec() const {
  const auto& c = config_;
  return {"norm.weight", "lm_head.weight", c.rms_norm_eps, c.vocab_size, c.unpadded_vocab_size,
          c.final_logit_softcapping, /*round_logits=*/false};
}

Inkling2StateGrad Inkling2Model::head_backward(const TensorMap& w, const Inkling2HeadCache& cache,
                                               const Tensor& d_logits, const TensorMap& grads) const {
  Tensor d_mix = lm_head_backward(w, head_spec(), cache.head, d_logits, grads);
  Tensor gq = grads.at("output_query.weight");
  std::vector<Tensor> ds = residual_mix_backward(d_mix, cache.sources, w.at("output_query.weight"), cache.mix, &gq);
  Inkling2StateGrad d;
  d.completed.resize(ds.size() - 1);
  for (std::size_t s = 0; s + 1 < ds.size(); ++s) accumulate(d.completed[s], ds[s]);
  accumulate(d.partial, ds.back());
  return d;
}

// ------------------------------------------------------------------------------------------------
// Staged execution (graph/models/sublayer_run.hpp)

std::unique_ptr<MicroBatchRun> Inkling2Model::start(const Batch& micro_batch, Precision precision,
                                                    float grad_scale) const {
  return std::make_unique<SublayerRun<Inkling2Model>>(*this, micro_batch, precision, grad_scale);
}

LossSum Inkling2Model::forward(const TensorMap& w, const Batch& batch, Precision precision, Tensor* logits_out) const {
  return sublayer_forward(*this, w, batch, precision, logits_out);
}

}  // namespace atl
