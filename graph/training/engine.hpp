// What runs training steps: the reference trainer (graph/reference) or the actor runtime
// (actors/). The run loop (run.hpp) drives either through this interface.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/param.hpp"
#include "graph/training/staged_model.hpp"

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
  // False when the loss or the gradient norm was not finite, or when the global batch held no
  // target (nothing to learn from, where AdamW's momentum and weight decay would still move the
  // weights): the optimizer left every parameter and moment as it was. `nonfinite` says which
  // quantity was not finite (and the first unit or tensor whose gradient is not); empty for a
  // batch without targets.
  bool applied = true;
  std::string nonfinite;
  std::int64_t bytes_gathered = 0;  // this process's ranks, parameter traffic, this step (0 for the reference trainer)
  std::int64_t bytes_reduced = 0;
  // Expert parallelism: the dispatched rows sent to the experts' owners and the outputs sent back,
  // forward (the backward moves as much again), this process's ranks, this step.
  std::int64_t bytes_dispatch = 0, bytes_combine = 0;
  // When requested: per micro-batch of the global batch (global order), its router choices.
  std::vector<std::vector<RoutingRecord>> routing;
  // Router load per MoE layer over the whole step (every rank): the busiest expert's tokens over
  // the mean (graph/training/expert_load.hpp); empty for a model without MoE layers.
  std::vector<double> expert_load;
  // Some process of the job asked to stop (request_stop before this step): every process learns it
  // from the same step, so all stop after it together; the signal (the largest number when
  // processes were asked by different ones), else 0. Every process ends with its exit code.
  int stop_signal = 0;
};

// The loss gradient's scale for a step of `targets` scored tokens (the mean over the global
// batch): every engine uses this one expression, so the scaled gradients agree bit for bit.
inline float loss_grad_scale(std::int64_t targets) {
  return targets > 0 ? static_cast<float>(1.0 / static_cast<double>(targets)) : 0.0f;
}

// Everything an optimizer step depends on besides the data: what a checkpoint saves.
struct TrainingState {
  std::int64_t step = 0;  // steps taken
  TensorMap master;       // fp32, full, native layout
  TensorMap exp_avg, exp_avg_sq;
};

// "loss is nan", "gradient norm is inf (first non-finite: model.layers.3.mlp...)": what
// StepResult::nonfinite says. `first` may be empty.
std::string nonfinite_description(double loss, double grad_norm, const std::string& first);

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;
  virtual const char* name() const = 0;
  // The rows of a global batch of `global_rows` that this process reads, as increasing disjoint
  // [begin, end) ranges: its data-parallel ranks' blocks (a single-process engine: all of them).
  virtual std::vector<RowRange> rows_read(std::int64_t global_rows) const { return {{0, global_rows}}; }
  // One optimizer step on the global batch, of which `rows` holds the rows_read ranges concatenated
  // (global rows a multiple of micro_batch × data-parallel ranks). Loss and token counts are the
  // global batch's.
  virtual StepResult step(const Batch& rows, bool record_routing = false) = 0;
  // Whether request_stop reaches every process of the job through the next step (the actor
  // runtime: the step's count collective carries it). Otherwise a stop ends the run before the
  // next step instead.
  virtual bool agrees_on_stop() const { return false; }
  virtual void request_stop(int /*signal*/) {}
  // Masters, AdamW moments and step, full (gathered from shards where sharded), spec order.
  virtual TrainingState state() const = 0;
  TensorMap master_weights() const { return state().master; }
  // A Chrome trace-event JSON of the work so far, for engines that record one.
  virtual std::optional<std::string> chrome_trace() const { return std::nullopt; }
};

}  // namespace atl
