// The trainer actor of one process: hands each of its ranks its block of micro-batches (the
// process reads only its ranks' rows: ActorEngine::rows_read), then
// combines what every rank of the job reported (all-gathered over the world by the step
// program, so each process combines the same numbers) in one fixed order — loss sums over the
// pairwise tree of global micro-batch indices (exactly the reference trainer's order), the
// gradient norm over (unit, shard) in plan order — and triggers its ranks' optimizer step with
// the clip factor and learning rate. Every process computes the same result.
//
// It is also its process's supervisor: it monitors every actor of the process, and an actor that
// stops (an exception escaped it) fails the step or export in flight, and every later one, with
// the actor's name and reason. Without that the other ranks would wait on its collectives forever.
#include <algorithm>
#include <cmath>
#include <map>

#include "actors/answer_once.hpp"
#include "actors/spawn.hpp"
#include "actors/supervision.hpp"
#include "kernels/ops/optim.hpp"
#include "graph/training/expert_load.hpp"
#include "kernels/tree_sum.hpp"

namespace atl {

namespace {

struct TrainerState {
  TrainerActorSetup setup;
  std::int64_t step = 0;
  std::map<caf::actor_addr, std::string> watched;  // every actor of the process, by address
  caf::error failure;                              // the first actor that stopped
  // Fails the request in flight (a step, export or probe): the engine asks one at a time.
  std::function<void(const caf::error&)> fail_in_flight;
};

using trainer_pointer = trainer_actor::stateful_pointer<TrainerState>;

// The answer to the engine's request in flight, given once: the normal result, a stage's error
// and a stopped actor's down message may all try (copies of a CAF 0.17 promise do not see each
// other's deliveries, so a second one would reach the engine as a stray reply).
template <class T>
class Answer {
 public:
  explicit Answer(trainer_pointer self) : self_(self), once_(self->make_response_promise<T>()) {}
  template <class X>
  void deliver(X&& x) {
    if (!once_.pending()) return;
    self_->state.fail_in_flight = nullptr;  // answered: a later failure belongs to no request
    once_.deliver(std::forward<X>(x));
  }
  caf::typed_response_promise<T> promise() const { return once_.promise(); }

 private:
  trainer_pointer self_;
  AnswerOnce<T> once_;
};

// The request in flight: a failing actor answers it with the failure.
template <class T>
std::shared_ptr<Answer<T>> in_flight(trainer_pointer self) {
  auto answer = std::make_shared<Answer<T>>(self);
  self->state.fail_in_flight = [answer](const caf::error& e) { answer->deliver(e); };
  return answer;
}

struct StepProgress {
  StepResult result;
  std::vector<StageReport> reports;  // by local stage (each holds every rank's numbers)
  std::size_t remaining = 0;
  std::shared_ptr<Answer<StepResult>> answer;
};

// The first unit (plan order) whose gradient's sum of squares is not finite on some rank.
std::string first_nonfinite_unit(const Plan& plan, const StageReport& report) {
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    for (const auto& rank_squares : report.unit_sum_squares) {
      if (!std::isfinite(rank_squares[u])) return plan.units[u].name;
    }
  }
  return {};
}

void combine_and_optimize(trainer_pointer self, std::shared_ptr<StepProgress> progress) {
  auto& st = self->state;
  const Plan& plan = *st.setup.plan;
  const Mesh& mesh = plan.mesh;
  StepResult& r = progress->result;

  // Loss: micro-batches in global order are the dp indices' blocks in dp order.
  std::vector<int> rank_of_dp(static_cast<std::size_t>(mesh.dp_size()), -1);
  for (int rank = 0; rank < mesh.world_size(); ++rank) rank_of_dp[static_cast<std::size_t>(mesh.dp_index(rank))] = rank;
  const StageReport& all = progress->reports.front();  // every rank's numbers, the same in each
  r.targets = all.targets;
  r.stop_signal = all.stop_signal;
  r.tokens = all.tokens;
  r.expert_load = ExpertCounts{st.setup.model_experts, all.expert_counts}.max_over_mean();
  auto loss_tree = make_tree_sum<double>([](double& a, const double& b) { a += b; });
  for (int rank : rank_of_dp) {
    for (double l : all.loss_sums[static_cast<std::size_t>(rank)]) loss_tree.push(l);
    // Routing records stay on their rank: this process reports its own ranks' (all of them in sim).
    const auto local = std::find(st.setup.ranks.begin(), st.setup.ranks.end(), rank);
    if (local == st.setup.ranks.end()) continue;
    for (const auto& routing : progress->reports[static_cast<std::size_t>(local - st.setup.ranks.begin())].routing) {
      r.routing.push_back(routing);
    }
  }
  const double loss_sum = loss_tree.finish();
  r.loss = r.targets > 0 ? loss_sum / static_cast<double>(r.targets) : 0.0;

  // Gradient norm: every unit's shards once (HSDP replicas hold identical shards; an expert
  // group's shards are all distinct: ep slices x ep_shard), in plan order.
  double total = 0;
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      if (plan.units[u].replicated(mesh) && mesh.coord(rank).dp_replicate != 0) continue;
      total += all.unit_sum_squares[static_cast<std::size_t>(rank)][u];
    }
  }
  r.grad_norm = std::sqrt(total);
  const OptimizerSettings& o = st.setup.optimizer;
  r.lr = warmup_cosine_lr(r.step, o.warmup, o.total_steps, o.lr, o.min_lr_ratio);
  OptimizerStep msg{r.step, static_cast<float>(r.lr), 1.0, o};
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.applied = msg.apply = false;  // every unit drops its gradient; nothing is updated
    r.nonfinite = nonfinite_description(r.loss, r.grad_norm, first_nonfinite_unit(plan, all));
  } else if (r.targets == 0) {
    r.applied = msg.apply = false;  // nothing to learn from (the reference trainer's rule)
  } else {
    msg.clip_factor = clip_factor(r.grad_norm, o.grad_clip);  // the reference trainer's rule
  }
  progress->remaining = st.setup.stages.size();
  for (const auto& stage : st.setup.stages) {
    self->request(stage, caf::infinite, optimize_atom::value, msg)
        .then(
            [=](done_atom) {
              if (--progress->remaining == 0) progress->answer->deliver(progress->result);
            },
            [=](caf::error& e) { progress->answer->deliver(std::move(e)); });
  }
}

void watch(trainer_pointer self, std::vector<WatchedActor> actors) {
  for (auto& a : actors) {
    self->monitor(a.handle);
    self->state.watched.emplace(a.handle.address(), std::move(a.name));
  }
  self->set_down_handler([=](caf::down_msg& down) {
    auto& st = self->state;
    if (down.reason == caf::exit_reason::user_shutdown) return;  // the engine stopping
    if (!st.failure) {
      const auto it = st.watched.find(down.source);
      const std::string who = it == st.watched.end() ? "an actor of this process" : it->second;
      st.failure =
          caf::make_error(caf::sec::runtime_error, who + " stopped: " + error_text(self->system(), down.reason));
    }
    if (st.fail_in_flight) std::exchange(st.fail_in_flight, nullptr)(st.failure);
  });
}

// Sends `request(local)` to every stage of the process; `combine(local, reply)` takes each
// answer; the result is `finish()` once all have answered, or the first error.
template <class Reply, class Result, class Request, class Combine, class Finish>
caf::result<Result> ask_stages(trainer_pointer self, Request request, Combine combine, Finish finish) {
  auto& st = self->state;
  if (st.failure) return st.failure;
  auto answer = in_flight<Result>(self);
  auto remaining = std::make_shared<std::size_t>(st.setup.stages.size());
  for (std::size_t local = 0; local < st.setup.stages.size(); ++local) {
    request(local).then(
        [=](Reply reply) mutable {
          combine(local, std::move(reply));
          if (--*remaining == 0) answer->deliver(finish());
        },
        [=](caf::error& e) { answer->deliver(std::move(e)); });
  }
  return answer->promise();
}

trainer_actor::behavior_type trainer_behavior(trainer_pointer self, TrainerActorSetup setup) {
  exit_with_exception_message(self);
  self->state.step = setup.start_step;
  watch(self, std::move(setup.watched));
  self->state.setup = std::move(setup);
  return {
      [=](step_atom, const ProcessStep& msg) -> caf::result<StepResult> {
        auto& st = self->state;
        if (st.failure) return st.failure;
        const Mesh& mesh = st.setup.plan->mesh;
        const Batch& batch = msg.batch;  // this process's rows: its data-parallel indices' blocks, in order
        const std::int64_t micro = st.setup.micro_batch;
        const std::vector<int> dps = mesh.dp_indices(st.setup.ranks);  // the process's blocks, in order
        const auto blocks = static_cast<std::int64_t>(dps.size());
        if (batch.rows() % (micro * blocks) != 0) {
          return caf::make_error(caf::sec::runtime_error, "this process's " + std::to_string(batch.rows()) +
                                                              " rows do not split into " + std::to_string(blocks) +
                                                              " data-parallel ranks of micro-batches of " +
                                                              std::to_string(micro) + " rows");
        }
        auto progress = std::make_shared<StepProgress>();
        StepResult& r = progress->result;
        r.step = ++st.step;
        st.setup.tracer->set_step(r.step);
        const std::int64_t per_rank = batch.rows() / micro / blocks;
        progress->reports.resize(st.setup.stages.size());
        progress->remaining = st.setup.stages.size();
        progress->answer = in_flight<StepResult>(self);
        for (std::size_t local = 0; local < st.setup.stages.size(); ++local) {
          StageStep stage_step{r.step, {}, msg.record_routing, msg.stop_signal};
          const auto dp = mesh.dp_index(st.setup.ranks[local]);
          const std::int64_t first = (std::lower_bound(dps.begin(), dps.end(), dp) - dps.begin()) * per_rank;
          for (std::int64_t m = first; m < first + per_rank; ++m) {
            stage_step.micro_batches.push_back(batch.slice_rows(m * micro, (m + 1) * micro));
          }
          self->request(st.setup.stages[local], caf::infinite, step_atom::value, std::move(stage_step))
              .then(
                  [=](StageReport& report) {
                    progress->reports[local] = std::move(report);
                    if (--progress->remaining == 0) combine_and_optimize(self, progress);
                  },
                  [=](caf::error& e) { progress->answer->deliver(std::move(e)); });
        }
        return progress->answer->promise();
      },
      // Every stage all-gathers the state; the first rank's copy is the process's.
      [=](export_atom) -> caf::result<GatheredState> {
        auto kept = std::make_shared<GatheredState>();
        return ask_stages<GatheredState, GatheredState>(
            self,
            [=](std::size_t local) {
              return self->request(self->state.setup.stages[local], caf::infinite, export_atom::value, local == 0);
            },
            [=](std::size_t local, GatheredState g) {
              if (local == 0) *kept = std::move(g);
            },
            [=] { return std::move(*kept); });
      },
      [=](probe_atom, std::uint64_t unit) -> caf::result<done_atom> {
        return ask_stages<done_atom, done_atom>(
            self,
            [=](std::size_t local) {
              return self->request(self->state.setup.stages[local], caf::infinite, probe_atom::value, unit);
            },
            [](std::size_t, done_atom) {}, [] { return done_atom::value; });
      },
  };
}

}  // namespace

trainer_actor spawn_trainer_actor(caf::actor_system& system, TrainerActorSetup setup) {
  return system.spawn(trainer_behavior, std::move(setup));
}

}  // namespace atl
