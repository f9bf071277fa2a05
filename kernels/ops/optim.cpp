#include "kernels/ops/optim.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamWHyper& h, std::int64_t step, const Tensor* bf16_copy) {
  KernelScope scope(KernelKind::optimizer);
  constexpr const char* op = "adamw_step";
  for (const auto* t : {&param, &grad, &exp_avg, &exp_avg_sq}) detail::require_dtype(op, "tensor", *t, DType::f32);
  require(grad.shape() == param.shape() && exp_avg.shape() == param.shape() && exp_avg_sq.shape() == param.shape(), op,
          [&] { return "param, grad and moments must share one shape; param is " + param.describe(); });
  require(step >= 1, op, [&] { return "step must be >= 1, got " + std::to_string(step); });
  float* copy = nullptr;
  if (bf16_copy) {
    detail::require_tensor(op, "bf16_copy", *bf16_copy, DType::f32, param.shape());
    copy = bf16_copy->data<float>();
    const auto bytes = static_cast<std::uintptr_t>(param.numel()) * sizeof(float);
    const auto c = reinterpret_cast<std::uintptr_t>(copy);
    for (const auto* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
      const auto o = reinterpret_cast<std::uintptr_t>(t->data<float>());
      require(c + bytes <= o || o + bytes <= c, op,
              [] { return std::string("bf16_copy must not overlap param, grad or the moments"); });
    }
  }
  cpu::adamw_step(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                  param.numel(), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step, copy);
}

namespace {

// Each tensor's element count, in order (the sizes parallel_for_each_largest_first takes).
std::vector<std::int64_t> numels(const std::vector<Tensor>& tensors) {
  std::vector<std::int64_t> counts;
  counts.reserve(tensors.size());
  for (const Tensor& t : tensors) counts.push_back(t.numel());
  return counts;
}

}  // namespace

double grad_sum_of_squares(const Tensor& grad) {
  detail::require_dtype("grad_sum_of_squares", "grad", grad, DType::f32);
  return cpu::sum_of_squares(grad.data<float>(), grad.numel());
}

double global_grad_norm(const std::vector<Tensor>& grads) {
  KernelScope scope(KernelKind::optimizer);
  // Each tensor's sum on its own (on the compute pool when there is one), then added in order.
  std::vector<double> sums(grads.size());
  cpu::parallel_for_each_largest_first(numels(grads), [&](std::int64_t i) {
    sums[static_cast<std::size_t>(i)] = grad_sum_of_squares(grads[static_cast<std::size_t>(i)]);
  });
  double total = 0;
  for (double s : sums) total += s;
  return std::sqrt(total);
}

double clip_factor(double norm, double max_norm) {
  return max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
}

double clip_grad_norm(const std::vector<Tensor>& grads, double norm, double max_norm) {
  KernelScope scope(KernelKind::optimizer);
  const double factor = clip_factor(norm, max_norm);
  if (factor < 1.0) {
    cpu::parallel_for_each_largest_first(numels(grads), [&](std::int64_t i) {
      scale_inplace(grads[static_cast<std::size_t>(i)], static_cast<float>(factor));
    });
  }
  return factor;
}

double warmup_cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total_steps, double peak_lr,
                        double min_lr_ratio) {
  if (warmup > 0 && step <= warmup) return peak_lr * static_cast<double>(step) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<std::int64_t>(total_steps - warmup, 1));
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace atl
