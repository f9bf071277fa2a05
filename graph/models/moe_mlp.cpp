#include "graph/models/moe_mlp.hpp"

#include "graph/models/model_parts.hpp"
#include "kernels/ops/activation.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/matmul.hpp"

namespace atl {

Tensor moe_mlp_forward(const std::string& p, const TensorMap& w, const Tensor& x, const Tensor& token_mask,
                       const MoeMlpSpec& spec, Precision prec, MoeMlpCache& k) {
  ExpertsConfig experts = spec.experts;
  experts.precision = prec;
  // Router: an fp32 matmul whatever the weight's policy (logits are never rounded).
  k.router_logits = linear_forward(x, w.at(p + "mlp.gate.weight"));
  const Tensor bias = spec.correction_bias ? w.at(p + "mlp.gate.e_score_correction_bias") : Tensor();
  k.routing = router_forward(k.router_logits, bias, spec.router, prec);
  // Dispatch -> experts -> combine (expert parallelism: all-to-all after dispatch and before combine).
  const Tensor& gate_up = w.at(p + "mlp.experts.gate_and_up_projs");
  k.dispatch = plan_expert_dispatch(k.routing.indices, k.routing.weights, token_mask, gate_up.size(0));
  const DispatchedRows rows = dispatch_forward(x, k.dispatch);
  k.experts = grouped_experts_forward(rows.x_rows, rows.w_rows, k.dispatch, 0, gate_up,
                                      w.at(p + "mlp.experts.down_projs"), experts);
  Tensor out = combine_forward(k.experts.down_out, k.dispatch, x.size(1), experts);
  if (!spec.shared_expert) return out;
  k.sg = project(x, w.at(p + "mlp.shared_experts.gate_proj.weight"), prec);
  k.su = project(x, w.at(p + "mlp.shared_experts.up_proj.weight"), prec);
  k.sact = swiglu_forward(k.sg, k.su, prec);
  const Tensor shared = project(k.sact, w.at(p + "mlp.shared_experts.down_proj.weight"), prec);
  return scaled_add(out, 1.0f, shared, 1.0f, prec);  // fp32 sum, rounded once
}

Tensor moe_mlp_backward(const std::string& p, const TensorMap& w, const Tensor& x, const Tensor& d_out,
                        const MoeMlpSpec& spec, Precision prec, const MoeMlpCache& k, const TensorMap& grads) {
  ExpertsConfig experts = spec.experts;
  experts.precision = prec;
  auto g = [&](const char* name) { return grads.at(p + name); };
  CombineGrads combined = combine_backward(d_out, k.experts.down_out, k.dispatch, experts);
  const GroupedExpertsGrads rows =
      grouped_experts_backward(combined.d_rows, k.experts, w.at(p + "mlp.experts.gate_and_up_projs"),
                               w.at(p + "mlp.experts.down_projs"), experts, g("mlp.experts.gate_and_up_projs"),
                               g("mlp.experts.down_projs"));
  Tensor d_x = Tensor::empty(x.shape());
  dispatch_backward(rows.d_x_rows, rows.d_w_rows, k.dispatch, experts, d_x, combined.d_weights);
  const Tensor d_logits = router_backward(combined.d_weights, k.routing, spec.router);
  Tensor d_gate = g("mlp.gate.weight");
  add_inplace(d_x, linear_backward(x, w.at(p + "mlp.gate.weight"), d_logits, &d_gate));
  if (!spec.shared_expert) return d_x;
  Tensor d_sd = g("mlp.shared_experts.down_proj.weight");
  const Tensor d_sact = project_backward(k.sact, w.at(p + "mlp.shared_experts.down_proj.weight"), d_out, &d_sd, prec);
  const GluSplitGrads sg = swiglu_backward(d_sact, k.sg, k.su);
  Tensor d_sg = g("mlp.shared_experts.gate_proj.weight"), d_su = g("mlp.shared_experts.up_proj.weight");
  add_inplace(d_x, project_backward(x, w.at(p + "mlp.shared_experts.gate_proj.weight"), sg.d_gate, &d_sg, prec));
  add_inplace(d_x, project_backward(x, w.at(p + "mlp.shared_experts.up_proj.weight"), sg.d_up, &d_su, prec));
  return d_x;
}

}  // namespace atl
