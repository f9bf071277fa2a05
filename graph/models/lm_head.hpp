// The end of every family's model, as two ops: the head (final RMSNorm, lm_head: untied, fp32
// accumulation, the family's logit rounding) and the loss (softcap, the unused-vocabulary mask and
// the cross entropy) (MODELS.md §0.4, §10.1.5–6).
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
};

struct LmLossCache {
  LogitLossForward loss;
  Tensor targets;  // flattened [T]
};

// hidden [T, H] -> logits f32 [T, V] (never rounded unless spec.round_logits).
Tensor lm_head_forward(const TensorMap& w, const LmHeadSpec& spec, const Tensor& hidden, const TokenContext& ctx,
                       LmHeadCache& cache);
// d_logits -> d_hidden; norm and head gradients accumulate into grads.
Tensor lm_head_backward(const TensorMap& w, const LmHeadSpec& spec, const LmHeadCache& cache, const Tensor& d_logits,
                        const TensorMap& grads);

// logits f32 [T, V], targets i64 [B, S]: the summed cross entropy. logits_out gets [B, S, V] after
// softcap and mask.
LossSum lm_loss_forward(const LmHeadSpec& spec, const Tensor& logits, const Tensor& targets, const TokenContext& ctx,
                        LmLossCache& cache, Tensor* logits_out = nullptr);
// The gradient of grad_scale * loss_sum wrt the logits.
Tensor lm_loss_backward(const LmHeadSpec& spec, const LmLossCache& cache, float grad_scale);

}  // namespace atl
