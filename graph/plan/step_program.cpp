#include "graph/plan/step_program.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "graph/config_reader.hpp"

namespace atl {

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::all_to_all_v: return "all_to_all_v";
  }
  return "?";
}

const char* step_instruction_name(StepInstructionKind kind) {
  switch (kind) {
    case StepInstructionKind::gather: return "gather";
    case StepInstructionKind::release: return "release";
    case StepInstructionKind::forward: return "forward";
    case StepInstructionKind::backward: return "backward";
    case StepInstructionKind::grads: return "grads";
    case StepInstructionKind::count: return "count";
    case StepInstructionKind::report: return "report";
    case StepInstructionKind::expert_forward: return "expert_forward";
    case StepInstructionKind::expert_backward: return "expert_backward";
  }
  return "?";
}


namespace {

// Emits instructions while tracking which units are gathered, as the actors will.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(const Plan& plan) : plan_(plan), gathered_(plan.units.size(), false) {}

  void gather(std::size_t u) {
    if (gathered_[u]) return;
    gathered_[u] = true;
    const std::string& axis = plan_.units[u].shard_axis;
    emit({StepInstructionKind::gather, -1, -1, u, false, collective(CollectiveOp::all_gather, axis, plan_.units[u].name), 1});
  }
  void gather_named(const std::vector<std::string>& names) {
    for (const auto& name : names) gather(plan_.unit_index(name));
  }
  void release(std::size_t u) {
    if (!gathered_[u]) return;
    gathered_[u] = false;
    emit({StepInstructionKind::release, -1, -1, u, false, 0, 0});
  }
  void run(StepInstructionKind kind, int op, int micro_batch) { emit({kind, op, micro_batch, 0, false, 0, 0}); }
  void grads(std::size_t u, int micro_batch, bool last) {
    std::uint64_t first = 0;
    int count = 0;
    if (last) {
      first = collective(CollectiveOp::reduce_scatter, plan_.units[u].shard_axis, plan_.units[u].name);
      ++count;
      if (plan_.units[u].replicated(plan_.mesh)) {
        collective(CollectiveOp::all_reduce, "dp_replicate", plan_.units[u].name);
        ++count;
      }
    }
    emit({StepInstructionKind::grads, -1, micro_batch, u, last, first, count});
  }
  // The experts op of an expert-parallel plan: its exchange over the ep group.
  void expert_exchange(StepInstructionKind kind, int op, int micro_batch, const std::string& op_name,
                       ExpertDispatchFlow flow) {
    const auto first = static_cast<std::uint64_t>(program_.collectives.size());
    const std::vector<ExchangePart> parts = expert_exchange_parts(flow, kind == StepInstructionKind::expert_forward);
    for (const auto& [op_kind, part] : parts) collective(op_kind, kExpertAxis, op_name + ":" + part);
    emit({kind, op, micro_batch, 0, false, first, static_cast<int>(parts.size())});
  }
  // The step's world all-gathers: `count` before the first forward, `report` at the end.
  void world_gather(StepInstructionKind kind) {
    emit({kind, -1, -1, 0, false, collective(CollectiveOp::all_gather, "world", step_instruction_name(kind)), 1});
  }
  StepProgram finish(int micro_batches) {
    program_.micro_batches = micro_batches;
    return std::move(program_);
  }

 private:
  // Appends a collective (numbered in program order) and returns its number.
  std::uint64_t collective(CollectiveOp op, const std::string& axis, std::string tag) {
    const auto seq = static_cast<std::uint64_t>(program_.collectives.size());
    program_.collectives.push_back({seq, op, axis, std::move(tag)});
    return seq;
  }
  void emit(StepInstruction i) { program_.instructions.push_back(i); }

  const Plan& plan_;
  std::vector<bool> gathered_;
  StepProgram program_;
};

}  // namespace

std::vector<ExchangePart> expert_exchange_parts(ExpertDispatchFlow flow, bool forward) {
  using enum CollectiveOp;
  if (flow == ExpertDispatchFlow::all_to_all) {
    if (forward) {
      return {{all_gather, "counts"}, {all_to_all_v, "dispatch"}, {all_to_all_v, "dispatch_weights"},
              {all_to_all_v, "combine"}};
    }
    return {{all_to_all_v, "combine_grad"}, {all_to_all_v, "dispatch_grad"}, {all_to_all_v, "dispatch_weights_grad"}};
  }
  if (forward) {
    return {{all_gather, "dispatch"}, {all_gather, "dispatch_weights"}, {all_gather, "dispatch_indices"},
            {all_gather, "dispatch_mask"}, {all_reduce, "combine"}};
  }
  return {{all_gather, "combine_grad"}, {reduce_scatter, "dispatch_grad"}, {reduce_scatter, "dispatch_weights_grad"}};
}

StepProgram compile_step_program(const Plan& plan, const std::vector<OpSpec>& op_specs, int micro_batches,
                                 StepSchedule schedule, ExpertDispatchFlow expert_flow) {
  if (micro_batches < 1) {
    throw std::invalid_argument(fmt::format("step program: expected at least 1 micro-batch, got {}", micro_batches));
  }
  // Neither axis has its collectives here yet (stage sends, K/V exchange, gradient sums over cp):
  // a program compiled without them would describe a wrong step.
  const std::pair<const char*, int> uncompiled[] = {{"pp", plan.mesh.pp()}, {"cp", plan.mesh.cp()}};
  for (const auto& [axis, size] : uncompiled) {
    if (size > 1) {
      throw ConfigError(plan.mesh.source_file(), std::string("topology.mesh.") + axis,
                        fmt::format("the step program for {} > 1 is not compiled yet; expected 1, got {}", axis, size));
    }
  }
  const std::vector<std::vector<std::size_t>> op_units = units_per_op(plan, op_specs);
  ProgramBuilder b(plan);
  const int ops = static_cast<int>(op_units.size());
  // A unit read by several ops (a block by its attention and MLP ops) is resharded after its last
  // reader in forward and hands in its gradient after its last reader in backward (its first in
  // forward order).
  std::vector<int> first_reader(plan.units.size(), ops), last_reader(plan.units.size(), -1);
  for (int op = 0; op < ops; ++op) {
    for (std::size_t u : op_units[static_cast<std::size_t>(op)]) {
      first_reader[u] = std::min(first_reader[u], op);
      last_reader[u] = std::max(last_reader[u], op);
    }
  }
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    if (plan.units[u].schedule.resident_for_step) b.gather(u);
  }
  // Under expert parallelism the experts ops exchange rows with the owners of the experts.
  auto exchanged = [&](int op) {
    return plan.mesh.ep() > 1 && op_specs[static_cast<std::size_t>(op)].kind == OpKind::experts;
  };
  auto forward = [&](int m) {
    for (int op = 0; op < ops; ++op) {
      const auto& units = op_units[static_cast<std::size_t>(op)];
      for (std::size_t u : units) b.gather(u);
      for (std::size_t u : units) b.gather_named(plan.units[u].forward_prefetch_units);
      if (m == 0 && op == 0) b.world_gather(StepInstructionKind::count);  // its gathers are in flight
      if (exchanged(op)) {
        b.expert_exchange(StepInstructionKind::expert_forward, op, m, op_specs[static_cast<std::size_t>(op)].name,
                          expert_flow);
      } else {
        b.run(StepInstructionKind::forward, op, m);
      }
      for (std::size_t u : units) {
        if (last_reader[u] == op && plan.units[u].schedule.reshard_after_forward) b.release(u);
      }
    }
  };
  auto backward = [&](int m) {
    const bool last = m + 1 == micro_batches;
    for (int op = ops - 1; op >= 0; --op) {
      const auto& units = op_units[static_cast<std::size_t>(op)];
      for (std::size_t u : units) b.gather(u);
      for (std::size_t u : units) b.gather_named(plan.units[u].backward_prefetch_units);
      if (exchanged(op)) {
        b.expert_exchange(StepInstructionKind::expert_backward, op, m, op_specs[static_cast<std::size_t>(op)].name,
                          expert_flow);
      } else {
        b.run(StepInstructionKind::backward, op, m);
      }
      for (std::size_t u : units) {
        if (first_reader[u] != op) continue;
        b.grads(u, m, last);
        // FSDP2 reshards after backward only on the last micro-batch (MODELS.md §5.4).
        if (last) b.release(u);
      }
    }
  };
  if (schedule == StepSchedule::one_at_a_time) {
    for (int m = 0; m < micro_batches; ++m) {
      forward(m);
      backward(m);
    }
  } else {
    for (int m = 0; m < micro_batches; ++m) forward(m);
    for (int m = 0; m < micro_batches; ++m) backward(m);
  }
  b.world_gather(StepInstructionKind::report);
  StepProgram program = b.finish(micro_batches);
  program.schedule = schedule;
  program.expert_flow = expert_flow;
  program.ops = op_specs;
  program.op_units = op_units;
  // Live micro-batches: from the forward of op 0 to the backward of op 0.
  int live = 0;
  for (const StepInstruction& i : program.instructions) {
    if (i.op != 0) continue;
    if (i.kind == StepInstructionKind::forward) program.activation_buffers = std::max(program.activation_buffers, ++live);
    if (i.kind == StepInstructionKind::backward) --live;
  }
  return program;
}

std::size_t compute_run_end(const StepProgram& program, std::size_t begin) {
  const auto& ins = program.instructions;
  auto is_compute = [&](std::size_t i) { return ins[i].is_compute(); };
  if (begin >= ins.size() || !is_compute(begin)) {
    throw std::invalid_argument("compute_run_end: instruction " + std::to_string(begin) + " is not a forward or backward");
  }
  std::size_t end = begin + 1;
  while (end < ins.size() && is_compute(end) && !(ins[end].kind == StepInstructionKind::forward && ins[end].op == 0)) {
    ++end;
  }
  return end;
}

std::vector<std::uint64_t> posted_by(const StepInstruction& i) {
  std::vector<std::uint64_t> out;
  for (int k = 0; k < i.collective_count; ++k) out.push_back(i.collective + static_cast<std::uint64_t>(k));
  return out;
}

}  // namespace atl
