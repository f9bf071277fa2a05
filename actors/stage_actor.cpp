// The stage actor: runs one pipeline stage's schedule (with pp = 1, the whole model) for this
// rank's micro-batches. For each op (embedding, each layer, final) it makes sure the op's units
// are gathered, prefetches as the plan's schedules say, hands the math to the compute actor, and
// afterwards reshards units and sends them their gradients.
//
// Every collective a unit will issue on the shard or replicate group gets its sequence number
// here, in program order: the same order on every rank, so comm actors issue identical streams.
#include "actors/spawn.hpp"

namespace atl {

// Units of op `op` (by role and layer): embedding; layer l = its islands and block; final = root,
// head and model-level islands (Inkling2's output_query).
std::vector<std::vector<std::size_t>> units_per_op(const Plan& plan, const StagedModel& model) {
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(model.op_count()));
  for (int op = 0; op < model.op_count(); ++op) {
    for (std::size_t u = 0; u < plan.units.size(); ++u) {
      const UnitPlan& unit = plan.units[u];
      bool mine = false;
      switch (model.op_kind(op)) {
        case OpKind::embedding:
          mine = unit.role == UnitRole::embedding;
          break;
        case OpKind::layer:
          mine = unit.layer == model.op_layer(op);
          break;
        case OpKind::final:
          mine = unit.role == UnitRole::root || unit.role == UnitRole::head ||
                 (unit.role == UnitRole::island && unit.layer < 0);
          break;
      }
      if (mine) out[static_cast<std::size_t>(op)].push_back(u);
    }
  }
  return out;
}

namespace {

struct StageState {
  StageActorSetup setup;
  int ops = 0;
  std::vector<std::vector<std::size_t>> op_units;  // op -> unit indices (plan order)
  std::vector<bool> gathered;                      // as last told to each unit
  std::uint64_t shard_seq = 0, replicate_seq = 0;
  // The step in flight.
  StageStep step;
  std::size_t micro_batch = 0;
  std::shared_ptr<MicroBatchRun> run;  // shared with compute jobs in flight
  std::vector<double> loss_sums;
  std::vector<std::vector<RoutingRecord>> routing;
  caf::typed_response_promise<StageReport> done;
};

using stage_pointer = stage_actor::stateful_pointer<StageState>;

void forward_op(stage_pointer self, int op);
void backward_op(stage_pointer self, int op);

// Any failure during a step (a unit, a collective, a kernel) ends the step with that error, so
// the trainer and the engine see it instead of waiting forever.
void fail(stage_pointer self, const caf::error& error) {
  auto& st = self->state;
  st.run.reset();
  if (st.done.pending()) st.done.deliver(error);
}

void ensure_gathered(stage_pointer self, std::size_t u) {
  auto& st = self->state;
  if (st.gathered[u]) return;
  st.gathered[u] = true;
  self->send(st.setup.units[u], gather_atom::value, st.shard_seq++);
}

void ensure_op_gathered(stage_pointer self, int op) {
  if (op < 0 || op >= self->state.ops) return;
  for (std::size_t u : self->state.op_units[static_cast<std::size_t>(op)]) ensure_gathered(self, u);
}

void release(stage_pointer self, std::size_t u) {
  auto& st = self->state;
  if (!st.gathered[u]) return;
  st.gathered[u] = false;
  self->send(st.setup.units[u], release_atom::value);
}

// Collects the gathered params of every unit of `op` into one map, then continues.
void with_params(stage_pointer self, int op, std::function<void(std::shared_ptr<TensorMap>)> next) {
  const auto& units = self->state.op_units[static_cast<std::size_t>(op)];
  auto merged = std::make_shared<TensorMap>();
  auto remaining = std::make_shared<std::size_t>(units.size());
  for (std::size_t u : units) {
    self->request(self->state.setup.units[u], caf::infinite, params_atom::value)
        .then(
            [=](const GatheredParams& p) {
              for (const auto& name : p.params->names()) merged->insert(name, p.params->at(name));
              if (--*remaining == 0 && self->state.run) next(merged);  // not after a failure
            },
            [=](caf::error& e) { fail(self, e); });
  }
}

void compute(stage_pointer self, std::string name, std::function<void()> work, std::function<void()> next) {
  self->request(self->state.setup.compute, caf::infinite, run_atom::value, ComputeJob{std::move(name), std::move(work)})
      .then(
          [=, next = std::move(next)](done_atom) {
            if (self->state.run) next();  // a failed step (run reset by fail) goes no further
          },
          [=](caf::error& e) { fail(self, e); });
}

bool last_micro_batch(const StageState& st) { return st.micro_batch + 1 == st.step.micro_batches.size(); }

void start_micro_batch(stage_pointer self) {
  auto& st = self->state;
  if (st.micro_batch == 0) {
    // Islands are resident for the step: tiny, so all of them are gathered up front and no op
    // ever waits for one.
    for (std::size_t u = 0; u < st.setup.units.size(); ++u) {
      if (st.setup.plan->units[u].schedule.resident_for_step) ensure_gathered(self, u);
    }
  }
  try {
    st.run = st.setup.model->start(st.step.micro_batches[st.micro_batch], st.setup.plan->precision, st.step.grad_scale);
  } catch (const std::exception& e) {
    return fail(self,
                caf::make_error(caf::sec::runtime_error, "rank " + std::to_string(st.setup.rank) + ": " + e.what()));
  }
  forward_op(self, 0);
}

void finish_step(stage_pointer self) {
  auto& st = self->state;
  const std::size_t n = st.setup.units.size();
  auto report = std::make_shared<StageReport>();
  report->loss_sums = st.loss_sums;
  report->routing = st.routing;
  report->unit_sum_squares.assign(n, 0.0);
  auto remaining = std::make_shared<std::size_t>(n);
  for (std::size_t u = 0; u < n; ++u) {
    self->request(st.setup.units[u], caf::infinite, reduced_atom::value)
        .then(
            [=](double sum_squares) {
              report->unit_sum_squares[u] = sum_squares;
              if (--*remaining == 0) self->state.done.deliver(std::move(*report));
            },
            [=](caf::error& e) { fail(self, e); });
  }
}

void forward_op(stage_pointer self, int op) {
  auto& st = self->state;
  ensure_op_gathered(self, op);
  // Forward prefetch: the plan names, per unit, which units to gather ahead.
  for (std::size_t u : st.op_units[static_cast<std::size_t>(op)]) {
    for (const auto& name : st.setup.plan->units[u].forward_prefetch_units) {
      ensure_gathered(self, st.setup.plan->unit_index(name));
    }
  }
  with_params(self, op, [=](std::shared_ptr<TensorMap> weights) {
    auto run = self->state.run;
    compute(
        self, "forward op " + std::to_string(op), [run, op, weights] { run->forward(op, *weights); },
        [=] {
          auto& s = self->state;
          for (std::size_t u : s.op_units[static_cast<std::size_t>(op)]) {
            if (s.setup.plan->units[u].schedule.reshard_after_forward) release(self, u);
          }
          if (op + 1 < s.ops) return forward_op(self, op + 1);
          s.loss_sums.push_back(s.run->loss_sum());
          if (s.step.record_routing) s.routing.push_back(s.run->routing());
          backward_op(self, s.ops - 1);
        });
  });
}

void backward_op(stage_pointer self, int op) {
  auto& st = self->state;
  ensure_op_gathered(self, op);  // a unit resharded after forward is gathered again
  for (std::size_t u : st.op_units[static_cast<std::size_t>(op)]) {
    for (const auto& name : st.setup.plan->units[u].backward_prefetch_units) {
      ensure_gathered(self, st.setup.plan->unit_index(name));
    }
  }
  with_params(self, op, [=](std::shared_ptr<TensorMap> weights) {
    auto& s = self->state;
    auto grads = std::make_shared<TensorMap>();
    for (const auto& name : weights->names()) grads->insert(name, Tensor::zeros(weights->at(name).shape()));
    auto run = s.run;
    compute(
        self, "backward op " + std::to_string(op), [run, op, weights, grads] { run->backward(op, *weights, *grads); },
        [=] {
          auto& s2 = self->state;
          const bool last = last_micro_batch(s2);
          for (std::size_t u : s2.op_units[static_cast<std::size_t>(op)]) {
            const UnitPlan& unit = s2.setup.plan->units[u];
            auto mine = std::make_shared<TensorMap>();
            for (const auto& p : unit.params) mine->insert(p.name, grads->at(p.name));
            UnitGrads msg{mine, last, 0, 0};
            if (last) {
              msg.shard_seq = s2.shard_seq++;
              if (s2.setup.replicated) msg.replicate_seq = s2.replicate_seq++;
            }
            self->send(s2.setup.units[u], grads_atom::value, std::move(msg));
            // FSDP2 keeps params gathered between micro-batches (reshard_after_backward only on the
            // last one), so the next micro-batch's forward needs no gather.
            if (last) release(self, u);
          }
          if (op > 0) return backward_op(self, op - 1);
          s2.run.reset();
          if (last) return finish_step(self);
          ++s2.micro_batch;
          start_micro_batch(self);
        });
  });
}

stage_actor::behavior_type stage_behavior(stage_pointer self, StageActorSetup setup) {
  auto& st = self->state;
  st.ops = setup.model->op_count();
  st.op_units = units_per_op(*setup.plan, *setup.model);
  st.gathered.assign(setup.units.size(), false);
  st.setup = std::move(setup);
  return {
      [=](step_atom, StageStep step) -> caf::result<StageReport> {
        auto& s = self->state;
        if (step.micro_batches.empty()) return caf::make_error(caf::sec::runtime_error, "stage: no micro-batches");
        s.step = std::move(step);
        s.micro_batch = 0;
        s.loss_sums.clear();
        s.routing.clear();
        s.done = self->make_response_promise<StageReport>();
        start_micro_batch(self);
        return s.done;
      },
      [=](probe_atom, std::uint64_t unit) -> caf::result<done_atom> {
        auto rp = self->make_response_promise<done_atom>();
        const auto u = static_cast<std::size_t>(unit);
        ensure_gathered(self, u);
        self->request(self->state.setup.units[u], caf::infinite, params_atom::value)
            .then(
                [=](const GatheredParams&) mutable {
                  release(self, u);
                  rp.deliver(done_atom::value);
                },
                [=](caf::error& e) mutable { rp.deliver(e); });
        return rp;
      },
      [=](optimize_atom, OptimizerStep msg) -> caf::result<done_atom> {
        auto rp = self->make_response_promise<done_atom>();
        auto remaining = std::make_shared<std::size_t>(self->state.setup.units.size());
        for (const auto& unit : self->state.setup.units) {
          self->request(unit, caf::infinite, optimize_atom::value, msg)
              .then(
                  [=](done_atom) mutable {
                    if (--*remaining == 0) rp.deliver(done_atom::value);
                  },
                  [=](caf::error& e) mutable { rp.deliver(e); });
        }
        return rp;
      },
  };
}

}  // namespace

stage_actor spawn_stage_actor(caf::actor_system& system, StageActorSetup setup) {
  return system.spawn(stage_behavior, std::move(setup));
}

}  // namespace atl
