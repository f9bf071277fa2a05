// The trainer actor of one process: hands each of its ranks its block of micro-batches, then
// combines what every rank of the job reported (all-gathered over the world by the step
// program, so each process combines the same numbers) in one fixed order — loss sums over the
// pairwise tree of global micro-batch indices (exactly the reference trainer's order), the
// gradient norm over (unit, shard) in plan order — and triggers its ranks' optimizer step with
// the clip factor and learning rate. Every process computes the same result.
#include <algorithm>
#include <cmath>

#include "actors/spawn.hpp"
#include "kernels/ops/optim.hpp"
#include "kernels/tree_sum.hpp"

namespace atl {

namespace {

struct TrainerState {
  TrainerActorSetup setup;
  std::int64_t step = 0;
};

using trainer_pointer = trainer_actor::stateful_pointer<TrainerState>;

struct StepProgress {
  StepResult result;
  std::vector<StageReport> reports;  // by local stage (each holds every rank's numbers)
  std::size_t remaining = 0;
  caf::typed_response_promise<StepResult> promise;
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

  // Gradient norm: every unit's shards once (replicas hold identical shards), in plan order.
  double total = 0;
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      if (mesh.coord(rank).dp_replicate != 0) continue;
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
  } else {
    msg.clip_factor = clip_factor(r.grad_norm, o.grad_clip);  // the reference trainer's rule
  }
  progress->remaining = st.setup.stages.size();
  for (const auto& stage : st.setup.stages) {
    self->request(stage, caf::infinite, optimize_atom::value, msg)
        .then([=](done_atom) {
          if (--progress->remaining == 0) progress->promise.deliver(progress->result);
        },
              [=](caf::error& e) { progress->promise.deliver(std::move(e)); });
  }
}

trainer_actor::behavior_type trainer_behavior(trainer_pointer self, TrainerActorSetup setup) {
  self->state.step = setup.start_step;
  self->state.setup = std::move(setup);
  return {
      [=](step_atom, const GlobalStep& msg) -> caf::result<StepResult> {
        auto& st = self->state;
        const Mesh& mesh = st.setup.plan->mesh;
        const Batch& batch = msg.batch;
        const std::int64_t micro = st.setup.micro_batch;
        const std::int64_t dp = mesh.dp_size();
        if (batch.rows() % (micro * dp) != 0) {
          return caf::make_error(caf::sec::runtime_error,
                                 "global batch of " + std::to_string(batch.rows()) + " rows does not split into " +
                                     std::to_string(dp) + " data-parallel ranks of micro-batches of " +
                                     std::to_string(micro) + " rows");
        }
        auto progress = std::make_shared<StepProgress>();
        StepResult& r = progress->result;
        r.step = ++st.step;
        r.targets = batch.target_count();
        r.tokens = batch.valid_count();
        st.setup.tracer->set_step(r.step);
        const float grad_scale = r.targets > 0 ? static_cast<float>(1.0 / static_cast<double>(r.targets)) : 0.0f;
        const std::int64_t per_rank = batch.rows() / micro / dp;
        progress->reports.resize(st.setup.stages.size());
        progress->remaining = st.setup.stages.size();
        progress->promise = self->make_response_promise<StepResult>();
        for (std::size_t local = 0; local < st.setup.stages.size(); ++local) {
          StageStep stage_step{r.step, {}, grad_scale, msg.record_routing};
          const std::int64_t first = mesh.dp_index(st.setup.ranks[local]) * per_rank;
          for (std::int64_t m = first; m < first + per_rank; ++m) {
            stage_step.micro_batches.push_back(batch.slice_rows(m * micro, (m + 1) * micro));
          }
          self->request(st.setup.stages[local], caf::infinite, step_atom::value, std::move(stage_step))
              .then(
                  [=](StageReport& report) {
                    progress->reports[local] = std::move(report);
                    if (--progress->remaining == 0) combine_and_optimize(self, progress);
                  },
                  [=](caf::error& e) { progress->promise.deliver(std::move(e)); });
        }
        return progress->promise;
      },
  };
}

}  // namespace

trainer_actor spawn_trainer_actor(caf::actor_system& system, TrainerActorSetup setup) {
  return system.spawn(trainer_behavior, std::move(setup));
}

}  // namespace atl
