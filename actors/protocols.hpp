// Every typed actor interface of the runtime in one place, with the messages they exchange.
// Messages carry tensors by reference-counted storage (never copied inside a process), so they
// are in-process types: CAF_ALLOW_UNSAFE_MESSAGE_TYPE, never serialized. Only actors/*.cpp (and
// the comm actor's test) include this header (CAF headers are heavy).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "comm/communicator.hpp"
#include "graph/data/batch.hpp"
#include "graph/param.hpp"
#include "graph/plan/step_program.hpp"
#include "graph/training/engine.hpp"

namespace atl {

// --- messages ---

// A unit's full parameters (fp32 values; bf16-valued when gathered in bf16).
struct GatheredParams {
  std::shared_ptr<const TensorMap> params;
};

// One micro-batch's gradient for a unit's parameters. On the last micro-batch of a step the unit
// reduces through `reductions`, the step program's collectives with their numbers in the rank's
// stream: a reduce-scatter over its shard group, then (HSDP) an all-reduce over its replicate group.
// An expert-group unit gets one gradient per source rank of its ep group (ep index order): it
// sums each source's micro-batches over the tree, then the sources in order, which is the
// reference's order of micro-batches (MODELS.md §5.5 numerics; issue 10).
struct UnitGrads {
  std::vector<std::shared_ptr<const TensorMap>> grads;  // per source (one for every other unit)
  bool last = false;
  std::vector<CollectiveNode> reductions;
};

// A collective for the rank's comm actor. Requests run in sequence-number order (the step
// program fixes the numbers, the same on every rank), whatever order they arrive in; `axis`
// names the rank's group that runs it.
struct CollectiveRequest {
  std::uint64_t seq = 0;
  std::string axis;
  CollectiveKind kind = CollectiveKind::all_gather;
  Tensor send, recv;
  std::string tag;
  std::vector<std::int64_t> send_counts, recv_counts;  // all_to_all_v: elements per group member
};

// The communicator call that runs a step program's collective (graph/ names them without comm/).
inline CollectiveKind collective_kind(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather: return CollectiveKind::all_gather;
    case CollectiveOp::reduce_scatter: return CollectiveKind::reduce_scatter;
    case CollectiveOp::all_reduce: return CollectiveKind::all_reduce;
    case CollectiveOp::all_to_all_v: return CollectiveKind::all_to_all_v;
  }
  throw std::logic_error("collective_kind: unknown CollectiveOp");
}

struct ComputeTask {
  std::string name;  // "forward model.layers.0.router": its trace span and errors say it
  std::function<void()> work;
};

// Tasks the compute actor runs in order, in one round trip (a stage's consecutive ops).
struct ComputeJob {
  std::vector<ComputeTask> tasks;
};

// A rank's share of one step: its micro-batches in global order. The loss scale (1 / the step's
// targets) comes from the program's count collective.
struct StageStep {
  std::int64_t step = 0;
  std::vector<Batch> micro_batches;
  bool record_routing = false;
  int stop_signal = 0;  // this process asks the job to stop after this step (travels in the count)
};

// The end of a rank's step: what every rank reported, all-gathered over the world by the step
// program's report collective (so every process holds the same numbers), and this rank's routing.
struct StageReport {
  std::int64_t targets = 0, tokens = 0;               // the step's, over every rank (the count collective)
  std::vector<std::vector<double>> loss_sums;         // [rank][micro-batch], micro-batches in order
  std::vector<std::vector<double>> unit_sum_squares;  // [rank][unit]: each rank's gradient shard
  std::vector<std::vector<RoutingRecord>> routing;    // this rank's, per micro-batch, when asked
  std::vector<std::int64_t> expert_counts;            // tokens per expert per MoE layer, every rank summed
  int stop_signal = 0;  // some rank's process asked to stop after this step: the largest signal, else 0
};

struct OptimizerStep {
  std::int64_t step = 0;
  float lr = 0;
  double clip_factor = 1.0;  // applied when < 1
  OptimizerSettings settings;
  bool apply = true;  // false: the step's loss or gradient is not finite; drop the gradients
};

struct UnitShards {
  Tensor master, exp_avg, exp_avg_sq;  // f32 [shard_numel] each
};

// Every unit's fp32 master, exp_avg and exp_avg_sq, all-gathered over the shard group (plan
// order; each f32 [shard_count * shard_numel]): what a checkpoint needs, through collectives.
struct GatheredState {
  std::vector<UnitShards> units;
};

// A step of this process: its rows of the global batch (ActorEngine::rows_read), concatenated.
struct ProcessStep {
  Batch batch;
  bool record_routing = false;
  int stop_signal = 0;  // ask the job to stop after this step (the signal that asked)
};

}  // namespace atl

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::GatheredParams)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::CollectiveNode)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::UnitGrads)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::CollectiveRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::ComputeJob)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::StageStep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::StageReport)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::OptimizerStep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::UnitShards)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::ProcessStep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::GatheredState)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(atl::StepResult)

namespace atl {

// --- atoms (at most 10 characters) ---
using gather_atom = caf::atom_constant<caf::atom("gather")>;
using params_atom = caf::atom_constant<caf::atom("params")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using grads_atom = caf::atom_constant<caf::atom("grads")>;
using reduced_atom = caf::atom_constant<caf::atom("reduced")>;
using optimize_atom = caf::atom_constant<caf::atom("optimize")>;
using master_atom = caf::atom_constant<caf::atom("master")>;
using collect_atom = caf::atom_constant<caf::atom("collect")>;
using completed_atom = caf::atom_constant<caf::atom("completed")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using probe_atom = caf::atom_constant<caf::atom("probe")>;
using export_atom = caf::atom_constant<caf::atom("export")>;

// --- interfaces ---

// The collective stream of one rank: runs the collectives of all its groups in sequence order.
using comm_actor = caf::typed_actor<caf::replies_to<collect_atom, CollectiveRequest>::with<done_atom>,
                                    caf::reacts_to<completed_atom, std::uint64_t>>;

// One device: runs kernels (model pieces). Spawned detached: compute never stalls the control plane.
using compute_actor = caf::typed_actor<caf::replies_to<run_atom, ComputeJob>::with<done_atom>>;

// One FSDP unit on one rank: fp32 master shard, gradient shard, AdamW state.
using unit_actor = caf::typed_actor<caf::reacts_to<gather_atom, CollectiveNode>,      // start a gather
                                    caf::replies_to<params_atom>::with<GatheredParams>,  // when gathered
                                    caf::reacts_to<release_atom>,                        // reshard
                                    caf::reacts_to<grads_atom, UnitGrads>,               // accumulate / reduce
                                    caf::replies_to<reduced_atom>::with<double>,         // shard sum of squares
                                    caf::replies_to<optimize_atom, OptimizerStep>::with<done_atom>,
                                    caf::replies_to<master_atom>::with<UnitShards>>;

// One pipeline stage on one rank (the whole model while pp = 1): runs the schedule.
// probe: gather one unit, take its params, reshard it (between steps): a gather round trip.
// export: all-gather every unit's master and moments over the shard group (between steps; every
// rank of the job takes part, in whichever process it lives); `keep`: reply with them (else empty).
using stage_actor = caf::typed_actor<caf::replies_to<step_atom, StageStep>::with<StageReport>,
                                     caf::replies_to<optimize_atom, OptimizerStep>::with<done_atom>,
                                     caf::replies_to<probe_atom, std::uint64_t>::with<done_atom>,
                                     caf::replies_to<export_atom, bool>::with<GatheredState>>;

// The trainer of one process: splits the global batch among its ranks, normalises the loss,
// computes the global gradient norm in one fixed order and triggers the optimizer step. Export
// and probe go to every stage of the process (export: the first rank's copy comes back). It
// monitors every actor of the process: one that stops fails the request in flight and all later.
using trainer_actor = caf::typed_actor<caf::replies_to<step_atom, ProcessStep>::with<StepResult>,
                                       caf::replies_to<export_atom>::with<GatheredState>,
                                       caf::replies_to<probe_atom, std::uint64_t>::with<done_atom>>;

}  // namespace atl
