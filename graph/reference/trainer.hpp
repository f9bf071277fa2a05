// The single-process reference trainer: plain loops over the model code, no actors, no
// sharding. Every distributed layout is tested against it.
//
// One step: the global batch is split into micro-batches; each micro-batch's gradient of
// (loss_sum / valid targets of the whole global batch) is computed separately and the
// micro-batch gradients (and loss sums) are added over the fixed pairwise tree of
// micro-batch indices (tree_sum.hpp); then global grad-norm clipping and AdamW with a
// warmup + cosine schedule on fp32 master weights.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/models/beam/model.hpp"
#include "graph/param.hpp"
#include "kernels/ops/optim.hpp"

namespace atl {

struct OptimizerSettings {
  double lr = 1e-3;
  std::int64_t warmup = 0;
  std::int64_t total_steps = 1;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // 0 = off
};

struct StepResult {
  std::int64_t step = 0;  // 1-based step just taken
  double loss = 0;        // mean CE over the global batch's targets
  std::int64_t targets = 0;
  std::int64_t tokens = 0;  // valid input tokens processed
  double grad_norm = 0;     // before clipping
  double lr = 0;
  std::vector<RoutingRecord> routing;  // first micro-batch's router choices, when requested
};

class ReferenceTrainer {
 public:
  ReferenceTrainer(std::shared_ptr<const BeamModel> model, TensorMap master, Precision precision,
                   std::int64_t micro_batch, OptimizerSettings optimizer);

  // One optimizer step on a global batch (rows must be a multiple of micro_batch).
  StepResult step(const Batch& global_batch, bool record_routing = false);

  const TensorMap& master() const { return master_; }
  const TensorMap& exp_avg() const { return exp_avg_; }
  const TensorMap& exp_avg_sq() const { return exp_avg_sq_; }
  std::int64_t steps_done() const { return step_; }
  const BeamModel& model() const { return *model_; }

  // The summed, unclipped gradient of the last step (for tests).
  const TensorMap& last_gradients() const { return last_grads_; }

 private:
  std::shared_ptr<const BeamModel> model_;
  TensorMap master_, exp_avg_, exp_avg_sq_, last_grads_;
  Precision precision_;
  std::int64_t micro_batch_;
  OptimizerSettings opt_;
  std::int64_t step_ = 0;
};

}  // namespace atl
