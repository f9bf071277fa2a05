// The single-process reference trainer: plain loops over the model code, no actors, no
// sharding. Every distributed layout is tested against it.
//
// One step: the global batch is split into micro-batches; each micro-batch's gradient of
// (loss_sum / valid targets of the whole global batch) is computed separately and the
// micro-batch gradients (and loss sums) are added over the fixed pairwise tree of
// micro-batch indices (tree_sum.hpp); then global grad-norm clipping and AdamW with a
// warmup + cosine schedule on fp32 master weights.
//
// Threads (compute.threads): micro-batches run side by side, one per thread, when a step has
// several; otherwise the kernels split their outputs over the threads. The step-wide work (the
// gradient tree's adds, the norm, the clip, AdamW) runs one tensor per task. Either way the sums
// keep their fixed order, so results are bitwise independent of the thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/models/model.hpp"
#include "graph/param.hpp"
#include "graph/training/engine.hpp"
#include "kernels/cpu/compute_pool.hpp"
#include "kernels/ops/optim.hpp"

namespace atl {

class ReferenceTrainer : public TrainingEngine {
 public:
  ReferenceTrainer(std::shared_ptr<const Model> model, TensorMap master, Precision precision,
                   std::int64_t micro_batch, OptimizerSettings optimizer, int compute_threads = 1);
  // Resuming from a saved state (masters, moments, step).
  ReferenceTrainer(std::shared_ptr<const Model> model, TrainingState state, Precision precision,
                   std::int64_t micro_batch, OptimizerSettings optimizer, int compute_threads = 1);

  const char* name() const override { return "reference"; }
  StepResult step(const Batch& global_batch, bool record_routing = false) override;
  TrainingState state() const override { return {step_, master_.clone(), exp_avg_.clone(), exp_avg_sq_.clone()}; }

  // Read only: the bf16 weights the forward reads are kept by AdamW, so a write through these
  // tensors would not reach them (build a new trainer from a changed state instead).
  const TensorMap& master() const { return master_; }

 private:
  std::shared_ptr<const Model> model_;
  TensorMap master_, exp_avg_, exp_avg_sq_;
  Precision precision_;
  std::int64_t micro_batch_;
  OptimizerSettings opt_;
  std::int64_t step_ = 0;
  std::unique_ptr<cpu::ComputePool> pool_;  // null: one thread
  // What the forward reads: compute_weights(master_), kept current by each step's AdamW (fp32
  // tensors are master_'s own storage; bf16 copies are written by the fused update).
  TensorMap weights_;
  std::vector<std::int64_t> sizes_;  // parameters' element counts (spec order): the step's tasks, largest first
};

}  // namespace atl
