#include "graph/plan/memory.hpp"

#include "graph/plan/step_program.hpp"

#include <map>

namespace atl {

std::int64_t gathered_bytes(const UnitPlan& unit) {
  return static_cast<std::int64_t>(unit.shard_count) * unit.shard_numel *
         static_cast<std::int64_t>(element_size(unit.policy.param_dtype));
}

int gathers_per_step(const UnitPlan& unit) {
  return unit.schedule.reshard_after_forward && !unit.schedule.resident_for_step ? 2 : 1;
}

MemoryEstimate estimate_memory(const Plan& plan, int stage, const StepProgram* program) {
  MemoryEstimate m;
  std::int64_t shard_bytes = 0;
  for (const auto& u : plan.units) {
    if (u.stage == stage) shard_bytes += u.shard_numel * static_cast<std::int64_t>(element_size(DType::f32));
    UnitTraffic t;
    t.name = u.name;
    t.gathered_bytes = gathered_bytes(u);
    t.gathers_per_step = gathers_per_step(u);
    t.bytes_gathered_per_step = t.gathered_bytes * t.gathers_per_step;
    m.units.push_back(t);
  }
  m.parameter_bytes = shard_bytes;
  m.gradient_bytes = shard_bytes;
  m.optimizer_bytes = 2 * shard_bytes;

  std::vector<bool> held(plan.units.size(), false);
  auto gather = [&](std::size_t i) { held[i] = true; };
  auto gather_named = [&](const std::vector<std::string>& names) {
    for (const auto& n : names) gather(plan.unit_index(n));
  };
  auto observe = [&](const std::string& where) {
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < held.size(); ++i) {
      if (held[i]) sum += gathered_bytes(plan.units[i]);
    }
    if (sum > m.peak_gathered_bytes) {
      m.peak_gathered_bytes = sum;
      m.peak_at = where;
    }
  };
  if (program) {
    for (const StepInstruction& in : program->instructions) {
      switch (in.kind) {
        case StepInstructionKind::gather: held[in.unit] = true; break;
        case StepInstructionKind::release: held[in.unit] = false; break;
        case StepInstructionKind::forward:
        case StepInstructionKind::backward:
        case StepInstructionKind::expert_forward:
        case StepInstructionKind::expert_backward:
          observe(std::string(step_instruction_name(in.kind)) + " of " +
                  program->ops.at(static_cast<std::size_t>(in.op)).name);
          break;
        default: break;
      }
    }
    return m;
  }
  for (std::size_t i = 0; i < plan.units.size(); ++i) {
    const UnitPlan& u = plan.units[i];
    if (u.stage != stage) continue;
    gather(i);
    gather_named(u.forward_prefetch_units);
    observe("forward of " + u.name);
    if (u.schedule.reshard_after_forward && !u.schedule.resident_for_step) held[i] = false;
  }
  for (std::size_t i = plan.units.size(); i-- > 0;) {
    const UnitPlan& u = plan.units[i];
    if (u.stage != stage) continue;
    gather(i);
    gather_named(u.backward_prefetch_units);
    observe("backward of " + u.name);
    if (!u.schedule.resident_for_step) held[i] = false;
  }
  return m;
}

}  // namespace atl
