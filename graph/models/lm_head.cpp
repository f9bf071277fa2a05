#include "graph/models/lm_head.hpp"

#include "kernels/ops/matmul.hpp"

namespace atl {

Tensor lm_head_forward(const TensorMap& w, const LmHeadSpec& s, const Tensor& hidden, const TokenContext& ctx,
                       LmHeadCache& k) {
  k.hidden = hidden;
  k.norm = rmsnorm_forward(hidden, w.at(s.norm), s.norm_eps, ctx.precision);
  // fp32 operands (the head is fp32 or an island); bf16 logits rounded by the GEMM as it finishes.
  return linear_forward(k.norm.y, w.at(s.head), Precision::fp32, s.round_logits && ctx.precision == Precision::bf16);
}

Tensor lm_head_backward(const TensorMap& w, const LmHeadSpec& s, const LmHeadCache& k, const Tensor& d_logits,
                        const TensorMap& grads) {
  Tensor gh = grads.at(s.head), gn = grads.at(s.norm);
  Tensor d_norm = linear_backward(k.norm.y, w.at(s.head), d_logits, &gh);
  return rmsnorm_backward(d_norm, k.hidden, w.at(s.norm), k.norm.rstd, &gn);
}

LossSum lm_loss_forward(const LmHeadSpec& s, const Tensor& logits, const Tensor& targets, const TokenContext& ctx,
                        LmLossCache& k, Tensor* logits_out) {
  k.targets = targets.reshape({targets.numel()});
  k.loss = logit_loss_forward(logits, k.targets, s.usable_vocab, s.softcap);
  if (logits_out) *logits_out = k.loss.capped.reshape({ctx.rows, ctx.seq, s.vocab_size});
  return {k.loss.loss_sum, k.loss.count};
}

Tensor lm_loss_backward(const LmHeadSpec& s, const LmLossCache& k, float grad_scale) {
  return logit_loss_backward(k.loss, k.targets, s.usable_vocab, s.softcap, grad_scale);
}

}  // namespace atl
