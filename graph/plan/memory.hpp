// Per-rank memory estimate of a Plan, and the all-gather traffic of each unit per step.
//
// Counted: fp32 master shards, fp32 gradient shards, AdamW state (two fp32 moments per shard
// element) and the peak of gathered (full, padded) parameter buffers in each unit's param dtype.
// Not counted: activations, unsharded gradients before the reduce-scatter, communication
// scratch. The walk is one micro-batch per step (forward then backward):
//   forward, unit by unit: gather the unit and the blocks it prefetches; after its forward a unit
//   with reshard_after_forward (and not resident) is freed; islands stay for the step, the last
//   block, root and heads stay until their backward.
//   backward, in reverse unit order: re-gather the unit if it was freed, gather the blocks it
//   prefetches; after its backward the unit is freed unless it is resident for the step.
// The peak is the largest sum of held buffers seen at any unit's forward or backward.
// With pp > 1 a rank holds only its stage's units: the estimate is per stage.
// Given the step program the runtime runs (pp = cp = 1), the peak is its own: its gathers and
// releases replayed, observed at every compute instruction. The unit walk misses what ops hold
// together: under expert parallelism a layer's block stays gathered while its experts run (the
// combine op reads it), one block more than the walk counts (beam-small, ep 2: 17% more).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "graph/plan/plan.hpp"

namespace atl {

struct StepProgram;  // graph/plan/step_program.hpp

struct UnitTraffic {
  std::string name;
  std::int64_t gathered_bytes = 0;    // one gathered buffer: shard_count * shard_numel in param dtype
  int gathers_per_step = 0;           // 1 (islands, units kept through backward) or 2 (resharded)
  std::int64_t bytes_gathered_per_step = 0;  // gathered_bytes * gathers_per_step
};

struct MemoryEstimate {
  std::int64_t parameter_bytes = 0;  // fp32 master shards
  std::int64_t gradient_bytes = 0;   // fp32 gradient shards
  std::int64_t optimizer_bytes = 0;  // AdamW: 2 x fp32 shards
  std::int64_t peak_gathered_bytes = 0;
  std::string peak_at;  // where the peak is first reached: "forward of <unit>" / "backward of <unit>"
  std::vector<UnitTraffic> units;  // in plan order
  std::int64_t total_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes + peak_gathered_bytes; }
};

std::int64_t gathered_bytes(const UnitPlan& unit);
int gathers_per_step(const UnitPlan& unit);
// The ranks of pipeline stage `stage` (0 when pp = 1); `units` lists every unit of the plan.
MemoryEstimate estimate_memory(const Plan& plan, int stage = 0, const StepProgram* program = nullptr);

}  // namespace atl
