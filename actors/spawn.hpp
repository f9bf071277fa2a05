// Spawn functions of the runtime's actors (internal to actors/; includes CAF).
#pragma once
#include <memory>
#include <vector>

#include "actors/protocols.hpp"
#include "actors/trace.hpp"
#include "comm/communicator.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"
#include "graph/training/staged_model.hpp"

namespace atl {

// One per rank: the communicators of the rank's groups (one per axis).
comm_actor spawn_comm_actor(caf::actor_system& system, std::vector<std::unique_ptr<Communicator>> communicators);

// threads: compute.threads of this rank (its kernels split their outputs over them).
compute_actor spawn_compute_actor(caf::actor_system& system, int rank, int threads, std::shared_ptr<SpanTracer> tracer);

struct UnitActorSetup {
  std::shared_ptr<const Plan> plan;
  std::size_t unit_index = 0;
  int rank = 0;
  int shard_index = 0;            // this rank's position in the unit's shard group
  comm_actor comm;                // the rank's collective stream (every group the rank is in)
  Tensor initial_shard;           // f32 [shard_numel]
  Tensor initial_exp_avg, initial_exp_avg_sq;  // f32 [shard_numel]
  std::vector<bool> weight_decay;  // per UnitParam
  std::shared_ptr<SpanTracer> tracer;
};
unit_actor spawn_unit_actor(caf::actor_system& system, UnitActorSetup setup);

struct StageActorSetup {
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const StagedModel> model;
  int rank = 0;
  std::vector<unit_actor> units;  // plan order
  compute_actor compute;
  comm_actor comm;                // the rank's collective stream (every group the rank is in)
  std::shared_ptr<const StepProgram> program;  // compiled once per engine, the same on every rank
  std::shared_ptr<SpanTracer> tracer;
};
stage_actor spawn_stage_actor(caf::actor_system& system, StageActorSetup setup);

// An actor the trainer watches, and what to call it when it stops ("rank 3 unit model.norm").
struct WatchedActor {
  caf::actor handle;
  std::string name;
};

struct TrainerActorSetup {
  std::shared_ptr<const Plan> plan;
  std::vector<int> ranks;           // the ranks of this process, increasing
  std::vector<stage_actor> stages;  // their stages, in the same order
  std::int64_t micro_batch = 1;     // rows per micro-batch
  std::int64_t start_step = 0;      // steps already taken (resuming)
  OptimizerSettings optimizer;
  std::shared_ptr<SpanTracer> tracer;
  std::vector<WatchedActor> watched;  // every other actor of the process
  std::int64_t model_experts = 0;     // routed experts per MoE layer (the router load statistics)
};
trainer_actor spawn_trainer_actor(caf::actor_system& system, TrainerActorSetup setup);

}  // namespace atl
