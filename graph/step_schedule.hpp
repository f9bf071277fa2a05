// The order of a step's micro-batches (train.schedule). one_at_a_time: each micro-batch's forward
// then its backward (FSDP2 gradient accumulation; one micro-batch's activations alive at a time).
// all_forward_first: every forward, then every backward in micro-batch order (GPipe's order: all
// micro-batches' activations alive at once, what a pipeline stage needs to fill). Both give the
// same numbers: each unit adds its micro-batch gradients in micro-batch order either way. It is
// job-wide: every rank must compile the same step program (the collectives' order follows it).
#pragma once

namespace atl {

enum class StepSchedule { one_at_a_time, all_forward_first };

inline const char* step_schedule_name(StepSchedule schedule) {
  return schedule == StepSchedule::one_at_a_time ? "one_at_a_time" : "all_forward_first";
}

}  // namespace atl
