#include "kernels/ops/router.hpp"

#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

#include <stdexcept>
#include <string>

namespace atl {

RouterForward router_forward(const Tensor& logits, const Tensor& correction_bias, const RouterConfig& cfg,
                             Precision precision) {
  KernelScope scope(KernelKind::routing);
  cpu::validate_router_config(cfg);
  if (!logits.defined() || logits.rank() != 2) {
    throw std::invalid_argument("router_forward: logits must be f32 [T, " + std::to_string(cfg.num_experts) +
                                "], got " + logits.describe());
  }
  const std::int64_t rows = logits.size(0);
  detail::require_tensor("router_forward", "logits", logits, DType::f32, {rows, cfg.num_experts});
  if (correction_bias.defined()) {
    detail::require_tensor("router_forward", "correction_bias", correction_bias, DType::f32, {cfg.num_experts});
  }
  RouterForward out{Tensor::empty({rows, cfg.top_k}, DType::i32), Tensor::empty({rows, cfg.top_k}),
                    Tensor::empty({rows, cfg.num_experts})};
  cpu::router_forward(logits.data<float>(), correction_bias.defined() ? correction_bias.data<float>() : nullptr, rows,
                      cfg, precision, out.indices.data<std::int32_t>(), out.weights.data<float>(),
                      out.scores.data<float>());
  return out;
}

Tensor router_backward(const Tensor& d_weights, const RouterForward& saved, const RouterConfig& cfg) {
  KernelScope scope(KernelKind::routing);
  cpu::validate_router_config(cfg);
  if (!saved.scores.defined() || saved.scores.rank() != 2) {
    throw std::invalid_argument("router_backward: saved.scores must be f32 [T, E]");
  }
  const std::int64_t rows = saved.scores.size(0);
  detail::require_tensor("router_backward", "saved.scores", saved.scores, DType::f32, {rows, cfg.num_experts});
  detail::require_tensor("router_backward", "saved.indices", saved.indices, DType::i32, {rows, cfg.top_k});
  detail::require_tensor("router_backward", "d_weights", d_weights, DType::f32, {rows, cfg.top_k});
  Tensor d_logits = Tensor::empty({rows, cfg.num_experts});
  cpu::router_backward(d_weights.data<float>(), saved.indices.data<std::int32_t>(), saved.scores.data<float>(), rows,
                       cfg, d_logits.data<float>());
  return d_logits;
}

}  // namespace atl
