// The unit actor: one FSDP unit on one rank. It owns the unit's fp32 master shard, its
// gradient shard and AdamW moments. gather: cast the shard to the policy's param dtype and
// all-gather it through the rank's comm actor as the step program's collective says (group axis,
// number); grads: add each micro-batch's gradient over the fixed pairwise tree, and after the
// last one run the program's reductions (a reduce-scatter in the reduce dtype, then for HSDP an
// all-reduce); optimize: AdamW on the shard.
#include "actors/spawn.hpp"
#include "actors/supervision.hpp"
#include "graph/plan/flat_shards.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/optim.hpp"
#include "kernels/tree_sum.hpp"

namespace atl {

namespace {

void add_maps(TensorMap& left, const TensorMap& right) {
  const auto l = left.tensors(), r = right.tensors();
  for (std::size_t i = 0; i < l.size(); ++i) add_inplace(l[i], r[i]);
}
using GradTree = PairwiseTreeSum<TensorMap, decltype(&add_maps)>;

enum class GatherState { sharded, gathering, gathered };

struct UnitState {
  UnitActorSetup setup;
  const UnitPlan* unit = nullptr;
  std::string actor_name;
  Tensor master, exp_avg, exp_avg_sq, grad_shard;
  // Shard-sized buffers kept from step to step: the shard in the param dtype, the reduced gradient
  // shard. Whole-unit buffers (the gathered bytes, the params unpacked from them) live only while
  // the unit is gathered: kept, every rank would hold the whole model after a step, which is what
  // sharding exists to avoid (the host allocator's cache hands their blocks out again).
  Tensor gather_send, reduce_recv;
  GatherState gather = GatherState::sharded;
  std::shared_ptr<const TensorMap> full;
  std::vector<caf::typed_response_promise<GatheredParams>> waiting_params;
  std::vector<std::unique_ptr<GradTree>> grad_trees;  // one per source (expert groups: per ep source)
  bool reduced = false;
  double sum_squares = 0;
  std::vector<caf::typed_response_promise<double>> waiting_reduced;
};

using unit_pointer = unit_actor::stateful_pointer<UnitState>;

// A failed collective fails everyone waiting on this unit, and the unit: a collective it never
// posted leaves a gap in its rank's stream that later ones would wait behind, and a stage that
// asks nothing of this unit would never hear of it. The trainer fails the step with the error.
void fail(unit_pointer self, const caf::error& error) {
  auto& st = self->state;
  for (auto& rp : st.waiting_params) rp.deliver(error);
  st.waiting_params.clear();
  for (auto& rp : st.waiting_reduced) rp.deliver(error);
  st.waiting_reduced.clear();
  self->quit(error);
}

void start_gather(unit_pointer self, const CollectiveNode& node) {
  auto& st = self->state;
  const UnitPlan& u = *st.unit;
  if (node.op != CollectiveOp::all_gather) {
    return fail(self, caf::make_error(caf::sec::runtime_error, st.actor_name + ": gather #" +
                                                                   std::to_string(node.seq) + " is a " +
                                                                   collective_op_name(node.op)));
  }
  st.gather = GatherState::gathering;
  if (u.policy.param_dtype != DType::f32 && !st.gather_send.defined()) {
    st.gather_send = Tensor::empty({u.shard_numel}, u.policy.param_dtype);
  }
  // The shard travels in the param dtype: bf16 for bulk units in bf16 runs, fp32 for islands.
  Tensor send = st.master;
  if (u.policy.param_dtype != DType::f32) {
    st.master.convert_into(st.gather_send);
    send = st.gather_send;
  }
  const Tensor recv = Tensor::empty({u.shard_count * u.shard_numel}, u.policy.param_dtype);
  const double start = st.setup.tracer->now_us();
  self->request(st.setup.comm, caf::infinite, collect_atom::value,
                CollectiveRequest{node.seq, node.axis, CollectiveKind::all_gather, send, recv, u.name, {}, {}})
      .then(
          [=](done_atom) {
            auto& s = self->state;
            s.full = std::make_shared<const TensorMap>(unpack_gathered(*s.unit, recv, s.unit->shard_count));
            s.gather = GatherState::gathered;
            s.setup.tracer->add({s.setup.rank, s.actor_name, "gather", "gather", start, s.setup.tracer->now_us()});
            for (auto& rp : s.waiting_params) rp.deliver(GatheredParams{s.full});
            s.waiting_params.clear();
          },
          [=](caf::error& e) { fail(self, e); });
}

void finish_reduce(unit_pointer self, Tensor shard, double start) {
  auto& st = self->state;
  st.grad_shard = shard;
  st.sum_squares = grad_sum_of_squares(shard);
  st.reduced = true;
  st.setup.tracer->add({st.setup.rank, st.actor_name, "reduce", "reduce", start, st.setup.tracer->now_us()});
  for (auto& rp : st.waiting_reduced) rp.deliver(st.sum_squares);
  st.waiting_reduced.clear();
}

// Runs reductions[k..] on the reduced buffer in place (all-reduces), then finishes.
void reduce_further(unit_pointer self, std::vector<CollectiveNode> reductions, std::size_t k, Tensor recv,
                    double start) {
  if (k == reductions.size()) return finish_reduce(self, recv, start);
  const CollectiveNode& node = reductions[k];
  if (node.op != CollectiveOp::all_reduce) {
    return fail(self, caf::make_error(caf::sec::runtime_error, self->state.actor_name + ": reduction #" +
                                                                   std::to_string(node.seq) + " is a " +
                                                                   collective_op_name(node.op)));
  }
  self->request(self->state.setup.comm, caf::infinite, collect_atom::value,
                CollectiveRequest{node.seq, node.axis, CollectiveKind::all_reduce, Tensor(), recv, self->state.unit->name, {}, {}})
      .then([=](done_atom) { reduce_further(self, reductions, k + 1, recv, start); },
            [=](caf::error& e) { fail(self, e); });
}

void start_reduce(unit_pointer self, const UnitGrads& msg) {
  auto& st = self->state;
  const UnitPlan& u = *st.unit;
  // Each source's micro-batches over the tree, then the sources in order: an aligned block of the
  // reference's micro-batches (source s owns [s n, (s+1) n)), summed as the reference's tree does
  // for power-of-two counts.
  auto sources = make_tree_sum<TensorMap>(&add_maps);
  for (auto& tree : st.grad_trees) sources.push(tree->finish());
  st.grad_trees.clear();
  TensorMap summed = sources.finish();
  // The program's reductions: a reduce-scatter over the shard group first (HSDP: then all-reduces).
  if (msg.reductions.empty() || msg.reductions.front().op != CollectiveOp::reduce_scatter) {
    return fail(self, caf::make_error(caf::sec::runtime_error, u.name + ": a last gradient without a reduce-scatter"));
  }
  Tensor send = pack_for_reduce_scatter(u, summed, u.shard_count);
  // Gradients are summed in the policy's reduce dtype; the planner chooses fp32 for every unit.
  if (u.policy.reduce_dtype != DType::f32) {
    return fail(self, caf::make_error(caf::sec::runtime_error, u.name + ": only fp32 gradient reduction is built"));
  }
  if (!st.reduce_recv.defined()) st.reduce_recv = Tensor::empty({u.shard_numel}, u.policy.reduce_dtype);
  const Tensor recv = st.reduce_recv;
  const double start = st.setup.tracer->now_us();
  const CollectiveNode& first = msg.reductions.front();
  self->request(st.setup.comm, caf::infinite, collect_atom::value,
                CollectiveRequest{first.seq, first.axis, CollectiveKind::reduce_scatter, send, recv, u.name, {}, {}})
      .then([=, reductions = msg.reductions](done_atom) { reduce_further(self, reductions, 1, recv, start); },
            [=](caf::error& e) { fail(self, e); });
}

void optimize(UnitState& st, const OptimizerStep& msg) {
  const UnitPlan& u = *st.unit;
  if (!msg.apply) {  // a non-finite step: masters and moments stay as they are
    st.reduced = false;
    st.grad_shard = Tensor();
    return;
  }
  if (msg.clip_factor < 1.0) scale_inplace(st.grad_shard, static_cast<float>(msg.clip_factor));
  const OptimizerSettings& o = msg.settings;
  for (std::size_t i = 0; i < u.params.size(); ++i) {
    const UnitParam& p = u.params[i];
    const float wd = st.setup.weight_decay[i] ? static_cast<float>(o.weight_decay) : 0.0f;
    const std::int64_t at = p.shard_offset;
    cpu::adamw_step(st.master.data<float>() + at, st.grad_shard.data<float>() + at,
                           st.exp_avg.data<float>() + at, st.exp_avg_sq.data<float>() + at, p.shard_numel, msg.lr,
                           static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps), wd,
                           msg.step);
  }
  st.reduced = false;
  st.grad_shard = Tensor();
}

unit_actor::behavior_type unit_behavior(unit_pointer self, UnitActorSetup setup) {
  auto& st = self->state;
  st.unit = &setup.plan->units.at(setup.unit_index);
  st.actor_name = "unit " + st.unit->name;
  exit_with_exception_message(self);
  st.master = setup.initial_shard;
  st.exp_avg = setup.initial_exp_avg;
  st.exp_avg_sq = setup.initial_exp_avg_sq;
  st.setup = std::move(setup);
  return {
      [=](gather_atom, const CollectiveNode& node) {
        // The step program gathers only sharded units; skipping would leave the collective
        // unissued and every rank's stream waiting on it, so a second gather is a bug, loudly.
        if (self->state.gather != GatherState::sharded) {
          return fail(self, caf::make_error(caf::sec::runtime_error,
                                            self->state.actor_name + ": gather #" + std::to_string(node.seq) +
                                                " of a unit that is already gathered"));
        }
        start_gather(self, node);
      },
      [=](params_atom) -> caf::result<GatheredParams> {
        auto& s = self->state;
        if (s.gather == GatherState::gathered) return GatheredParams{s.full};
        if (s.gather == GatherState::sharded) {
          return caf::make_error(caf::sec::runtime_error, s.actor_name + ": params asked before a gather");
        }
        auto rp = self->make_response_promise<GatheredParams>();
        s.waiting_params.push_back(rp);
        return rp;
      },
      [=](release_atom) {
        auto& s = self->state;
        // The step program releases only gathered units; a release mid-gather would let the next
        // gather reuse buffers still in flight.
        if (s.gather == GatherState::gathering) {
          return fail(self, caf::make_error(caf::sec::runtime_error, s.actor_name + ": released during a gather"));
        }
        s.gather = GatherState::sharded;
        s.full.reset();  // (freed once the stage drops them too, when its compute ends)
      },
      [=](grads_atom, const UnitGrads& msg) {
        auto& s = self->state;
        if (s.grad_trees.empty()) {
          for (std::size_t j = 0; j < msg.grads.size(); ++j) s.grad_trees.push_back(std::make_unique<GradTree>(&add_maps));
        }
        if (msg.grads.size() != s.grad_trees.size()) {
          return fail(self, caf::make_error(caf::sec::runtime_error,
                                            s.actor_name + ": gradients from " + std::to_string(msg.grads.size()) +
                                                " sources, expected " + std::to_string(s.grad_trees.size())));
        }
        // handles: this micro-batch's tensors are not reused
        for (std::size_t j = 0; j < msg.grads.size(); ++j) s.grad_trees[j]->push(*msg.grads[j]);
        if (msg.last) start_reduce(self, msg);
      },
      [=](reduced_atom) -> caf::result<double> {
        auto& s = self->state;
        if (s.reduced) return s.sum_squares;
        auto rp = self->make_response_promise<double>();
        s.waiting_reduced.push_back(rp);
        return rp;
      },
      [=](optimize_atom, const OptimizerStep& msg) -> done_atom {
        optimize(self->state, msg);
        return done_atom::value;
      },
      [=](master_atom) {
        return UnitShards{self->state.master, self->state.exp_avg, self->state.exp_avg_sq};
      },
  };
}

}  // namespace

unit_actor spawn_unit_actor(caf::actor_system& system, UnitActorSetup setup) {
  return system.spawn(unit_behavior, std::move(setup));
}

}  // namespace atl
