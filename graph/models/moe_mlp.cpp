#include "graph/models/moe_mlp.hpp"

#include "graph/models/model_parts.hpp"
#include "kernels/ops/activation.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/matmul.hpp"

namespace atl {

namespace {

ExpertsConfig experts_config(const MoeMlpSpec& spec, Precision prec) {
  ExpertsConfig e = spec.experts;
  e.precision = prec;
  return e;
}

}  // namespace

void append_moe_mlp_specs(std::vector<ParamSpec>& specs, const std::string& p, const MoeMlpSpec& spec, std::int64_t H,
                          std::int64_t I, bool router_island) {
  const std::int64_t E = spec.router.num_experts;
  specs.push_back(make_param(p + "mlp.gate.weight", {E, H}, Init::normal, router_island));
  if (spec.correction_bias) {
    specs.push_back(make_param(p + "mlp.gate.e_score_correction_bias", {E}, Init::zeros, /*island=*/true));
  }
  specs.push_back(make_param(p + "mlp.experts.gate_and_up_projs", {E, H, 2 * I}));
  specs.push_back(make_param(p + "mlp.experts.down_projs", {E, I, H}));
  if (const std::int64_t S = spec.shared_width; S > 0) {
    specs.push_back(make_param(p + "mlp.shared_experts.gate_proj.weight", {S, H}));
    specs.push_back(make_param(p + "mlp.shared_experts.up_proj.weight", {S, H}));
    specs.push_back(make_param(p + "mlp.shared_experts.down_proj.weight", {H, S}));
  }
}

void moe_route_forward(const std::string& p, const TensorMap& w, const Tensor& x, const Tensor& token_mask,
                       const MoeMlpSpec& spec, Precision prec, MoeMlpCache& k) {
  k.x = x;
  // Router: an fp32 matmul whatever the weight's policy (logits are never rounded).
  k.router_logits = linear_forward(x, w.at(p + "mlp.gate.weight"));
  const Tensor bias = spec.correction_bias ? w.at(p + "mlp.gate.e_score_correction_bias") : Tensor();
  k.routing = router_forward(k.router_logits, bias, spec.router, prec);
  // The router's own expert count: the router op does not read the experts' weights (under
  // expert parallelism they live elsewhere).
  k.dispatch = plan_expert_dispatch(k.routing.indices, k.routing.weights, token_mask, spec.router.num_experts);
}

void moe_dispatch_forward(MoeMlpCache& k) { k.rows = dispatch_forward(k.x, k.dispatch); }

void moe_experts_forward(const std::string& p, const TensorMap& w, const MoeMlpSpec& spec, Precision prec,
                         MoeMlpCache& k) {
  k.experts = grouped_experts_forward(k.rows.x_rows, k.rows.w_rows, k.dispatch, 0,
                                      w.at(p + "mlp.experts.gate_and_up_projs"), w.at(p + "mlp.experts.down_projs"),
                                      experts_config(spec, prec));
  k.rows = {};  // the experts keep what their backward needs
}

void moe_shared_forward(const std::string& p, const TensorMap& w, Precision prec, MoeMlpCache& k) {
  k.sg = project(k.x, w.at(p + "mlp.shared_experts.gate_proj.weight"), prec);
  k.su = project(k.x, w.at(p + "mlp.shared_experts.up_proj.weight"), prec);
  k.sact = swiglu_forward(k.sg, k.su, prec);
  k.shared_out = project(k.sact, w.at(p + "mlp.shared_experts.down_proj.weight"), prec);
}

Tensor moe_combine_forward(const MoeMlpSpec& spec, Precision prec, MoeMlpCache& k) {
  Tensor out = combine_forward(k.experts.down_out, k.dispatch, k.x.size(1), experts_config(spec, prec));
  if (!spec.shared_expert()) return out;
  Tensor sum = scaled_add(out, 1.0f, k.shared_out, 1.0f, prec);  // fp32 sum, rounded once
  k.shared_out = Tensor();
  return sum;
}

void moe_combine_backward(const Tensor& d_out, const MoeMlpSpec& spec, Precision prec, const MoeMlpCache& k,
                          MoeMlpBackward& b) {
  b.combined = combine_backward(d_out, k.experts.down_out, k.dispatch, experts_config(spec, prec));
  if (spec.shared_expert()) b.d_out = d_out;  // the shared expert's backward reads it
}

void moe_shared_backward(const std::string& p, const TensorMap& w, Precision prec, const MoeMlpCache& k,
                         MoeMlpBackward& b, const TensorMap& grads) {
  const Tensor d_out = std::move(b.d_out);
  Tensor d_sd = grads.at(p + "mlp.shared_experts.down_proj.weight");
  const Tensor d_sact = project_backward(k.sact, w.at(p + "mlp.shared_experts.down_proj.weight"), d_out, &d_sd, prec);
  const GluSplitGrads sg = swiglu_backward(d_sact, k.sg, k.su);
  Tensor d_sg = grads.at(p + "mlp.shared_experts.gate_proj.weight");
  Tensor d_su = grads.at(p + "mlp.shared_experts.up_proj.weight");
  b.d_shared_gate_x = project_backward(k.x, w.at(p + "mlp.shared_experts.gate_proj.weight"), sg.d_gate, &d_sg, prec);
  b.d_shared_up_x = project_backward(k.x, w.at(p + "mlp.shared_experts.up_proj.weight"), sg.d_up, &d_su, prec);
}

void moe_experts_backward(const std::string& p, const TensorMap& w, const MoeMlpSpec& spec, Precision prec,
                          const MoeMlpCache& k, MoeMlpBackward& b, const TensorMap& grads) {
  b.d_rows = grouped_experts_backward(b.combined.d_rows, k.experts, w.at(p + "mlp.experts.gate_and_up_projs"),
                                      w.at(p + "mlp.experts.down_projs"), experts_config(spec, prec),
                                      grads.at(p + "mlp.experts.gate_and_up_projs"),
                                      grads.at(p + "mlp.experts.down_projs"));
  b.combined.d_rows = Tensor();
}

void moe_dispatch_backward(const MoeMlpSpec& spec, Precision prec, const MoeMlpCache& k, MoeMlpBackward& b) {
  b.d_x = Tensor::empty(k.x.shape());
  dispatch_backward(b.d_rows.d_x_rows, b.d_rows.d_w_rows, k.dispatch, experts_config(spec, prec), b.d_x,
                    b.combined.d_weights);
  b.d_rows = {};
}

Tensor moe_route_backward(const std::string& p, const TensorMap& w, const MoeMlpSpec& spec, const MoeMlpCache& k,
                          MoeMlpBackward& b, const TensorMap& grads) {
  // d_x = dispatch part + router part + shared gate part + shared up part, in this order.
  Tensor d_x = std::move(b.d_x);
  const Tensor d_logits = router_backward(b.combined.d_weights, k.routing, spec.router);
  Tensor d_gate = grads.at(p + "mlp.gate.weight");
  add_inplace(d_x, linear_backward(k.x, w.at(p + "mlp.gate.weight"), d_logits, &d_gate));
  if (spec.shared_expert()) {
    add_inplace(d_x, b.d_shared_gate_x);
    add_inplace(d_x, b.d_shared_up_x);
  }
  return d_x;
}

Tensor moe_expert_group_forward(const std::string& p, const TensorMap& w, const MoeMlpSpec& spec, Precision prec,
                                std::vector<ExpertSourceRows> sources, ExpertGroupCache& cache) {
  const Tensor& gate_up = w.at(p + "mlp.experts.gate_and_up_projs");
  const Tensor& down = w.at(p + "mlp.experts.down_projs");
  cache.sources.clear();
  std::vector<Tensor> outs;
  for (ExpertSourceRows& s : sources) {
    cache.sources.push_back(
        grouped_experts_forward(s.x_rows, s.w_rows, s.offsets, gate_up, down, experts_config(spec, prec)));
    outs.push_back(cache.sources.back().down_out);
  }
  Tensor out = concat_rows(outs);
  for (auto& saved : cache.sources) saved.down_out = Tensor();  // the source keeps its copy for combine
  return out;
}

ExpertRowGrads moe_expert_group_backward(const std::string& p, const TensorMap& w, const MoeMlpSpec& spec,
                                         Precision prec, const ExpertGroupCache& cache, const Tensor& d_rows,
                                         const std::vector<TensorMap>& grads) {
  if (grads.size() != cache.sources.size()) {
    throw std::invalid_argument("expert group backward: " + std::to_string(grads.size()) + " gradient maps for " +
                                std::to_string(cache.sources.size()) + " sources");
  }
  const std::string gu = p + "mlp.experts.gate_and_up_projs", dn = p + "mlp.experts.down_projs";
  std::vector<Tensor> dx, dw;
  std::int64_t at = 0;
  for (std::size_t j = 0; j < cache.sources.size(); ++j) {
    const GroupedExpertsSaved& saved = cache.sources[j];
    const std::int64_t rows = saved.x_rows.size(0);
    const GroupedExpertsGrads g = grouped_experts_backward(d_rows.slice_rows(at, at + rows), saved, w.at(gu), w.at(dn),
                                                           experts_config(spec, prec), grads[j].at(gu), grads[j].at(dn));
    at += rows;
    dx.push_back(g.d_x_rows);
    dw.push_back(g.d_w_rows);
  }
  if (at != d_rows.size(0)) {
    throw std::invalid_argument("expert group backward: " + std::to_string(d_rows.size(0)) + " gradient rows for " +
                                std::to_string(at) + " rows received");
  }
  return {concat_rows(dx), concat_rows(dw)};
}

Tensor moe_mlp_forward(const std::string& p, const TensorMap& w, const Tensor& x, const Tensor& token_mask,
                       const MoeMlpSpec& spec, Precision prec, MoeMlpCache& k) {
  moe_route_forward(p, w, x, token_mask, spec, prec, k);
  moe_dispatch_forward(k);
  if (spec.shared_expert()) moe_shared_forward(p, w, prec, k);
  moe_experts_forward(p, w, spec, prec, k);
  return moe_combine_forward(spec, prec, k);
}

}  // namespace atl
