#include "graph/models/gqa_attention.hpp"

#include <cmath>

#include "graph/models/model_parts.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/rope.hpp"

namespace atl {

namespace {
AttentionOptions options(const GqaAttentionSpec& s) {
  AttentionOptions o;
  o.window = s.sliding ? s.window : 0;
  o.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  return o;
}
}  // namespace

Tensor gqa_attention_forward(const std::string& p, const TensorMap& w, const Tensor& x, const TokenContext& ctx,
                             const GqaAttentionSpec& s, GqaAttentionCache& k) {
  const Precision prec = ctx.precision;
  const std::int64_t T = ctx.tokens(), D = s.head_dim, Hq = s.heads, Hkv = s.kv_heads;
  const Tensor flat_pos = ctx.positions.reshape({T});
  k.q_lin = project(x, w.at(p + "self_attn.q_proj.weight"), prec);
  k.k_lin = project(x, w.at(p + "self_attn.k_proj.weight"), prec);
  k.v = project(x, w.at(p + "self_attn.v_proj.weight"), prec);
  k.q_norm = rmsnorm_forward(k.q_lin.reshape({T * Hq, D}), w.at(p + "self_attn.q_norm.weight"), s.norm_eps, prec);
  k.k_norm = rmsnorm_forward(k.k_lin.reshape({T * Hkv, D}), w.at(p + "self_attn.k_norm.weight"), s.norm_eps, prec);
  if (s.sliding) {
    k.q_att = rounded(rope_forward(k.q_norm.y.reshape({T, Hq, D}), flat_pos, s.rope_theta), prec);
    k.k_att = rounded(rope_forward(k.k_norm.y.reshape({T, Hkv, D}), flat_pos, s.rope_theta), prec);
  } else {
    k.q_att = s.ssmax ? rounded(ssmax_forward(k.q_norm.y.reshape({T, Hq, D}), flat_pos, s.ssmax_base, s.ssmax_exponent),
                                prec)
                      : k.q_norm.y.reshape({T, Hq, D});
    k.k_att = k.k_norm.y.reshape({T, Hkv, D});
  }
  // Sinks are an fp32 island: never rounded, whatever the precision.
  const Tensor sinks = s.sinks.empty() ? Tensor() : w.at(p + s.sinks);
  k.attention = attention_forward(k.q_att.reshape({ctx.rows, ctx.seq, Hq, D}),
                                  k.k_att.reshape({ctx.rows, ctx.seq, Hkv, D}), k.v.reshape({ctx.rows, ctx.seq, Hkv, D}),
                                  ctx.positions, ctx.valid, sinks, options(s));
  k.out = rounded_copy(k.attention.out.reshape({T, Hq * D}), prec);
  return k.out;
}

Tensor gqa_attention_backward(const std::string& p, const TensorMap& w, const Tensor& x, const TokenContext& ctx,
                              const GqaAttentionSpec& s, const GqaAttentionCache& k, const Tensor& d_out,
                              const TensorMap& grads) {
  const std::int64_t T = ctx.tokens(), D = s.head_dim, Hq = s.heads, Hkv = s.kv_heads;
  const Tensor flat_pos = ctx.positions.reshape({T});
  auto g = [&](const std::string& name) { return grads.at(p + name); };
  const Tensor sinks = s.sinks.empty() ? Tensor() : w.at(p + s.sinks);
  Tensor d_sinks = s.sinks.empty() ? Tensor() : g(s.sinks);
  AttentionGrads ag = attention_backward(
      d_out.reshape({ctx.rows, ctx.seq, Hq, D}), k.q_att.reshape({ctx.rows, ctx.seq, Hq, D}),
      k.k_att.reshape({ctx.rows, ctx.seq, Hkv, D}), k.v.reshape({ctx.rows, ctx.seq, Hkv, D}), k.attention,
      ctx.positions, ctx.valid, sinks, s.sinks.empty() ? nullptr : &d_sinks, options(s));
  Tensor d_qn = ag.dq.reshape({T, Hq, D}), d_kn = ag.dk.reshape({T, Hkv, D});
  if (s.sliding) {
    d_qn = rope_backward(d_qn, flat_pos, s.rope_theta);
    d_kn = rope_backward(d_kn, flat_pos, s.rope_theta);
  } else if (s.ssmax) {
    d_qn = ssmax_backward(d_qn, flat_pos, s.ssmax_base, s.ssmax_exponent);
  }
  Tensor gqn = g("self_attn.q_norm.weight"), gkn = g("self_attn.k_norm.weight");
  Tensor d_q = rmsnorm_backward(d_qn.reshape({T * Hq, D}), k.q_lin.reshape({T * Hq, D}),
                                w.at(p + "self_attn.q_norm.weight"), k.q_norm.rstd, &gqn);
  Tensor d_k = rmsnorm_backward(d_kn.reshape({T * Hkv, D}), k.k_lin.reshape({T * Hkv, D}),
                                w.at(p + "self_attn.k_norm.weight"), k.k_norm.rstd, &gkn);
  Tensor gq = g("self_attn.q_proj.weight"), gk = g("self_attn.k_proj.weight"), gv = g("self_attn.v_proj.weight");
  Tensor d_x = project_backward(x, w.at(p + "self_attn.q_proj.weight"), d_q.reshape({T, Hq * D}), &gq, ctx.precision);
  add_inplace(d_x, project_backward(x, w.at(p + "self_attn.k_proj.weight"), d_k.reshape({T, Hkv * D}), &gk, ctx.precision));
  add_inplace(d_x, project_backward(x, w.at(p + "self_attn.v_proj.weight"), ag.dv.reshape({T, Hkv * D}), &gv, ctx.precision));
  return d_x;
}

}  // namespace atl
