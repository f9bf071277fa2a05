#include "graph/models/dense_mlp.hpp"

#include "graph/models/model_parts.hpp"
#include "kernels/ops/activation.hpp"
#include "kernels/ops/elementwise.hpp"

namespace atl {

void append_dense_mlp_specs(std::vector<ParamSpec>& specs, const std::string& p, std::int64_t H, std::int64_t I) {
  specs.push_back(make_param(p + "mlp.gate_proj.weight", {I, H}));
  specs.push_back(make_param(p + "mlp.up_proj.weight", {I, H}));
  specs.push_back(make_param(p + "mlp.down_proj.weight", {H, I}));
}

Tensor dense_mlp_forward(const std::string& p, const TensorMap& w, const Tensor& x, Precision prec, DenseMlpCache& k) {
  k.g = project(x, w.at(p + "mlp.gate_proj.weight"), prec);
  k.u = project(x, w.at(p + "mlp.up_proj.weight"), prec);
  k.act = swiglu_forward(k.g, k.u, prec);
  return project(k.act, w.at(p + "mlp.down_proj.weight"), prec);
}

Tensor dense_mlp_backward(const std::string& p, const TensorMap& w, const Tensor& x, const Tensor& d_out,
                          Precision prec, const DenseMlpCache& k, const TensorMap& grads) {
  Tensor dd = grads.at(p + "mlp.down_proj.weight"), dg = grads.at(p + "mlp.gate_proj.weight"),
         du = grads.at(p + "mlp.up_proj.weight");
  const Tensor d_act = project_backward(k.act, w.at(p + "mlp.down_proj.weight"), d_out, &dd, prec);
  const GluSplitGrads sg = swiglu_backward(d_act, k.g, k.u);
  Tensor d_x = project_backward(x, w.at(p + "mlp.gate_proj.weight"), sg.d_gate, &dg, prec);
  add_inplace(d_x, project_backward(x, w.at(p + "mlp.up_proj.weight"), sg.d_up, &du, prec));
  return d_x;
}

}  // namespace atl
