// The step program: what one rank's stage does in one training step, compiled from the Plan
// before anything runs (DESIGN.md "The plan is the dataflow graph"). The stage actor walks it
// and decides nothing itself: which unit to gather before which op, which prefetches, when to
// reshard, which gradients reduce, and the sequence number of every collective.
//
// Collectives are nodes with a sequence number fixed here: one stream per rank, numbered across
// all of the rank's groups in program order. Every rank compiles the same program (pp = 1: the
// program depends only on the plan and the micro-batch count), so every rank issues the same
// collectives in the same order on every group, and across groups too (what NCCL on one stream
// needs; posting the replicate all-reduce whenever the reduce-scatter happens to finish would
// order them differently on different ranks).
//
// The walk reproduces FSDP2's schedule (MODELS.md §5.2, §5.4) for n micro-batches:
//   step start: gather every island (resident for the step);
//   forward of op o, micro-batch m: gather o's units that are not gathered, then the units they
//     prefetch; run; reshard the units whose schedule says so and that no later op reads;
//   backward of op o (reverse order): gather again what was resharded, then the backward
//     prefetches; run; hand each unit whose last backward reader this is its gradient (summed
//     over its ops). On the last micro-batch the unit reduces:
//     reduce-scatter over its shard group, all-reduce over the replicate group (HSDP), then
//     reshards. Before that units stay gathered between micro-batches;
//   step end: the report. When every unit has reduced, each rank all-gathers over the world its
//     loss sums (one per micro-batch) and its units' gradient sums of squares, so every process
//     combines the same numbers in the same fixed order (no reply to a central trainer).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/plan/op_graph.hpp"
#include "graph/plan/plan.hpp"
#include "graph/expert_flow.hpp"
#include "graph/step_schedule.hpp"

namespace atl {

enum class CollectiveOp { all_gather, reduce_scatter, all_reduce, all_to_all_v };
const char* collective_op_name(CollectiveOp op);

// One collective of the rank's stream.
struct CollectiveNode {
  std::uint64_t seq = 0;  // position in the rank's stream (0-based within the step)
  CollectiveOp op = CollectiveOp::all_gather;
  std::string axis;       // the group: "dp_shard" or "ep_shard" (a unit's shard group), "dp_replicate",
                          // "ep" (an experts op's exchange) or "world"
  std::string tag;        // who posts it: the unit's name, "count", "report", or "<experts op>:<part>"
};

enum class StepInstructionKind {
  gather,    // unit starts its all-gather (collective `collective`)
  release,   // unit frees its gathered params
  forward,   // run op's forward for micro_batch
  backward,  // run op's backward for micro_batch
  grads,     // hand unit its gradient of this micro-batch; `last`: it reduces (collectives
             // `collective` and, with HSDP, `collective + 1`)
  count,     // before the first forward: all-gather the rank's target and token counts over the
             // world (`collective`) and wait: every rank then knows the step's totals, the loss
             // scale its backward needs (a process reads only its own ranks' rows)
  report,    // after every unit reduced: all-gather the rank's report over the world (`collective`)
  // Expert parallelism (ep > 1): the experts op of micro_batch as an exchange over the ep group
  // (MODELS.md §5.5; expert_exchange_parts lists the collectives of each flow).
  expert_forward,
  expert_backward,
};
const char* step_instruction_name(StepInstructionKind kind);

struct StepInstruction {
  StepInstructionKind kind = StepInstructionKind::forward;
  int op = -1;                  // forward, backward, expert_*
  int micro_batch = -1;         // forward, backward, grads, expert_*
  std::size_t unit = 0;         // gather, release, grads
  bool last = false;            // grads: the step's last micro-batch
  std::uint64_t collective = 0;  // gather, grads with last, count, report, expert_*: index into StepProgram::collectives
  int collective_count = 0;      // the collectives it posts: collective, collective + 1, ... (HSDP grads: 2)

  bool is_compute() const { return kind == StepInstructionKind::forward || kind == StepInstructionKind::backward; }
};

// The collectives `i` posts, in order (indices into StepProgram::collectives).
std::vector<std::uint64_t> posted_by(const StepInstruction& i);

// The exchanges of the experts op under expert parallelism.
inline constexpr const char* kExpertAxis = "ep";

// The collectives of an experts op's exchange, in order, each with its tag's part name.
//   all_to_all forward: all_gather "counts" (every source's rows per expert), all_to_all_v
//     "dispatch" (rows to their owners), "dispatch_weights" (their routing weights), (the owners
//     run their experts) all_to_all_v "combine" (the outputs back). Backward: all_to_all_v
//     "combine_grad" (output gradients to the owners), "dispatch_grad" and "dispatch_weights_grad"
//     (row and routing-weight gradients back).
//   all_gather forward: all_gather "dispatch" (every source's tokens), "dispatch_weights",
//     "dispatch_indices", "dispatch_mask"; (every owner runs its experts on every source's rows)
//     all_reduce "combine" (each (token, slot) pair's output, from its one owner). Backward:
//     all_gather "combine_grad" (every pair's output gradient), reduce_scatter "dispatch_grad" and
//     "dispatch_weights_grad" (each pair's input gradients, from its one owner).
struct ExchangePart {
  CollectiveOp op;
  const char* part;
};
std::vector<ExchangePart> expert_exchange_parts(ExpertDispatchFlow flow, bool forward);


struct StepProgram {
  int micro_batches = 0;
  StepSchedule schedule = StepSchedule::one_at_a_time;
  ExpertDispatchFlow expert_flow = ExpertDispatchFlow::all_to_all;  // the experts ops' exchanges (ep > 1)
  // Buffers per activation edge: the most micro-batches whose activations are alive at once (from
  // a micro-batch's first forward to its last backward). The stage refuses to exceed it.
  int activation_buffers = 0;
  std::vector<OpSpec> ops;                         // the model's op graph, forward order
  std::vector<std::vector<std::size_t>> op_units;  // units_per_op(plan, ops)
  std::vector<StepInstruction> instructions;
  std::vector<CollectiveNode> collectives;  // in stream order: collectives[i].seq == i
};

// Ops run forward 0..n-1 and backward n-1..0; each reads the units that own its parameters (a
// unit may be read by several ops). With dp_replicate > 1 every reduction of a unit sharded over
// dp_shard adds an all-reduce. With ep > 1 the experts ops are expert_forward / expert_backward.
// Throws std::invalid_argument for micro_batches < 1, ConfigError (topology.mesh.pp or .cp) for a
// pipeline- or context-parallel plan, std::logic_error when an op reads a parameter no unit owns or a unit is
// read by no op.
StepProgram compile_step_program(const Plan& plan, const std::vector<OpSpec>& ops, int micro_batches,
                                 StepSchedule schedule = StepSchedule::one_at_a_time,
                                 ExpertDispatchFlow expert_flow = ExpertDispatchFlow::all_to_all);

// The end (one past) of the compute run that starts at forward or backward instruction `begin`:
// the consecutive forward and backward instructions after it, with nothing between them to send,
// which the stage hands to its compute actor as one job (one round trip, not one per op: an MoE
// layer is five ops). A forward of op 0 starts a micro-batch, taking an activation buffer that a
// backward earlier in the same job would only free after the job, so it only ever starts a run.
std::size_t compute_run_end(const StepProgram& program, std::size_t begin);

// For atoll-plan --graph. Text: the ops (activations in -> out, units read), then one line per
// instruction, collectives with their sequence number and group. JSON: {micro_batches, ops: [...],
// instructions: [...], collectives: [...]} with names.
// DOT: the instructions as a chain, each collective a box hanging off the instruction that posts it.
std::string format_step_program(const Plan& plan, const StepProgram& program);
std::string step_program_json(const Plan& plan, const StepProgram& program);
std::string step_program_dot(const Plan& plan, const StepProgram& program);

}  // namespace atl
