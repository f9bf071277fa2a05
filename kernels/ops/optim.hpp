// Optimizer ops: AdamW on fp32 master parameters, global gradient-norm clipping, and the
// warmup + cosine learning-rate schedule.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/ops/elementwise.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// param, grad, exp_avg, exp_avg_sq: f32 of one shape. step >= 1. bf16_copy (f32, the same shape,
// its own storage): receives the new param rounded to bf16 (cpu::adamw_step).
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamWHyper& hyper, std::int64_t step, const Tensor* bf16_copy = nullptr);

// Sum of squares of one f32 tensor in double (cpu::sum_of_squares' fixed lane order).
double grad_sum_of_squares(const Tensor& grad);
// sqrt of the sum of per-tensor sums of squares, added in the order given (the tensors' sums run
// on the current compute pool; the result does not depend on it).
double global_grad_norm(const std::vector<Tensor>& grads);
// min(1, max_norm / (norm + 1e-6)) when max_norm > 0, else 1 (PyTorch clip_grad_norm_).
double clip_factor(double norm, double max_norm);
// Scales every gradient by clip_factor(norm, max_norm) (on the current compute pool); returns the
// factor applied.
double clip_grad_norm(const std::vector<Tensor>& grads, double norm, double max_norm);

// Linear warmup over `warmup` steps to peak_lr, then cosine decay to min_lr_ratio * peak_lr at
// total_steps. step counts from 1.
double warmup_cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total_steps, double peak_lr,
                        double min_lr_ratio);

}  // namespace atl
