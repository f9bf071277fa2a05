#include "kernels/ops/loss.hpp"
#include "kernels/kernel_clock.hpp"

#include <stdexcept>
#include <string>

namespace atl {

namespace {


void check_loss_inputs(const char* op, const Tensor& logits, const Tensor& targets, std::int64_t usable_vocab) {
  if (!logits.defined() || logits.dtype() != DType::f32 || logits.device() != Device::cpu || logits.rank() != 2) {
    throw std::invalid_argument(std::string(op) + ": logits must be a cpu f32 [N,V] tensor, got " + logits.describe());
  }
  const std::int64_t rows = logits.size(0);
  if (!targets.defined() || targets.dtype() != DType::i64 || targets.device() != Device::cpu ||
      targets.shape() != Shape{rows}) {
    throw std::invalid_argument(std::string(op) + ": targets must be a cpu i64 [" + std::to_string(rows) +
                                "] tensor, got " + targets.describe());
  }
  if (usable_vocab < 1 || usable_vocab > logits.size(1)) {
    throw std::invalid_argument(std::string(op) + ": usable_vocab " + std::to_string(usable_vocab) +
                                " must be in [1, " + std::to_string(logits.size(1)) + "]");
  }
}

}  // namespace

LogitLossForward logit_loss_forward(const Tensor& logits, const Tensor& targets, std::int64_t usable_vocab,
                                    float cap) {
  KernelScope scope(KernelKind::loss);
  check_loss_inputs("logit_loss_forward", logits, targets, usable_vocab);
  LogitLossForward f;
  f.capped = Tensor::empty(logits.shape());
  f.probs = Tensor::empty(logits.shape());
  f.loss_sum = cpu::logit_loss_forward(logits.data<float>(), targets.data<std::int64_t>(), logits.size(0),
                                       logits.size(1), usable_vocab, cap, f.capped.data<float>(),
                                       f.probs.data<float>(), &f.count);
  return f;
}

Tensor logit_loss_backward(const LogitLossForward& saved, const Tensor& targets, std::int64_t usable_vocab, float cap,
                           float scale) {
  KernelScope scope(KernelKind::loss);
  check_loss_inputs("logit_loss_backward", saved.probs, targets, usable_vocab);
  if (!saved.capped.defined() || saved.capped.dtype() != DType::f32 || saved.capped.shape() != saved.probs.shape()) {
    throw std::invalid_argument("logit_loss_backward: saved.capped must be f32 " + shape_string(saved.probs.shape()) +
                                ", got " + saved.capped.describe());
  }
  cpu::check_loss_targets(targets.data<std::int64_t>(), targets.numel(), usable_vocab);
  Tensor d_logits = Tensor::empty(saved.probs.shape());
  cpu::logit_loss_backward(saved.probs.data<float>(), saved.capped.data<float>(), targets.data<std::int64_t>(),
                           saved.probs.size(0), saved.probs.size(1), usable_vocab, cap, scale,
                           d_logits.data<float>());
  return d_logits;
}

}  // namespace atl
