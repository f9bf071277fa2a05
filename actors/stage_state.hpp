// The stage actor's state and the steps its instruction handlers share (internal to actors/:
// stage_actor.cpp walks the program, stage_experts.cpp runs the expert-parallel exchanges).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "actors/spawn.hpp"
#include "graph/plan/expert_exchange.hpp"
#include "graph/training/expert_load.hpp"
#include "kernels/ops/experts.hpp"

namespace atl::stage {

// An experts op's exchange of one micro-batch, from its forward to its backward.
struct ExchangeRecord {
  std::int64_t hidden = 0;
  ExpertExchange exchange;  // all_to_all: who sent how many rows where
  // all_gather: this rank's own dispatch (its rows' (token, slot) pairs), and as an owner each
  // source's dispatch with the rows of this rank's experts in it: [first, first + count).
  ExpertDispatch own;
  std::vector<ExpertDispatch> sources;
  std::vector<std::int64_t> first, count;
};

struct StageState {
  StageActorSetup setup;
  std::uint64_t next_seq = 0;  // the rank's collective stream position before the next step or probe
  // The step in flight.
  bool active = false;
  bool failed = false;  // a step failed: the stage refuses everything after (fail())
  StageStep step;
  std::size_t pc = 0;          // next instruction
  std::uint64_t seq_base = 0;  // the step's first collective sequence number
  // The micro-batches in flight, by id (at most the program's activation buffers); shared with
  // compute jobs in flight.
  std::map<int, std::shared_ptr<MicroBatchRun>> runs;
  // Per unit, its gradient of the micro-batch in backward: created (zeros) by the first backward
  // op that reads the unit, added to by the others, handed over by the grads instruction. One map
  // per source: an expert-group unit gets one per rank of its ep group, every other unit one.
  std::vector<std::vector<std::shared_ptr<TensorMap>>> unit_grads;
  std::map<std::pair<int, int>, ExchangeRecord> exchanges;  // by (micro-batch, op)
  std::vector<double> loss_sums;
  ExpertCounts load;  // this rank's tokens per expert of every MoE layer, this step
  bool counted = false;                  // the step's count has completed
  std::int64_t targets = 0, tokens = 0;  // the step's totals (count), once known
  std::int64_t stop_signal = 0;          // the count: the largest signal a process stops by after this step
  float grad_scale = 0;                  // 1 / targets (0 without targets)
  std::vector<std::vector<RoutingRecord>> routing;
  caf::typed_response_promise<StageReport> done;
};

using stage_pointer = stage_actor::stateful_pointer<StageState>;

// Walks instructions until one must wait or the program ends.
void advance(stage_pointer self);
// The collectives `ins` posts, numbered in the rank's stream.
std::vector<CollectiveNode> scheduled(const StageState& st, const StepInstruction& ins);
// Ends the step with `error` (any failure: a unit, a collective, a kernel).
void fail(stage_pointer self, const caf::error& error);
// Collects the gathered params of `units` into one map, then continues.
void with_params(stage_pointer self, const std::vector<std::size_t>& units,
                 std::function<void(std::shared_ptr<TensorMap>)> next);
// The experts op of an expert-parallel plan (stage_experts.cpp): its exchange, then the next
// instruction.
void expert_forward(stage_pointer self, const StepInstruction& ins);
void expert_backward(stage_pointer self, const StepInstruction& ins);

}  // namespace atl::stage
