// The end of every family's model: final RMSNorm, lm_head (untied, fp32 accumulation), the
// family's logit rounding and softcap, the unused-vocabulary mask and the cross entropy
// (MODELS.md §0.4, §10.1.5–6).
#pragma once
#include <string>

#include "graph/models/token_context.hpp"
#include "graph/param.hpp"
#include "graph/training/staged_model.hpp"
#include "kernels/ops/loss.hpp"
#include "kernels/ops/norm.hpp"

namespace atl {

struct LmHeadSpec {
  std::string norm = "model.norm.weight";
  std::string head = "lm_head.weight";
  float norm_eps = 1e-6f;
  std::int64_t vocab_size = 0, usable_vocab = 0;
  float softcap = 0;          // 0 = none
  bool round_logits = false;  // a bulk head in bf16 (Beam): logits rounded before the fp32 softcap
};

struct LmHeadCache {
  Tensor hidden;
  RmsNormForward norm;
  LogitLossForward loss;
  Tensor targets;  // flattened [T]
};

// hidden [T, H]; targets i64 [B, S]. logits_out gets [B, S, V] after softcap and mask.
LossSum lm_head_forward(const TensorMap& w, const LmHeadSpec& spec, const Tensor& hidden, const Tensor& targets,
                        const TokenContext& ctx, LmHeadCache& cache, Tensor* logits_out);
// Gradient of grad_scale * loss_sum wrt hidden; norm and head gradients accumulate into grads.
Tensor lm_head_backward(const TensorMap& w, const LmHeadSpec& spec, const LmHeadCache& cache, float grad_scale,
                        const TensorMap& grads);

}  // namespace atl
