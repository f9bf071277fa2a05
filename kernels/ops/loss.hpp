// Logit softcap + unused-vocabulary mask + cross entropy on f32 CPU tensors (MODELS.md §0.4,
// §10.1.5, §10.1.6), all fp32 (the sum of CE is returned in double). The caller normalises:
// it divides the sum by the total count (over micro-batches/ranks) and passes 1/count as the
// backward scale.
#pragma once
#include <cstdint>

#include "kernels/cpu/loss.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct LogitLossForward {
  double loss_sum = 0;     // sum of CE over targets that are not -100
  std::int64_t count = 0;  // number of such targets (0 if all are ignored; loss_sum is then 0)
  Tensor probs;            // f32 [N,V] softmax of capped; 0 in columns >= usable_vocab
  Tensor capped;           // f32 [N,V] cap·tanh(z/cap), -inf in columns >= usable_vocab
};

// logits f32 [N,V], targets i64 [N] (-100 = ignore; anything else outside [0, usable_vocab) throws),
// 1 <= usable_vocab <= V, cap <= 0 means no softcap.
LogitLossForward logit_loss_forward(const Tensor& logits, const Tensor& targets, std::int64_t usable_vocab,
                                    float cap);

// d_logits f32 [N,V] = scale · d(loss_sum)/d(logits).
Tensor logit_loss_backward(const LogitLossForward& saved, const Tensor& targets, std::int64_t usable_vocab, float cap,
                           float scale);

}  // namespace atl
