// The stage actor: the interpreter of its rank's step program (graph/plan/step_program.hpp).
// It walks the program's instructions in order: gather, release and grads go out as messages
// to the unit actors (with the collective sequence numbers the program fixed), forward and
// backward wait for the op's units' params and run on the compute actor. It decides nothing
// about what comes next; the program says it.
#include <algorithm>
#include <bit>
#include <optional>
#include <map>

#include "actors/answer_once.hpp"
#include "actors/stage_state.hpp"
#include "actors/supervision.hpp"
#include "graph/plan/step_program.hpp"

namespace atl::stage {

// The collectives `ins` posts, numbered in the rank's stream (the step's first number + the
// program's).
std::vector<CollectiveNode> scheduled(const StageState& st, const StepInstruction& ins) {
  std::vector<CollectiveNode> out;
  for (std::uint64_t c : posted_by(ins)) {
    CollectiveNode node = st.setup.program->collectives[c];
    node.seq += st.seq_base;
    out.push_back(std::move(node));
  }
  return out;
}

constexpr const char* kFailedBefore = "stage: an earlier step failed on this rank; nothing more runs here";

// Any failure during a step (a unit, a collective, a kernel) ends the step with that error, so
// the trainer and the engine see it instead of waiting forever.
// The stage stays broken: callbacks of the failed step still in flight carry no step identity,
// and its collectives' numbers were taken, so no later step, probe, optimize or export may run.
void fail(stage_pointer self, const caf::error& error) {
  auto& st = self->state;
  st.active = false;
  st.failed = true;
  st.runs.clear();
  if (st.done.pending()) st.done.deliver(error);
}

// Collects the gathered params of `units` into one map, then continues.
void with_params(stage_pointer self, const std::vector<std::size_t>& units,
                 std::function<void(std::shared_ptr<TensorMap>)> next) {
  auto merged = std::make_shared<TensorMap>();
  if (units.empty()) return next(merged);  // ops without parameters (an MoE dispatch)
  auto remaining = std::make_shared<std::size_t>(units.size());
  for (std::size_t u : units) {
    self->request(self->state.setup.units[u], caf::infinite, params_atom::value)
        .then(
            [=](const GatheredParams& p) {
              for (const auto& name : p.params->names()) merged->insert(name, p.params->at(name));
              if (--*remaining == 0 && self->state.active) next(merged);  // not after a failure
            },
            [=](caf::error& e) { fail(self, e); });
  }
}

// What one compute instruction adds to a job: its task, and what the stage does after the job.
struct ComputePart {
  ComputeTask task;
  std::function<void()> after;
};

// The forward of one op for one micro-batch. Op 0 starts the micro-batch (an activation buffer).
std::optional<ComputePart> forward_part(stage_pointer self, const StepInstruction& ins,
                                        std::shared_ptr<TensorMap> weights) {
  auto& st = self->state;
  const int mb = ins.micro_batch, op = ins.op;
  if (op == 0) {
    if (!st.counted) {  // the program counts before the first forward; a run needs its loss scale
      fail(self, caf::make_error(caf::sec::runtime_error, "stage: a micro-batch starts before the step's count"));
      return std::nullopt;
    }
    if (static_cast<int>(st.runs.size()) >= st.setup.program->activation_buffers) {
      fail(self, caf::make_error(caf::sec::runtime_error,
                                 "stage: micro-batch " + std::to_string(mb) + " would exceed the plan's " +
                                     std::to_string(st.setup.program->activation_buffers) + " activation buffers"));
      return std::nullopt;
    }
    try {
      st.runs[mb] = st.setup.model->start(st.step.micro_batches[static_cast<std::size_t>(mb)],
                                          st.setup.plan->precision, st.grad_scale);
    } catch (const std::exception& e) {
      fail(self, caf::make_error(caf::sec::runtime_error, "rank " + std::to_string(st.setup.rank) + ": " + e.what()));
      return std::nullopt;
    }
  }
  auto run = st.runs.at(mb);
  const bool last = op + 1 == static_cast<int>(st.setup.program->ops.size());
  return ComputePart{{"forward " + st.setup.model->ops()[static_cast<std::size_t>(op)].name,
                      [run, op, weights] { run->forward(op, *weights); }},
                     [=] {
                       if (!last) return;
                       auto& s = self->state;
                       s.loss_sums.push_back(run->loss_sum());
                       const std::vector<RoutingRecord> routing = run->routing();
                       s.load.add(routing, s.step.micro_batches[static_cast<std::size_t>(mb)].valid);
                       if (s.step.record_routing) s.routing.push_back(routing);
                     }};
}

// The backward of one op for one micro-batch, adding into its units' gradients (created, zero,
// by the first backward op that reads the unit). Op 0 ends the micro-batch.
ComputePart backward_part(stage_pointer self, const StepInstruction& ins, std::shared_ptr<TensorMap> weights) {
  auto& st = self->state;
  const int op = ins.op, mb = ins.micro_batch;
  auto grads = std::make_shared<TensorMap>();  // this op's units' gradient tensors, by name
  for (std::size_t u : st.setup.program->op_units[static_cast<std::size_t>(op)]) {
    auto& mine = st.unit_grads[u];
    if (mine.empty()) {
      mine.push_back(std::make_shared<TensorMap>());
      for (const auto& p : st.setup.plan->units[u].params) {
        mine[0]->insert(p.name, Tensor::zeros(weights->at(p.name).shape()));
      }
    }
    for (const auto& name : mine[0]->names()) grads->insert(name, mine[0]->at(name));
  }
  auto run = st.runs.at(mb);
  return ComputePart{{"backward " + st.setup.model->ops()[static_cast<std::size_t>(op)].name,
                      [run, op, weights, grads] { run->backward(op, *weights, *grads); }},
                     [=] {
                       if (op == 0) self->state.runs.erase(mb);  // the micro-batch is done
                     }};
}

// Runs the compute run at pc (compute_run_end: consecutive forwards and backwards) as one job on
// the compute actor once its ops' units' params are there; afterwards each part's `after` in
// order, then the instruction after the run.
void run_compute(stage_pointer self) {
  auto& st = self->state;
  const std::size_t begin = st.pc, end = compute_run_end(*st.setup.program, begin);
  std::vector<std::size_t> units;  // read by the run, each once
  for (std::size_t i = begin; i < end; ++i) {
    for (std::size_t u : st.setup.program->op_units[static_cast<std::size_t>(st.setup.program->instructions[i].op)]) {
      if (std::find(units.begin(), units.end(), u) == units.end()) units.push_back(u);
    }
  }
  with_params(self, units, [=](std::shared_ptr<TensorMap> weights) {
    auto& s = self->state;
    ComputeJob job;
    std::vector<std::function<void()>> after;
    for (std::size_t i = begin; i < end; ++i) {
      const StepInstruction& ins = s.setup.program->instructions[i];
      std::optional<ComputePart> part =
          ins.kind == StepInstructionKind::forward ? forward_part(self, ins, weights) : backward_part(self, ins, weights);
      if (!part) return;  // the step failed
      job.tasks.push_back(std::move(part->task));
      after.push_back(std::move(part->after));
    }
    self->request(s.setup.compute, caf::infinite, run_atom::value, std::move(job))
        .then(
            [=](done_atom) {
              if (!self->state.active) return;  // a failed step goes no further
              for (const auto& a : after) a();
              self->state.pc = end;
              advance(self);
            },
            [=](caf::error& e) { fail(self, e); });
  });
}

void send_grads(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  std::vector<std::shared_ptr<const TensorMap>> mine(st.unit_grads[ins.unit].begin(), st.unit_grads[ins.unit].end());
  st.unit_grads[ins.unit].clear();
  self->send(st.setup.units[ins.unit], grads_atom::value, UnitGrads{std::move(mine), ins.last, scheduled(st, ins)});
}

// Doubles travel bit for bit as i64 (a collective moves bytes; there is no f64 dtype).
// The expert token counts follow as they are.
Tensor encode_report(const std::vector<double>& loss_sums, const std::vector<double>& sum_squares,
                     const std::vector<std::int64_t>& expert_counts) {
  Tensor t = Tensor::empty(
      {static_cast<std::int64_t>(loss_sums.size() + sum_squares.size() + expert_counts.size())}, DType::i64);
  auto* out = t.data<std::int64_t>();
  for (double v : loss_sums) *out++ = std::bit_cast<std::int64_t>(v);
  for (double v : sum_squares) *out++ = std::bit_cast<std::int64_t>(v);
  for (std::int64_t c : expert_counts) *out++ = c;
  return t;
}

// The report instruction: once every unit has reduced, all-gather this rank's loss sums, gradient
// sums of squares and expert token counts over the world, then answer the step with everyone's
// (the counts summed: integers, so the order does not matter).
void report(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  const std::size_t n = st.setup.units.size();
  auto sum_squares = std::make_shared<std::vector<double>>(n, 0.0);
  auto remaining = std::make_shared<std::size_t>(n);
  const std::uint64_t seq = st.seq_base + ins.collective;
  for (std::size_t u = 0; u < n; ++u) {
    self->request(st.setup.units[u], caf::infinite, reduced_atom::value)
        .then(
            [=](double value) {
              (*sum_squares)[u] = value;
              if (--*remaining != 0 || !self->state.active) return;
              auto& s = self->state;
              const Tensor send = encode_report(s.loss_sums, *sum_squares, s.load.counts);
              const int world = s.setup.plan->mesh.world_size();
              const Tensor recv = Tensor::empty({world * send.numel()}, DType::i64);
              self->request(s.setup.comm, caf::infinite, collect_atom::value,
                            CollectiveRequest{seq, s.setup.program->collectives[ins.collective].axis,
                                              CollectiveKind::all_gather, send, recv, "report", {}, {}})
                  .then(
                      [=](done_atom) {
                        auto& s2 = self->state;
                        StageReport out;
                        out.targets = s2.targets;
                        out.stop_signal = static_cast<int>(s2.stop_signal);
                        out.tokens = s2.tokens;
                        const std::size_t micro = s2.loss_sums.size(), experts = s2.load.counts.size();
                        const std::size_t per_rank = micro + n + experts;
                        ExpertCounts load{s2.load.experts, {}};
                        const auto* all = recv.data<std::int64_t>();
                        for (int r = 0; r < world; ++r) {
                          const auto* mine = all + static_cast<std::size_t>(r) * per_rank;
                          auto& losses = out.loss_sums.emplace_back(micro);
                          for (std::size_t m = 0; m < micro; ++m) losses[m] = std::bit_cast<double>(mine[m]);
                          auto& squares = out.unit_sum_squares.emplace_back(n);
                          for (std::size_t k = 0; k < n; ++k) squares[k] = std::bit_cast<double>(mine[micro + k]);
                          load.add(std::vector<std::int64_t>(mine + micro + n, mine + per_rank));
                        }
                        out.expert_counts = std::move(load.counts);
                        out.routing = s2.routing;
                        s2.active = false;
                        if (s2.done.pending()) s2.done.deliver(std::move(out));
                      },
                      [=](caf::error& e) { fail(self, e); });
            },
            [=](caf::error& e) { fail(self, e); });
  }
}

// The count instruction: all-gather this rank's target and token counts over the world, then
// (every rank in the same rank order) the step's totals and the loss scale; the program goes on.
// One contribution per rank is right while every rank has rows of its own (pp = cp = 1, which
// Mesh::require_runnable enforces); with cp or pp, one rank per data-parallel index must count.
void count(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  // targets, tokens, and whether this rank's process asks to stop after this step
  const Tensor send = Tensor::empty({3}, DType::i64);
  send.data<std::int64_t>()[0] = send.data<std::int64_t>()[1] = 0;
  send.data<std::int64_t>()[2] = st.step.stop_signal;
  for (const Batch& b : st.step.micro_batches) {
    send.data<std::int64_t>()[0] += b.target_count();
    send.data<std::int64_t>()[1] += b.valid_count();
  }
  const int world = st.setup.plan->mesh.world_size();
  const Tensor recv = Tensor::empty({3 * world}, DType::i64);
  self->request(st.setup.comm, caf::infinite, collect_atom::value,
                CollectiveRequest{st.seq_base + ins.collective, st.setup.program->collectives[ins.collective].axis,
                                  CollectiveKind::all_gather, send, recv, "count", {}, {}})
      .then(
          [=](done_atom) {
            auto& s = self->state;
            if (!s.active) return;
            s.targets = s.tokens = 0;
            s.stop_signal = 0;
            for (int r = 0; r < world; ++r) {
              s.targets += recv.data<std::int64_t>()[3 * r];
              s.tokens += recv.data<std::int64_t>()[3 * r + 1];
              s.stop_signal = std::max(s.stop_signal, recv.data<std::int64_t>()[3 * r + 2]);
            }
            s.grad_scale = loss_grad_scale(s.targets);
            s.counted = true;
            ++s.pc;
            advance(self);
          },
          [=](caf::error& e) { fail(self, e); });
}

// Walks instructions until one must wait (a compute run, the count) or the program ends.
void advance(stage_pointer self) {
  auto& st = self->state;
  const auto& instructions = st.setup.program->instructions;
  while (st.active && st.pc < instructions.size()) {
    const StepInstruction& ins = instructions[st.pc];
    switch (ins.kind) {
      case StepInstructionKind::gather:
        self->send(st.setup.units[ins.unit], gather_atom::value, scheduled(st, ins).at(0));
        break;
      case StepInstructionKind::release:
        self->send(st.setup.units[ins.unit], release_atom::value);
        break;
      case StepInstructionKind::grads:
        send_grads(self, ins);
        break;
      case StepInstructionKind::forward:
      case StepInstructionKind::backward:
        return run_compute(self);
      case StepInstructionKind::count:
        return count(self, ins);  // waits for the step's totals
      case StepInstructionKind::expert_forward:
        return expert_forward(self, ins);  // waits for the exchange
      case StepInstructionKind::expert_backward:
        return expert_backward(self, ins);
      case StepInstructionKind::report:
        ++st.pc;
        return report(self, ins);  // the last instruction: it answers the step
    }
    ++st.pc;
  }
}

// Export, unit by unit in plan order (one unit's buffers at a time): take the unit's shards,
// all-gather master, exp_avg and exp_avg_sq over the shard group on the rank's stream. Every rank
// takes part; only a rank asked to `keep` holds on to the gathered tensors (so a process keeps one
// copy of the model, not one per rank). The request is answered once, with the first error.
void export_units(stage_pointer self, std::shared_ptr<GatheredState> out, std::size_t u, bool keep,
                  AnswerOnce<GatheredState> rp) {
  auto& st = self->state;
  if (u == st.setup.units.size()) {
    rp.deliver(std::move(*out));
    return;
  }
  const UnitPlan& unit = st.setup.plan->units[u];
  self->request(st.setup.units[u], caf::infinite, master_atom::value)
      .then(
          [=](const UnitShards& shards) mutable {
            auto& s = self->state;
            auto gathered = std::make_shared<UnitShards>();
            const Tensor sources[3] = {shards.master, shards.exp_avg, shards.exp_avg_sq};
            Tensor* targets[3] = {&gathered->master, &gathered->exp_avg, &gathered->exp_avg_sq};
            // An expert-group unit holds one EP slice: every slice comes, over the world (rank order).
            const bool experts = unit.ep_slices > 1;
            const std::string axis = experts ? std::string("world") : unit.shard_axis;
            const int members = experts ? s.setup.plan->mesh.world_size() : unit.shard_count;
            for (Tensor* t : targets) *t = Tensor::empty({members * unit.shard_numel});
            auto remaining = std::make_shared<int>(3);
            for (int k = 0; k < 3; ++k) {
              self->request(s.setup.comm, caf::infinite, collect_atom::value,
                            CollectiveRequest{s.next_seq++, axis, CollectiveKind::all_gather, sources[k],
                                              *targets[k], unit.name, {}, {}})
                  .then(
                      [=](done_atom) mutable {
                        if (--*remaining != 0) return;
                        if (keep) out->units.push_back(*gathered);
                        export_units(self, out, u + 1, keep, rp);
                      },
                      [=](caf::error& e) { rp.deliver(e); });
            }
          },
          [=](caf::error& e) { rp.deliver(e); });
}

stage_actor::behavior_type stage_behavior(stage_pointer self, StageActorSetup setup) {
  exit_with_exception_message(self);
  self->state.setup = std::move(setup);
  return {
      [=](step_atom, StageStep step) -> caf::result<StageReport> {
        auto& s = self->state;
        if (step.micro_batches.empty()) return caf::make_error(caf::sec::runtime_error, "stage: no micro-batches");
        if (s.active) return caf::make_error(caf::sec::runtime_error, "stage: a step is already running");
        if (s.failed) return caf::make_error(caf::sec::runtime_error, kFailedBefore);
        if (static_cast<int>(step.micro_batches.size()) != s.setup.program->micro_batches) {
          return caf::make_error(caf::sec::runtime_error,
                                 "stage: " + std::to_string(step.micro_batches.size()) +
                                     " micro-batches, the step program runs " +
                                     std::to_string(s.setup.program->micro_batches) + " per rank");
        }
        s.unit_grads.assign(s.setup.units.size(), {});
        s.exchanges.clear();
        s.step = std::move(step);
        s.pc = 0;
        s.seq_base = s.next_seq;
        s.next_seq += s.setup.program->collectives.size();
        s.loss_sums.clear();
        s.routing.clear();
        s.load = ExpertCounts{s.setup.model->routed_experts(), {}};
        s.counted = false;  // the program's count sets targets, tokens and grad_scale for this step
        s.targets = s.tokens = 0;
        s.grad_scale = 0;
        s.active = true;
        s.done = self->make_response_promise<StageReport>();
        advance(self);
        return s.done;
      },
      // Between steps: gather one unit, take its params, reshard it (a gather round trip). It
      // takes the next number of the rank's stream, like a one-collective program.
      [=](probe_atom, std::uint64_t unit) -> caf::result<done_atom> {
        // (A probe takes the next number of the rank's stream: mid-step it would shift the step's.)
        if (self->state.active) return caf::make_error(caf::sec::runtime_error, "stage: probe during a step");
        if (self->state.failed) return caf::make_error(caf::sec::runtime_error, kFailedBefore);
        auto rp = self->make_response_promise<done_atom>();
        const auto u = static_cast<std::size_t>(unit);
        const unit_actor target = self->state.setup.units[u];
        self->send(target, gather_atom::value,
                   CollectiveNode{self->state.next_seq++, CollectiveOp::all_gather,
                                  self->state.setup.plan->units[u].shard_axis, "probe"});
        self->request(target, caf::infinite, params_atom::value)
            .then(
                [=](const GatheredParams&) mutable {
                  self->send(target, release_atom::value);
                  rp.deliver(done_atom::value);
                },
                [=](caf::error& e) mutable { rp.deliver(e); });
        return rp;
      },
      [=](export_atom, bool keep) -> caf::result<GatheredState> {
        if (self->state.active) return caf::make_error(caf::sec::runtime_error, "stage: export during a step");
        if (self->state.failed) return caf::make_error(caf::sec::runtime_error, kFailedBefore);
        const AnswerOnce<GatheredState> rp(self->make_response_promise<GatheredState>());
        export_units(self, std::make_shared<GatheredState>(), 0, keep, rp);
        return rp.promise();
      },
      [=](optimize_atom, OptimizerStep msg) -> caf::result<done_atom> {
        if (self->state.active) return caf::make_error(caf::sec::runtime_error, "stage: optimize during a step");
        if (self->state.failed) return caf::make_error(caf::sec::runtime_error, kFailedBefore);
        const AnswerOnce<done_atom> rp(self->make_response_promise<done_atom>());
        auto remaining = std::make_shared<std::size_t>(self->state.setup.units.size());
        for (const auto& unit : self->state.setup.units) {
          self->request(unit, caf::infinite, optimize_atom::value, msg)
              .then(
                  [=](done_atom) {
                    if (--*remaining == 0) rp.deliver(done_atom::value);
                  },
                  [=](caf::error& e) { rp.deliver(e); });
        }
        return rp.promise();
      },
  };
}

}  // namespace atl::stage

namespace atl {

stage_actor spawn_stage_actor(caf::actor_system& system, StageActorSetup setup) {
  return system.spawn(stage::stage_behavior, std::move(setup));
}

}  // namespace atl
