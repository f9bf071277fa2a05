#include "graph/reference/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "graph/training/expert_load.hpp"
#include "kernels/tree_sum.hpp"

namespace atl {

namespace {

// Each parameter's element count, in spec order (the order of every TensorMap the step builds).
std::vector<std::int64_t> spec_sizes(const std::vector<ParamSpec>& specs) {
  std::vector<std::int64_t> sizes;
  for (const auto& s : specs) sizes.push_back(s.numel());
  return sizes;
}

}  // namespace

ReferenceTrainer::ReferenceTrainer(std::shared_ptr<const Model> model, TensorMap master, Precision precision,
                                   std::int64_t micro_batch, OptimizerSettings optimizer, int compute_threads)
    : model_(std::move(model)),
      master_(std::move(master)),
      exp_avg_(TensorMap::zeros_like(model_->specs())),
      exp_avg_sq_(TensorMap::zeros_like(model_->specs())),
      precision_(precision),
      micro_batch_(micro_batch),
      opt_(optimizer),
      weights_(compute_weights(model_->specs(), master_, precision_)),
      sizes_(spec_sizes(model_->specs())) {
  if (micro_batch_ <= 0) throw std::invalid_argument("train.micro_batch: expected a positive integer");
  if (compute_threads > 1) pool_ = std::make_unique<cpu::ComputePool>(compute_threads);
}

ReferenceTrainer::ReferenceTrainer(std::shared_ptr<const Model> model, TrainingState state, Precision precision,
                                   std::int64_t micro_batch, OptimizerSettings optimizer, int compute_threads)
    : ReferenceTrainer(std::move(model), std::move(state.master), precision, micro_batch, optimizer,
                       compute_threads) {
  exp_avg_ = std::move(state.exp_avg);
  exp_avg_sq_ = std::move(state.exp_avg_sq);
  step_ = state.step;
}

StepResult ReferenceTrainer::step(const Batch& batch, bool record_routing) {
  if (batch.rows() % micro_batch_ != 0) {
    throw std::invalid_argument("global batch of " + std::to_string(batch.rows()) +
                                " rows is not a multiple of train.micro_batch " + std::to_string(micro_batch_));
  }
  const auto& specs = model_->specs();
  StepResult r;
  r.step = ++step_;
  r.targets = batch.target_count();
  r.tokens = batch.valid_count();
  const float grad_scale = loss_grad_scale(r.targets);

  cpu::ComputePoolScope scope(pool_.get());
  // Step-wide work between and after the micro-batches (the tree's adds, the norm, AdamW) runs
  // one tensor a task on the pool: elementwise or per tensor, so no bit depends on the threads.
  auto grad_tree = make_tree_sum<TensorMap>([&](TensorMap& left, const TensorMap& right) {
    const auto l = left.tensors(), rt = right.tensors();
    cpu::parallel_for_each_largest_first(sizes_, [&](std::int64_t i) {
      add_inplace(l[static_cast<std::size_t>(i)], rt[static_cast<std::size_t>(i)]);
    });
  });
  auto loss_tree = make_tree_sum<double>([](double& left, const double& right) { left += right; });
  const std::int64_t micro_batches = batch.rows() / micro_batch_;
  if (record_routing) r.routing.resize(static_cast<std::size_t>(micro_batches));
  // Micro-batches in waves of one per thread; their results enter the trees in index order.
  const std::int64_t wave = pool_ ? std::min<std::int64_t>(pool_->threads(), micro_batches) : 1;
  std::vector<TensorMap> micro_grads(static_cast<std::size_t>(wave));
  std::vector<double> losses(static_cast<std::size_t>(wave));
  std::vector<std::vector<RoutingRecord>> routing(static_cast<std::size_t>(wave));
  ExpertCounts load{model_->routed_experts(), {}};
  for (std::int64_t m0 = 0; m0 < micro_batches; m0 += wave) {
    const int count = static_cast<int>(std::min(wave, micro_batches - m0));
    auto run_micro_batch = [&](int i) {
      const std::int64_t m = m0 + i;
      micro_grads[i] = TensorMap::zeros_like(specs);
      Batch micro = batch.slice_rows(m * micro_batch_, (m + 1) * micro_batch_);
      routing[i].clear();
      losses[i] = model_->forward_backward(weights_, micro, precision_, grad_scale, micro_grads[i], &routing[i]).loss_sum;
    };
    if (pool_) {
      pool_->run(count, run_micro_batch);
    } else {
      run_micro_batch(0);
    }
    for (int i = 0; i < count; ++i) {
      grad_tree.push(std::move(micro_grads[i]));
      loss_tree.push(losses[i]);
      const std::int64_t m = m0 + i;
      load.add(routing[i], batch.slice_rows(m * micro_batch_, (m + 1) * micro_batch_).valid);
      if (record_routing) r.routing[static_cast<std::size_t>(m)] = std::move(routing[i]);
    }
  }
  const TensorMap summed = grad_tree.finish();  // held for this step only
  r.loss = r.targets > 0 ? loss_tree.finish() / static_cast<double>(r.targets) : 0.0;
  r.expert_load = load.max_over_mean();

  const std::vector<Tensor> grads = summed.tensors();
  r.grad_norm = global_grad_norm(grads);
  r.lr = warmup_cosine_lr(r.step, opt_.warmup, opt_.total_steps, opt_.lr, opt_.min_lr_ratio);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    std::string first;  // the first parameter (spec order) whose gradient is not finite
    for (const auto& s : specs) {
      if (!std::isfinite(grad_sum_of_squares(summed.at(s.name)))) {
        first = s.name;
        break;
      }
    }
    r.applied = false;
    r.nonfinite = nonfinite_description(r.loss, r.grad_norm, first);
    return r;
  }
  if (r.targets == 0) {
    r.applied = false;
    return r;
  }
  clip_grad_norm(grads, r.grad_norm, opt_.grad_clip);
  cpu::parallel_for_each_largest_first(sizes_, [&](std::int64_t i) {
    const ParamSpec& s = specs[static_cast<std::size_t>(i)];
    AdamWHyper h{static_cast<float>(r.lr), static_cast<float>(opt_.beta1), static_cast<float>(opt_.beta2),
                 static_cast<float>(opt_.eps), s.weight_decay ? static_cast<float>(opt_.weight_decay) : 0.0f};
    const bool own_copy = s.compute_dtype(precision_) == DType::bf16;  // else weights_ holds master_'s tensor
    adamw_step(master_.at(s.name), summed.at(s.name), exp_avg_.at(s.name), exp_avg_sq_.at(s.name), h, r.step,
               own_copy ? &weights_.at(s.name) : nullptr);
  });
  return r;
}

}  // namespace atl
